#!/usr/bin/env bash
# A larger held-out evaluation of finished main-job runs (recipes/demo.sh folders), for comparing
# arms whose differences the job's own 100 held-out problems cannot resolve (its 32 multi-step
# problems give one seed a ±10-12 point interval there).
#
#   bash recipes/heldout.sh RUN...
#   npm run bench:seeds -- A... --vs B... --set ms      # the comparison, on this set
#
# Each RUN gets eval-NAME-sft (its SFT checkpoint) and eval-NAME-rl (the checkpoint its eval-rl
# evaluated), on one problem set written beside them as eval-NAME-problems.jsonl: NAME's families,
# drawn from the run's curriculum with another seed, the held-out side of its split only (the split is
# by prompt, so none of them was trained on), none of the run's own held-out problems. The same
# sampling as the run's evaluations (its template, turns, final budget, temperature 1, eval seed 0,
# the group tool cache). An SFT checkpoint shared by several runs is evaluated once. A finished
# evaluation is kept; a run made with other settings than the first one is refused.
#
# Env: RSTAR_HELDOUT_NAME [ms]  RSTAR_HELDOUT_FAMILIES [inspect,search,recover: the multi-step ones]
#      RSTAR_HELDOUT_PROBLEMS [400]  RSTAR_HELDOUT_SEED [1] the draw  RSTAR_HELDOUT_N [4] samples each
#      RSTAR_HELDOUT_ENGINES [2] engine-serve processes
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh
# shellcheck source=recipes/servers.sh
source recipes/servers.sh
RSTAR=(node bin/rstar.js)

(($# > 0)) || die "usage: bash recipes/heldout.sh RUN... (main-job run folders)"
NAME=${RSTAR_HELDOUT_NAME:-ms}
[[ $NAME =~ ^[a-z0-9][a-z0-9-]*$ ]] || die "RSTAR_HELDOUT_NAME: expected lower-case letters, digits and -, got '$NAME'"
FAMILIES=${RSTAR_HELDOUT_FAMILIES:-inspect,search,recover}
COUNT=${RSTAR_HELDOUT_PROBLEMS:-400}
SEED=${RSTAR_HELDOUT_SEED:-1}
N=${RSTAR_HELDOUT_N:-4}
ENGINE_PROCS=${RSTAR_HELDOUT_ENGINES:-2}
for v in COUNT SEED N ENGINE_PROCS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "RSTAR_HELDOUT_${v/ENGINE_PROCS/ENGINES}: expected a positive whole number, got '${!v}'"
done

# setting RUN NAME: a setting of the run's manifest ('' when absent)
setting() { sed -n "s/^$2=//p" "$1/manifest.txt" | tail -n 1; }
sft_of() { local s; s=$(setting "$1" RSTAR_DEMO_SFT); printf '%s' "${s:-$1/sft}"; }
# the checkpoint eval-rl evaluated: its step on the run's curve
rl_checkpoint() {
  local step
  step=$(sed -n 's/.*"step":\([0-9]*\),.*"eval":"rl".*/\1/p' "$1/rl/curve.jsonl" 2>/dev/null | tail -n 1)
  [[ -n $step ]] || die "$1/rl/curve.jsonl: no point for eval-rl (is the run finished?)"
  [[ -d $1/rl/step-$step ]] || die "$1/rl/step-$step: missing (the checkpoint eval-rl evaluated)"
  printf '%s' "$1/rl/step-$step"
}

FIRST=$1
for run in "$@"; do
  [[ -f $run/manifest.txt ]] || die "$run/manifest.txt: missing (not a main-job run folder)"
  [[ -f $run/eval-rl/report.json ]] || die "$run/eval-rl/report.json: missing (the run is not finished)"
  for s in RSTAR_DEMO_TOKENS RSTAR_RL_MAX_TURNS RSTAR_SFT_TEMPLATE RSTAR_DEMO_EVAL_TOOL_CACHE RSTAR_DEMO_TOOL_TIMEOUT; do
    [[ $(setting "$run" $s) == "$(setting "$FIRST" $s)" ]] ||
      die "$run/manifest.txt: $s: '$(setting "$run" $s)' there; '$(setting "$FIRST" $s)' in $FIRST (one evaluation for all)"
  done
  sft=$(sft_of "$run")
  [[ -f $sft/ckpt/config.json && -f $sft/manifest.txt ]] || die "$run: its SFT run $sft is missing"
  [[ $(setting "$sft" RSTAR_SFT_CURRICULUM) == "$(setting "$(sft_of "$FIRST")" RSTAR_SFT_CURRICULUM)" ]] ||
    die "$sft/manifest.txt: RSTAR_SFT_CURRICULUM differs from $FIRST's SFT run's"
done

read -r -a TOKENS <<<"$(setting "$FIRST" RSTAR_DEMO_TOKENS)"
TEMPLATE=$(setting "$FIRST" RSTAR_SFT_TEMPLATE)
MAX_TURNS=$(setting "$FIRST" RSTAR_RL_MAX_TURNS)
FIRST_SFT=$(sft_of "$FIRST")
CURRICULUM=$(setting "$FIRST_SFT" RSTAR_SFT_CURRICULUM)
TOOL_STATE=$(setting "$FIRST_SFT" RSTAR_SFT_TOOL_STATE)
OWN=$(sft_data "$FIRST_SFT")/test-problems.jsonl # the runs' own held-out problems, kept out of the set

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rstar-heldout.XXXXXX")
cleanup() {
  local status=$?
  trap '' INT TERM
  stop_children
  stop_servers
  rm -rf "$WORK"
  exit "$status"
}
trap cleanup EXIT INT TERM

# 1. The problem set: held-out problems of the families, drawn until there are COUNT of them.
SET=$WORK/problems.jsonl
want=$((COUNT * 4))
for _ in 1 2 3 4 5 6; do
  child "${RSTAR[@]}" sft-data --synthetic "$CURRICULUM" --train 0 --test "$want" --seed "$SEED" \
    --tokenizer "$FIRST_SFT/ckpt" --test-out "$WORK/drawn.jsonl" 2>/dev/null
  node -e '
    const fs = require("fs");
    const [drawn, own, families, count, out] = process.argv.slice(1);
    const keep = new Set(families.split(","));
    const seen = new Set(fs.readFileSync(own, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l).prompt));
    const picked = fs.readFileSync(drawn, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l))
      .filter((p) => keep.has(p.meta.family) && !seen.has(p.prompt)).slice(0, Number(count));
    if (picked.length < Number(count)) process.exit(3);
    fs.writeFileSync(out, picked.map((p) => JSON.stringify(p)).join("\n") + "\n");
  ' "$WORK/drawn.jsonl" "$OWN" "$FAMILIES" "$COUNT" "$SET" && break
  want=$((want * 2))
