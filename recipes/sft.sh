#!/usr/bin/env bash
# SFT stage of the tiny embedded model: the synthetic tool-use curriculum, model-init, SFT with
# one resident trainer (`rstar sft-train`), then a held-out evaluation through the real pipeline
# (engine-serve + sandbox-serve + rollout + verify), greedy and at temperature 1.
#
#   bash recipes/sft.sh [OUT]          # OUT defaults to runs/sft
#   RSTAR_SFT_QUICK=1 bash recipes/sft.sh /tmp/sft-ci   # CI: a minute or two, checks the loop runs
#
# Sizes come from environment variables (defaults in brackets):
#   RSTAR_SFT_CURRICULUM [mix-agentic: the eight families, three of them multi-step; mix: the five one-call ones]  RSTAR_SFT_TRAIN [5000]  RSTAR_SFT_TEST [100]  RSTAR_SFT_SEED [0]
#   RSTAR_SFT_CONFIG [fixtures/tiny/config.json]  RSTAR_SFT_INIT [induction: model-init --init; heads
#   above the first layer start as copying heads, docs/sft.md; `normal` for a plain random init]
#   RSTAR_SFT_BATCH [8]  RSTAR_SFT_LR [4e-3]  RSTAR_SFT_NPROC [2 on a machine with 2 or more cores:
#   train-step --nproc, data-parallel ranks of one thread each, ~15% faster here than one 2-thread rank]
#   RSTAR_SFT_WINDOW [1: batches are uniform draws; N > 1: batches of similar length from windows of
#   N batches, less padding but copying formed later in every run so far, docs/sft.md]
#   RSTAR_SFT_WARMUP [30]  RSTAR_SFT_DECAY [0.25: LR decays linearly to 2% over this last fraction
#   of the budget; 0 = constant]  RSTAR_SFT_TOTAL [1800: wall-clock seconds for the whole recipe, a guard:
#   RSTAR_SFT_MAX_STEPS ends training first on any machine doing a step in under ~1.3 s, so a loaded machine
#   trains the same model, only later; 480 left a loaded run 380 of its 600 steps, docs/sft.md]
#   RSTAR_SFT_SECONDS [the training loop's budget; default: what RSTAR_SFT_TOTAL leaves after the data
#   and model-init, minus RSTAR_SFT_EVAL_RESERVE (70) for the evaluation]
#   RSTAR_SFT_MAX_STEPS [1200: twice the 600 steps that the first 480 s budget trained; at 600 the
#   held-out avg@4 was 40% with 9% format violations, at 1,200 78% and 2.3% (docs/sft.md); training
#   ends there, on a faster machine as on a slower one; 0 = no limit]  RSTAR_SFT_CKPT_EVERY [500]  RSTAR_SFT_EVAL_N [2: samples per
#   problem at temperature 1]  RSTAR_SFT_EVAL_TOKENS [512: above the longest demonstration, ~430]  RSTAR_SFT_DATA [reuse a built data folder]
#   RSTAR_SFT_TEMPLATE [fixtures/curriculum/tiny.jinja; `rstar2` for the release's full prompt]
#   RSTAR_SFT_SANDBOX [unset: the curriculum's own programs run in one warm python3 with the sandbox's cell
#                     semantics (sft-data's default); embedded, or a sandbox-serve URL: in the sandbox]
#   RSTAR_SFT_TOOL_STATE [stateless; session: demonstrations whose calls are the cells of one Python
#                     session, some reusing a variable of their first call, the prompts saying so, and the
#                     evaluation rolled out the same way (sft-data / rollout --tool-state); RL must then use
#                     RSTAR_RL_TOOL_STATE=session]
#   RSTAR_SFT_FAMILY_WEIGHTS [mix-agentic: inspect=2,search=2,recover=2, each multi-step family drawn twice as
#                     often as a one-call one; other curricula: uniform]: the training demonstrations' family
#                     proportions (sft-data --family-weights; `uniform`: all alike), the held-out problems unchanged
#   RSTAR_SFT_EVAL [1; 0: no held-out evaluation here, for a caller that evaluates the checkpoint itself,
#   as recipes/demo.sh does; the training budget still leaves RSTAR_SFT_EVAL_RESERVE, so the SFT is the same]
# OUT/manifest.txt records the settings above that shape OUT's data and checkpoint; a rerun with other
# values stops at once, naming them (RSTAR_FRESH=1: delete OUT and start afresh; RSTAR_CHECK_ONLY=1:
# only compare, run nothing). recipes/lib.sh, check_manifest.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh

OUT=${1:-${RSTAR_SFT_OUT:-runs/sft}}
QUICK=${RSTAR_SFT_QUICK:-0}
if [[ $QUICK == 1 ]]; then
  : "${RSTAR_SFT_TRAIN:=48}" "${RSTAR_SFT_TEST:=4}" "${RSTAR_SFT_SECONDS:=40}" "${RSTAR_SFT_MAX_STEPS:=3}"
  : "${RSTAR_SFT_EVAL_N:=1}" "${RSTAR_SFT_CKPT_EVERY:=2}" "${RSTAR_SFT_EVAL_TOKENS:=64}"
