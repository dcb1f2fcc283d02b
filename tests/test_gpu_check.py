""".ci/gpu-check.sh, the one script for every GPU measurement and test of the issue "NAC at attention's
speed": its dry run lists every step, each under a time limit, all of them within 8 minutes."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu-check.sh"

#: each step and what its command must hold
EXPECTED = {
    "setup": ["pip install", "--no-index", "--no-deps", "--target /tmp/site", "WHEELS_DIR/*.whl", "nvidia-smi",
              "missing modules"],
    "pytest-cuda": ["-m pytest", "-m cuda", "tests/test_nac_triton.py", "tests/test_bench_nac_device.py",
                    "tests/test_train_device_data.py -k cuda"],
    "bench-nac-cuda": ["-m agent.cli bench nac --device cuda --nac-path triton", "--cuda-profile --selector-sweep", "--json OUT_DIR/bench-nac-cuda.json"],
    "bench-train-cuda": ["-m agent.cli bench train --device cuda", "--json OUT_DIR/bench-train-cuda.json"],
    "bench-nac-cpu": ["-m agent.cli bench nac --device cpu --paired-only --thread-counts 1 2 16",
                      "--json OUT_DIR/bench-nac-cpu-threads.json"],
    "train-cuda": ["-m agent.cli train --env carracing --data recordings/nac-drive/sample-v0 --train.epochs 2",
                   "--device cuda", "--json OUT_DIR/train-cuda.json"],
}


def _run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env}, cwd="/")


def test_dry_run_lists_every_step_within_eight_minutes(tmp_path):
    res = _run("--dry-run", OUT=str(tmp_path / "out"), WHEELS="WHEELS_DIR")
    assert res.returncode == 0, res.stderr
    out = res.stdout.replace(str(tmp_path / "out"), "OUT_DIR")
    steps = re.findall(r"^step (\d+) (\S+) (\d+)s: (.*)$", out, re.M)
    assert [name for _, name, _, _ in steps] == list(EXPECTED)
    for _, name, limit, cmd in steps:
        assert int(limit) > 0
        for part in EXPECTED[name]:
            assert part in cmd, (name, part, cmd)
    total = sum(int(limit) for _, _, limit, _ in steps)
    assert total <= 480 and f"time limits adding up to {total} s" in out
    assert not (tmp_path / "out").exists()  # a dry run runs nothing


def test_only_picks_steps_and_refuses_unknown_ones(tmp_path):
    res = _run("--dry-run", ONLY="setup bench-nac-cuda", OUT=str(tmp_path))
    assert res.returncode == 0 and re.findall(r"^step \d+ (\S+)", res.stdout, re.M) == ["setup", "bench-nac-cuda"]
    bad = _run("--dry-run", ONLY="setup bench-nothing")
    assert bad.returncode == 2 and "unknown step bench-nothing" in bad.stderr
    assert _run("--bogus").returncode == 2
