#!/usr/bin/env bash
# The main job on the embedded defaults, end to end on one CPU machine, as rStar2-Agent's recipe:
#   1. non-reasoning SFT of the tiny model on the synthetic tool-use curriculum (recipes/sft.sh)
#   2. GRPO-RoC in three stages (recipes/rl.sh: rollout --steps | roc-filter | advantage |
#      train-step --follow --sync, one streaming pipeline per stage, the step count continuing):
#        stage 1 at a short response budget, stage 2 at a raised budget, stage 3 on the hard problems
#        only (those not solved by every rollout of their last pass, `rstar hard-problems`)
#   3. held-out evaluation after SFT, every 10 steps and after each stage: OUT/rl/curve.jsonl and curve.svg
#      (training reward per step, held-out avg@n every 10 steps), and OUT/compare.md (SFT vs RL, with
#      paired bootstrap 95% intervals)
#
#   bash recipes/demo.sh [OUT]     # OUT defaults to runs/demo; rerunning resumes where it stopped
#
# Sizes come from environment variables (defaults in brackets):
#   RSTAR_DEMO_STAGES ["20 20 10"] steps of stages 1, 2, 3   RSTAR_DEMO_TOKENS ["384 512 512"] their budgets
#   RSTAR_DEMO_PROBLEMS [16] problems per step   RSTAR_DEMO_KEEP [4] G (2G rollouts per problem)
#   RSTAR_DEMO_LR ["3e-4 3e-4 1e-4"] the learning rates of stages 1, 2, 3 (one value: all three);
#     stage 3, on the hard subset, drifted at 3e-4 (docs/experiments/2026-12-03-stage-3-lr.md)
#   RSTAR_DEMO_MINI_BATCHES [2]   RSTAR_DEMO_DOWN_SAMPLE [roc; none: plain GRPO]
#   RSTAR_DEMO_POSITIVES [sorted: RoC keeps the cleanest positives; weighted: samples them by 1/(0.1 + penalty),
#     keeping some that failed a call and fixed it] (roc-filter --positives)
#   RSTAR_DEMO_STEP_WEIGHT [1: step-level advantages (advantage --step-weight 1 --gamma 0.95); 0: off]: they
#     won on 400 held-out multi-step and 400 one-call problems over 3 seeds at equal generated tokens
#     (docs/experiments/2026-12-06-larger-held-out-set.md)
#   RSTAR_DEMO_RESERVE_RECOVERED [1: RoC keeps one positive that failed a call and then made one that
#     succeeded, when the group has one (roc-filter --reserve-recovered 1); 0: the release's sort]: with step
#     advantages, recovery after RL stays above SFT's on 3 seeds of 3, at equal generated tokens
#     (docs/experiments/2026-12-06-step-advantages-default.md)
#   RSTAR_DEMO_OVERLONG_BUFFER [0]  RSTAR_DEMO_BRANCH [0]: the other credit levers of issue 41, off until
#     they win (RSTAR_RL_OVERLONG_BUFFER, _BRANCH in rl.sh); RSTAR_DEMO_BRANCH_CREDIT [siblings; with-parent]
#     (RSTAR_RL_BRANCH_CREDIT)
#   RSTAR_DEMO_LORA_RANK [0: off]  RSTAR_DEMO_LORA_ALPHA [the rank]: the RL stages train a LoRA adapter on the
#     frozen SFT checkpoint (RSTAR_RL_LORA_RANK in rl.sh; each stage goes on from the last one's adapter), and
#     every evaluation of an adapter step serves the base with it merged (rstar model-merge); LoRA wants
#     a higher learning rate than full fine-tuning (RSTAR_DEMO_LR)
#   RSTAR_DEMO_DYNAMIC [2: dynamic sampling, up to 2x the problems until every step has B mixed groups;
#     1: off] (docs/experiments/2026-12-02-dynamic-sampling.md)
#   RSTAR_DEMO_OVERSAMPLE [0: B problems, then refill rounds; 1: a step's first round already samples
#     B / r problems, r the last step's share of mixed groups (rollout --oversample; no faster here)]
#   RSTAR_DEMO_REFILL [streaming: refill problems start as soon as the finished groups show a shortfall;
#     rounds: once the round's slowest trajectory has finished] (rollout --refill)
#   RSTAR_DEMO_STALENESS [1: one-step-off, generation of step k+1 overlaps training of step k, on one
#     thread each (engine-serve --threads 1, train-step --threads 1); 0: strictly on-policy, each on every core]
#   RSTAR_DEMO_ENGINES [2 one-step-off, 1 on-policy] engine-serve processes (rollout's scheduler spreads
#     the requests over them; train-step --sync updates them all)
#   RSTAR_RL_MAX_TURNS [4] assistant turns per trajectory, RL and the evaluations: two calls and the answer,
#     and one more to fix a failed call
#   RSTAR_DEMO_EVAL_N [4] samples per held-out problem for the SFT and final evaluations
#   RSTAR_DEMO_CURVE_N [2] samples per held-out problem for the curve's points (0: skip them)
#   RSTAR_DEMO_CURVE_EVERY [20: the ends of stages 1 and 2; each point is ~200 held-out trajectories of up to
#     512 tokens, ~13 s]
#     a curve point every this many steps (the checkpoint step-K, evaluated
#     once its stage is done, so the evaluation never shares the engine with a running stage) and
#     after each stage
#   RSTAR_DEMO_TOOL_TIMEOUT [5] seconds a tool call may run (sandbox-serve --tool-timeout), RL and evaluations
#   RSTAR_DEMO_TOOL_CACHE [group] in the RL stages, a problem's samples share the result of an identical
#     pure tool call (rollout --tool-cache; off: every call runs): ~73% of the calls are such
#     repeats, and the RL stages run ~30% faster on a slow-forking VM with the same share of turns under
#     the newer policy and a three-seed gain as large (docs/experiments/2026-12-04-turn-versions-tool-cache.md)
#   RSTAR_DEMO_EVAL_TOOL_CACHE [group] the same for the held-out evaluations (eval --tool-cache): they train
#     nothing, and on seed 2's SFT checkpoint avg@4, pass@k, tool errors and format violations came out
#     equal to `off`'s, ~20% faster
#   RSTAR_DEMO_KEEP_CHECKPOINTS [2] RL checkpoints kept besides every RSTAR_DEMO_CURVE_EVERY-th step (the
#     ones the curve evaluates) and the one a stage started from (0: all; each is ~17 MB with AdamW state)
#   RSTAR_DEMO_TOOL_CACHE_AUDIT [0.05] share of cache hits run again for real and compared, in the RL
#     stages and the evaluations (--tool-cache-audit); the summary counts them, a mismatch is a WARNING
#   RSTAR_DEMO_SEED [0] the RL seed   RSTAR_DEMO_SFT [reuse a finished SFT run folder instead of training one]
#   and the RSTAR_SFT_* variables of recipes/sft.sh (RSTAR_SFT_QUICK=1 for a quick smoke run; RSTAR_SFT_EVAL
#   [0 here: the SFT checkpoint is evaluated once, as eval-sft]),
#   and RSTAR_RL_* of recipes/rl.sh for anything else (e.g. RSTAR_RL_EPOCHS, RSTAR_RL_MICRO_BATCH_TOKENS).
#   RSTAR_SFT_TOOL_STATE [stateless; session: Python sessions per trajectory] is the job's one tool state:
#   the SFT data, the RL stages (RSTAR_RL_TOOL_STATE, which may only repeat it) and the evaluations.
# OUT/manifest.txt records the settings above that shape OUT (sft.sh and rl.sh keep their own for their
# folders): a rerun with other values stops before anything runs, naming each one, instead of reusing
# another run's checkpoints and evaluations. RSTAR_FRESH=1 deletes OUT and starts afresh instead;
# RSTAR_CHECK_ONLY=1 only compares. The smoke run (recipes/smoke.sh) has a folder of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh
# shellcheck source=recipes/servers.sh
source recipes/servers.sh