fi
CURRICULUM=${RSTAR_SFT_CURRICULUM:-mix-agentic}
TRAIN=${RSTAR_SFT_TRAIN:-5000}
TEST=${RSTAR_SFT_TEST:-100}
SEED=${RSTAR_SFT_SEED:-0}
CONFIG=${RSTAR_SFT_CONFIG:-fixtures/tiny/config.json}
INIT=${RSTAR_SFT_INIT:-induction}
NPROC=${RSTAR_SFT_NPROC:-$(($(nproc) >= 2 ? 2 : 1))}
BATCH=${RSTAR_SFT_BATCH:-8}
LR=${RSTAR_SFT_LR:-4e-3}
WARMUP=${RSTAR_SFT_WARMUP:-30}
WINDOW=${RSTAR_SFT_WINDOW:-1}
DECAY=${RSTAR_SFT_DECAY:-0.25}
TOTAL=${RSTAR_SFT_TOTAL:-1800}
EVAL_RESERVE=${RSTAR_SFT_EVAL_RESERVE:-70}
recipe_start=$EPOCHREALTIME
MAX_STEPS=${RSTAR_SFT_MAX_STEPS:-1200}
CKPT_EVERY=${RSTAR_SFT_CKPT_EVERY:-500}
EVAL_N=${RSTAR_SFT_EVAL_N:-2}
EVAL_TOKENS=${RSTAR_SFT_EVAL_TOKENS:-512}
TEMPLATE=${RSTAR_SFT_TEMPLATE:-fixtures/curriculum/tiny.jinja}
TOOL_STATE=${RSTAR_SFT_TOOL_STATE:-stateless}
[[ $TOOL_STATE == stateless || $TOOL_STATE == session ]] ||
  die "RSTAR_SFT_TOOL_STATE: expected stateless or session, got '$TOOL_STATE'"
# Recorded in the manifest only when it is not the default, so folders made before the setting
# existed (all stateless) are still reused.
LATER_SETTINGS=()
[[ $TOOL_STATE == stateless ]] || LATER_SETTINGS=(RSTAR_SFT_TOOL_STATE="$TOOL_STATE")
# sft-data --family-weights: the training demonstrations' family proportions. mix-agentic's default
# draws each multi-step family twice as often as a one-call one (docs/sft.md); `uniform` (or '') draws
# them alike. Recorded only when not uniform, as above.
DEFAULT_WEIGHTS=''
[[ $CURRICULUM != mix-agentic ]] || DEFAULT_WEIGHTS=inspect=2,search=2,recover=2
FAMILY_WEIGHTS=${RSTAR_SFT_FAMILY_WEIGHTS-$DEFAULT_WEIGHTS}
[[ $FAMILY_WEIGHTS != uniform ]] || FAMILY_WEIGHTS=''
WEIGHTS_ARG=()
[[ -z $FAMILY_WEIGHTS ]] || {
  LATER_SETTINGS+=(RSTAR_SFT_FAMILY_WEIGHTS="$FAMILY_WEIGHTS")
  WEIGHTS_ARG=(--family-weights "$FAMILY_WEIGHTS")
}

# What OUT's data was made with (a rerun reuses OUT/data; recipes/demo.sh reuses OUT/ckpt): another
# run's is refused, naming the settings that differ (RSTAR_FRESH=1: start afresh). The evaluation's
# settings are not among them: nothing reuses an evaluation.
earlier=0
occupied "$OUT" && earlier=1
check_manifest "$OUT/manifest.txt" "$earlier" "$OUT" RSTAR_SFT_QUICK="$QUICK" RSTAR_SFT_CURRICULUM="$CURRICULUM" \
  RSTAR_SFT_TRAIN="$TRAIN" RSTAR_SFT_TEST="$TEST" RSTAR_SFT_SEED="$SEED" RSTAR_SFT_CONFIG="$CONFIG" RSTAR_SFT_INIT="$INIT" \
  RSTAR_SFT_BATCH="$BATCH" RSTAR_SFT_LR="$LR" RSTAR_SFT_WARMUP="$WARMUP" RSTAR_SFT_WINDOW="$WINDOW" RSTAR_SFT_DECAY="$DECAY" \
  RSTAR_SFT_TOTAL="$TOTAL" RSTAR_SFT_SECONDS="${RSTAR_SFT_SECONDS:-}" RSTAR_SFT_EVAL_RESERVE="$EVAL_RESERVE" \
  RSTAR_SFT_MAX_STEPS="$MAX_STEPS" RSTAR_SFT_TEMPLATE="$TEMPLATE" RSTAR_SFT_DATA="${RSTAR_SFT_DATA:-}" \
  "${LATER_SETTINGS[@]}"
