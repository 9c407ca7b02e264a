#!/usr/bin/env bash
# One GRPO-RoC stage as one streaming pipeline of the toolchain's commands, the trainer resident:
#
#   rstar rollout --steps S --batch B --n 2G ...      (waits for each step's policy on the engines)
#     | rstar roc-filter --keep G --group-size 2G     (--down-sample none: keep all 2G, plain GRPO)
#     | rstar advantage --group-size G
#     | rstar train-step --follow --loss grpo --sync ENGINE ...   (checkpoint OUT/step-K, then the
#                                                                 engine loads it as weight_version K)
#
#   bash recipes/rl.sh OUT               # needs RSTAR_RL_MODEL and RSTAR_RL_PROBLEMS
#
# Rerunning the same command resumes: the pipeline starts after the last complete checkpoint
# OUT/step-K (a checkpoint is renamed into place whole, so one that exists is complete), from K's
# weights and AdamW state, and rollout draws the same problems for each step as before.
#
# Environment (defaults in brackets):
#   RSTAR_RL_MODEL      checkpoint to start from (e.g. the SFT checkpoint)
#   RSTAR_RL_PROBLEMS   training problems (NDJSON Problem records)
#   RSTAR_RL_STEPS [8]  this stage's last step (a later stage continues the step count: RSTAR_RL_FIRST)
#   RSTAR_RL_FIRST [1]  the stage's first step (a stage after another starts at its last step + 1)
#   RSTAR_RL_BATCH [16] problems per step   RSTAR_RL_KEEP [4] G   RSTAR_RL_N [2G] rollouts per problem
#   RSTAR_RL_DOWN_SAMPLE [roc]  roc: keep G of 2G (GRPO-RoC); none: keep all N (plain GRPO, same budget)
#   RSTAR_RL_POSITIVES [sorted]  which positives RoC keeps (roc-filter --positives): sorted, the fewest
#                       tool errors and format faults first; weighted, sampled with weight 1/(0.1 + penalty)
#                       (seeded by RSTAR_RL_SEED), so a positive that failed a call and fixed it is sometimes kept
#   RSTAR_RL_RESERVE_RECOVERED [0]  positive slots RoC reserves for recovered positives, a failed call then a
#                       later successful one (roc-filter --reserve-recovered; docs/roc.md)
#   RSTAR_RL_STEP_WEIGHT [0: off]  RSTAR_RL_GAMMA [0.95]  step-level (GiGPO-style) advantages added with weight W,
#                       returns discounted by G per later turn (advantage --step-weight, --gamma)
#   RSTAR_RL_BRANCH [0: off]  RSTAR_RL_BRANCH_BUDGET [N*B/2]  tree rollouts: K more continuations from the state
#                       just after a sample's first failed call, at most BUDGET branch samples a step
#                       (rollout --branch, --branch-budget; trained in groups of their own: docs/rollout.md)
#   RSTAR_RL_BRANCH_CREDIT [siblings]  with-parent: the parent's tokens after its branch point are credited in
#                       its branch group, as one more continuation from that state (advantage --branch-credit)
#   RSTAR_RL_OVERLONG_BUFFER [0: off]  RSTAR_RL_OVERLONG_PENALTY [1]  DAPO's soft overlong penalty over the last
#                       L tokens of RSTAR_RL_MAX_TOKENS (advantage --overlong-buffer, --overlong-penalty)
#   RSTAR_RL_LR [3e-4]  RSTAR_RL_MINI_BATCHES [2]  RSTAR_RL_EPOCHS [1]  RSTAR_RL_MAX_TOKENS [384]
#   RSTAR_RL_MAX_TURNS [3]  RSTAR_RL_TEMPERATURE [1]  RSTAR_RL_STALENESS [0: on-policy; 1: one-step-off]
#   RSTAR_RL_DYNAMIC [2: refill up to 2*B problems until B groups are mixed, so every update sees a
#                       full batch; 1: off]
#   RSTAR_RL_OVERSAMPLE [0]  1: under dynamic sampling, a step's first round already samples B / r
#                       problems, r the last step's share of mixed groups (rollout --oversample)
#   RSTAR_RL_REFILL [rounds]  streaming: refill problems start as soon as the finished groups show a
#                       shortfall, beside the trajectories still running (rollout --refill)
#   RSTAR_RL_TOOL_CACHE [off]  group: a problem's samples share the result of an identical pure
#                       tool call (rollout --tool-cache; 73% of the main job's calls, which sets it: the RL
#                       stages ~30% faster on a slow-forking VM, the same gain over three seeds:
#                       docs/experiments/2026-12-04-turn-versions-tool-cache.md)
#   RSTAR_RL_TOOL_CACHE_AUDIT [0]  share of cache hits run again for real and compared (rollout
#                       --tool-cache-audit; counted in rollout-steps.jsonl, a mismatch is a WARNING)
#   RSTAR_RL_TOOL_STATE [stateless]  session: each trajectory's tool calls are the cells of one Python
#                       session, the prompt saying so (rollout --tool-state; the SFT data should match:
#                       recipes/sft.sh RSTAR_SFT_TOOL_STATE); the tool cache then shares a cell by its history
#   RSTAR_RL_SEED [0]  RSTAR_RL_TEMPLATE [fixtures/curriculum/tiny.jinja]  RSTAR_RL_TOKENIZER [the model]
#   RSTAR_RL_TRAIN_THREADS [0: torch's default]  CPU threads of train-step (--threads)
#   RSTAR_RL_ENGINE_THREADS [0]  of each engine this script starts; with RSTAR_RL_STALENESS=1 on a CPU
#                       machine, 1 and 1 let generation and training overlap on one core each
#   RSTAR_RL_MICRO_BATCH_TOKENS [2048]  padded tokens per micro-batch of train-step (sequences packed
#                       in length order; on CPU small micro-batches are ~3x faster than one per
#                       mini-batch: attention's padded (T, T) scores dominate a step)
#   RSTAR_RL_TRAIN_ARGS [extra train-step flags]
#   RSTAR_RL_LORA_RANK [0: off]  RSTAR_RL_LORA_ALPHA [the rank]  train a LoRA adapter of rank R on the frozen
#                       base (train-step --lora-rank, --lora-alpha): OUT/step-K is an adapter folder, the
#                       engines load each one beside the base as rstar-lora-step-K (never the base again),
#                       and rollout --lora names it in every request (docs/rollout.md "LoRA"). A stage after
#                       a LoRA stage (RSTAR_RL_FIRST > 1) gives that stage's last adapter folder as
#                       RSTAR_RL_MODEL: the base is the one its adapter_config.json names, and training goes
#                       on from the adapter and its AdamW state (train-step --lora-init)
#   RSTAR_RL_KEEP_CHECKPOINTS [0: all]  K: after each step only the last K checkpoints stay (train-step
#                       --keep-checkpoints), besides every RSTAR_RL_KEEP_EVERY-th [0: none] and the one
#                       the stage started from; a resume needs only the newest
#   RSTAR_RL_ENGINE_PROCS [1]  engine-serve processes this script starts (rollout's KV-cache scheduler
#                       spreads the requests, train-step --sync updates them all)
#   RSTAR_RL_ENGINE / RSTAR_RL_SANDBOX  running servers to use, RSTAR_RL_ENGINE one URL or several
#                       separated by spaces (default: start engine-serve and sandbox-serve for this
#                       stage and stop them at the end)
#
# Writes OUT/step-K/ (checkpoint), OUT/trajectories/step-K.jsonl, OUT/steps.jsonl (train-step's Step records),
# OUT/rollout-steps.jsonl (rollout's per-step statistics), OUT/curve.jsonl (training reward per step),
# OUT/manifest-stage-FIRST.txt (the settings above that shape the stage's steps: a rerun with other
# values, which would resume those steps, is refused, naming each one; recipes/lib.sh check_manifest).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh
# shellcheck source=recipes/servers.sh
source recipes/servers.sh

