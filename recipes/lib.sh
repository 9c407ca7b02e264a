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

# json_field JSON KEY: prints one top-level field of a JSON object.
json_field() { node -e 'const v = JSON.parse(process.argv[1])[process.argv[2]];
  process.stdout.write(typeof v === "number" ? v.toFixed(4) : String(v));' "$1" "$2"; }
