#!/usr/bin/env bash
# Shared helpers for recipes: logging to stderr, deterministic shuffles, reading one JSON field.

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
step() { log "== $*"; }
die() {
  log "error: $*"
  exit 1
}

# shuffle_lines FILE SEED: a seeded (reproducible) permutation of FILE's lines.
shuffle_lines() {
  shuf --random-source=<(openssl enc -aes-256-ctr -pass "pass:$2" -nosalt </dev/zero 2>/dev/null) "$1"
}

# json_number JSON KEY: a top-level numeric field of a one-line JSON object, without a process.
json_number() {
  local re="\"$2\": ?(-?[0-9.]+([eE][-+]?[0-9]+)?)"
  [[ $1 =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}
