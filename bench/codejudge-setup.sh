#!/usr/bin/env bash
# Sets up code-judge (github.com/0xWJ/code-judge) next to rstar for bench/batch.bench.ts, on
# Debian 12's own packages (no PyPI): python3-fastapi 0.92, python3-uvicorn 0.17, python3-redis
# 4.3, python3-pydantic 1.10, redis-server 7.0.
#
#   bench/codejudge-setup.sh MIRROR [DEST] [PORT]
#     MIRROR  a git directory of code-judge (e.g. what `git clone --mirror` or the fetch tool gives)
#     DEST    where to check it out (default /work/codejudge; outside this repository)
#     PORT    its HTTP port (default 8000); its Redis listens on PORT+1000
#
# Then: node dist/bench/batch.bench.js --codejudge http://127.0.0.1:PORT
# Stop (each started in its own process group):
#   kill -- -"$(cat DEST/api.pid)" -"$(cat DEST/workers.pid)"; redis-cli -p $((PORT+1000)) shutdown nosave
#
# What it runs, matching `rstar sandbox-serve --workers 2`: two execution workers
# (MAX_WORKERS=2, `python run_workers.py`) and the API under uvicorn with two processes
# (`--workers 2`, its README's deployment shape scaled to this machine), its own redis-server.
# Programs run under the same interpreter as rstar's executors (RSTAR_SANDBOX_PYTHON or the
# `python3` on PATH, resolved to its real binary), so the mix imports the same numpy and sympy.
#
# The edits, all mechanical (code-judge targets pydantic 2 and FastAPI >= 0.93):
#  1. pydantic 1 API names: `.model_validate_json(` -> `.parse_raw(`, `.model_dump_json(` -> `.json(`.
#  2. pydantic 1 never calls `model_post_init` (which fills in sub_id / work_id / timestamp):
#     each `def model_post_init(self, __context):` becomes an `__init__(self, **data)` that calls
#     `super().__init__(**data)` first and then runs the same body.
#  3. pydantic 1 spells a list's minimum length `min_items`, not `min_length`.
#  4. FastAPI 0.92 has no `lifespan=` argument: the same context manager is set as
#     `app.router.lifespan_context` (Starlette 0.26 supports it).
#  5. redis-py 4.3 does not import `redis.asyncio` with `redis`: import it explicitly.
set -euo pipefail

MIRROR=${1:?usage: codejudge-setup.sh MIRROR [DEST] [PORT]}
DEST=${2:-/work/codejudge}
PORT=${3:-8000}
REDIS_PORT=$((PORT + 1000))
API_PYTHON=/usr/bin/python3

if ! "$API_PYTHON" -c 'import fastapi, uvicorn, redis, pydantic, psutil' 2>/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y \
    python3-fastapi python3-uvicorn python3-redis python3-pydantic python3-psutil redis-server
fi
EXEC_PYTHON=$("${RSTAR_SANDBOX_PYTHON:-python3}" -c 'import sys; print(sys.executable)')

rm -rf "$DEST"
mkdir -p "$DEST"
git --git-dir="$MIRROR" archive HEAD | tar -x -C "$DEST"
echo "code-judge $(git --git-dir="$MIRROR" rev-parse HEAD) -> $DEST"

cd "$DEST"
sed -i 's/\.model_validate_json(/.parse_raw(/g; s/\.model_dump_json(/.json(/g' \
  app/judge.py app/worker_manager.py app/main.py app/model.py
sed -i 's/^    def model_post_init(self, __context):$/    def __init__(self, **data):\n        super().__init__(**data)/' app/model.py
sed -i 's/Field(\.\.\., min_length=1)/Field(..., min_items=1)/' app/model.py
sed -i 's/^app = fastapi\.FastAPI(lifespan=_set_access_log)$/app = fastapi.FastAPI()\napp.router.lifespan_context = _set_access_log/' app/main.py
sed -i 's/^import redis$/import redis\nimport redis.asyncio/' app/libs/redis_queue.py
# Every edit must have applied (an upstream change would silently skip one).
grep -q 'parse_raw' app/judge.py
grep -q 'super().__init__(\*\*data)' app/model.py
grep -q 'min_items=1' app/model.py
grep -q 'app.router.lifespan_context = _set_access_log' app/main.py
grep -q '^import redis.asyncio$' app/libs/redis_queue.py
if grep -rq 'model_post_init\|model_validate_json\|model_dump_json' app; then exit 1; fi

redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no --daemonize yes \
  --pidfile "$DEST/redis.pid" --logfile "$DEST/redis.log"
export REDIS_URI="redis://127.0.0.1:$REDIS_PORT" MAX_WORKERS=2 PYTHON_EXECUTOR_PATH="$EXEC_PYTHON"
setsid "$API_PYTHON" run_workers.py >"$DEST/workers.log" 2>&1 &
echo $! >"$DEST/workers.pid"
setsid "$API_PYTHON" -m uvicorn app.main:app --host 127.0.0.1 --port "$PORT" --workers 2 \
  --no-access-log >"$DEST/api.log" 2>&1 &
echo $! >"$DEST/api.pid"

for _ in $(seq 1 100); do
  if curl -fsS -X POST "http://127.0.0.1:$PORT/run" -H 'content-type: application/json' \
    -d '{"type":"python","solution":"print(1+1)"}' 2>/dev/null | grep -q '"stdout":"2\\n"'; then
    echo "code-judge answers at http://127.0.0.1:$PORT (redis :$REDIS_PORT, executor $EXEC_PYTHON)"
    exit 0
  fi
  sleep 0.3
done
echo "code-judge did not answer; see $DEST/api.log and $DEST/workers.log" >&2
exit 1
