"""The trainer's batch paths (agent.train.batches): batches gathered on the device from frames held
there give exactly the DataLoader's batches; training on either gives the same weights as the loop
before the batch paths existed (same seed, bit for bit); auto picks by memory; `agent bench train`
prints the loop and compute rates and refuses bad input with exit code 2.

Everything runs on the CPU ("device" is then RAM, through the same code as on CUDA), on a few
random 96x96 frames.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from cli_run import run_cli
from torch.utils.data import DataLoader

from agent.data.recordings import Demonstrations
from agent.data.windows import CARRACING_GAS, DemonstrationSource, UdacitySource, WindowDataset
from agent.nn.policy import DrivingPolicy, default_config
from agent.train import batches as tb
from agent.train.bc import TrainConfig, TrainReport, _loss_mask, fit
from agent.train.config import ConfigError, TrainRun, TrainSection, to_toml

LENGTHS = (9, 6, 3, 1)  # windows of 4: full ones, short ones, a one-frame episode


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _source(continuous=False, skip_stalls=False, standstills=0.0, weighted=False, read_only=False, seed=0):
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8) for n in LENGTHS]
    if continuous:
        actions = [rng.uniform(-1, 1, (n, 2)).astype(np.float32) for n in LENGTHS]
    else:
        actions = [rng.integers(0, 5, n).astype(np.int64) for n in LENGTHS]
    # stalls: episode 0's frames 3..5 repeat frame 2 with a label that keeps the car there
    frames[0][3:6] = frames[0][2]
    if continuous:
        actions[0][3:6, 1] = -0.5
    else:
        actions[0][3:6] = 4
    if read_only:  # as the frame cache's memory maps
        for f in frames:
            f.setflags(write=False)
    weights = [rng.uniform(0.5, 3, n).astype(np.float32) for n in LENGTHS] if weighted else None
    demos = Demonstrations(frames, actions, list(range(len(LENGTHS))), [0.0] * len(LENGTHS), weights=weights)
    return DemonstrationSource(demos, skip_stalls=skip_stalls, standstills=standstills)


SOURCES = {
    "discrete, stalls, standstills, weights": dict(skip_stalls=True, standstills=0.5, weighted=True),
    "continuous, standstills": dict(continuous=True, standstills=0.6),
    "discrete, read-only frames": dict(read_only=True),
}


def _batches(source, mode, previous=True, causal=True, epochs=(1, 2, 3), seed=5, bsz=3, device="cpu", workers=0):
    dataset = WindowDataset(source, 4, shuffle_borders=True, seed=seed, previous=previous)
    batches = tb.TrainBatches(dataset, bsz, device, seed, workers=workers, mode=mode, causal=causal)
    out = []
    for epoch in epochs:
        dataset.set_epoch(epoch)
        out.extend(batches)
    return batches, out


def _same_batches(expected, got):
    """Every batch of ``got`` (any device) equals ``expected``'s (CPU), key by key, counts included."""
    assert len(got) == len(expected) > 3
    for b, (want, have) in enumerate(zip(expected, got)):
        assert sorted(have) == sorted(want), f"batch {b}: keys"
        assert have["counted"] == want["counted"], f"batch {b}: counted"
        for k in want:
            if k == "counted":
                continue
            assert have[k].dtype == want[k].dtype and have[k].shape == want[k].shape, f"batch {b} {k}"
            assert torch.equal(have[k].cpu(), want[k]), f"batch {b}: {k} differs"


@pytest.mark.parametrize("kind", list(SOURCES))
@pytest.mark.parametrize("previous,causal", [(True, True), (False, False)])
def test_device_batches_are_the_loaders_batches(kind, previous, causal):
    source = _source(**SOURCES[kind])
    loader, expected = _batches(source, "loader", previous, causal)
    device, got = _batches(source, "device", previous, causal)
    assert (loader.path, device.path) == ("loader", "device")
    assert len(got) == len(expected) > 3
    for b, (want, have) in enumerate(zip(expected, got)):
        counted, loader_counted = have.pop("counted"), want.pop("counted")
        assert sorted(have) == sorted(want), f"batch {b}: keys"
        for k in want:
            assert have[k].dtype == want[k].dtype and have[k].shape == want[k].shape, f"batch {b} {k}"
            assert torch.equal(have[k], want[k]), f"batch {b}: {k} differs"
        # the host's count of the positions the loss counts is the device's
        policy_core = type("Core", (), {"causal": causal})
        mask = _loss_mask(type("P", (), {"core": policy_core})(), want["mask"]) & want["learn"]
        assert counted == loader_counted == int(mask.sum())
    cat = {k: torch.cat([b[k].flatten() for b in expected]) for k in ("mask", "learn")}
    if SOURCES[kind].get("skip_stalls"):
        assert not bool(cat["learn"][cat["mask"]].all()), "the fixture's stalls are left out of the loss"
    if SOURCES[kind].get("standstills"):  # standstills were drawn: whole windows of gas / full throttle
        target = torch.cat([b["target"] for b in expected])
        still = [bool((target[i][m] == CARRACING_GAS).all()) if target.dim() == 2 else
                 bool((target[i][m][:, 1] == 1.0).all()) for i, m in enumerate(torch.cat([b["mask"] for b in expected]))]
        assert sum(still) >= 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", list(SOURCES))