if [[ ${RSTAR_CHECK_ONLY:-0} == 1 ]]; then
  log "sft: $OUT: settings match (RSTAR_CHECK_ONLY=1: nothing run)"
  exit 0
fi
mkdir -p "$OUT"
sft_resume_hint() { echo "run the SFT stage again (it starts over)"; }
trap_interrupts sft_resume_hint
RSTAR=(node bin/rstar.js)
[[ -f dist/src/cli.js ]] || npx tsc -p .

# 1. Data: demonstrations (every program run for real) + disjoint train/test problems.
DATA=${RSTAR_SFT_DATA:-$OUT/data}
if [[ ! -s $DATA/sft.jsonl ]]; then
  runner=()
  [[ -n ${RSTAR_SFT_SANDBOX:-} ]] && runner=(--sandbox "$RSTAR_SFT_SANDBOX")
  step "sft-data --synthetic $CURRICULUM --train $TRAIN --test $TEST"
  child "${RSTAR[@]}" sft-data --synthetic "$CURRICULUM" --train "$TRAIN" --test "$TEST" --seed "$SEED" \
    "${runner[@]}" "${WEIGHTS_ARG[@]}" --chat-template "$TEMPLATE" --tool-state "$TOOL_STATE" --out "$DATA"
fi

# 2. A fresh tiny model.
step "model-init $CONFIG (--init $INIT)"
rm -rf "$OUT/init" "$OUT/ckpt"
child "${RSTAR[@]}" model-init --config "$CONFIG" --out "$OUT/init" --seed "$SEED" --init "$INIT" >"$OUT/init.json"

# 3. SFT: `rstar sft-train`, one resident trainer, until the budget (wall clock or steps) is spent;
# the LR warms up, then decays over the last DECAY fraction of the budget. metrics.jsonl: one line
# per step (the Step record, elapsed, tokens_per_s). The whole recipe fits RSTAR_SFT_TOTAL: training
# gets what the data and init left, less the eval's share.
SECONDS_BUDGET=${RSTAR_SFT_SECONDS:-$(awk -v a="$recipe_start" -v b="$EPOCHREALTIME" -v t="$TOTAL" -v r="$EVAL_RESERVE" \
  'BEGIN { s = t - (b - a) - r; printf "%d", (s < 60 ? 60 : s) }')}
step "sft-train (batch $BATCH, lr $LR, $NPROC ranks, ${SECONDS_BUDGET}s budget)"
child "${RSTAR[@]}" sft-train --data "$DATA/sft.jsonl" --model "$OUT/init" --out "$OUT/ckpt" \
  --batch-records "$BATCH" --lr "$LR" --warmup-steps "$WARMUP" --decay "$DECAY" --window "$WINDOW" \
  --seconds "$SECONDS_BUDGET" --max-steps "$MAX_STEPS" --snapshot-every "$CKPT_EVERY" \
  --seed "$SEED" --nproc "$NPROC" >"$OUT/metrics.jsonl"

# 4. Held-out evaluation with the real pipeline: embedded engine-serve + sandbox-serve, rollout, verify.
evaluate() { # NAME TEMPERATURE N
  local name=$1 temperature=$2 n=$3
  step "rollout $name (temperature $temperature, n $n) on $(wc -l <"$DATA/test-problems.jsonl") held-out problems"
  rm -f "$OUT/eval-$name.jsonl.tmp" # rollout resumes an --out file; this one must start fresh
  child "${RSTAR[@]}" rollout --problems "$DATA/test-problems.jsonl" --model "$OUT/ckpt" --tokenizer "$OUT/ckpt" \
    --chat-template "$TEMPLATE" --n "$n" --temperature "$temperature" --seed "$SEED" --max-tokens "$EVAL_TOKENS" --max-turns 4 \
    --tool-state "$TOOL_STATE" --out "$OUT/eval-$name.jsonl.tmp"
  mv "$OUT/eval-$name.jsonl.tmp" "$OUT/eval-$name.jsonl"
  "${RSTAR[@]}" sft-eval --name "$name" "$OUT/eval-$name.jsonl" | tee -a "$OUT/eval.jsonl"
}
if [[ ${RSTAR_SFT_EVAL:-1} == 1 ]]; then
  : >"$OUT/eval.jsonl"
  evaluate greedy 0 1
  evaluate sampled 1 "$EVAL_N"
  wrote="$OUT/metrics.jsonl, $OUT/eval.jsonl"
else
  rm -f "$OUT/eval.jsonl" # an earlier run's figures would pass for this checkpoint's
  wrote="$OUT/metrics.jsonl (no evaluation: RSTAR_SFT_EVAL=0)"
fi
log "done in $(awk -v a="$recipe_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')s: $wrote"
