#!/usr/bin/env bash
# The wheels that .ci/gpu-check.sh installs on a lent GPU machine, which has no network (docs/benchmarks.md,
# "Checking on a GPU"). Run here, where pip reaches PyPI: it fills .whl/ (ignored by git through
# .git/info/exclude) with the project's run-time packages that the machine's image lacks, built for its
# Python 3.12 on x86-64, at the versions this project's CPU environment uses. About 17 MB; carry it with
# `carry: [".whl"]` (the working tree and the carried paths together may be 64 MiB).
#
# The image already holds torch (2.11.0+cu130 when last seen, a CUDA build: nothing to carry), triton (3.6.0),
# numpy, scipy, numba, h5py, opencv-python-headless, pillow, aiohttp, rich, tqdm, tensorboard, matplotlib,
# networkx, scikit-learn, typer and pytest (/work/.library/device/KINDS.md). The project itself is not installed
# there: gpu-check.sh runs it from the checkout (PYTHONPATH), so its torch pin (2.13, CPU) does not apply.
# Not carried because no GPU step imports them: stable-baselines3, grad-cam/ttach, imageio-ffmpeg, import-linter.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-.whl}
mkdir -p "$WHEELS" .git/info
grep -qxF "/$WHEELS/" .git/info/exclude 2>/dev/null || echo "/$WHEELS/" >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" \
  Box2D==2.3.10 pygame-ce==2.5.8 gymnasium==1.4.0 Farama-Notifications==0.0.6 minari==0.5.4 ncps==1.0.1 \
  tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 dacite==1.9.2 tomli_w==1.2.0 websocket-client==1.9.2
ls -la "$WHEELS"
du -sh "$WHEELS"