def test_cuda_batches_either_path_are_the_cpu_loaders_batches(kind):
    source = _source(**SOURCES[kind])
    _, expected = _batches(source, "loader")
    device, got = _batches(source, "device", device="cuda")
    assert device.path == "device" and got[0]["obs"].is_cuda and got[0]["target"].is_cuda
    _same_batches(expected, got)
    loader, got = _batches(source, "loader", device="cuda", workers=1)  # pinned, prefetched
    assert loader.path == "loader" and got[0]["obs"].is_cuda
    _same_batches(expected, got)
    auto, _ = _batches(source, "auto", device="cuda", epochs=())  # a few MB fit in any GPU
    assert auto.path == "device" and "free on" in auto.reason


def test_device_batches_refuse_another_sources_windows():
    source = _source()
    windows = tb.DeviceWindows(source, "cpu")
    other = WindowDataset(_source(seed=1), 4)
    with pytest.raises(ValueError, match="another source"):
        windows.batch(other, [0])
    assert windows.frames.shape == (sum(LENGTHS), 96, 96, 3) and windows.frames.dtype == torch.uint8
    assert windows.nbytes >= windows.frames.numel()


def _reference_fit(policy, source, cfg, epochs):
    """The training loop of agent.train.bc.fit as it was before the batch paths (commit 167c7a8), without
    validation and checkpoints: the losses per epoch."""
    device = torch.device(cfg.device)
    T = policy.config.window
    bsz = max(1, cfg.batch_frames // T)
    dataset = WindowDataset(source, T, shuffle_borders=True, seed=cfg.seed, previous=policy.features.uses_previous)
    loader = DataLoader(dataset, batch_size=bsz, shuffle=True, num_workers=cfg.workers,
                        generator=torch.Generator().manual_seed(cfg.seed), drop_last=False)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    total_steps = max(1, epochs * math.ceil(len(dataset) * 1.1 / 1 / bsz) + 1)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=total_steps, pct_start=0.15)
    losses = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch + 1)
        policy.train()
        total, seen = 0.0, 0
        for batch in loader:
            mask = batch["mask"].to(device)
            prev = batch["prev"].to(device) if "prev" in batch else None
            out = policy(batch["obs"].to(device), batch["t"].to(device), mask, prev=prev)
            counted = _loss_mask(policy, mask)
            if "learn" in batch:
                counted = counted & batch["learn"].to(device)
            if not bool(counted.any()):
                continue
            weight = batch["weight"].to(device) if "weight" in batch else None
            loss = policy.head.loss(out, batch["target"].to(device), counted, weight)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            opt.step()
            if sched.last_epoch + 1 < total_steps:
                sched.step()
            n = int(counted.sum())
            total, seen = total + loss.item() * n, seen + n
        losses.append(total / max(seen, 1))
    return losses


def _train(source, batches, reference=False, epochs=2):
    pcfg = default_config("carracing", window=4, d_model=16)
    torch.manual_seed(0)
    policy = DrivingPolicy(pcfg)
    cfg = TrainConfig(epochs=epochs, batch_frames=8, seed=3, batches=batches)
    torch.manual_seed(1)  # dropout
    if reference:
        losses = _reference_fit(policy, source, cfg, epochs)
    else:
        report = TrainReport("t", {}, {}, "accuracy", True, "", 0, 0)
        fit(policy, source, None, cfg, epochs, report)
        losses = [m.train_loss for m in report.epochs]
    return {k: v.clone() for k, v in policy.state_dict().items()}, losses


def test_training_on_either_path_gives_the_weights_of_the_loop_before():
    source = _source(skip_stalls=True, standstills=0.5, weighted=True)
    ref_state, ref_losses = _train(source, "auto", reference=True)
    for batches in ("auto", "loader", "device"):  # auto is the loader on the CPU
        state, losses = _train(source, batches)
        assert losses == ref_losses, f"batches {batches}: the losses differ"
        differ = [k for k in ref_state if not torch.equal(ref_state[k], state[k])]
        assert not differ, f"batches {batches}: the weights differ in {differ}"
    # and the check can fail: another seed of the data trains other weights
    other, _ = _train(_source(skip_stalls=True, standstills=0.5, weighted=True, seed=1), "device")
    assert any(not torch.equal(ref_state[k], other[k]) for k in ref_state)


def test_one_ahead_keeps_every_batch_in_order_and_takes_the_next_first():
    taken = []

    def source():
        for i in range(4):
            taken.append(i)
            yield i

    got = []
    for b in tb.one_ahead(source()):
        got.append(b)
        assert taken[-1] == min(b + 1, 3)  # the next batch was taken before this one is used
    assert got == [0, 1, 2, 3] and list(tb.one_ahead(iter([]))) == []


