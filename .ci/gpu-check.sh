#!/usr/bin/env bash
# Every GPU measurement and test of the issue "NAC at attention's speed" in one run of at most 8 minutes
# (docs/benchmarks.md, "Checking on a GPU"). GPU time comes by chance and is short: run this script, whole.
#
# usage: bash .ci/gpu-check.sh [--dry-run]      (from anywhere; it works in the repository root)
#   --dry-run   print the steps, their time limits and commands, and run nothing
#   OUT         folder for every report (default /tmp/gpu-check); the device tool sets it
#   WHEELS      folder of carried wheels for the packages the GPU machine lacks (default .whl; made here by
#               `bash .ci/gpu-wheels.sh`); installed without network into /tmp/site, never into the system
#   PYTHON      the interpreter (default python3: on the lent GPU machines the one that holds a CUDA torch)
#   ONLY        run only these steps (names, space-separated), e.g. ONLY="setup bench-nac-cuda" for a rerun
#   NAC_PATH    the NAC paths bench-nac-cuda times: triton (default), torch or both (the torch path's figures of
#               2026-11-27 are in results/device/: it need not run every time)
#
# The steps, each under `timeout` (the limits add up to 440 s; the whole run took 243 s on an H200, 2026-11-27):
#   setup             the carried wheels into /tmp/site (pip --no-index --no-deps), versions, a check that every
#                     module the steps import is there
#   pytest-cuda       pytest -m cuda: tests/test_nac_triton.py's cuda suite and tests/test_bench_nac_device.py's,
#                     then tests/test_train_device_data.py's CUDA tests (-k cuda; they carry no cuda mark)
#   bench-nac-cuda    agent bench nac --device cuda --nac-path triton --cuda-profile (where NAC's time goes)
#                     --selector-sweep (the exact selector's tunables, timed side by side)
#                                                                     -> $OUT/bench-nac-cuda.json
#   bench-train-cuda  agent bench train --device cuda (loop vs compute frames/s, both batch paths)
#                                                                     -> $OUT/bench-train-cuda.json
#   bench-nac-cpu     agent bench nac --paired-only --thread-counts 1 2 16 on the machine's CPU
#                                                                     -> $OUT/bench-nac-cpu-threads.json
#   train-cuda        agent train --device cuda, 2 epochs on recordings/nac-drive/sample-v0 (the trainer's
#                     frames/s log lines)                             -> $OUT/train-cuda.json
# Then $OUT/summary.txt (also printed); the whole output is in $OUT/gpu-check.log. Exit code: the number of
# steps that failed or ran out of time (0: all passed).
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash .ci/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/gpu-check}
WHEELS=${WHEELS:-.whl}
PY=${PYTHON:-python3}
NAC_PATH=${NAC_PATH:-triton}
A="$PY -m agent.cli"   # the project runs from this checkout (PYTHONPATH), not from an installed copy
TRAIN_TMP=/tmp/gpu-check-train

STEPS=(setup pytest-cuda bench-nac-cuda bench-train-cuda bench-nac-cpu train-cuda)
if [ -n "${ONLY:-}" ]; then
  for s in $ONLY; do [[ " ${STEPS[*]} " == *" $s "* ]] || { echo "ONLY: unknown step $s (steps: ${STEPS[*]})" >&2; exit 2; }; done
  read -r -a STEPS <<< "$ONLY"
fi
declare -A LIMIT=([setup]=30 [pytest-cuda]=90 [bench-nac-cuda]=120 [bench-train-cuda]=45 [bench-nac-cpu]=110
                  [train-cuda]=45)
