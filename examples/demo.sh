#!/usr/bin/env bash
# The main job end to end on the built-in examples: describe a cluster, check, simulate,
# plan with every solver, draw, profile a real model, plan it and run the plan on local processes,
# pick its fastest schedule (interleaved, zero-bubble, ...) and export it.
# Usage: examples/demo.sh PATH/TO/pipeplan   (make demo passes the venv's script)
set -euo pipefail
PIPEPLAN=${1:-pipeplan}
cd "$(dirname "$0")/.."
mkdir -p out
EX=examples

echo "== 0. describe a cluster from the catalog (two A100 servers, four V100 ones, InfiniBand) and plan GPT-1 on it"
"$PIPEPLAN" cluster --server 2x8:a100-80g:nvlink3 --server 4x8:v100-32g:pcie3 --network ib-hdr -o out/48.cluster.json
"$PIPEPLAN" plan $EX/gpt1.graph.json out/48.cluster.json --batch 256 --microbatches 16 --solver group-search \
    -o out/gpt1.48.plan.json

echo
echo "== 1. check the example graphs, cluster and plans"
"$PIPEPLAN" validate $EX/chain8.graph.json $EX/two-servers.cluster.json $EX/hetero.plan.json $EX/custom.plan.json
"$PIPEPLAN" validate $EX/skip8.graph.json $EX/two-servers.cluster.json $EX/skip8.plan.json

echo
echo "== 2. simulate a hand-written plan (replication, per-stage unequal microbatches, recompute)"
"$PIPEPLAN" simulate $EX/chain8.graph.json $EX/two-servers.cluster.json $EX/hetero.plan.json \
    --gantt out/hetero.gantt.png --trace out/hetero.trace.json

echo
echo "== 3. plan chain8 on the two-server cluster with every solver"
"$PIPEPLAN" compare $EX/chain8.graph.json $EX/two-servers.cluster.json --batch 64 --microbatches 8 \
    --schedule 1f1b --time-limit 10 --plot out/compare.png --best out/best.plan.json --gantt out/best.gantt.png
"$PIPEPLAN" simulate $EX/chain8.graph.json $EX/two-servers.cluster.json out/best.plan.json

echo
echo "== 4. the model zoo; profile gpt-tiny on this machine, plan it for two local processes, run it"
"$PIPEPLAN" models
"$PIPEPLAN" profile gpt-tiny --batch-sizes 1,2,4,8,16 -o out/gpt-tiny.graph.json
"$PIPEPLAN" plan out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json --batch 64 --microbatches 4 \
    --schedule 1f1b --solver cpsat --time-limit 20 -o out/gpt-tiny.plan.json
echo "-- measured against the prediction (float32, as profiled):"
"$PIPEPLAN" run out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json out/gpt-tiny.plan.json --model gpt-tiny \
    --steps 10 --gantt out/gpt-tiny.run.png --side-by-side
echo "-- the cluster's speeds measured in this pipeline (pipeplan calibrate), for predictions that charge it:"
"$PIPEPLAN" calibrate out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json out/gpt-tiny.plan.json --model gpt-tiny \
    --runs 2 --steps 10 -o out/cpu-pair.calibrated.cluster.json
echo "-- trained exactly like one process (float64):"
"$PIPEPLAN" run out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json out/gpt-tiny.plan.json --model gpt-tiny \
    --steps 4 --verify
echo
echo "== 5. version-2 schedules: plan gpt-tiny for every schedule (GPipe to ZB-V), keep the fastest, run it verified"
"$PIPEPLAN" plan out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json --batch 64 --microbatches 4 \
    --schedule auto --solver cpsat --time-limit 20 -o out/gpt-tiny.auto.plan.json
"$PIPEPLAN" simulate out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json out/gpt-tiny.auto.plan.json \
    --gantt out/gpt-tiny.auto.gantt.png
"$PIPEPLAN" run out/gpt-tiny.graph.json $EX/cpu-pair.cluster.json out/gpt-tiny.auto.plan.json --model gpt-tiny \
    --steps 4 --verify
echo
echo "== 6. export the gpt-tiny plan to torch.distributed.pipelining, torchtitan, DeepSpeed and Megatron-LM"
for target in torch deepspeed megatron; do
    "$PIPEPLAN" export out/gpt-tiny.plan.json --to $target --graph out/gpt-tiny.graph.json -o out/export-$target
done
# torchtitan's own debug model has 6 layers, gpt-tiny 4: the config in examples/titan_configs.py matches it
PYTHONPATH="$EX${PYTHONPATH:+:$PYTHONPATH}" "$PIPEPLAN" export out/gpt-tiny.plan.json --to torchtitan \
    --torchtitan-model titan_configs:llama3_4_layers --graph out/gpt-tiny.graph.json -o out/export-torchtitan
echo "-- train it with torch: (cd out/export-torch && torchrun --standalone --nproc-per-node=2 train.py --steps 4)"
echo
echo "pictures: out/hetero.gantt.png out/compare.png out/best.gantt.png out/gpt-tiny.run.png out/gpt-tiny.auto.gantt.png;"
echo "traces: out/hetero.trace.json (open in https://ui.perfetto.dev)"
