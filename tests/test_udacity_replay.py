"""drive --env udacity --replay DIR: a recording played as the simulator through the bridge, the policy
scored against the driver (tiny recordings written by the tests, tests/udacity_fixture.py)."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"

import re

import numpy as np
import pytest

from agent.data.udacity import load_recording
from agent.eval.steering import intent_scores
from tests.cli_run import run_cli
from udacity_fixture import write_recording

#: 20 frames at ~14 Hz in two sessions (a 1.5 s gap after frame 10): a left curve, straight, a right curve
N = 20
GAPS_MS = [70, 68, 72, 70, 66, 74, 70, 69, 71, 1500, 70, 72, 68, 70, 71, 69, 70, 73, 67]
STEERING = [-0.3, -0.2, -0.4, 0.0, -0.3, -0.25, 0.0, 0.0, 0.0, 0.0,
            0.0, 0.0, 0.1, 0.3, 0.0, 0.35, 0.2, 0.3, 0.25, 0.0]


@pytest.fixture
def recording(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=N, gaps_ms=GAPS_MS, steering=STEERING)
    return root


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    """An untrained udacity policy (NAC-Exact over 4 frames with their times) saved as a real file."""
    from agent.nn.policy import DrivingPolicy, default_config

    policy = DrivingPolicy(default_config("udacity", window=4, d_model=40, seed=1,
                                          core_kwargs={"num_heads": 4, "topk": 8, "sparsity": 0.5})).eval()
    return policy.save(tmp_path_factory.mktemp("policy") / "udacity-tiny.pt")


def _stream(policy_file, frames, times) -> np.ndarray:
    """The policy's steering streamed over ``frames`` with ``times`` as its time input (no bridge)."""
    from agent.actors.loading import load_policy
    from agent.actors.rollout import PolicyActor

    actor = PolicyActor(load_policy(policy_file))
    return np.array([float(actor.act(f, None, {"time_s": float(t)}).action[0]) for f, t in zip(frames, times)])


def _summary_values(out: str) -> dict:
    num = r"(-?[0-9.]+|-)"
    pats = {"smoothed_mse": rf"intent \(labels averaged over ±0.5 s\): MSE {num}",
            "smoothed_ratio": rf"smoothed ratio {num}", "smoothed_zero_mse": rf"predict-0 MSE {num}",
            "smoothed_corr": rf"Pearson r {num}", "right_way": rf"turned the right way {num}",
            "right_way_left": rf"\(left {num},", "right_way_right": rf", right {num}\); mean",
            "curve_mean_abs_pred": rf"mean \|steering\| {num} against", "curve_mean_abs_label": rf"the driver's {num}$",
            "n_curve": r"\|smoothed\| > 0.05: (\d+),", "n_left": r"(\d+) left", "n_right": r"(\d+) right\)",
            "straight_error_share": rf"where the error lies: {num} of it on straight frames",
            "straight_mean_abs_pred": rf"\|steering\| there {num}\)",
            "curve_signed_excess": rf"exceeds the driver's by ([+-][0-9.]+|-) on average"}
    found = {}
    for key, pat in pats.items():
        m = re.search(pat, out, re.M)
        assert m, f"{key} not in the summary:\n{out}"
        found[key] = float("nan") if m.group(1) == "-" else float(m.group(1))
    return found