XDIST="\$($PY -c 'import xdist' 2>/dev/null && echo '-n 4')"
declare -A CMD=(
  [setup]="if ls $WHEELS/*.whl >/dev/null 2>&1; then $PY -m pip install -q --no-index --no-deps --no-compile \
--no-cache-dir --upgrade --target /tmp/site $WHEELS/*.whl; else echo 'no wheels in $WHEELS: using what is installed'; fi \
&& (nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true) \
&& $PY -c \"import importlib, importlib.util, os, sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '-', \
'cpus', os.cpu_count()); missing = [m for m in ('triton', 'numba', 'numpy', 'scipy', 'h5py', 'cv2', 'PIL', 'aiohttp', \
'rich', 'tqdm', 'gymnasium', 'Box2D', 'pygame', 'minari', 'ncps', 'tyro', 'dacite', 'tomli_w', 'websocket', 'pytest') \
if importlib.util.find_spec(m) is None]; print('triton', importlib.import_module('triton').__version__ if not 'triton' \
in missing else 'missing'); print('missing modules:', ' '.join(missing) or 'none'); sys.exit(1 if missing else 0)\""
  [pytest-cuda]="$PY -m pytest -q -p no:cacheprovider -m cuda $XDIST tests/test_nac_triton.py tests/test_bench_nac_device.py; \
a=\$?; $PY -m pytest -q -p no:cacheprovider tests/test_train_device_data.py -k cuda; b=\$?; exit \$(( a || b ))"
  [bench-nac-cuda]="$A bench nac --device cuda --nac-path $NAC_PATH --cuda-repeats 15 --cuda-timeout-s 55 --step-count 200 \
--cuda-profile --selector-sweep --json $OUT/bench-nac-cuda.json --overwrite"
  [bench-train-cuda]="$A bench train --device cuda --frames 20000 --steps 30 --warmup 5 --threads 0 --data device loader \
--workers 4 --json $OUT/bench-train-cuda.json --overwrite"
  [bench-nac-cpu]="$A bench nac --device cpu --paired-only --thread-counts 1 2 16 --sizes 256 1024 --no-peer --train-T 256 \
--step-window 0 --repeats 5 --json $OUT/bench-nac-cpu-threads.json --overwrite"
  [train-cuda]="rm -rf $TRAIN_TMP && $A train --env carracing --data recordings/nac-drive/sample-v0 --train.epochs 2 \
--device cuda --workers 2 --seed 0 --train.tensorboard '' --overwrite --out $TRAIN_TMP/bc.pt --run-dir $TRAIN_TMP/run \
--json $OUT/train-cuda.json"
)

total=0
for s in "${STEPS[@]}"; do total=$(( total + LIMIT[$s] )); done
if [ "$DRY" = 1 ]; then
  echo "gpu-check: ${#STEPS[@]} steps, time limits adding up to ${total} s; OUT=$OUT WHEELS=$WHEELS PYTHON=$PY"
  i=0
  for s in "${STEPS[@]}"; do i=$(( i + 1 )); echo "step $i $s ${LIMIT[$s]}s: ${CMD[$s]}"; done
  exit 0
fi

mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-check.log") 2>&1
export PYTHONUNBUFFERED=1 SDL_VIDEODRIVER=dummy SDL_AUDIODRIVER=dummy MPLBACKEND=Agg
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
unset TRITON_INTERPRET NAC_TRITON
declare -A RESULT SECONDS_TAKEN
failed=0
t_all=$(date +%s)
for s in "${STEPS[@]}"; do
  echo "=== $s (limit ${LIMIT[$s]} s): ${CMD[$s]}"
  t0=$(date +%s)
  timeout -k 5 "${LIMIT[$s]}" bash -c "${CMD[$s]}"
  rc=$?
  SECONDS_TAKEN[$s]=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then RESULT[$s]=ok
  elif [ $rc = 124 ] || [ $rc = 137 ]; then RESULT[$s]="TIMED OUT"; failed=$(( failed + 1 ))
  else RESULT[$s]="FAILED (exit $rc)"; failed=$(( failed + 1 )); fi
  echo "=== $s: ${RESULT[$s]} in ${SECONDS_TAKEN[$s]} s"
done
{
  echo "gpu-check summary: $(( $(date +%s) - t_all )) s in all, $failed of ${#STEPS[@]} steps failed or timed out"
  for s in "${STEPS[@]}"; do printf '  %-17s %-18s %4s s (limit %s s)\n' "$s" "${RESULT[$s]}" "${SECONDS_TAKEN[$s]}" "${LIMIT[$s]}"; done
  echo "--- key lines"
  grep -E "^(python|triton|missing modules|NVIDIA|[0-9]+ (passed|failed|skipped|deselected|error)|=+ .*(passed|failed|error))|device: |targets met:|frames/s|training took|^\| [0-9]+ \| |^\| (triton|torch) \(|^ *(forward|train) \| " \
    "$OUT/gpu-check.log" | grep -vE "^=== " | head -80
} | tee "$OUT/summary.txt"
exit "$failed"
