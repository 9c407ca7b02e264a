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