def test_replay_end_to_end_summary_equals_agent_eval_steering(recording, policy_file, tmp_path, capsys):
    from agent.cli import main
    from agent.drive.traces import load_traces

    traces = tmp_path / "t.npz"
    capsys.readouterr()
    rc = main(["drive", "--env", "udacity", "--replay", str(recording), "--policy", str(policy_file), "--headless",
               "--dump-traces", str(traces)])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 0, captured.err
    assert "Traceback" not in captured.err
    assert f"replaying {recording} ({N} frames) as the simulator on ws://127.0.0.1:" in out
    # every recorded frame went over the bridge, and the policy answered each one
    assert f"{N} sent over the bridge, {N} answered by the policy;" in out and "sent again" not in out
    assert re.search(r"answered by the policy; [0-9.]+ FPS", out)

    rec = load_recording(recording, progress=False)  # the recording as agent evaluate reads it
    assert len(rec) == N and len(rec.segments) == 2
    # what the policy answered: the same frames, in order, with their capture times as its time input
    expected = _stream(policy_file, rec.frames_center, rec.timestamps)
    d = load_traces(traces)
    np.testing.assert_allclose(d["action"].reshape(-1), expected, atol=1e-5)
    assert not np.allclose(expected, _stream(policy_file, rec.frames_center, np.arange(N) * 0.001), atol=1e-4), \
        "the policy ignores its time input: the check above could not tell capture times from arrival times"

    # the summary holds agent.eval.steering's scores of the steering sent (six decimals on the wire)
    want = intent_scores(np.round(expected, 6), rec.steering, rec.timestamps, segments=rec.segments)["scores"]
    got = _summary_values(out)
    assert want["n_curve"] > 0 and want["n_left"] > 0 and want["n_right"] > 0
    for key, value in got.items():
        if np.isnan(want[key]):
            assert np.isnan(value), key
        else:
            assert value == pytest.approx(want[key], abs=6e-5), key


def test_replay_simulator_sends_every_frame_as_recorded(recording):
    """The bridge env gets the recording's frames and telemetry, in order and pixel for pixel, and the
    simulator keeps the steering that answered each; after the last it hangs up."""
    from agent.drive.replay import ReplayClock, load_replay
    from envs.udacity.env import UdacityEnv
    from envs.udacity.replay import ReplaySimulator

    rec = load_recording(recording, progress=False)
    replay = load_replay(recording)
    assert len(replay) == N and np.array_equal(replay.timestamps, rec.timestamps)
    env = UdacityEnv(port=0, connect_timeout=5, step_timeout=5)
    env.start()
    clock = ReplayClock(env, replay)
    sim = ReplaySimulator(env.port, replay.images, replay.steering, replay.throttle, replay.speed)
    sent = [0.01 * k - 0.1 for k in range(N)]
    try:
        sim.connect()
        obs, info = clock.reset()
        for k in range(N):
            assert np.array_equal(obs, rec.frames_center[k]), k
            assert info["replay_frame"] == k and info["time_s"] == pytest.approx(rec.timestamps[k])
            assert info["driver_steering"] == pytest.approx(rec.steering[k])
            assert info["steering_angle_deg"] == pytest.approx(25.0 * rec.steering[k], abs=1e-4)
            assert info["speed_mph"] == pytest.approx(rec.speed[k], abs=1e-4)
            obs, _, terminated, truncated, info = clock.step(np.array([sent[k]], np.float32))
            assert not terminated and truncated == (k == N - 1), k
        assert info["truncated_reason"] == "disconnected"
        assert sim.wait(5)
    finally:
        sim.close()
        clock.close()
    assert sim.frames_sent == N and sim.answered == N and sim.resent == 0
    np.testing.assert_allclose(sim.answers, np.float32(sent), atol=1e-6)
    assert sim.counts["steer"] == N


