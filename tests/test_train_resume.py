"""`agent train` survives interruption: a checkpoint in the run folder after every epoch and DAgger
round, `agent train --resume RUN_DIR` continues from it, and the resumed run ends with the SAME
weights, bit for bit, as a run never interrupted (same seed, one thread).

Each interrupted run is the real command line in a subprocess, stopped by a signal (SIGINT: the
Ctrl-C path, SIGKILL: a crash) as soon as its first checkpoint exists; the resume runs in this
process. The runs train a window-2 policy on the shipped sample recording (seconds each); the
DAgger variant runs 2 rounds of one 20-step rollout with the shipped discrete expert as teacher.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from cli_run import run_cli

from agent.actors.loading import load_policy
from agent.cli import main
from agent.train.checkpoint import CHECKPOINT_NAME, load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "recordings" / "nac-drive" / "sample-v0")
TEACHER = str(ROOT / "policies" / "carracing-expert-discrete-margin.zip")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NAC_PROGRESS": "0", "SDL_VIDEODRIVER": "dummy",
       "SDL_AUDIODRIVER": "dummy", "MPLBACKEND": "Agg"}


def _args(tmp: Path, name: str, epochs: int = 4, dagger: bool = False) -> list[str]:
    args = ["train", "--data", SAMPLE, "--out", str(tmp / f"{name}.pt"), "--run-dir", str(tmp / name),
            "--policy.window", "2", "--train.epochs", str(epochs), "--train.batch-frames", "16",
            "--train.val-fraction", "0.5", "--train.tensorboard", "", "--threads", "1", "--device", "cpu",
            "--seed", "3"]
    if dagger:
        args += ["--teacher.expert", TEACHER, "--dagger.rounds", "2", "--dagger.episodes", "1", "--dagger.epochs",
                 "2", "--dagger.max-steps", "20", "--dagger.beta", "0.5"]
    return args


def _interrupt(args: list[str], run_dir: Path, sig: int, after: str = CHECKPOINT_NAME) -> subprocess.CompletedProcess:
    """Run ``agent ARGS`` in a subprocess and send ``sig`` as soon as ``run_dir/after`` exists."""
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", *args], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / after).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _same_weights(a: Path, b: Path) -> None:
    pa, pb = load_policy(a), load_policy(b)
    sa, sb = pa.state_dict(), pb.state_dict()
    assert sa.keys() == sb.keys()
    differ = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not differ, f"the resumed run's weights differ from the uninterrupted run's in {differ}"


def _epochs(policy: Path) -> list:
    import json

    report = json.loads((policy.parent / policy.stem / "report.json").read_text())
    return [(e["epoch"], e["tag"], e["train_loss"], e["val_metric"]) for e in report["epochs"]]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill"])
def test_an_interrupted_bc_run_resumes_to_the_same_weights(tmp_path, capsys, sig):
    assert main(_args(tmp_path, "whole")) == 0

    stopped = _interrupt(_args(tmp_path, "cut"), tmp_path / "cut", sig)
    state = load_checkpoint(tmp_path / "cut")
    assert state["stage"] == "bc" and state["fit"]["epochs_done"] < 4, "interrupted before the end"
    assert not (tmp_path / "cut.pt").exists()
    assert not list((tmp_path / "cut").glob("*.tmp"))
    if sig == signal.SIGINT:  # Ctrl-C: exit 130 and one line that says how to resume
        assert stopped.returncode == 130, stopped.stderr[-2000:]
        assert f"agent train --resume {tmp_path / 'cut'}" in stopped.stderr
        assert "Traceback" not in stopped.stderr

    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut")], capsys)
    assert rc == 0, err
    done = state["fit"]["epochs_done"]
    assert f"resumed from the checkpoint of bc epoch {done} of 4" in err
    assert f"bc epoch {done}/4" not in err and "bc epoch 4/4" in err, "the finished epochs are not trained again"
    _same_weights(tmp_path / "whole.pt", tmp_path / "cut.pt")
    assert _epochs(tmp_path / "whole.pt") == _epochs(tmp_path / "cut.pt")
    # the run is finished now: a second resume says so
    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut")], capsys)
    assert rc == 2 and "finished" in err and "nothing to resume" in err


def test_an_interrupted_dagger_run_resumes_to_the_same_weights(tmp_path, capsys):
    """Killed after DAgger round 1's rollouts were saved; the resumed run re-adds that round's data."""
    assert main(_args(tmp_path, "whole", epochs=1, dagger=True)) == 0
    assert not list((tmp_path / "whole").glob("dagger-round-*")), "a finished run deletes its round data"

    _interrupt(_args(tmp_path, "cut", epochs=1, dagger=True), tmp_path / "cut", signal.SIGKILL,
               after="dagger-round-1.npz")
    state = load_checkpoint(tmp_path / "cut")
    assert state["stage"] == "dagger" and (state["round"], state["round_done"]) < (2, True), state["what"]
    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut")], capsys)
    assert rc == 0, err
    assert f"resumed from the checkpoint of {state['what']}" in err and "bc epoch 1/1" not in err
    _same_weights(tmp_path / "whole.pt", tmp_path / "cut.pt")
    assert _epochs(tmp_path / "whole.pt") == _epochs(tmp_path / "cut.pt")
    assert load_policy(tmp_path / "whole.pt").metadata["dagger_returns"] == \
        load_policy(tmp_path / "cut.pt").metadata["dagger_returns"]


def test_resume_refuses_options_that_change_the_run(tmp_path, capsys):
    stopped = _interrupt(_args(tmp_path, "cut"), tmp_path / "cut", signal.SIGKILL)
    assert stopped.returncode != 0
    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut"), "--train.epochs", "9"], capsys)
    assert rc == 2 and "train.epochs (9 given, 4 stored)" in err and "would change the run" in err
    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut"), "--config", "recipes/nac.toml"], capsys)
    assert rc == 2 and "drop --config" in err
    rc, err = run_cli(["train", "--resume", str(tmp_path / "nothing")], capsys)
    assert rc == 2 and "holds no checkpoint" in err
    # the interrupted run's own command line with --resume added repeats the stored values: accepted
    rc, err = run_cli([*_args(tmp_path, "cut"), "--resume", str(tmp_path / "cut")], capsys)
    assert rc == 0, err


def test_help_documents_resume(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--resume" in out and "checkpoint" in out


def test_resume_is_refused_under_torchrun(tmp_path):
    """Data-parallel runs write no checkpoints; a checkpoint is not resumed by several processes."""
    from agent.data.recordings import load_demonstrations
    from agent.data.windows import DemonstrationSource
    from agent.nn.policy import default_config
    from agent.train.bc import TrainConfig
    from agent.train.distributed import DistContext
    from agent.train.run import train

    source = DemonstrationSource(load_demonstrations(SAMPLE))
    ctx = DistContext(world_size=2, rank=0, backend="gloo")
    with pytest.raises(ValueError, match="under torchrun is not supported"):
        train(source, default_config("carracing", window=2), TrainConfig(epochs=1), dist=ctx, resume={"stage": "bc"})


def test_a_checkpoint_is_read_without_running_code(tmp_path):
    """numpy values are stored as plain numbers and tensors; a pickle that would run code is refused."""
    import pickle

    import numpy as np

    from agent.train.checkpoint import CheckpointError, Checkpointer

    Checkpointer(tmp_path, "seed = 1\n").save("a test", stage="bc", report={"best": np.float64(0.5)},
                                              frames=np.zeros((2, 3), np.uint8))
    state = load_checkpoint(tmp_path)
    assert state["what"] == "a test" and type(state["report"]["best"]) is float
    assert isinstance(state["frames"], torch.Tensor) and state["frames"].dtype == torch.uint8
    assert set(state["rng"]) == {"torch", "cuda", "numpy", "python", "dagger"}

    class Payload:
        def __reduce__(self):
            return (print, ("code ran",))

    (tmp_path / CHECKPOINT_NAME).write_bytes(pickle.dumps({"kind": "agent-train-checkpoint", "x": Payload()}, protocol=2))
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path)


def test_rerunning_the_same_command_continues_its_checkpoint(tmp_path, capsys):
    """A recipe's rerun (the same resolved config, same run folder) continues a cut-short stage from
    its checkpoint instead of training it again, and ends with the uninterrupted run's weights; a
    different config in that folder is not continued."""
    assert main(_args(tmp_path, "whole", epochs=3)) == 0
    _interrupt(_args(tmp_path, "cut", epochs=3), tmp_path / "cut", signal.SIGKILL)
    done = load_checkpoint(tmp_path / "cut")["fit"]["epochs_done"]
    assert done < 3
    rc, err = run_cli(_args(tmp_path, "cut", epochs=3), capsys)
    assert rc == 0, err
    assert "holds a checkpoint of this run" in err and f"bc epoch {done}/3" not in err and "bc epoch 3/3" in err
    _same_weights(tmp_path / "whole.pt", tmp_path / "cut.pt")

    from agent.cli.train import unfinished_checkpoint
    from agent.train.config import TrainRun
    import tyro

    finished = tyro.cli(TrainRun, args=_args(tmp_path, "cut", epochs=3)[1:])
    assert unfinished_checkpoint(finished) is None  # that run finished
    other = tyro.cli(TrainRun, args=_args(tmp_path, "cut", epochs=5)[1:])
    assert unfinished_checkpoint(other) is None  # another config


def test_a_dagger_run_moved_without_its_frames_resumes_to_the_same_weights(tmp_path, capsys):
    """The run folder copied without its dagger-round-*.npy (vectorised rollouts keep the executed
    actions): the resumed run replays the rounds' frames and ends bit for bit where the whole run does."""
    two = ["--dagger.envs", "2", "--dagger.episodes", "2"]
    assert main(_args(tmp_path, "whole", epochs=1, dagger=True) + two) == 0
    _interrupt(_args(tmp_path, "cut", epochs=1, dagger=True) + two, tmp_path / "cut", signal.SIGKILL,
               after="dagger-round-2.npz")  # by then the checkpoint lists round 1
    state = load_checkpoint(tmp_path / "cut")
    assert state["stage"] == "dagger" and state["rounds"][0] == "dagger-round-1.npz", state["what"]
    frames = list((tmp_path / "cut").glob("dagger-round-*.npy"))
    assert frames
    for f in frames:
        f.unlink()
    rc, err = run_cli(["train", "--resume", str(tmp_path / "cut")], capsys)
    assert rc == 0, err
    assert "replaying DAgger round data dagger-round-1.npz: 2 episodes" in err
    _same_weights(tmp_path / "whole.pt", tmp_path / "cut.pt")
    assert _epochs(tmp_path / "whole.pt") == _epochs(tmp_path / "cut.pt")