OUT=${1:?usage: bash recipes/rl.sh OUT}
MODEL=${RSTAR_RL_MODEL:?RSTAR_RL_MODEL: the checkpoint to start from}
PROBLEMS=${RSTAR_RL_PROBLEMS:?RSTAR_RL_PROBLEMS: the training problems}
FIRST=${RSTAR_RL_FIRST:-1}
STEPS=${RSTAR_RL_STEPS:-8}
BATCH=${RSTAR_RL_BATCH:-16}
KEEP=${RSTAR_RL_KEEP:-4}
N=${RSTAR_RL_N:-$((2 * KEEP))}
DOWN=${RSTAR_RL_DOWN_SAMPLE:-roc}
LR=${RSTAR_RL_LR:-3e-4}
MINI=${RSTAR_RL_MINI_BATCHES:-2}
EPOCHS=${RSTAR_RL_EPOCHS:-1}
MAX_TOKENS=${RSTAR_RL_MAX_TOKENS:-384}
MAX_TURNS=${RSTAR_RL_MAX_TURNS:-3}
TEMPERATURE=${RSTAR_RL_TEMPERATURE:-1}
STALENESS=${RSTAR_RL_STALENESS:-0}
TRAIN_THREADS=${RSTAR_RL_TRAIN_THREADS:-0}
ENGINE_THREADS=${RSTAR_RL_ENGINE_THREADS:-0}
ENGINE_PROCS=${RSTAR_RL_ENGINE_PROCS:-1}
MICRO_TOKENS=${RSTAR_RL_MICRO_BATCH_TOKENS:-2048}
DYNAMIC=${RSTAR_RL_DYNAMIC:-2}
case ${RSTAR_RL_OVERSAMPLE:-0} in
  0) OVERSAMPLE=() ;;
  1) OVERSAMPLE=(--oversample) ;;
  *) die "RSTAR_RL_OVERSAMPLE: expected 0 or 1, got '$RSTAR_RL_OVERSAMPLE'" ;;