OUT=${1:-runs/demo}
read -r -a STAGES <<<"${RSTAR_DEMO_STAGES:-20 20 10}"
read -r -a TOKENS <<<"${RSTAR_DEMO_TOKENS:-384 512 512}"
((${#STAGES[@]} == 3 && ${#TOKENS[@]} == 3)) || die "RSTAR_DEMO_STAGES and RSTAR_DEMO_TOKENS take three numbers each"
read -r -a LRS <<<"${RSTAR_DEMO_LR:-3e-4 3e-4 1e-4}"
((${#LRS[@]} == 1)) && LRS=("${LRS[0]}" "${LRS[0]}" "${LRS[0]}")
((${#LRS[@]} == 3)) || die "RSTAR_DEMO_LR takes one learning rate or three (one per stage), got '${RSTAR_DEMO_LR-}'"
EVAL_N=${RSTAR_DEMO_EVAL_N:-4}
CURVE_N=${RSTAR_DEMO_CURVE_N:-2}
CURVE_EVERY=${RSTAR_DEMO_CURVE_EVERY:-20}
# Two calls and the answer are three turns; the fourth is room to fix a failed call (recovery).
MAX_TURNS=${RSTAR_RL_MAX_TURNS:-4}
export RSTAR_RL_MAX_TURNS=$MAX_TURNS
[[ $CURVE_EVERY =~ ^[1-9][0-9]*$ ]] || die "RSTAR_DEMO_CURVE_EVERY: expected a positive whole number, got '$CURVE_EVERY'"
TEMPLATE=${RSTAR_SFT_TEMPLATE:-fixtures/curriculum/tiny.jinja}
KEEP_CHECKPOINTS=${RSTAR_DEMO_KEEP_CHECKPOINTS:-2}
[[ $KEEP_CHECKPOINTS =~ ^[0-9]+$ ]] || die "RSTAR_DEMO_KEEP_CHECKPOINTS: expected a whole number, got '$KEEP_CHECKPOINTS'"
SFT=${RSTAR_DEMO_SFT:-$OUT/sft}
# The model is told whether variables persist (its SFT prompts); RL and the evaluations run it so.
TOOL_STATE=${RSTAR_SFT_TOOL_STATE:-stateless}
[[ ${RSTAR_RL_TOOL_STATE:-$TOOL_STATE} == "$TOOL_STATE" ]] ||
  die "RSTAR_RL_TOOL_STATE ($RSTAR_RL_TOOL_STATE) differs from RSTAR_SFT_TOOL_STATE ($TOOL_STATE): the job has one tool state"
export RSTAR_RL_TOOL_STATE=$TOOL_STATE

# What OUT was made with: a rerun resumes only a run of the same settings (rl.sh and sft.sh check
# their own below); another run's checkpoints and evaluations are refused, naming the settings that
# differ, before anything runs (RSTAR_FRESH=1: delete OUT and start afresh).
earlier=0
occupied "$OUT" && earlier=1
SETTINGS=(RSTAR_DEMO_STAGES="${STAGES[*]}" RSTAR_DEMO_TOKENS="${TOKENS[*]}" \
  RSTAR_DEMO_LR="${LRS[*]}" RSTAR_DEMO_PROBLEMS="${RSTAR_DEMO_PROBLEMS:-16}" RSTAR_DEMO_KEEP="${RSTAR_DEMO_KEEP:-4}" \
  RSTAR_DEMO_MINI_BATCHES="${RSTAR_DEMO_MINI_BATCHES:-2}" RSTAR_DEMO_DOWN_SAMPLE="${RSTAR_DEMO_DOWN_SAMPLE:-roc}" \
  RSTAR_DEMO_DYNAMIC="${RSTAR_DEMO_DYNAMIC:-2}" RSTAR_DEMO_OVERSAMPLE="${RSTAR_DEMO_OVERSAMPLE:-0}" \
  RSTAR_DEMO_REFILL="${RSTAR_DEMO_REFILL:-streaming}" RSTAR_DEMO_STALENESS="${RSTAR_DEMO_STALENESS:-1}" \
  RSTAR_DEMO_EVAL_N="$EVAL_N" RSTAR_DEMO_CURVE_N="$CURVE_N" RSTAR_DEMO_CURVE_EVERY="$CURVE_EVERY" \
  RSTAR_DEMO_TOOL_TIMEOUT="${RSTAR_DEMO_TOOL_TIMEOUT:-5}" RSTAR_DEMO_TOOL_CACHE="${RSTAR_DEMO_TOOL_CACHE:-group}" \
  RSTAR_DEMO_EVAL_TOOL_CACHE="${RSTAR_DEMO_EVAL_TOOL_CACHE:-group}" RSTAR_DEMO_SEED="${RSTAR_DEMO_SEED:-0}" \
  RSTAR_DEMO_SFT="${RSTAR_DEMO_SFT:-}" RSTAR_SFT_TEMPLATE="$TEMPLATE" RSTAR_RL_MAX_TURNS="$MAX_TURNS")
# a later setting is recorded only when not its default, so runs made before it still resume
POSITIVES=${RSTAR_DEMO_POSITIVES:-sorted}
[[ $POSITIVES == sorted || $POSITIVES == weighted ]] ||
  die "RSTAR_DEMO_POSITIVES: expected sorted or weighted, got '$POSITIVES'"
[[ $POSITIVES == sorted ]] || SETTINGS+=(RSTAR_DEMO_POSITIVES="$POSITIVES")
RESERVE_RECOVERED=${RSTAR_DEMO_RESERVE_RECOVERED:-1}
STEP_WEIGHT=${RSTAR_DEMO_STEP_WEIGHT:-1}
BRANCH=${RSTAR_DEMO_BRANCH:-0}
BRANCH_CREDIT=${RSTAR_DEMO_BRANCH_CREDIT:-siblings}
OVERLONG_BUFFER=${RSTAR_DEMO_OVERLONG_BUFFER:-0}
[[ -z ${RSTAR_RL_LORA_RANK:-}${RSTAR_RL_LORA_ALPHA:-} ]] ||
  die "RSTAR_RL_LORA_RANK/_ALPHA: the main job's LoRA settings are RSTAR_DEMO_LORA_RANK/_ALPHA (its evaluations merge the adapters)"
LORA_RANK=${RSTAR_DEMO_LORA_RANK:-0}
[[ $LORA_RANK != 0 || -z ${RSTAR_DEMO_LORA_ALPHA:-} ]] || die "RSTAR_DEMO_LORA_ALPHA: set RSTAR_DEMO_LORA_RANK too (LoRA is off)"
LORA_ALPHA=${RSTAR_DEMO_LORA_ALPHA:-$LORA_RANK}
[[ $LORA_RANK == 0 ]] || SETTINGS+=(RSTAR_DEMO_LORA_RANK="$LORA_RANK" RSTAR_DEMO_LORA_ALPHA="$LORA_ALPHA")
# recorded when on: a run made before these were the defaults (nothing recorded) was made with 0
[[ $RESERVE_RECOVERED == 0 ]] || SETTINGS+=(RSTAR_DEMO_RESERVE_RECOVERED="$RESERVE_RECOVERED")
[[ $STEP_WEIGHT == 0 ]] || SETTINGS+=(RSTAR_DEMO_STEP_WEIGHT="$STEP_WEIGHT")
[[ $BRANCH == 0 ]] || SETTINGS+=(RSTAR_DEMO_BRANCH="$BRANCH")
[[ $BRANCH_CREDIT == siblings ]] || SETTINGS+=(RSTAR_DEMO_BRANCH_CREDIT="$BRANCH_CREDIT")
[[ $OVERLONG_BUFFER == 0 ]] || SETTINGS+=(RSTAR_DEMO_OVERLONG_BUFFER="$OVERLONG_BUFFER")
check_manifest "$OUT/manifest.txt" "$earlier" "$OUT" "${SETTINGS[@]}"
# The SFT checkpoint this run would reuse: made with this run's RSTAR_SFT_* settings? (sft.sh's own
# check; a folder given as RSTAR_DEMO_SFT is the caller's choice and is taken as it is)
if [[ -z ${RSTAR_DEMO_SFT:-} && -d $SFT/ckpt ]] && ! RSTAR_CHECK_ONLY=1 bash recipes/sft.sh "$SFT"; then
  [[ ${RSTAR_FRESH:-0} == 1 && ${RSTAR_CHECK_ONLY:-0} != 1 ]] && deletable "$OUT" ||
    die "demo: $SFT: made with other SFT settings (above)"
  log "RSTAR_FRESH=1: deleting $OUT (its SFT stage was made with other settings)"
  rm -rf -- "$OUT"
  check_manifest "$OUT/manifest.txt" 0 "" "${SETTINGS[@]}"
fi
if [[ ${RSTAR_CHECK_ONLY:-0} == 1 ]]; then
  log "demo: $OUT: settings match (RSTAR_CHECK_ONLY=1: nothing run)"
  exit 0
fi

RSTAR=(node bin/rstar.js)
[[ -f dist/src/cli.js ]] || npx tsc -p .
mkdir -p "$OUT/rl"
started=$EPOCHREALTIME
demo_resume_hint() {
  local k
  k=$(last_step "$OUT/rl" 1 1000000)
  if ((k > 0)); then echo "resume after step $k"; else echo "resume (no RL step finished yet)"; fi
}
trap_interrupts demo_resume_hint

# 1. SFT (or reuse one).
if [[ ! -d $SFT/ckpt ]]; then
  step "SFT stage"
  # The job evaluates the SFT checkpoint itself below (eval-sft, avg@4 through the shared engines), so
  # the recipe's own greedy and temperature-1 passes would only repeat it (~20 s).
  RSTAR_SFT_EVAL=${RSTAR_SFT_EVAL:-0} child bash recipes/sft.sh "$SFT"
fi
DATA=$(sft_data "$SFT") # RSTAR_SFT_DATA: the SFT run's data live elsewhere

# 2. Servers shared by the stages and the evaluations: the engines, one sandbox.
trap stop_servers EXIT
step "engine-serve + sandbox-serve"
STALENESS=${RSTAR_DEMO_STALENESS:-1}
# Overlapped, every engine and the trainer get one thread each: the engine's decode steps are small
# enough that a second thread buys it nothing (measured: same tokens/s), and two processes spinning
# two OpenMP threads each on two cores spend much of their time in the kernel. The trainer needs
# its core a third of the time, so a second single-threaded engine takes up the slack (rollout's
# KV-cache scheduler splits the requests; docs/experiments/2026-12-03-main-job-speed-and-reproducibility.md).
THREADS=0
ENGINE_PROCS=1
((STALENESS > 0)) && THREADS=1 ENGINE_PROCS=2
ENGINE_PROCS=${RSTAR_DEMO_ENGINES:-$ENGINE_PROCS}
[[ $ENGINE_PROCS =~ ^[1-9][0-9]*$ ]] || die "RSTAR_DEMO_ENGINES: expected a positive whole number, got '$ENGINE_PROCS'"
start_engines "$ENGINE_PROCS" "$OUT/engine" --model "$SFT/ckpt" --weight-version 0 --threads "$THREADS"
# The curriculum's programs run in milliseconds; what reaches a limit is the model's compute bomb
# (pow(87, 153915391) without a modulus), which holds its step and a core for the whole limit.
start_server sandbox-serve "$OUT/sandbox.log" sandbox-serve --tool-timeout "${RSTAR_DEMO_TOOL_TIMEOUT:-5}"
SANDBOX=$SERVER_URL
ROLLOUT=("${ENGINES[@]/#/--engine=}" --sandbox "$SANDBOX" --tokenizer "$SFT/ckpt" --chat-template "$TEMPLATE"
  --max-turns "$MAX_TURNS" --temperature 1 --max-tokens "${TOKENS[2]}" --tool-cache "${RSTAR_DEMO_EVAL_TOOL_CACHE:-group}"
  --tool-cache-audit "${RSTAR_DEMO_TOOL_CACHE_AUDIT:-0.05}" --tool-state "$TOOL_STATE")

# evaluate NAME CHECKPOINT VERSION N STEP: held-out avg@N of a checkpoint (kept if already done),
# added to the curve at STEP.
evaluate() {
  local name=$1 ckpt=$2 version=$3 n=$4 at=$5 merged=''
  if [[ ! -f $OUT/eval-$name/report.json ]]; then
    step "eval $name ($ckpt) on $(wc -l <"$DATA/test-problems.jsonl") held-out problems x $n"
    if [[ -f $ckpt/adapter_config.json ]]; then
      # a LoRA step: eval names no adapter, so the engines serve the base with the adapter merged in
      merged=$OUT/eval-$name.merged
      rm -rf "$merged"
      child "${RSTAR[@]}" model-merge --base "$(adapter_base "$ckpt")" --adapter "$ckpt" --out "$merged" >/dev/null
      ckpt=$merged
    fi
    child "${RSTAR[@]}" rollout --reload "$ckpt" --weight-version "$version" "${ENGINES[@]/#/--engine=}"
    child "${RSTAR[@]}" eval --problems "$DATA/test-problems.jsonl" --n "$n" --seed 0 "${ROLLOUT[@]}" \
      --out "$OUT/eval-$name.partial" >/dev/null
    rm -rf "$OUT/eval-$name" && mv "$OUT/eval-$name.partial" "$OUT/eval-$name"
    [[ -z $merged ]] || rm -rf "$merged"
  fi
  local avg
  avg=$(json_number "$(tr -d '\n' <"$OUT/eval-$name/report.json")" 'avg@n')
  grep -q "\"eval\":\"$name\"" "$OUT/rl/curve.jsonl" 2>/dev/null ||
    printf '{"v":1,"step":%s,"heldout_avg@n":%s,"eval":"%s"}\n' "$at" "$avg" "$name" >>"$OUT/rl/curve.jsonl"
  log "held-out avg@$n after $name: $avg"
}

evaluate sft "$SFT/ckpt" 0 "$EVAL_N" 0

# 3. The RL stages. rl.sh resumes inside a stage; a finished stage returns at once.
export RSTAR_RL_MODEL=$SFT/ckpt RSTAR_RL_ENGINE="${ENGINES[*]}" RSTAR_RL_SANDBOX=$SANDBOX RSTAR_RL_TOKENIZER=$SFT/ckpt
export RSTAR_RL_TEMPLATE=$TEMPLATE RSTAR_RL_BATCH=${RSTAR_DEMO_PROBLEMS:-16} RSTAR_RL_KEEP=${RSTAR_DEMO_KEEP:-4}
export RSTAR_RL_MINI_BATCHES=${RSTAR_DEMO_MINI_BATCHES:-2} RSTAR_RL_TOOL_CACHE=${RSTAR_DEMO_TOOL_CACHE:-group}
export RSTAR_RL_TOOL_CACHE_AUDIT=${RSTAR_DEMO_TOOL_CACHE_AUDIT:-0.05}
export RSTAR_RL_DOWN_SAMPLE=${RSTAR_DEMO_DOWN_SAMPLE:-roc} RSTAR_RL_SEED=${RSTAR_DEMO_SEED:-0}
export RSTAR_RL_POSITIVES=$POSITIVES
export RSTAR_RL_RESERVE_RECOVERED=$RESERVE_RECOVERED RSTAR_RL_STEP_WEIGHT=$STEP_WEIGHT RSTAR_RL_OVERLONG_BUFFER=$OVERLONG_BUFFER
export RSTAR_RL_BRANCH=$BRANCH RSTAR_RL_BRANCH_CREDIT=$BRANCH_CREDIT
# LoRA: each stage trains one adapter on the SFT checkpoint, a later stage going on from the last one's
[[ $LORA_RANK == 0 ]] || export RSTAR_RL_LORA_RANK=$LORA_RANK RSTAR_RL_LORA_ALPHA=$LORA_ALPHA
# the curve's steps stay until they are evaluated (after their stage), and after: a rerun finds them
export RSTAR_RL_KEEP_CHECKPOINTS=$KEEP_CHECKPOINTS RSTAR_RL_KEEP_EVERY=$CURVE_EVERY
export RSTAR_RL_DYNAMIC=${RSTAR_DEMO_DYNAMIC:-2} RSTAR_RL_OVERSAMPLE=${RSTAR_DEMO_OVERSAMPLE:-0} RSTAR_RL_REFILL=${RSTAR_DEMO_REFILL:-streaming} RSTAR_RL_STALENESS=$STALENESS RSTAR_RL_TRAIN_THREADS=$THREADS
first=1
last=0
for stage in 1 2 3; do
  last=$((last + STAGES[stage - 1]))
  problems=$DATA/train-problems.jsonl
  if ((stage == 3)); then
    # the hard subset: problems not solved by every rollout of their last pass
    # (fixed once: a resumed stage 3 draws from the same subset)
    if [[ ! -s $OUT/rl/hard-problems.jsonl ]]; then
      child "${RSTAR[@]}" hard-problems --problems "$problems" "$OUT"/rl/trajectories/step-*.jsonl >"$OUT/rl/hard.partial"
      mv "$OUT/rl/hard.partial" "$OUT/rl/hard-problems.jsonl"
    fi
    problems=$OUT/rl/hard-problems.jsonl
  fi
  step "RL stage $stage: steps $first..$last, response budget ${TOKENS[stage - 1]}"
  # the stage starts from the previous stage's last checkpoint
  if ((first > 1)); then export RSTAR_RL_MODEL=$OUT/rl/step-$((first - 1)); fi
  RSTAR_RL_FIRST=$first RSTAR_RL_STEPS=$last RSTAR_RL_MAX_TOKENS=${TOKENS[stage - 1]} RSTAR_RL_PROBLEMS=$problems \
    RSTAR_RL_LR=${LRS[stage - 1]} child bash recipes/rl.sh "$OUT/rl"
  if ((CURVE_N > 0)); then
    # the stage's own checkpoints every CURVE_EVERY steps (the stage's last one: below)
    for ((k = (first + CURVE_EVERY - 1) / CURVE_EVERY * CURVE_EVERY; k < last; k += CURVE_EVERY)); do
      evaluate "step$k" "$OUT/rl/step-$k" "$k" "$CURVE_N" "$k"
    done
    if ((stage < 3)); then evaluate "stage$stage" "$OUT/rl/step-$last" "$last" "$CURVE_N" "$last"; fi
  fi
  first=$((last + 1))
done

# 4. The final evaluation, the comparison and the curve.
evaluate rl "$OUT/rl/step-$last" "$last" "$EVAL_N" "$last"
"${RSTAR[@]}" eval --compare "$OUT/eval-sft/report.json" "$OUT/eval-rl/report.json" | tee "$OUT/compare.md"
"${RSTAR[@]}" eval --curve "$OUT/rl/curve.jsonl" >/dev/null
# The tool cache's audit over every RL step and evaluation: a mismatch means a shared result varied.
read -r hits audited mismatches calls < <(cat "$OUT"/rl/rollout-steps.jsonl "$OUT"/eval-*/report.json 2>/dev/null | tr -d ' \n' |
  grep -o '"tool_cache":{[^}]*}' | awk -F'[:,}]' '{ h += $3; a += $5; m += $7; c += $9 } END { printf "%d %d %d %d\n", h, a, m, c }')
log "tool cache: ${hits:-0} hits of ${calls:-0} calls, ${audited:-0} audited, ${mismatches:-0} mismatches"
((${mismatches:-0} == 0)) || log "WARNING: ${mismatches} audited tool-cache hits differed when run again: shared results correlated some groups' samples (grep 'WARNING tool cache' in the logs)"
log "done in $(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", b - a }') s: $OUT/compare.md, $OUT/rl/curve.svg, $OUT/rl/steps.jsonl"