def test_replay_session_hud_shows_the_running_scores(recording, policy_file):
    """With the HUD drawn, each step shows the driver's label and the scores so far; over the whole
    replay the running scores equal the final ones."""
    from agent.actors.loading import load_policy
    from agent.drive.config import parse_drive_args
    from agent.drive.replay import final_scores, load_replay
    from agent.drive.session import DriveSession

    replay = load_replay(recording)
    cfg = parse_drive_args(["--env", "udacity", "--replay", str(recording), "--headless"])
    s = DriveSession(cfg, load_policy(policy_file), "udacity-tiny.pt", headless=True, force_draw=True, replay=replay)
    views = []
    s.renderer.panels.append(lambda surface, view: views.append(view))  # every view drawn
    try:
        assert s.run() == 0
        lines = s.replay_summary()
    finally:
        s.close()
    assert len(views) == N
    assert [v.driver_steering for v in views] == pytest.approx(list(replay.steering))
    assert views[0].notes[0].startswith(f"replay rec: frame 1/{N}")
    assert views[-1].notes[0].startswith(f"replay rec: frame {N}/{N}") and "ratio" in views[-1].notes[1]
    # the steering the HUD scored is what the simulator received (six decimals on the wire) ...
    np.testing.assert_allclose(s.replay_sim.answers, s.replay_score.pred, atol=1e-6)
    # ... and at the end of the replay its running scores are the per-recording function's
    run, final = s.replay_score.running(), final_scores(s.replay_score.pred, replay)
    assert run["n"] == N
    assert run["ratio"] == pytest.approx(final["smoothed_ratio"], abs=1e-12)
    assert run["r"] == pytest.approx(final["smoothed_corr"], abs=1e-12)
    assert (run["share"], run["left_share"], run["right_share"], run["n_curve"]) == pytest.approx(
        (final["right_way"], final["right_way_left"], final["right_way_right"], final["n_curve"]), nan_ok=True)
    assert (run["abs_pred"], run["abs_label"]) == pytest.approx(
        (final["curve_mean_abs_pred"], final["curve_mean_abs_label"]), abs=1e-12)
    assert f"{N} answered by the policy" in lines[0]


@pytest.mark.parametrize("case, message", [
    ("missing", "no such folder"),
    ("empty", "no driving_log.csv in it"),
    ("no-img", "no IMG/ folder beside driving_log.csv"),
    ("no-center", "lists no frame with a usable center image (row 1: missing image IMG/center_"),
])
def test_replay_bad_folder_is_one_line(case, message, tmp_path, policy_file, capsys):
    import shutil

    folder = tmp_path / "rec"
    if case != "missing":
        folder.mkdir()
    if case in ("no-img", "no-center"):
        write_recording(folder, n=3)
        if case == "no-img":
            shutil.rmtree(folder / "IMG")
        else:
            for p in (folder / "IMG").glob("center_*.jpg"):
                p.unlink()
    rc, err = run_cli(["drive", "--env", "udacity", "--replay", str(folder), "--policy", str(policy_file),
                       "--headless"], capsys)
    assert rc == 2
    assert message in err and "Traceback" not in err, err
    assert err.startswith(f"drive: error: --replay {folder}: ")
    assert "driving_log.csv" in err and ("IMG/" in err)  # how to fix it


def test_replay_options_that_do_not_go_together(recording, capsys):
    rc, err = run_cli(["drive", "--replay", str(recording), "--headless"], capsys)
    assert rc == 2 and "--replay plays a Udacity simulator recording; add --env udacity" in err
    rc, err = run_cli(["drive", "--env", "udacity", "--replay", str(recording), "--episodes", "2"], capsys)
    assert rc == 2 and "--replay plays the recording once" in err


def test_replay_cut_short_scores_the_frames_answered(recording, policy_file, capsys):
    """--max-steps stops the replay early: the frame in flight was sent but not answered, and the summary
    scores the answered frames only."""
    from agent.cli import main

    capsys.readouterr()
    assert main(["drive", "--env", "udacity", "--replay", str(recording), "--policy", str(policy_file), "--headless",
                 "--max-steps", "7", "--no-overlay"]) == 0
    out = capsys.readouterr().out
    assert "8 sent over the bridge, 7 answered by the policy;" in out
    rec = load_recording(recording, progress=False)
    expected = _stream(policy_file, rec.frames_center[:7], rec.timestamps[:7])
    want = intent_scores(np.round(expected, 6), rec.steering[:7], rec.timestamps[:7])["scores"]
    assert _summary_values(out)["smoothed_mse"] == pytest.approx(want["smoothed_mse"], abs=6e-5)