esac
REFILL=${RSTAR_RL_REFILL:-rounds}
[[ $REFILL == rounds || $REFILL == streaming ]] || die "RSTAR_RL_REFILL: expected rounds or streaming, got '$REFILL'"
SEED=${RSTAR_RL_SEED:-0}
TOOL_CACHE=${RSTAR_RL_TOOL_CACHE:-off}
TOOL_CACHE_AUDIT=${RSTAR_RL_TOOL_CACHE_AUDIT:-0}
TOOL_STATE=${RSTAR_RL_TOOL_STATE:-stateless}
[[ $TOOL_STATE == stateless || $TOOL_STATE == session ]] ||
  die "RSTAR_RL_TOOL_STATE: expected stateless or session, got '$TOOL_STATE'"
# In the manifest only when not the default: stages made before these settings still resume.
OPTIONAL_SETTINGS=()
[[ $TOOL_STATE == stateless ]] || OPTIONAL_SETTINGS=(RSTAR_RL_TOOL_STATE="$TOOL_STATE")
POSITIVES=${RSTAR_RL_POSITIVES:-sorted}
[[ $POSITIVES == sorted || $POSITIVES == weighted ]] ||
  die "RSTAR_RL_POSITIVES: expected sorted or weighted, got '$POSITIVES'"
