#!/usr/bin/env bash
# The main job end to end on the built-in examples, as far as pipeplan goes today.
# Usage: examples/demo.sh PATH/TO/pipeplan   (make demo passes the venv's script)
set -euo pipefail
PIPEPLAN=${1:-pipeplan}
cd "$(dirname "$0")/.."
mkdir -p out
EX=examples

echo "== 1. check the example graph, cluster and plans"
"$PIPEPLAN" validate $EX/chain8.graph.json $EX/two-servers.cluster.json $EX/hetero.plan.json $EX/custom.plan.json
"$PIPEPLAN" validate $EX/skip8.graph.json $EX/two-servers.cluster.json $EX/skip8.plan.json

echo
echo "== 2. simulate the example plan (replication, per-stage unequal microbatches, recompute)"
"$PIPEPLAN" simulate $EX/chain8.graph.json $EX/two-servers.cluster.json $EX/hetero.plan.json \
    --gantt out/hetero.gantt.png --trace out/hetero.trace.json
echo "wrote out/hetero.gantt.png and out/hetero.trace.json (open the trace in https://ui.perfetto.dev)"

if "$PIPEPLAN" models >/dev/null 2>&1; then
  echo
  echo "== 3. the model zoo, and a measured profile of gpt-tiny on this machine"
  "$PIPEPLAN" models
  "$PIPEPLAN" profile gpt-tiny --batch-sizes 1,2,4,8 -o out/gpt-tiny.graph.json
  "$PIPEPLAN" validate out/gpt-tiny.graph.json
fi
