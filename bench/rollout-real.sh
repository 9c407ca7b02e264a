#!/usr/bin/env bash
# The real-run rollout benchmark (docs/rollout.md, "Real run"): two engine-serve processes with
# different KV budgets and one sandbox-serve on this machine, the same batch rolled out with each
# scheduling policy (passes interleaved, so a change in the machine's load hits every policy),
# reporting wall time, trajectories/s, generated tokens/s and tool calls/s per policy.
#
#   bash bench/rollout-real.sh MODEL PROBLEMS [OUT]
#     MODEL     an engine-serve checkpoint; an SFT checkpoint of the tiny model calls the tool
#               (e.g. runs/sft/ckpt from recipes/sft.sh), a random one never does
#     PROBLEMS  Problem records (NDJSON), e.g. runs/sft/data/test-problems.jsonl
#   Environment (defaults in brackets): RSTAR_BENCH_N [4: samples per problem]
#   RSTAR_BENCH_PROBLEMS [32: first problems of PROBLEMS]  RSTAR_BENCH_MAX_TOKENS [384]
#   RSTAR_BENCH_KV ["8192 4096": --max-total-tokens of each engine]  RSTAR_BENCH_PASSES [2]
#   RSTAR_BENCH_POLICIES ["kv least-requests round-robin static"]
#   RSTAR_BENCH_TEMPLATE [fixtures/curriculum/tiny.jinja: the SFT recipe's]  RSTAR_BENCH_MAX_TURNS [3]
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=recipes/lib.sh
source recipes/lib.sh
# shellcheck source=recipes/servers.sh
source recipes/servers.sh

[[ $# -ge 2 ]] || die "usage: bash bench/rollout-real.sh MODEL PROBLEMS [OUT]"
MODEL=$1
PROBLEMS=$2
OUT=${3:-runs/bench-rollout}
N=${RSTAR_BENCH_N:-4}
COUNT=${RSTAR_BENCH_PROBLEMS:-32}
MAX_TOKENS=${RSTAR_BENCH_MAX_TOKENS:-384}
read -r -a KV <<<"${RSTAR_BENCH_KV:-8192 4096}"
PASSES=${RSTAR_BENCH_PASSES:-2}
read -r -a POLICIES <<<"${RSTAR_BENCH_POLICIES:-kv least-requests round-robin static}"
TEMPLATE=${RSTAR_BENCH_TEMPLATE:-fixtures/curriculum/tiny.jinja}
MAX_TURNS=${RSTAR_BENCH_MAX_TURNS:-3}
[[ -d $MODEL ]] || die "$MODEL: no such checkpoint folder"
[[ -f $PROBLEMS ]] || die "$PROBLEMS: no such file"
mkdir -p "$OUT"
[[ -f dist/src/cli.js ]] || npx tsc -p .
trap stop_servers EXIT

head -n "$COUNT" "$PROBLEMS" >"$OUT/problems.jsonl"
ENGINES=()
for i in "${!KV[@]}"; do
  start_server "engine $i" "$OUT/engine-$i.log" engine-serve --model "$MODEL" --max-total-tokens "${KV[$i]}"
  ENGINES+=(--engine "$SERVER_URL")
done
start_server sandbox "$OUT/sandbox.log" sandbox-serve
SANDBOX=$SERVER_URL
log "engines: ${KV[*]} KV tokens; $(wc -l <"$OUT/problems.jsonl") problems x $N, --max-tokens $MAX_TOKENS; load $(cut -d' ' -f1-3 /proc/loadavg)"

: >"$OUT/runs.tsv"
for ((pass = 1; pass <= PASSES; pass++)); do
  for policy in "${POLICIES[@]}"; do
    out="$OUT/$policy-$pass.jsonl"
    rm -f "$out"
    t0=$EPOCHREALTIME
    node bin/rstar.js rollout --problems "$OUT/problems.jsonl" "${ENGINES[@]}" --sandbox "$SANDBOX" \
      --tokenizer "$MODEL" --chat-template "$TEMPLATE" --max-turns "$MAX_TURNS" --n "$N" \
      --max-tokens "$MAX_TOKENS" --temperature 1 --seed "$pass" \
      --schedule "$policy" --out "$out"
    seconds=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }')
    # Generated tokens are the response tokens the model sampled (loss_mask 1), not tool tokens.
    node -e '
      const fs = require("fs");
      const [file, policy, pass, seconds] = process.argv.slice(1);
      const rows = fs.readFileSync(file, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
      const generated = rows.reduce((s, t) => s + t.loss_mask.reduce((a, m) => a + m, 0), 0);
      const calls = rows.reduce((s, t) => s + t.tool_calls, 0);
      const reward = rows.reduce((s, t) => s + t.reward, 0) / rows.length;
      console.log([policy, pass, seconds, rows.length, generated, calls, reward.toFixed(3)].join("\t"));
    ' "$out" "$policy" "$pass" "$seconds" | tee -a "$OUT/runs.tsv" >&2
  done
done

# One row per policy: every pass's wall time, then rates from the fastest pass.
node -e '
  const fs = require("fs");
  const rows = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map((l) => l.split("\t"));
  const policies = [...new Set(rows.map((r) => r[0]))];
  console.log("| policy | wall time per pass | trajectories/s (best) | generated tokens/s (best) | tool calls/s (best) | mean reward (that pass) |");
  console.log("| --- | --- | ---: | ---: | ---: | ---: |");
  for (const p of policies) {
    const mine = rows.filter((r) => r[0] === p);
    const best = mine.reduce((a, b) => (Number(b[2]) < Number(a[2]) ? b : a));
    const s = Number(best[2]);
    console.log(`| ${p} | ${mine.map((r) => r[2] + " s").join(", ")} | ${(best[3] / s).toFixed(2)} | ${(best[4] / s).toFixed(0)} | ${(best[5] / s).toFixed(2)} | ${best[6]} |`);
  }
' "$OUT/runs.tsv" | tee "$OUT/table.md"
