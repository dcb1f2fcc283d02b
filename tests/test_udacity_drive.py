"""drive --env udacity: the runner, the overlays and the bridge together, against the wire-level fake simulator."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"

import socket
import threading

import numpy as np
import pytest

from agent.drive.config import DriveConfig, parse_drive_args
from agent.drive.session import DriveSession, run_drive


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


@pytest.fixture(scope="module")
def policy():
    from agent.nn.policy import DrivingPolicy, default_config

    return DrivingPolicy(default_config("udacity", window=4, d_model=40, seed=1,
                                        core_kwargs={"num_heads": 4, "topk": 8, "sparsity": 0.5})).eval()


@pytest.fixture
def same_policy(monkeypatch, policy, tmp_path):
    import agent.drive.session  # run_drive loads the policy through these names

    monkeypatch.setattr(agent.drive.session, "load_policy", lambda name, device="cpu": policy)
    monkeypatch.setattr(agent.drive.session, "resolve_policy_path", lambda name: tmp_path / "udacity-tiny.pt")
    return policy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_drive_udacity_steers_the_fake_simulator_with_overlays(same_policy):
    from envs.udacity.fake import FakeSimulator

    s = DriveSession(_parse("--env", "udacity", "--headless", "--udacity.port", "0", "--max-steps", "25"), same_policy,
                     "udacity-tiny.pt", headless=True, force_draw=True)
    sim = FakeSimulator(s.env.unwrapped.port, autoreply=True)
    timer = threading.Timer(0.2, sim.connect)
    timer.start()
    try:
        how, _, steps = s.play_episode(0, 1)
        assert how == "done" and steps == 25
        assert sim.wait_for(lambda counts: counts["steer"] >= 25, timeout=5)
        # what the simulator received is the policy's steering on the frames it sent
        last = sim.next_event("steer")
        assert -1.0 <= float(last["steering_angle"]) <= 1.0
        assert s.overlays.saliency is not None and s.overlays.panel is not None
        assert len(s.overlays.history) == 25
        assert s.renderer.steering and s.renderer.size[0] > 640
        assert s.overlays.saliency.kind == "steering"
    finally:
        timer.cancel()
        sim.close()
        s.close()
    assert not s.overlays.saliency.hooks  # released


def test_drive_udacity_records_and_dumps(same_policy, tmp_path, capsys):
    from agent.drive.traces import load_traces
    from envs.udacity.fake import FakeSimulator

    port = _free_port()
    sim = FakeSimulator(port, autoreply=True)

    def connect_when_up():
        for _ in range(100):
            try:
                sim.connect()
                return
            except OSError:
                threading.Event().wait(0.05)

    t = threading.Thread(target=connect_when_up, daemon=True)
    t.start()
    video, traces = tmp_path / "u.mp4", tmp_path / "u.npz"
    try:
        code = run_drive(_parse("--env", "udacity", "--udacity.port", str(port), "--headless", "--max-steps", "15",
                                "--record", str(video), "--dump-traces", str(traces)))
        sent = [float(sim.next_event("steer", timeout=2)["steering_angle"]) for _ in range(15)]
    finally:
        sim.close()
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"serving ws://127.0.0.1:{port}" in out and "Autonomous mode" in out
    assert video.stat().st_size > 0
    d = load_traces(traces)
    assert d["phi"].shape[0] == 15 and set(np.unique(d["action_class"])) <= {0, 1, 2}
    assert list(d["class_names"]) == ["straight", "left", "right"]
    assert np.all(np.abs(d["action"]) <= 1.0)
    np.testing.assert_allclose(sent, d["action"], atol=1e-4)  # the simulator got the policy's steering
    assert np.all(np.diff(d["time_s"]) > 0)  # frame arrival times, seconds
    assert d["cam"].shape == (15, 160, 320) and d["cam"].dtype == np.float32  # Grad-CAM at the camera's resolution
    assert not {"speed", "off_road", "off_road_steps", "longest_standstill_steps"} & set(d)  # no wheels, mph only
    assert "off-road" not in out and "standstill" not in out


def test_drive_udacity_without_simulator_times_out_clearly(same_policy, capsys):
    code = run_drive(_parse("--env", "udacity", "--udacity.port", "0", "--headless", "--udacity.connect-timeout", "0.3"))
    err = capsys.readouterr().err
    assert code == 2 and "simulator" in err.lower() and "Traceback" not in err


def test_policy_for_the_other_simulator_is_refused(same_policy, capsys):
    code = run_drive(_parse("--env", "carracing", "--headless", "--max-steps", "2"))
    assert code == 2 and "--env udacity" in capsys.readouterr().err


def test_bench_bridge_rows_with_policy_and_overlays(same_policy, capsys):
    from agent.cli import main

    assert main(["bench", "bridge", "--policy", "tiny.pt", "--n", "12", "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if "|" in line and "ms" not in line]
    labels = [line.split("|")[0].strip() for line in rows]
    assert labels == ["bridge only", "policy", "policy + overlays"]
    assert not same_policy.saliency_layer()._forward_hooks  # the overlays' Grad-CAM hooks were released
