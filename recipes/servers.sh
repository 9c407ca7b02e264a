#!/usr/bin/env bash
# Shared by recipes: start engine-serve / sandbox-serve as direct children on free loopback ports,
# wait until they listen, and stop them (and only them) when the recipe exits.
#   source recipes/servers.sh
#   start_server NAME LOG rstar-args...   -> sets SERVER_URL; the pid is remembered for stop_servers
#   start_engines N LOG_PREFIX engine-serve-args...   -> N engine-serve processes, their URLs in ENGINES
#   trap stop_servers EXIT
#
# The server says when it is ready: with --port 0 the OS picks a free port and --ready-file makes
# the server write its URL to a file once it listens, so nothing here guesses a port or probes
# /health; the recipe only waits for that file while the server lives.

SERVER_PIDS=()

# start_server NAME LOG COMMAND [ARGS...]: runs `bin/rstar.js COMMAND ARGS --port 0 --ready-file F`
# in the background (a direct child, so stop_servers' SIGTERM reaches the server itself) and
# waits for F (120 s at most).
start_server() {
  local name=$1 log=$2 ready pid tenths=0
  shift 2
  ready=$(mktemp -u "${TMPDIR:-/tmp}/rstar-ready.XXXXXX")
  node bin/rstar.js "$@" --port 0 --ready-file "$ready" >"$log" 2>&1 &
  pid=$!
  SERVER_PIDS+=("$pid")
  until [[ -s $ready ]]; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited before it was ready" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    if ((++tenths > 1200)); then
      echo "$name not ready after 120 s" >&2
      tail -n 20 "$log" >&2
      return 1
    fi
    sleep 0.1
  done
  SERVER_URL=$(<"$ready")
  rm -f "$ready"
}

# start_engines N LOG_PREFIX [ENGINE-SERVE ARGS...]: N engine-serve processes (logs LOG_PREFIX-1.log,
# ...), their URLs in the array ENGINES, in start order.
start_engines() {
  local count=$1 prefix=$2 e
  shift 2
  ENGINES=()
  for ((e = 1; e <= count; e++)); do
    start_server engine-serve "$prefix-$e.log" engine-serve "$@" || return 1
    ENGINES+=("$SERVER_URL")
  done
}

stop_servers() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}
