#!/usr/bin/env bash
# The main job on the embedded defaults, end to end on one CPU machine:
#   1. SFT of the tiny model on the synthetic tool-use curriculum (recipes/sft.sh)
#   2. GRPO-RoC: rollout 2G per problem (engine-serve + sandbox-serve) | roc-filter --keep G
#      | advantage | train-step --loss grpo, then the engine reloads the new weights; repeated
#   3. eval of the SFT and the RL checkpoints on the held-out problems, and the comparison
#
#   bash recipes/demo.sh [OUT]     # OUT defaults to runs/demo
#
# Sizes come from environment variables (defaults in brackets):
#   RSTAR_DEMO_STEPS [4] RL steps   RSTAR_DEMO_PROBLEMS [16] problems per step   RSTAR_DEMO_KEEP [4] G
#   RSTAR_DEMO_LR [2e-4]   RSTAR_DEMO_MAX_TOKENS [384]   RSTAR_DEMO_EVAL_N [4] samples per eval problem
#   RSTAR_DEMO_SFT [reuse a finished SFT run folder instead of training one]
#   and the RSTAR_SFT_* variables of recipes/sft.sh (RSTAR_SFT_QUICK=1 for a quick smoke run).
# The SFT stage is sft.sh's 8-minute default (RSTAR_SFT_TOTAL 480): the tiny model leaves it with the
# format learnt and the reading of the problem half-learnt (docs/sft.md: ~97% format-valid, ~70%
# correct at temperature 1), so many RoC groups have mixed rewards for RL to learn from.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh
# shellcheck source=recipes/servers.sh
source recipes/servers.sh

OUT=${1:-runs/demo}
STEPS=${RSTAR_DEMO_STEPS:-4}
PROBLEMS=${RSTAR_DEMO_PROBLEMS:-16}
KEEP=${RSTAR_DEMO_KEEP:-4}
N=$((2 * KEEP))
LR=${RSTAR_DEMO_LR:-2e-4}
MAX_TOKENS=${RSTAR_DEMO_MAX_TOKENS:-384}
EVAL_N=${RSTAR_DEMO_EVAL_N:-4}
TEMPLATE=${RSTAR_SFT_TEMPLATE:-fixtures/curriculum/tiny.jinja}
RSTAR=(node bin/rstar.js)
[[ -f dist/src/cli.js ]] || npx tsc -p .
mkdir -p "$OUT/rl"
trap stop_servers EXIT

# 1. SFT (or reuse one).
SFT=${RSTAR_DEMO_SFT:-$OUT/sft}
if [[ ! -d $SFT/ckpt ]]; then
  step "SFT stage"
  bash recipes/sft.sh "$SFT"
fi
DATA=$SFT/data

# 2. Servers: one engine on the SFT weights, one sandbox.
step "engine-serve + sandbox-serve"
start_server engine-serve "$OUT/engine.log" engine-serve --model "$SFT/ckpt"
ENGINE=$SERVER_URL
start_server sandbox-serve "$OUT/sandbox.log" sandbox-serve
SANDBOX=$SERVER_URL
ROLLOUT=(--engine "$ENGINE" --sandbox "$SANDBOX" --tokenizer "$SFT/ckpt" --chat-template "$TEMPLATE"
  --max-tokens "$MAX_TOKENS" --max-turns 3 --temperature 1)

# 3. GRPO-RoC steps. Each step's trajectories, filter statistics and Step record stay in OUT/rl.
current=$SFT/ckpt
: >"$OUT/rl/steps.jsonl"
for ((k = 1; k <= STEPS; k++)); do
  dir=$OUT/rl/step-$k
  mkdir -p "$dir"
  shuffle_lines "$DATA/train-problems.jsonl" "$k" >"$dir/shuffled.jsonl" # (no `| head`: pipefail)
  head -n "$PROBLEMS" "$dir/shuffled.jsonl" >"$dir/problems.jsonl" && rm "$dir/shuffled.jsonl"
  step "RL step $k/$STEPS: rollout $PROBLEMS problems x $N, roc-filter --keep $KEEP, advantage, train-step"
  "${RSTAR[@]}" rollout --problems "$dir/problems.jsonl" --n "$N" --seed "$k" "${ROLLOUT[@]}" \
    --out "$dir/trajectories.jsonl"
  "${RSTAR[@]}" roc-filter --keep "$KEEP" --group-size "$N" --stats "$dir/roc-stats.json" "$dir/trajectories.jsonl" |
    "${RSTAR[@]}" advantage --group-size "$KEEP" >"$dir/batch.jsonl"
  rewards=$(awk -F'"reward":' 'NF > 1 { split($2, a, /[,}]/); s += a[1]; n++ } END { printf "%.3f", (n ? s / n : 0) }' \
    "$dir/trajectories.jsonl")
  if [[ ! -s $dir/batch.jsonl ]]; then
    log "step $k: every group had equal rewards (mean reward $rewards); nothing to learn from, weights unchanged"
    continue
  fi
  # shellcheck disable=SC2086
  "${RSTAR[@]}" train-step --loss grpo --model "$current" --out "$dir/ckpt" --lr "$LR" --policy "rl-step-$k" \
    ${RSTAR_DEMO_TRAIN_ARGS:-} "$dir/batch.jsonl" | tee -a "$OUT/rl/steps.jsonl" >/dev/null
  log "step $k: mean reward $rewards, $(wc -l <"$dir/batch.jsonl") trajectories trained, $(tail -n 1 "$OUT/rl/steps.jsonl" | cut -c1-160)"
  current=$dir/ckpt
  "${RSTAR[@]}" rollout --reload "$current" --engine "$ENGINE"
done

# 4. Held-out evaluation of the SFT and the final RL checkpoints, and the difference table.
evaluate() { # NAME CHECKPOINT
  step "eval $1 ($2) on $(wc -l <"$DATA/test-problems.jsonl") held-out problems x $EVAL_N"
  "${RSTAR[@]}" rollout --reload "$2" --engine "$ENGINE"
  "${RSTAR[@]}" eval --problems "$DATA/test-problems.jsonl" --n "$EVAL_N" --seed 0 "${ROLLOUT[@]}" \
    --out "$OUT/eval-$1" >/dev/null
}
evaluate sft "$SFT/ckpt"
evaluate rl "$current"
"${RSTAR[@]}" eval --compare "$OUT/eval-sft/report.json" "$OUT/eval-rl/report.json" | tee "$OUT/compare.md"
log "done: $OUT/compare.md, $OUT/rl/steps.jsonl, $OUT/eval-{sft,rl}/report.md"