def test_auto_takes_the_device_on_cuda_when_the_data_fit(monkeypatch):
    source = _source()
    need = tb.data_bytes(source)
    assert need >= sum(LENGTHS) * 96 * 96 * 3
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * need, 8 * need))
    path, why = tb.choose_path(source, torch.device("cuda"), "auto", 0.5)
    assert path == "device" and "Fake GPU" in why
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (need, 8 * need))
    path, why = tb.choose_path(source, torch.device("cuda"), "auto", 0.5)
    assert path == "loader" and "exceed 50%" in why
    assert tb.choose_path(source, torch.device("cuda"), "auto", 1.0)[0] == "device"
    assert tb.choose_path(source, torch.device("cuda"), "loader")[0] == "loader"
    assert tb.choose_path(source, torch.device("cuda"), "auto", distributed=True)[0] == "loader"
    assert tb.choose_path(source, torch.device("cpu"), "auto")[0] == "loader"  # the CPU keeps the loader
    assert tb.choose_path(source, torch.device("cpu"), "device")[0] == "device"


def test_the_device_path_refuses_what_it_cannot_hold():
    udacity = UdacitySource([])
    assert tb.choose_path(udacity, torch.device("cpu"), "auto")[0] == "loader"
    with pytest.raises(ValueError, match="CarRacing frames"):
        tb.choose_path(udacity, torch.device("cpu"), "device")
    with pytest.raises(ValueError, match="torchrun"):
        tb.choose_path(_source(), torch.device("cpu"), "device", distributed=True)
    with pytest.raises(ValueError, match="batches must be one of"):
        tb.choose_path(_source(), torch.device("cpu"), "gpu")
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        tb.choose_path(_source(), torch.device("cpu"), "auto", 0.0)
    with pytest.raises(ValueError, match="batches must be one of"):
        TrainConfig(batches="gpu")


def test_the_train_options_are_declared_and_leave_the_resolved_config_as_it_was(capsys):
    from agent.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["train", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--train.batches" in out and "--train.device-share" in out and "free GPU memory" in " ".join(out.split())
    text = to_toml(TrainRun(data=("x",)).resolved())
    assert "batches" not in text and "device_share" not in text  # recipes' stages keep matching their runs
    with pytest.raises(ConfigError, match="train.batches"):
        TrainSection(batches="gpu")
    with pytest.raises(ConfigError, match="train.device_share"):
        TrainSection(device_share=1.5)
    with pytest.raises(ConfigError, match="Udacity"):
        TrainRun(env="udacity", data=("x",), train=TrainSection(batches="device")).check()
    from agent.cli.train import _train_config

    run = TrainRun(data=("x",), device="cpu", train=TrainSection(batches="device", device_share=0.25)).resolved()
    cfg = _train_config(run)
    assert (cfg.batches, cfg.device_share) == ("device", 0.25)
    assert (_train_config(TrainRun(data=("x",), device="cpu").resolved()).batches) == "auto"


def test_bench_train_prints_the_loop_and_compute_rates(tmp_path, capsys):
    path = tmp_path / "train.json"
    args = ["bench", "train", "--device", "cpu", "--frames", "40", "--steps", "2", "--warmup", "1",
            "--batch-frames", "8", "--threads", "1", "--data", "device", "loader", "--json", str(path)]
    capsys.readouterr()
    rc, err = run_cli(args, capsys)
    assert rc == 0, err
    rows = json.loads(path.read_text())
    assert [(r["data"], r["path"]) for r in rows] == [("device", "device"), ("loader", "loader")]
    for r in rows:
        assert r["loop_fps"] > 0 and r["compute_fps"] > 0 and r["threads"] == 1 and r["batch_frames"] == 8
        assert r["ratio"] == pytest.approx(r["loop_fps"] / r["compute_fps"])
        assert r["device"] == "cpu" and r["torch"] == torch.__version__
    rc, err = run_cli(args, capsys)
    assert rc == 2 and "already exists" in err


def test_bench_train_prints_a_table(capsys):
    from agent.cli import main

    assert main(["bench", "train", "--device", "cpu", "--frames", "40", "--steps", "1", "--warmup", "0",
                 "--batch-frames", "8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "| threads | data (taken)" in out and "loop frames/s" in out and "compute frames/s" in out
    assert "| 1 | auto -> loader |" in out  # auto keeps the loader on the CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_bench_train_on_cuda_without_a_gpu_is_a_user_error(capsys):
    rc, err = run_cli(["bench", "train", "--device", "cuda", "--frames", "40", "--steps", "1"], capsys)
    assert rc == 2 and "sees no CUDA GPU" in err and "Traceback" not in err


@pytest.mark.parametrize("args,message", [(["--frames", "0"], "--frames"), (["--threads", "-1"], "--threads"),
                                          (["--device", "tpu"], "device must be"),
                                          (["--core", "nope"], "unknown core")])
def test_bench_train_refuses_bad_options(args, message, capsys):
    rc, err = run_cli(["bench", "train", "--device", "cpu", *args], capsys)
    assert rc == 2 and message in err, err
