#!/usr/bin/env bash
# Shared by recipes: start engine-serve / sandbox-serve as direct children on free loopback ports,
# wait until they answer /health, and stop them (and only them) when the recipe exits.
#   source recipes/servers.sh
#   start_server NAME LOG rstar-args...   -> sets SERVER_URL; the pid is remembered for stop_servers
#   trap stop_servers EXIT

SERVER_PIDS=()

free_port() { node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }

# Polls URL/health until it answers 200 or the process behind it died (120 s at most).
wait_health() {
  local url=$1 pid=$2 name=$3
  for _ in $(seq 1 240); do
    if ! kill -0 "$pid" 2>/dev/null; then echo "$name exited before it was ready" >&2; return 1; fi
    if node -e 'fetch(process.argv[1]).then(r=>process.exit(r.ok?0:1),()=>process.exit(1))' "$url/health"; then return 0; fi
    sleep 0.5
  done
  echo "$name not ready after 120 s" >&2
  return 1
}

# start_server NAME LOG COMMAND [ARGS...]: runs `bin/rstar.js COMMAND ARGS --port P` in the
# background (a direct child, so stop_servers' SIGTERM reaches the server itself).
start_server() {
  local name=$1 log=$2 port
  shift 2
  port=$(free_port)
  node bin/rstar.js "$@" --port "$port" >"$log" 2>&1 &
  SERVER_PIDS+=($!)
  SERVER_URL="http://127.0.0.1:$port"
  wait_health "$SERVER_URL" "$!" "$name" || { tail -n 20 "$log" >&2; return 1; }
}

stop_servers() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  SERVER_PIDS=()
}