# likewise in the manifest only when not the default (stages made before the setting were sorted)
[[ $POSITIVES == sorted ]] || OPTIONAL_SETTINGS+=(RSTAR_RL_POSITIVES="$POSITIVES")
# The credit levers (issue 41), off by default and likewise recorded only when set.
RESERVE_RECOVERED=${RSTAR_RL_RESERVE_RECOVERED:-0}
STEP_WEIGHT=${RSTAR_RL_STEP_WEIGHT:-0}
GAMMA=${RSTAR_RL_GAMMA:-0.95}
OVERLONG_BUFFER=${RSTAR_RL_OVERLONG_BUFFER:-0}
OVERLONG_PENALTY=${RSTAR_RL_OVERLONG_PENALTY:-1}
[[ $RESERVE_RECOVERED == 0 ]] || OPTIONAL_SETTINGS+=(RSTAR_RL_RESERVE_RECOVERED="$RESERVE_RECOVERED")
BRANCH=${RSTAR_RL_BRANCH:-0}
BRANCHING=()
if [[ $BRANCH != 0 ]]; then
  BRANCHING=(--branch "$BRANCH")
  OPTIONAL_SETTINGS+=(RSTAR_RL_BRANCH="$BRANCH")
  if [[ -n ${RSTAR_RL_BRANCH_BUDGET:-} ]]; then
    BRANCHING+=(--branch-budget "$RSTAR_RL_BRANCH_BUDGET")
    OPTIONAL_SETTINGS+=(RSTAR_RL_BRANCH_BUDGET="$RSTAR_RL_BRANCH_BUDGET")
  fi
fi
CREDIT=()
BRANCH_CREDIT=${RSTAR_RL_BRANCH_CREDIT:-siblings}
[[ $BRANCH_CREDIT == siblings || $BRANCH_CREDIT == with-parent ]] ||
  die "RSTAR_RL_BRANCH_CREDIT: expected siblings or with-parent, got '$BRANCH_CREDIT'"
if [[ $BRANCH_CREDIT != siblings ]]; then
  OPTIONAL_SETTINGS+=(RSTAR_RL_BRANCH_CREDIT="$BRANCH_CREDIT")
  CREDIT+=(--branch-credit "$BRANCH_CREDIT")
fi
if [[ $STEP_WEIGHT != 0 ]]; then
  OPTIONAL_SETTINGS+=(RSTAR_RL_STEP_WEIGHT="$STEP_WEIGHT" RSTAR_RL_GAMMA="$GAMMA")
  CREDIT+=(--step-weight "$STEP_WEIGHT" --gamma "$GAMMA")
fi
if [[ $OVERLONG_BUFFER != 0 ]]; then
  OPTIONAL_SETTINGS+=(RSTAR_RL_OVERLONG_BUFFER="$OVERLONG_BUFFER" RSTAR_RL_OVERLONG_PENALTY="$OVERLONG_PENALTY")
  CREDIT+=(--overlong-buffer "$OVERLONG_BUFFER" --overlong-penalty "$OVERLONG_PENALTY" --max-tokens "$MAX_TOKENS")
fi
# LoRA (issue 42), off by default and likewise recorded only when set.
LORA_RANK=${RSTAR_RL_LORA_RANK:-0}
TRAIN_LORA=()
ROLLOUT_LORA=()
if [[ $LORA_RANK != 0 ]]; then
  [[ $LORA_RANK =~ ^[1-9][0-9]*$ ]] || die "RSTAR_RL_LORA_RANK: expected a positive whole number, got '$LORA_RANK'"
  LORA_ALPHA=${RSTAR_RL_LORA_ALPHA:-$LORA_RANK}
  # The engines label the base 0 and adapter K step K's, so a stage after step 1 goes on from an
  # adapter, and only the first stage starts from the base alone.
  [[ -d $MODEL ]] || die "RSTAR_RL_MODEL: $MODEL is not a checkpoint or adapter folder"
  if [[ -f $MODEL/adapter_config.json ]]; then
    ((FIRST > 1)) || die "RSTAR_RL_MODEL: $MODEL is an adapter folder: a LoRA stage starting at step 1 trains a new adapter on the base (give the base)"
  else
    ((FIRST == 1)) || die "RSTAR_RL_LORA_RANK: a LoRA stage at RSTAR_RL_FIRST=$FIRST goes on from the previous stage's adapter folder, got the full checkpoint RSTAR_RL_MODEL=$MODEL"
  fi
  OPTIONAL_SETTINGS+=(RSTAR_RL_LORA_RANK="$LORA_RANK" RSTAR_RL_LORA_ALPHA="$LORA_ALPHA")
  TRAIN_LORA=(--lora-rank "$LORA_RANK" --lora-alpha "$LORA_ALPHA")
  ROLLOUT_LORA=(--lora)