done
[[ -s $SET ]] || die "RSTAR_HELDOUT_FAMILIES: $FAMILIES: not $COUNT held-out problems of them in curriculum $CURRICULUM"
log "held-out set $NAME: $COUNT problems of $FAMILIES (curriculum $CURRICULUM, seed $SEED)"

# 2. The servers, then each checkpoint.
start_engines "$ENGINE_PROCS" "$WORK/engine" --model "$FIRST_SFT/ckpt" --weight-version 0 --threads 1
start_server sandbox-serve "$WORK/sandbox.log" sandbox-serve --tool-timeout "$(setting "$FIRST" RSTAR_DEMO_TOOL_TIMEOUT)"
SANDBOX=$SERVER_URL
CACHE=$(setting "$FIRST" RSTAR_DEMO_EVAL_TOOL_CACHE)
version=0
# evaluate CHECKPOINT DEST: DEST/report.json of the checkpoint on the set (kept if done on this set)
evaluate() {
  local ckpt=$1 dest=$2
  if [[ -f $dest/report.json ]] && cmp -s "$dest/problems.jsonl" "$SET"; then
    log "$dest: done"
    return
  fi
  if [[ -f $ckpt/adapter_config.json ]]; then # a LoRA step: served as its base with it merged in
    child "${RSTAR[@]}" model-merge --base "$(adapter_base "$ckpt")" --adapter "$ckpt" --out "$WORK/merged" >/dev/null
    ckpt=$WORK/merged
  fi
  version=$((version + 1))
  step "eval $ckpt on $COUNT held-out problems x $N -> $dest"
  child "${RSTAR[@]}" rollout --reload "$ckpt" --weight-version "$version" "${ENGINES[@]/#/--engine=}"
  child "${RSTAR[@]}" eval --problems "$SET" --n "$N" --seed 0 "${ENGINES[@]/#/--engine=}" --sandbox "$SANDBOX" \
    --tokenizer "$FIRST_SFT/ckpt" --chat-template "$TEMPLATE" --max-turns "$MAX_TURNS" --temperature 1 \
    --max-tokens "${TOKENS[2]}" --tool-cache "$CACHE" --tool-state "${TOOL_STATE:-stateless}" \
    --out "$dest.partial" >/dev/null
  cp "$SET" "$dest.partial/problems.jsonl"
  rm -rf "$dest" "$WORK/merged" && mv "$dest.partial" "$dest"
  log "$dest: avg@$N $(json_number "$(tr -d '\n' <"$dest/report.json")" 'avg@n')"
}

declare -A DONE_SFT=()
for run in "$@"; do
  sft=$(sft_of "$run")
  if [[ -n ${DONE_SFT[$sft]:-} && ! -f $run/eval-$NAME-sft/report.json ]]; then
    cp -r "${DONE_SFT[$sft]}" "$run/eval-$NAME-sft"
  else
    evaluate "$sft/ckpt" "$run/eval-$NAME-sft"
  fi
  DONE_SFT[$sft]=$run/eval-$NAME-sft
  evaluate "$(rl_checkpoint "$run")" "$run/eval-$NAME-rl"
  cp "$SET" "$run/eval-$NAME-problems.jsonl"
done
log "done: npm run bench:seeds -- RUN... --set $NAME"
