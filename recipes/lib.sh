#!/usr/bin/env bash
# Shared helpers for recipes: logging to stderr, deterministic shuffles, reading one JSON field.

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
step() { log "== $*"; }
die() {
  log "error: $*"
  exit 1
}

# shuffle_lines FILE SEED: a seeded (reproducible) permutation of FILE's lines.
# (coreutils + awk: awk's seeded generator is shuf's byte source.)
shuffle_lines() {
  shuf --random-source=<(awk -v seed="$2" 'BEGIN { srand(seed); while (1) printf "%c", int(rand() * 256) }' 2>/dev/null) "$1"
}

# json_number JSON KEY: a top-level numeric field of a one-line JSON object, without a process.
json_number() {
  local re="\"$2\": ?(-?[0-9.]+([eE][-+]?[0-9]+)?)"
  [[ $1 =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}

# trap_interrupts HINT: Ctrl-C or SIGTERM stops this recipe's children (servers included) quietly
# and exits 130 with one line, "interrupted; rerun to HINT's output". A recipe another one runs
# (demo.sh runs sft.sh and rl.sh; one Ctrl-C reaches them all) leaves the line to the outermost.
trap_interrupts() {
  INTERRUPT_HINT=$1
  export RSTAR_RECIPE_TOP=${RSTAR_RECIPE_TOP:-$$}
  trap interrupted INT TERM
}
interrupted() {
  trap '' INT TERM
  if declare -F stop_servers >/dev/null; then stop_servers; fi
  local pids
  pids=$(jobs -p)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || kill -TERM $pids 2>/dev/null || true
  wait 2>/dev/null || true
  [[ $RSTAR_RECIPE_TOP != "$$" ]] || log "interrupted; rerun to $($INTERRUPT_HINT)"
  exit 130
}

# last_step DIR FIRST LAST: the last complete checkpoint DIR/step-K with FIRST <= K <= LAST, else FIRST - 1.
last_step() {
  local dir k last=$(($2 - 1))
  for dir in "$1"/step-*/; do
    k=${dir%/}
    k=${k##*/step-}
    [[ $k =~ ^[0-9]+$ && -f $dir/trainer_state.json ]] || continue
    ((k >= $2 && k <= $3 && k > last)) && last=$k
  done
  echo "$last"
}
