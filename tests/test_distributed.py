"""Data-parallel behaviour cloning under torchrun (agent.train.distributed): two CPU ranks (gloo)
through the real entry point, then the result loaded with the project's loader and driven."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.data.recordings import load_demonstrations
from agent.data.windows import DemonstrationSource, WindowDataset
from agent.train.distributed import DAGGER_UNDER_TORCHRUN, DistContext, ShardSource, epoch_loader, shard_batch_size

SAMPLE = Path(__file__).resolve().parents[1] / "recordings" / "nac-drive" / "sample-v0"


def _torchrun(*agent_args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 --no-python agent ...`` (a free port on this machine)."""
    script = Path(sys.executable).with_name("agent")
    launch = ["--no-python", str(script)] if script.is_file() else ["-m", "agent.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NAC_PROGRESS": "0", "SDL_VIDEODRIVER": "dummy",
           "SDL_AUDIODRIVER": "dummy", "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *launch, *agent_args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """Two gloo ranks train 2 epochs on the sample recording, given twice (4 episodes; seed 1 holds
    out one copy of each of its two different episodes, so each rank scores a different one)."""
    work = tmp_path_factory.mktemp("ddp")
    proc = _torchrun("train", "--data", str(SAMPLE), str(SAMPLE), "--seed", "1", "--train.val-fraction", "0.5",
                     "--policy.window", "4", "--train.epochs", "2", "--train.batch-frames", "32", "--out",
                     str(work / "p.pt"), "--run-dir", str(work / "run"), "--train.tensorboard", str(work / "tb"),
                     "--json", str(work / "report.json"), cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, proc


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)  # rich wraps long log lines when stderr is not a terminal


def test_two_ranks_log_once_and_write_one_set(ddp_run):
    work, proc = ddp_run
    err = _flat(proc.stderr)
    assert err.count("world size 2") == 1 and err.count("gloo") == 1
    assert err.count("behaviour cloning carracing") == 1  # rank 1's INFO messages stay quiet
    assert err.count("bc epoch 1/2") == 1 and err.count("bc epoch 2/2") == 1
    assert proc.stdout.count("held-out accuracy") == 1 and proc.stdout.count("training took") == 1
    files = sorted(p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    assert len([f for f in files if f.startswith("tb/")]) == 1  # one TensorBoard run, one event file
    # nothing else, nowhere else: the policy, the report and rank 0's run folder (its resolved config and report)
    assert [f for f in files if not f.startswith("tb/")] == ["p.pt", "report.json", "run/config.toml",
                                                             "run/report.json"]


def test_the_result_loads_scores_as_reported_and_drives(ddp_run):
    from agent.eval.offline import score_stream
    from agent.actors.loading import load_policy, make_actor, make_carracing_for
    from agent.nn.policy import DrivingPolicy
    from agent.actors.rollout import rollout

    work, _ = ddp_run
    raw = torch.load(work / "p.pt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("module.") for k in raw["state_dict"]), "the DDP wrapper was saved"
    policy = load_policy(work / "p.pt")  # the project's loader (weights_only=True)
    assert isinstance(policy, DrivingPolicy)
    report = json.loads((work / "report.json").read_text())
    assert report["n_val_sequences"] == 2 and report["n_train_sequences"] == 2
    assert len(report["epochs"]) == 2

    # the held-out accuracy that chose the checkpoint is the whole held-out split's, as one process scores it
    source = DemonstrationSource(load_demonstrations([SAMPLE, SAMPLE]))
    _, val = source.split(0.5, 1)
    acc, frames = score_stream(policy, val)
    assert frames == 200
    assert acc == report["best_metric"]
    assert report["best_metric"] == max(e["val_metric"] for e in report["epochs"])

    env = make_carracing_for(policy)
    try:
        ep = rollout(env, make_actor(policy), seed=1_000_000, max_steps=5, keep_frames=False)
    finally:
        env.close()
    assert len(ep.actions) == 5 and all(0 <= int(a) < 5 for a in ep.actions)


def test_ranks_read_disjoint_shards_of_the_windows():
    source = DemonstrationSource(load_demonstrations(SAMPLE))
    dataset = WindowDataset(source, 4, shuffle_borders=True, seed=3)
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        seen = []
        for rank in (0, 1):
            ctx = DistContext(world_size=2, rank=rank, backend="gloo")
            loader = epoch_loader(dataset, shard_batch_size(8, ctx), ctx, seed=3, epoch=epoch)
            assert loader.batch_size == 4
            seen.append([int(i) for i in loader.sampler])
        assert len(seen[0]) == len(seen[1])  # every rank takes as many steps (DDP needs it)
        pad = len(seen[0]) + len(seen[1]) - len(dataset)  # DistributedSampler repeats a few to even them out
        assert 0 <= pad < 2
        assert len(set(seen[0]) & set(seen[1])) == pad and set(seen[0]) | set(seen[1]) == set(range(len(dataset)))
    assert seen[0] != sorted(seen[0])  # shuffled


def test_validation_shards_partition_the_sequences():
    source = DemonstrationSource(load_demonstrations([SAMPLE, SAMPLE]))
    shards = [ShardSource(source, r, 3) for r in range(3)]
    assert [s.sequences for s in shards] == [[0, 3], [1], [2]]
    assert shards[0].lengths == [100, 100] and shards[2].lengths == [100]
    frames, target, _ = shards[1].window(0, 10, 5)
    np.testing.assert_array_equal(frames, source.window(1, 10, 5)[0])
    np.testing.assert_array_equal(shards[2].targets(0), source.targets(2))
    assert shards[0].target_dtype == source.target_dtype  # the rest is the source's


def test_dagger_is_refused_under_torchrun():
    from agent.nn.policy import default_config
    from agent.train.bc import TrainConfig
    from agent.train.run import train

    source = DemonstrationSource(load_demonstrations(SAMPLE))
    ctx = DistContext(world_size=2, rank=0, backend="gloo")
    with pytest.raises(ValueError, match="without torchrun"):
        train(source, default_config("carracing", window=4), TrainConfig(epochs=1, dagger_rounds=1), dist=ctx)
    assert "--init POLICY --epochs 0" in DAGGER_UNDER_TORCHRUN
