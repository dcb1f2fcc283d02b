"""`agent train` on a full disk: one error line (exit 1, no traceback), the previous checkpoint
whole, no `.tmp` file left; once space is freed, `--resume` finishes the run with the weights an
uninterrupted run gives.

The full disk is a small tmpfs mounted in a user and mount namespace (`unshare -Urm`; the tests
skip where that is not allowed), sized from the policy file's size P: a checkpoint holds about 4 P
(weights, AdamW's two moments, the best weights). "Freeing space" is a remount with a larger size,
which keeps the files.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agent.actors.loading import load_policy
from agent.cli import main
from agent.train.checkpoint import atomic_save, load_checkpoint
from tmpfs import unshare_works

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "recordings" / "nac-drive" / "sample-v0")


def _train_args(out: Path, run_dir: Path, epochs: int = 3) -> list[str]:
    return ["train", "--data", SAMPLE, "--out", str(out), "--run-dir", str(run_dir), "--policy.window", "2",
            "--train.epochs", str(epochs), "--train.batch-frames", "16", "--train.val-fraction", "0.5",
            "--train.tensorboard", "", "--threads", "1", "--device", "cpu", "--seed", "5"]


needs_unshare = pytest.mark.skipif(not unshare_works(), reason="needs `unshare -Urm` to mount a small tmpfs")


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    env = {"OMP_NUM_THREADS": "1", "NAC_PROGRESS": "0", "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy",
           "MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin", "HOME": "/tmp", "COLUMNS": "400"}
    return subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=600)


def _agent(args: list[str]) -> str:
    return shlex.join([sys.executable, "-m", "agent.cli", *args])


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("agent train: error:")]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted run that the resumed ones must equal."""
    tmp = tmp_path_factory.mktemp("whole")
    assert main(_train_args(tmp / "whole.pt", tmp / "whole")) == 0
    return tmp / "whole.pt"


def _same_weights(a: Path, b: Path) -> None:
    sa, sb = load_policy(a).state_dict(), load_policy(b).state_dict()
    assert [k for k in sa if not torch.equal(sa[k], sb[k])] == []


def test_a_failed_write_raises_one_oserror_and_writes_nothing(tmp_path):
    """The folder cannot be made (a file is in the way): an OSError naming the checkpoint, no file."""
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(OSError, match="cannot write the checkpoint .*nothing was written"):
        atomic_save({"x": torch.zeros(3)}, tmp_path / "file" / "checkpoint.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@needs_unshare
def test_a_full_disk_mid_run_keeps_the_previous_checkpoint_and_resume_finishes(whole, tmp_path):
    size = whole.stat().st_size  # P: the first checkpoint (~4 P) fits in 6 P, a second beside it does not
    disk, run_dir, out = tmp_path / "disk", tmp_path / "disk" / "run", tmp_path / "cut.pt"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size={6 * size} tmpfs {disk} && "
              f"{_agent(_train_args(out, run_dir))}; echo rc=$? >&2; "
              f"ls -a {run_dir} >&2; cp {run_dir}/checkpoint.pt {tmp_path}/kept.pt; "
              f"mount -o remount,size={64 * size} {disk} && "  # space freed
              f"{_agent(['train', '--resume', str(run_dir)])}; echo rc2=$? >&2")
    done = _in_namespace(script)
    err = done.stderr
    assert "rc=1" in err, err[-3000:]
    assert "Traceback" not in err and "Segmentation" not in err
    errors = _errors(err)
    assert len(errors) == 1 and "cannot write the checkpoint" in errors[0] and "No space left" in errors[0] and \
        "the previous one is kept" in errors[0], err[-3000:]
    assert ".tmp" not in err.split("rc=1")[1].split("rc2=")[0], "a .tmp file was left in the run folder"
    kept = torch.load(tmp_path / "kept.pt", weights_only=True)
    assert kept["stage"] == "bc" and kept["fit"]["epochs_done"] == 1  # the epoch-1 checkpoint, whole
    assert "rc2=0" in err, err[-3000:]
    _same_weights(whole, out)


@needs_unshare
def test_a_full_disk_at_the_policy_save_keeps_the_checkpoint_and_resume_writes_it(whole, tmp_path):
    size = whole.stat().st_size
    disk, run_dir = tmp_path / "disk", tmp_path / "run"
    disk.mkdir()
    out = disk / "cut.pt"
    script = (f"mount -t tmpfs -o size={size // 2} tmpfs {disk} && "
              f"{_agent(_train_args(out, run_dir))}; echo rc=$? >&2; ls -a {disk} >&2; echo listed >&2; "
              f"mount -o remount,size={4 * size} {disk} && "
              f"{_agent(['train', '--resume', str(run_dir)])}; echo rc2=$? >&2; cp {out} {tmp_path}/cut.pt")
    done = _in_namespace(script)
    err = done.stderr
    assert "rc=1" in err, err[-3000:]
    assert "Traceback" not in err
    errors = _errors(err)
    assert len(errors) == 1 and "cannot write the policy" in errors[0] and "No space left" in errors[0] and \
        f"agent train --resume {run_dir}" in errors[0], err[-3000:]
    assert ".tmp" not in err.split("rc=1")[1].split("listed")[0], "a .tmp file was left beside the policy"
    assert "rc2=0" in err, err[-3000:]
    _same_weights(whole, tmp_path / "cut.pt")
    assert load_checkpoint(run_dir)["stage"] == "done"