elif [[ -n ${RSTAR_RL_LORA_ALPHA:-} ]]; then
  die "RSTAR_RL_LORA_ALPHA: set RSTAR_RL_LORA_RANK too (LoRA is off)"
elif [[ -f $MODEL/adapter_config.json ]]; then
  die "RSTAR_RL_MODEL: $MODEL is a LoRA adapter folder: set RSTAR_RL_LORA_RANK to go on training it, or merge it first (rstar model-merge)"
fi
TEMPLATE=${RSTAR_RL_TEMPLATE:-fixtures/curriculum/tiny.jinja}
KEEP_CHECKPOINTS=${RSTAR_RL_KEEP_CHECKPOINTS:-0}
KEEP_EVERY=${RSTAR_RL_KEEP_EVERY:-0}
RSTAR=(node bin/rstar.js)
[[ -s $PROBLEMS ]] || die "RSTAR_RL_PROBLEMS: $PROBLEMS is missing or empty"
case $DOWN in
  roc) KEPT=$KEEP ;;
  none) KEPT=$N ;;  # roc-filter --keep N: equal-reward groups are still dropped, as dynamic sampling does
  *) die "RSTAR_RL_DOWN_SAMPLE: expected roc or none, got '$DOWN'" ;;
esac

# Resume: the newest complete checkpoint (older ones may be pruned: --keep-checkpoints). One at or
# past STEPS means this stage is done (a later stage's count continues past it).
newest=0
for ckpt in "$OUT"/step-*/trainer_state.json; do
  [[ -f $ckpt ]] || continue
  k=${ckpt%/trainer_state.json}
  k=${k##*/step-}
  [[ $k =~ ^[0-9]+$ ]] && ((k > newest)) && newest=$k
done
if ((newest >= STEPS)); then
  log "rl: every step up to $STEPS is done ($OUT/step-$newest)"
  exit 0
fi
earlier=0
((newest >= FIRST)) && earlier=1
check_manifest "$OUT/manifest-stage-$FIRST.txt" "$earlier" "" RSTAR_RL_MODEL="$MODEL" RSTAR_RL_PROBLEMS="$PROBLEMS" \
  RSTAR_RL_BATCH="$BATCH" RSTAR_RL_KEEP="$KEEP" RSTAR_RL_N="$N" RSTAR_RL_DOWN_SAMPLE="$DOWN" RSTAR_RL_LR="$LR" \
  RSTAR_RL_MINI_BATCHES="$MINI" RSTAR_RL_EPOCHS="$EPOCHS" RSTAR_RL_MAX_TOKENS="$MAX_TOKENS" RSTAR_RL_MAX_TURNS="$MAX_TURNS" \
  RSTAR_RL_TEMPERATURE="$TEMPERATURE" RSTAR_RL_STALENESS="$STALENESS" RSTAR_RL_DYNAMIC="$DYNAMIC" \
  RSTAR_RL_OVERSAMPLE="${RSTAR_RL_OVERSAMPLE:-0}" RSTAR_RL_REFILL="$REFILL" RSTAR_RL_SEED="$SEED" \
  RSTAR_RL_TOOL_CACHE="$TOOL_CACHE" RSTAR_RL_TEMPLATE="$TEMPLATE" RSTAR_RL_MICRO_BATCH_TOKENS="$MICRO_TOKENS" \
  RSTAR_RL_TRAIN_ARGS="${RSTAR_RL_TRAIN_ARGS:-}" "${OPTIONAL_SETTINGS[@]}"
if [[ ${RSTAR_CHECK_ONLY:-0} == 1 ]]; then
  log "rl: $OUT: settings match (RSTAR_CHECK_ONLY=1: nothing run)"
  exit 0
fi
mkdir -p "$OUT"
start=$FIRST
model=$MODEL
version=$((FIRST - 1))
adapter=''  # with LoRA: the adapter the stage goes on from (the base, version 0, is the one it names)
if ((LORA_RANK != 0)) && [[ -f $MODEL/adapter_config.json ]]; then
  adapter=$MODEL
  model=$(adapter_base "$MODEL")
  version=0
fi
if ((newest >= FIRST)) && ((LORA_RANK != 0)); then
  start=$((newest + 1)) adapter=$OUT/step-$newest
elif ((newest >= FIRST)); then
  start=$((newest + 1)) model=$OUT/step-$newest version=$newest
else
  [[ -d $MODEL ]] || die "RSTAR_RL_MODEL: $MODEL is not a checkpoint folder"
fi
[[ -z $adapter ]] || TRAIN_LORA+=(--lora-init "$adapter")
TOKENIZER=${RSTAR_RL_TOKENIZER:-$model}
[[ -f dist/src/cli.js ]] || npx tsc -p .
((start > FIRST)) && log "rl: resuming after step $((start - 1)) (${adapter:-$model})"
# A run killed between a checkpoint and its Step record going down the pipe: the record is in the
# checkpoint (step.json), so steps.jsonl and curve.jsonl get every finished step exactly once.
touch "$OUT/steps.jsonl" "$OUT/curve.jsonl"
# curve_point K: step K's curve.jsonl line from its rollout statistics (sets $reward for the log):
# the mean reward, and the tool use of its rollouts where rollout recorded it (stats.tool_use).
curve_point() {
  local stats extra='' share err
  # (a step killed before its statistics were written has none: its point says reward 0)
  stats=$(grep "\"step\":$1," "$OUT/rollout-steps.jsonl" | tail -n 1) || stats=''
  reward=$(json_number "$stats" mean_reward) || reward=''
  share=$(json_number "$stats" multi_call_share) || share=''
  err=$(json_number "$stats" positive_tool_error_rate) || err=''
  [[ -n $share ]] && extra+=",\"train_multi_call_share\":$share"
  [[ -n $err ]] && extra+=",\"train_positive_tool_error_rate\":$err"
  printf '{"v":1,"step":%s,"train_reward":%s%s}\n' "$1" "${reward:-0}" "$extra" >>"$OUT/curve.jsonl"
}
for ((k = FIRST; k < start; k++)); do
  # (a pruned checkpoint's record went down the pipe before it was pruned)
  grep -q "\"step\": $k," "$OUT/steps.jsonl" || [[ ! -f $OUT/step-$k/step.json ]] ||
    cat "$OUT/step-$k/step.json" >>"$OUT/steps.jsonl"
  if ! grep -q "\"step\":$k," "$OUT/curve.jsonl"; then
    curve_point "$k"
  fi
done

trap stop_servers EXIT
rl_resume_hint() { echo "resume after step $(last_step "$OUT" "$FIRST" "$STEPS")"; }
trap_interrupts rl_resume_hint
read -r -a ENGINES <<<"${RSTAR_RL_ENGINE:-}"
if ((${#ENGINES[@]} == 0)); then
  [[ $ENGINE_PROCS =~ ^[1-9][0-9]*$ ]] || die "RSTAR_RL_ENGINE_PROCS: expected a positive whole number, got '$ENGINE_PROCS'"
  start_engines "$ENGINE_PROCS" "$OUT/engine" --model "$model" --weight-version "$version" --threads "$ENGINE_THREADS"
else
  child "${RSTAR[@]}" rollout --reload "$model" --weight-version "$version" "${ENGINES[@]/#/--engine=}"
fi
# a LoRA stage going on from an adapter (resumed, or after a LoRA stage): the engines serve the base,
# and that adapter beside it (rstar-lora-step-K)
[[ -z $adapter ]] || child "${RSTAR[@]}" rollout --reload "$adapter" --weight-version "$((start - 1))" "${ENGINES[@]/#/--engine=}"
SANDBOX=${RSTAR_RL_SANDBOX:-}
if [[ -z $SANDBOX ]]; then
  start_server sandbox-serve "$OUT/sandbox.log" sandbox-serve
  SANDBOX=$SERVER_URL
fi

step "RL steps $start..$STEPS: $BATCH problems x $N, keep $KEPT ($DOWN), $MINI mini-batches x $EPOCHS epochs, LR $LR"
# rollout runs beside the rest of the pipeline, through a FIFO: if a later stage fails, rollout
# (waiting for a policy that will never come) is stopped instead of hanging the recipe; if rollout
# fails, train-step refuses the unterminated last batch (nothing half-trained).
fifo=$OUT/.rollout.fifo
rm -f "$fifo" && mkfifo "$fifo"
"${RSTAR[@]}" rollout --problems "$PROBLEMS" --steps "$STEPS" --start-step "$start" --batch "$BATCH" --n "$N" \
  --seed "$SEED" --max-staleness "$STALENESS" --dynamic-sampling "$DYNAMIC" "${OVERSAMPLE[@]}" --refill "$REFILL" \
  "${ENGINES[@]/#/--engine=}" --sandbox "$SANDBOX" --tokenizer "$TOKENIZER" --chat-template "$TEMPLATE" \
  --max-tokens "$MAX_TOKENS" --max-turns "$MAX_TURNS" --temperature "$TEMPERATURE" --tool-cache "$TOOL_CACHE" \
  --tool-cache-audit "$TOOL_CACHE_AUDIT" --tool-state "$TOOL_STATE" "${BRANCHING[@]}" "${ROLLOUT_LORA[@]}" \
  --save "$OUT/trajectories/step-{step}.jsonl" --step-stats "$OUT/rollout-steps.jsonl" >"$fifo" &
rollout_pid=$!
trained() {
  # shellcheck disable=SC2086
  "${RSTAR[@]}" roc-filter --keep "$KEPT" --group-size "$N" --positives "$POSITIVES" --seed "$SEED" \
    --reserve-recovered "$RESERVE_RECOVERED" --stats "$OUT/roc-stats.json" <"$fifo" |
    "${RSTAR[@]}" advantage --group-size "$KEPT" "${CREDIT[@]}" --stats "$OUT/advantage-stats.json" |
    "${RSTAR[@]}" train-step --follow --loss grpo --model "$model" --weight-version "$((start - 1))" \
      --out "$OUT/step-{step}" --policy "rl-step-{step}" --sync "${ENGINES[@]}" --max-staleness "$STALENESS" \
      --lr "$LR" --mini-batches "$MINI" --passes-per-batch "$EPOCHS" --threads "$TRAIN_THREADS" \
      --micro-batch-tokens "$MICRO_TOKENS" --keep-checkpoints "$KEEP_CHECKPOINTS" --keep-every "$KEEP_EVERY" \
      "${TRAIN_LORA[@]}" ${RSTAR_RL_TRAIN_ARGS:-} |
    tee -a "$OUT/steps.jsonl" |
    while IFS= read -r record; do
      k=$(json_number "$record" step)
      curve_point "$k"
      log "step $k: mean reward ${reward:-?}, $(json_number "$record" sequences) trained, clip $(json_number "$record" pg_clipfrac), kl $(json_number "$record" approx_kl), $(json_number "$record" seconds)s"
    done
}
if ! child trained; then
  kill "$rollout_pid" 2>/dev/null || true
  wait "$rollout_pid" 2>/dev/null || true
  rm -f "$fifo"
  die "rl: the pipeline failed (see above); rerun the same command to resume after the last finished step"
fi
wait "$rollout_pid" || { rm -f "$fifo"; die "rl: rollout failed (see above); rerun to resume"; }
rm -f "$fifo"
log "rl: done: $OUT/step-$STEPS, $OUT/steps.jsonl, $OUT/curve.jsonl"
