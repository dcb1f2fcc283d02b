#!/bin/bash
# The behaviour-cloning epoch on a GPU against the CPU, side by side on one machine (README, "Training on a GPU").
#
# usage: bash docs/gpu_bc_epoch.sh [N] [GPU_EPOCHS]     (run from the repository root, with the project installed
#        or on PYTHONPATH; OUT=folder for the reports, default /tmp/gpu-bc)
#
# Data: N copies (default 500) of the shipped sample recording (recordings/nac-drive/sample-v0, 2 expert episodes
# of 100 steps), i.e. N*200 frames: 500 copies give 100,000 frames, the size of the 120 teacher laps that
# policies/nac-bc.pt was trained on. The frames are real CarRacing frames; only their number matters for the time.
# The copies hold the same two episodes, so the held-out accuracy (1.0) says nothing here.
# Runs: the default carracing recipe (nac-steady, T=4, 256 frames a batch) on cuda (8 DataLoader workers, GPU_EPOCHS
# epochs, default 3), then 1 epoch on the CPU with 2 threads (the development machine's size) and with 16.
# Each writes its training report (--json) with every epoch's seconds, and its resolved config to its run folder.
N=${1:-500}; GE=${2:-3}; OUT=${OUT:-/tmp/gpu-bc}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 SDL_VIDEODRIVER=dummy
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tail -1
python3 -c "import torch,sys,numpy,os;print('torch',torch.__version__,'cuda',torch.cuda.is_available(),'py',sys.version.split()[0],'numpy',numpy.__version__,'cpus',os.cpu_count())"
lscpu | grep "Model name"
R=$(mktemp -d)/nac-drive; mkdir -p "$R"
for k in $(seq 1 "$N"); do cp -r recordings/nac-drive/sample-v0 "$R/s$k-v0"; done
D=$(ls -d "$R"/s*-v0)
for spec in "cuda:0:$GE:8:210" "cpu:2:1:0:150" "cpu:16:1:4:100"; do IFS=: read dev th ep wk to <<< "$spec"
  echo "== $dev threads=$th epochs=$ep workers=$wk"
  t0=$(date +%s)
  timeout "$to" python3 -c "import sys; from agent.cli import main; sys.exit(main())" train --env carracing \
     --policy.window 4 --seed 0 --train.tensorboard '' --overwrite --data $D --train.epochs "$ep" --device "$dev" \
     --threads "$th" --workers "$wk" --out "$OUT/bc-$dev-$th.pt" --run-dir "$OUT/run-$dev-$th" \
     --json "$OUT/bc-$dev-$th.json" 2>&1 \
     | grep -vE "it/s|s/it|batch/s" | grep -E "epoch|took|error|Error|Traceback|frames|windows" | tail -14
  echo "wall $(( $(date +%s) - t0 )) s"
done
rm -r "$(dirname "$R")"
