"""The runner's env worker (``drive --env-worker``) and its frame pacer: the same episodes as the
env stepped in this process, the choice of when to use it, and a pacer that holds the mean rate."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"  # never open a window in tests
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


import numpy as np
import pytest

from agent.drive.config import DriveConfig, parse_drive_args
from agent.drive.envworker import EnvWorker, use_env_worker
from agent.drive.window import FramePacer


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


# ------------------------------------------------------------------------------- the worker
@pytest.mark.parametrize("continuous", [False, True])
def test_worker_gives_the_in_process_episode(continuous):
    from agent.actors.rollout import all_wheels_off_road
    from agent.actors.vector import CarRacingEnvs
    from envs.carracing import car_speed, make_carracing

    rng = np.random.default_rng(3)
    n = 60
    actions = (rng.integers(0, 5, n) if not continuous else
               rng.uniform(-1, 1, (n, 2)).astype(np.float32))
    local = make_carracing(continuous=continuous)
    worker = EnvWorker(CarRacingEnvs(1, continuous=continuous))
    try:
        assert worker.observation_space == local.observation_space and worker.action_space == local.action_space
        assert worker.metadata["render_fps"] == local.metadata["render_fps"]
        obs_l, _ = local.reset(seed=1234)
        obs_w, info_w = worker.reset(seed=1234)
        np.testing.assert_array_equal(obs_w, obs_l)
        assert info_w["speed"] == pytest.approx(car_speed(local))
        for a in actions:
            worker.step_async(a)  # in flight while the local env steps
            r_l = local.step(a)
            obs, reward, term, trunc, info = worker.step_wait()
            np.testing.assert_array_equal(obs, r_l[0])
            assert (reward, term, trunc) == (pytest.approx(r_l[1]), r_l[2], r_l[3])
            assert info["speed"] == pytest.approx(car_speed(local)) and info["off_road"] == all_wheels_off_road(local)
        # a new episode while a step is in flight: the step is collected first, then the reset
        worker.step_async(actions[0])
        obs_w, _ = worker.reset(seed=99)
        np.testing.assert_array_equal(obs_w, local.reset(seed=99)[0])
    finally:
        worker.close()
        local.close()


def test_worker_refuses_out_of_order_calls():
    from agent.actors.vector import CarRacingEnvs

    with pytest.raises(ValueError, match="one env"):
        EnvWorker(CarRacingEnvs(2))
    worker = EnvWorker(CarRacingEnvs(1))
    try:
        worker.reset(seed=1)
        with pytest.raises(RuntimeError, match="no step in flight"):
            worker.step_wait()
        worker.step_async(0)
        with pytest.raises(RuntimeError, match="already in flight"):
            worker.step_async(0)
        assert worker.step_wait()[0].shape == (96, 96, 3)
    finally:
        worker.close()


@pytest.mark.parametrize("choice,env,expert,draws,cpus,use", [
    ("auto", "carracing", False, True, 2, True),
    ("auto", "carracing", False, False, 2, False),   # nothing drawn: nothing to overlap
    ("auto", "carracing", False, True, 1, False),    # one CPU
    ("auto", "carracing", True, True, 2, False),     # the expert reads the env in this process
    ("auto", "udacity", False, True, 2, False),
    ("on", "carracing", False, False, 1, True),
    ("off", "carracing", False, True, 8, False),
])
def test_when_the_worker_is_used(choice, env, expert, draws, cpus, use):
    got, why = use_env_worker(choice, env, expert, draws, cpus)
    assert got is use and why


def test_worker_on_where_it_cannot_be_is_an_error():
    with pytest.raises(ValueError, match="expert"):
        use_env_worker("on", "carracing", True, True, 2)
    with pytest.raises(ValueError, match="Udacity"):
        use_env_worker("on", "udacity", False, True, 2)
    with pytest.raises(ValueError, match="--env-worker must be one of"):
        use_env_worker("sometimes", "carracing", False, True, 2)


def test_drive_with_and_without_the_worker_drives_the_same_episode(tmp_path, capsys):
    from agent.drive.session import run_drive
    from agent.nn.policy import DrivingPolicy, default_config

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    path = DrivingPolicy(default_config("carracing", window=4)).save(tmp_path / "tiny.pt")
    lines = {}
    for choice in ("on", "off"):
        code = run_drive(_parse("--policy", str(path), "--headless", "--max-steps", "40", "--env-worker", choice,
                                "--record", str(tmp_path / f"{choice}.mp4")))
        out = capsys.readouterr().out
        assert code == 0
        assert ("env in a worker process" in out) is (choice == "on")
        ep = next(line for line in out.splitlines() if line.startswith("episode 1/1"))
        lines[choice] = ep.split("mean FPS")[0], ep.split("mean FPS")[1].split(None, 1)[1]
    assert lines["on"] == lines["off"]  # return, steps, standstill and off-road figures


# -------------------------------------------------------------------------------- the pacer
class _FakeTime:
    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s


def _run(pacer: FramePacer, t: _FakeTime, frame_seconds) -> float:
    start = t.now
    for dt in frame_seconds:
        t.now += dt  # the loop's own work
        pacer.wait()
    return len(frame_seconds) / (t.now - start)


def test_pacer_holds_the_mean_rate_when_frames_vary():
    t = _FakeTime()
    frames = np.random.default_rng(0).uniform(0.012, 0.026, 500)  # mean 19 ms, many over 20 ms
    assert frames.mean() < 0.02 and (frames > 0.02).mean() > 0.3
    fps = _run(FramePacer(50, clock=t.clock, sleep=t.sleep), t, frames)
    assert fps == pytest.approx(50, abs=0.2)
    # what padding each frame to the period from the last tick gives (pygame's Clock.tick): slower
    padded = len(frames) / np.maximum(frames, 0.02).sum()
    assert padded < 48


def test_pacer_never_goes_faster_than_the_rate():
    t = _FakeTime()
    assert _run(FramePacer(50, clock=t.clock, sleep=t.sleep), t, [0.001] * 200) == pytest.approx(50, rel=1e-3)


def test_pacer_does_not_race_after_a_stall():
    t = _FakeTime()
    pacer = FramePacer(50, max_behind_frames=2, clock=t.clock, sleep=t.sleep)
    _run(pacer, t, [0.001] * 10)
    t.now += 1.0  # a one-second stall (the window dragged)
    pacer.wait()
    before = t.now
    _run(pacer, t, [0.001] * 10)
    # at most two frames come early to make up; the other eight are paced
    assert t.now - before >= 8 * 0.02 - 1e-9


def test_pacer_rejects_bad_rates():
    with pytest.raises(ValueError, match="fps > 0"):
        FramePacer(0)
    with pytest.raises(ValueError, match="max_behind_frames"):
        FramePacer(50, max_behind_frames=-1)


def test_pacer_started_early_makes_up_a_slow_first_frame():
    frames = [0.050] + [0.012] * 99  # the first frame (first Grad-CAM, first drawing) 30 ms late
    t = _FakeTime()
    late_start = _run(FramePacer(50, clock=t.clock, sleep=t.sleep), t, frames)
    t = _FakeTime()
    pacer = FramePacer(50, clock=t.clock, sleep=t.sleep)
    pacer.start()  # the schedule runs from the first frame's start, not from its end
    started = _run(pacer, t, frames)
    assert started == pytest.approx(50, rel=1e-6)
    assert late_start < 49.9  # without start() the first frame's 50 ms count in full


def test_quiet_gc_freezes_what_is_alive_and_close_unfreezes(tmp_path):
    import gc

    from agent.drive.session import DriveSession, quiet_gc
    from agent.nn.policy import DrivingPolicy, default_config

    torch = pytest.importorskip("torch")
    try:
        quiet_gc()
        assert gc.get_freeze_count() > 1000  # torch, gymnasium, ... no longer traversed by collections
        before = gc.get_freeze_count()
        quiet_gc()  # idempotent: nothing new worth speaking of
        assert gc.get_freeze_count() >= before
    finally:
        gc.unfreeze()
    torch.manual_seed(0)
    policy = DrivingPolicy(default_config("carracing", window=4))
    session = DriveSession(_parse("--headless", "--max-steps", "5", "--episodes", "1", "--env-worker", "off"),
                           policy, "tiny", headless=True)
    try:
        assert session.run() == 0
        assert gc.get_freeze_count() > 0  # the run froze the heap
    finally:
        session.close()
    assert gc.get_freeze_count() == 0
    assert session.episode_fps > 0
