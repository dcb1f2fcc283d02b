""""No stalls" figures (longest standstill, steps off the road) in rollouts, ``agent evaluate`` and
``drive`` (HUD, printed lines, ``--dump-traces``), the continuous expert actor, and the Grad-CAM
maps of ``--dump-traces`` with :func:`agent.drive.saliency.bottom_share`."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import json
import re

import numpy as np
import pytest
import torch

from agent.drive.config import DriveConfig, parse_drive_args
from agent.drive.session import run_drive
from agent.actors.rollout import (STALL_STEPS, Decision, Episode, ExpertActor, StallMeter, all_wheels_off_road, longest_run,
                           rollout, standstill)
from envs.carracing import STANDSTILL_SPEED


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


def _episode(speeds, off_road=None) -> Episode:
    n = len(speeds) - 1
    return Episode(0, None, np.zeros(n, np.int64), None, np.zeros(n, np.float32), np.zeros(n, bool),
                   np.zeros(n, bool), np.asarray(speeds, np.float32),
                   None if off_road is None else np.asarray(off_road, bool))


# ----------------------------------------------------------------------------- the measurements
def test_longest_run_and_standstill():
    assert longest_run([]) == 0 and longest_run([False, False]) == 0
    assert longest_run([True]) == 1 and longest_run([True, True, False, True]) == 2
    assert longest_run([False, True, True, True, False, True, True]) == 3
    assert longest_run(np.ones(7, bool)) == 7
    with pytest.raises(ValueError, match="1-D"):
        longest_run(np.ones((2, 2), bool))
    np.testing.assert_array_equal(standstill([0.0, 0.99, STANDSTILL_SPEED, 5.0, np.nan]),
                                  [True, True, False, False, False])


def test_episode_figures_on_a_synthetic_episode():
    # speeds at the reset and after each of 10 steps: standstill after steps 1-2 and 5-8 (4 in a row)
    speeds = [0.0, 0.2, 0.5, 3.0, 8.0, 0.9, 0.0, 0.1, 0.3, 2.0, 0.0]
    off = [0, 0, 1, 1, 0, 0, 0, 1, 0, 0]
    ep = _episode(speeds, off)
    assert ep.longest_standstill == 4 and ep.off_road_steps == 3
    # the reset speed does not count: a car that moves from the first step never stood still
    assert _episode([0.0, 2.0, 3.0]).longest_standstill == 0
    # an env without wheels or speed reports None, not a number
    no_env = _episode([np.nan] * 4)
    assert no_env.off_road_steps is None and no_env.longest_standstill is None
    with pytest.raises(ValueError, match="off_road"):
        _episode([0.0, 1.0, 2.0], [0, 0, 0])
    with pytest.raises(ValueError, match="speeds"):
        Episode(0, None, np.zeros(2, np.int64), None, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), np.zeros(2))


def test_stall_meter_agrees_with_the_episode():
    rng = np.random.default_rng(0)
    speeds = np.concatenate([[0.0], rng.choice([0.0, 0.5, 3.0, 20.0], 200)]).astype(np.float32)
    off = rng.random(200) < 0.3
    ep = _episode(speeds, off)
    m = StallMeter()
    for v, o in zip(speeds[1:], off):
        m.update(float(v), bool(o))
    assert (m.longest_standstill, m.off_road_steps, m.steps) == (ep.longest_standstill, ep.off_road_steps, 200)
    still = standstill(speeds[1:])
    trailing = len(still) - (np.flatnonzero(~still)[-1] + 1) if not still.all() else len(still)
    assert m.standstill_run == trailing
    m.reset()
    m.update(float("nan"), None)  # Udacity: no speed in simulator units, no wheels
    assert m.longest_standstill is None and m.off_road_steps is None


class _Teleport:
    """Stands still for 10 steps, is moved 40 units off the road before step 6, then gasses."""

    label, has_probs, traces_reason = "teleport", False, None

    def reset(self):
        self.n = 0

    def act(self, obs, env, info=None):
        self.n += 1
        if self.n == 6:
            car = env.unwrapped.car
            x, y = car.hull.position
            r = float(np.hypot(x, y))
            for b in (car.hull, *car.wheels):
                b.position = (b.position[0] + 40 * x / r, b.position[1] + 40 * y / r)
        return Decision(3 if self.n > 10 else 0, 0)


def test_rollout_measures_off_road_and_standstill_in_carracing():
    from envs.carracing import make_carracing

    env = make_carracing(render_pixels=False, max_episode_steps=20)
    try:
        ep = rollout(env, _Teleport(), 1_000_000, keep_frames=False)
        assert all_wheels_off_road(env) is True
    finally:
        env.close()
    np.testing.assert_array_equal(ep.off_road, [False] * 5 + [True] * 15)
    assert ep.off_road.dtype == bool and ep.off_road_steps == 15
    # on the road every wheel touches a tile; 40 units off, none does (all four off is not "on the edge")
    np.testing.assert_array_equal(ep.wheels_off, [0] * 5 + [4] * 15)
    assert ep.edge_steps == 0
    # the car stood at the start, then was moved away: nearly every tile is still to be visited
    assert ep.tiles_missed is not None and ep.tiles_missed > 200
    assert ep.longest_standstill == 10  # no gas for 10 steps, then it moves
    assert np.all(ep.speeds[1:11] < STANDSTILL_SPEED) and np.all(ep.speeds[11:] >= STANDSTILL_SPEED)


def test_all_wheels_off_road_without_wheels_is_none():
    class NoCar:
        unwrapped = object()

    assert all_wheels_off_road(NoCar()) is None


# ----------------------------------------------------------------------------- wrong way
class _Gas:
    """Full gas from the start line; with ``turn`` the car is first turned round on the spot (the
    hull and its wheels rotated by 180 degrees about the hull's centre), so it drives the lap backwards."""

    label, has_probs, traces_reason = "gas", False, None

    def __init__(self, turn: bool):
        self.turn, self.n = turn, 0

    def reset(self):
        self.n = 0

    def act(self, obs, env, info=None):
        self.n += 1
        if self.turn and self.n == 1:
            car = env.unwrapped.car
            cx, cy = car.hull.position
            for b in (car.hull, *car.wheels):
                x, y = b.position
                b.position = (2 * cx - x, 2 * cy - y)
                b.angle = b.angle + np.pi
        return Decision(3, 0)


@pytest.mark.parametrize("turn", [False, True])
def test_rollout_counts_the_steps_driven_the_wrong_way(turn):
    from agent.actors.rollout import wrong_way
    from envs.carracing import WRONG_WAY_SPEED, make_carracing

    env = make_carracing(render_pixels=False, max_episode_steps=60)
    try:
        ep = rollout(env, _Gas(turn), 1_000_000, keep_frames=False)
        cos = env.unwrapped.track_direction_cosine
        last = wrong_way(env)
    finally:
        env.close()
    assert ep.wrong_way.dtype == bool and len(ep.wrong_way) == ep.steps == 60
    fast = ep.speeds[1:] >= WRONG_WAY_SPEED
    assert fast[-30:].all()  # 30 steps of gas take the car past the threshold either way
    if turn:  # backwards along the start straight: every step once it is fast enough
        assert ep.wrong_way_steps == int(np.count_nonzero(fast)) and ep.wrong_way_steps >= 30
        assert last is True and cos < -0.9
    else:
        assert ep.wrong_way_steps == 0 and last is False and cos > 0.9
    assert not ep.wrong_way[~fast].any()  # slower than the threshold is never "wrong way"


def test_wrong_way_without_a_track_is_none():
    from agent.actors.rollout import wrong_way

    class NoCar:
        unwrapped = object()

    assert wrong_way(NoCar()) is None
    with pytest.raises(ValueError, match="wrong_way has 2 entries"):
        Episode(seed=0, observations=None, actions=np.zeros(3, np.int64), labels=None, rewards=np.zeros(3, np.float32),
                terminations=np.zeros(3, bool), truncations=np.zeros(3, bool), speeds=np.zeros(4, np.float32),
                wrong_way=np.zeros(2, bool))


# ----------------------------------------------------------------------------- continuous expert, labels
class _FakeExpert:
    def __init__(self, action):
        self.action = action

    def act(self, env):
        return self.action


def test_expert_actor_continuous_and_discrete():
    d = ExpertActor(_FakeExpert(np.array([0.3, 0.5], np.float32))).act(None, None)
    assert isinstance(d.action, np.ndarray) and d.action.dtype == np.float32 and d.action.shape == (2,)
    np.testing.assert_allclose(d.action, [0.3, 0.5])
    assert d.action_class == 2  # steering right
    assert ExpertActor(_FakeExpert(np.array([-0.4, 1.0], np.float32))).act(None, None).action_class == 1
    assert ExpertActor(_FakeExpert(np.array([0.01, 0.0], np.float32))).act(None, None).action_class == 0
    d = ExpertActor(_FakeExpert(3)).act(None, None)
    assert d.action == 3 and d.action_class == 3 and isinstance(d.action, int)
    d = ExpertActor(_FakeExpert(np.int64(4))).act(None, None)
    assert d.action == 4 and isinstance(d.action, int)


def test_rollout_keeps_array_labels():
    from envs.carracing import make_carracing

    class Still:
        label, has_probs, traces_reason = "still", False, None

        def reset(self):
            pass

        def act(self, obs, env, info=None):
            return Decision(0, 0)

    env = make_carracing(render_pixels=False, max_episode_steps=5)
    try:
        cont = rollout(env, Still(), 0, keep_frames=False, labeler=lambda e: np.array([0.25, -0.5], np.float32))
        disc = rollout(env, Still(), 0, keep_frames=False, labeler=lambda e: np.int64(2))
    finally:
        env.close()
    assert cont.labels.shape == (5, 2) and cont.labels.dtype == np.float32
    np.testing.assert_allclose(cont.labels, [[0.25, -0.5]] * 5)
    assert disc.labels.shape == (5,) and disc.labels.dtype == np.int64 and set(disc.labels) == {2}


# ----------------------------------------------------------------------------- agent evaluate
def _constant_policy(path, action: int):
    """A tiny CarRacing policy that always picks ``action`` (its head outputs a constant logit)."""
    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    p = DrivingPolicy(default_config("carracing", window=2)).eval()
    last = p.head.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.zero_()
        last.bias[action] = 10.0
    return p.save(path)


@pytest.mark.parametrize("action, standing", [(0, True), (3, False)])  # nothing: never moves; gas: moves at once
def test_evaluate_json_has_the_stall_figures(tmp_path, capsys, action, standing):
    from agent.cli import main

    pol = _constant_policy(tmp_path / f"const{action}.pt", action)
    js = tmp_path / "eval.json"
    steps = STALL_STEPS + 6 if standing else 12
    rc = main(["evaluate", "--policy", str(pol), "--episodes", "1", "--track-seed", "1000000", "--max-steps",
               str(steps), "--workers", "1", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0
    res = json.loads(js.read_text())
    assert res["steps"] == [steps]
    assert res["longest_standstill_steps"] == [steps if standing else 0]
    assert res["off_road_steps"] == [0]  # it starts on the road and does not leave it so soon
    assert res["max_longest_standstill_steps"] == (steps if standing else 0)
    assert res["episodes_with_stall"] == int(standing) and res["mean_off_road_steps"] == 0.0
    assert res["standstill_speed"] == STANDSTILL_SPEED and res["stall_steps"] == STALL_STEPS
    line = [x for x in out.splitlines() if x.strip().startswith("seed 1000000")]
    assert len(line) == 1 and f"longest standstill {steps if standing else 0:4d} steps" in line[0]
    assert f"{int(standing)}/1 episodes stood still > {STALL_STEPS} steps" in out
    # a few steps from the start line leave most of the lap's tiles unvisited, and no lap finished
    assert res["tiles_missed"][0] > 100 and res["laps_finished"] == 0 and len(res["edge_steps"]) == 1
    assert f"tiles missed {res['tiles_missed'][0]:3d}" in line[0] and "0/1 finished" in out
    # it drives forward from the start line (or stands), never against the lap's direction
    assert res["wrong_way_steps"] == [0] and res["episodes_wrong_way"] == 0


# ----------------------------------------------------------------------------- drive
@pytest.fixture(scope="module")
def policy():
    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    return DrivingPolicy(default_config("carracing", window=4)).eval()


@pytest.fixture
def same_policy(monkeypatch, policy, tmp_path):
    import agent.drive.session  # run_drive loads the policy through these names

    monkeypatch.setattr(agent.drive.session, "load_policy", lambda name, device="cpu": policy)
    monkeypatch.setattr(agent.drive.session, "resolve_policy_path", lambda name: tmp_path / "tiny.pt")
    return policy


def _printed_stalls(out: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(r"longest standstill\s+(\d+) steps\s+off-road\s+(\d+) steps", out)]


def test_drive_dump_has_cam_and_stall_figures(same_policy, tmp_path, capsys):
    from agent.drive.saliency import bottom_share
    from agent.drive.traces import load_traces

    out = tmp_path / "t.npz"
    assert run_drive(_parse("--headless", "--max-steps", "8", "--episodes", "2", "--dump-traces", str(out))) == 0
    printed = capsys.readouterr().out
    d = load_traces(out)
    assert d["cam"].shape == (16, 96, 96) and d["cam"].dtype == np.float32
    assert np.all((d["cam"] >= 0) & (d["cam"] <= 1)) and d["cam"].reshape(16, -1).max(1).min() > 0
    assert d["speed"].shape == (16,) and d["speed"].dtype == np.float32
    assert d["off_road"].shape == (16,) and d["off_road"].dtype == bool
    np.testing.assert_array_equal(d["standstill"], d["speed"] < STANDSTILL_SPEED)
    np.testing.assert_array_equal(d["episodes"], [1, 2])
    # the dump's per-episode figures are the ones drive printed at the end of each episode
    assert _printed_stalls(printed) == list(zip(d["longest_standstill_steps"].tolist(), d["off_road_steps"].tolist()))
    # 8 steps from the start (--max-steps): the tiles not reached yet are not "missed"
    assert printed.count("lap cut short") == 2 and "tiles missed" not in printed
    for e in (1, 2):
        sel = d["episode"] == e
        assert d["longest_standstill_steps"][e - 1] == longest_run(d["speed"][sel] < STANDSTILL_SPEED)
        assert d["off_road_steps"][e - 1] == d["off_road"][sel].sum()
    assert 0.0 <= bottom_share(d["cam"]) <= 1.0


def test_drive_dump_cam_covers_only_the_cnn_region(same_policy, tmp_path, monkeypatch, capsys):
    """A CNN that sees rows 0..83 of the frame (the dashboard cropped): the dumped maps are 96 x 96 with
    zeros on the 12 dashboard rows, so none of the saliency is on the dashboard strip."""
    from agent.drive.saliency import DASHBOARD_ROWS, bottom_share
    from agent.drive.traces import load_traces

    monkeypatch.setattr(same_policy, "saliency_region", lambda hw: (0, hw[0] - DASHBOARD_ROWS, 0, hw[1]))
    out = tmp_path / "t.npz"
    assert run_drive(_parse("--headless", "--max-steps", "4", "--dump-traces", str(out))) == 0
    cam = load_traces(out)["cam"]
    assert cam.shape == (4, 96, 96)
    assert np.all(cam[:, -DASHBOARD_ROWS:] == 0) and cam[:, :-DASHBOARD_ROWS].max() > 0
    assert bottom_share(cam) == 0.0


def test_drive_no_saliency_dumps_no_cam(same_policy, tmp_path, capsys):
    from agent.drive.traces import load_traces

    out = tmp_path / "t.npz"
    assert run_drive(_parse("--headless", "--max-steps", "3", "--no-saliency", "--dump-traces", str(out))) == 0
    d = load_traces(out)
    assert "cam" not in d and d["phi"].shape[0] == 3 and d["off_road_steps"].tolist() == [0]


def test_saliency_switched_off_midway_leaves_nan_rows(tmp_path):
    from agent.drive.traces import TraceRecorder, load_traces, save_traces, step_traces

    class Inter:  # one head, two keys
        def __init__(self):
            t = torch.ones(1, 1, 1, 2)
            self.phi = self.omega = self.logits = self.weights = self.t_gate = t
            self.indices, self.valid, self.neurons = torch.tensor([[[[0, 1]]]]), torch.ones(1, 1, 1, 2, dtype=bool), {}

    rec = TraceRecorder()
    cam = np.full((96, 96), 0.5, np.float32)
    for i, c in enumerate((cam, None, cam)):
        rec.add(step_traces(Inter()), action=0, action_class=0, reward=0.0, episode=1, step=i + 1, time_s=i,
                speed=float(i), off_road=i == 2, cam=c)
    d = load_traces(save_traces(tmp_path / "x.npz", rec, action_names=(), class_names=()))
    assert np.isnan(d["cam"][1]).all() and np.all(d["cam"][[0, 2]] == 0.5)
    assert d["longest_standstill_steps"].tolist() == [1] and d["off_road_steps"].tolist() == [1]


def test_hud_shows_the_stall_figures():
    from agent.drive.hud import Renderer, StepView

    r = Renderer(scale=2, panel_width=0)
    frame = np.zeros((96, 96, 3), np.uint8)
    plain = r.compose(StepView(frame=frame)).copy()
    shown = r.compose(StepView(frame=frame, standstill_steps=7, longest_standstill=12, off_road_steps=3))
    a, b = r.pygame.surfarray.array3d(plain), r.pygame.surfarray.array3d(shown)
    assert (a != b).any()  # a line more in the HUD
    assert (a[:, :r.hud_rect.y] == b[:, :r.hud_rect.y]).all()  # the frame is untouched


# ----------------------------------------------------------------------------- bottom_share
def test_bottom_share():
    from agent.drive.saliency import DASHBOARD_ROWS, bottom_share

    assert DASHBOARD_ROWS == 12
    assert bottom_share(np.ones((96, 96))) == pytest.approx(12 / 96)
    bottom = np.zeros((96, 96))
    bottom[-3:, 10] = 1.0
    assert bottom_share(bottom) == 1.0 and bottom_share(bottom, rows=2) == pytest.approx(2 / 3)
    assert bottom_share(bottom, rows=0) == 0.0
    # a run is pooled by mass; maps holding NaN (Grad-CAM switched off) are skipped
    top = np.zeros((96, 96))
    top[0, :] = 1.0  # 96 units of mass at the top
    run = np.stack([bottom, top, np.full((96, 96), np.nan)])
    assert bottom_share(run) == pytest.approx(3 / 99)
    assert np.isnan(bottom_share(np.zeros((4, 96, 96))))
    with pytest.raises(ValueError, match="rows"):
        bottom_share(np.ones((96, 96)), rows=97)
    with pytest.raises(ValueError, match="shape"):
        bottom_share(np.ones(96))
    with pytest.raises(ValueError, match="negative"):
        bottom_share(-np.ones((16, 16)))


# ------------------------------------------------------------------ the expert's stalls left out of the loss
def _still_episode(n_moving=3, n_still=4, seed=0):
    """Frames that change for ``n_moving`` steps, then repeat (only the dashboard strip flickers)."""
    rng = np.random.default_rng(seed)
    moving = rng.integers(0, 256, (n_moving, 96, 96, 3), dtype=np.uint8)
    still = np.repeat(moving[-1:], n_still, axis=0)
    still[:, 90:] = rng.integers(0, 256, (n_still, 6, 96, 3), dtype=np.uint8)  # the strip may change at rest
    return np.concatenate([moving, still])


def test_expert_stalls_are_still_frames_labelled_other_than_gas():
    from agent.data.windows import CARRACING_GAS, expert_stalls
    from envs.carracing import ACTION_NAMES

    assert CARRACING_GAS == ACTION_NAMES.index("gas")

    frames = _still_episode()
    labels = np.array([4, 4, 4, 4, CARRACING_GAS, 1, 0])
    got = expert_stalls(frames, frames[0], labels)
    # frame 0 is its own previous frame (still); frames 3-6 repeat frame 2's road scene
    assert got.tolist() == [True, False, False, True, False, True, True]
    cont = np.zeros((7, 2), np.float32)
    cont[:, 1] = [0.0, 0.0, 0.0, 0.0, 0.5, -0.2, 0.0]  # throttle
    assert expert_stalls(frames, frames[0], cont).tolist() == [True, False, False, True, False, True, True]


def test_skip_stalls_masks_the_loss_not_the_context():
    from agent.data.recordings import Demonstrations
    from agent.data.windows import DemonstrationSource, WindowDataset

    frames = _still_episode()
    labels = np.array([3, 3, 3, 4, 3, 4, 4])
    demos = Demonstrations([frames], [labels], [0], [0.0])
    for skip, expect in ((False, [True] * 7), (True, [True, True, True, False, True, False, False])):
        ds = WindowDataset(DemonstrationSource(demos, skip_stalls=skip), 7, shuffle_borders=False)
        item = ds[0]
        assert item["mask"].tolist() == [True] * 7, "every frame stays in the window"
        assert item["learn"].tolist() == expect


def test_train_with_skip_stalls_ignores_the_stalled_labels(tmp_path):
    """Trained only on frames whose labels are all stalls except gas, the student never learns to brake at rest."""
    from agent.data.recordings import Demonstrations
    from agent.data.windows import DemonstrationSource
    from agent.nn.policy import default_config
    from agent.train.bc import TrainConfig
    from agent.train.run import train

    eps = [_still_episode(2, 30, seed=s) for s in range(4)]
    labels = [np.r_[np.full(2, 3), np.full(30, 4)] for _ in eps]  # gas while moving, brake forever at rest
    demos = Demonstrations(eps, labels, list(range(4)), [0.0] * 4)
    cfg = default_config("carracing", window=2, features_kwargs={"dropout": 0.0, "dashboard": "speed", "motion": True})
    tcfg = TrainConfig(epochs=3, batch_frames=16, lr=3e-3, val_fraction=0.0)
    for skip in (False, True):
        policy, report = train(DemonstrationSource(demos, skip_stalls=skip), cfg, tcfg)
        with torch.no_grad():
            out = policy(torch.from_numpy(eps[0][None, -2:]), prev=torch.from_numpy(eps[0][None, -3]))
        brake_at_rest = int(out[0, -1].argmax()) == 4
        assert brake_at_rest == (not skip)
        assert ("stalls left out" in report.data) == skip


# --------------------------------------------------------------------------- synthetic standstills
def test_standstill_window_repeats_one_frame_blanks_the_speed_bar_and_labels_go():
    from agent.data.recordings import Demonstrations
    from agent.data.windows import CARRACING_GAS, DemonstrationSource, WindowDataset
    from agent.nn.features import dashboard_rows, speed_bar_columns
    from envs.carracing import speedometer_region

    top, bottom, left, right = speedometer_region(96, 96)

    rng = np.random.default_rng(1)
    frames = rng.integers(1, 256, (40, 96, 96, 3), dtype=np.uint8)  # no pixel is 0: blanking shows
    disc = np.full(40, 4)  # brake everywhere
    cont = np.stack([np.linspace(-1, 1, 40), np.full(40, -0.5)], 1).astype(np.float32)
    c0, c1 = speed_bar_columns(96)
    strip = 96 - dashboard_rows(96)
    for labels in (disc, cont):
        demos = Demonstrations([frames], [labels], [0], [0.0])
        ds = WindowDataset(DemonstrationSource(demos, standstills=1.0), 4, shuffle_borders=True, previous=True)
        seen = 0
        for i in range(len(ds)):
            item = ds[i]
            n = int(item["mask"].sum())
            obs, prev = item["obs"][:n].numpy(), item["prev"].numpy()
            assert (obs == prev).all(), "every frame equals the previous one: the motion channels are zero"
            assert (prev[strip:, c0:c1] == 0).all() and (prev[strip:, :c0] > 0).all(), "only the speed bar is blanked"
            assert (prev[top:bottom, left:right] == 0).all(), "and the speedometer (at rest)"
            # the repeated frame is one of the recording's frames, speed bar and speedometer aside
            src = frames.copy()
            src[:, strip:, c0:c1] = 0
            src[:, top:bottom, left:right] = 0
            k = int(np.flatnonzero((src == prev).reshape(40, -1).all(1))[0])
            tgt = item["target"][:n].numpy()
            if labels.ndim == 2:
                assert (tgt[:, 1] == 1.0).all(), "full throttle"
                e, start, _ = ds.items[i]
                np.testing.assert_array_equal(tgt[:, 0], cont[start:start + n, 0])  # the recorded steering
                assert start <= k < start + n, "the frame is from the window itself"
            else:
                assert (tgt == CARRACING_GAS).all()
            assert item["learn"][:n].all()
            seen += 1
        assert seen == len(ds) > 5
        # the share: about `standstills` of the windows, and none without an rng (validation)
        half = WindowDataset(DemonstrationSource(demos, standstills=0.5), 1, shuffle_borders=True, previous=True)
        stills = [bool((half[i]["obs"][0].numpy() == half[i]["prev"].numpy()).all()) for i in range(len(half))]
        assert 0.3 < np.mean(stills) < 0.7
        plain = WindowDataset(DemonstrationSource(demos, standstills=1.0), 4, shuffle_borders=False, previous=True)
        np.testing.assert_array_equal(plain[1]["obs"].numpy(), frames[4:8])
        np.testing.assert_array_equal(plain[1]["target"].numpy(), labels[4:8])


def test_standstills_are_checked_and_kept_through_split_and_extend():
    from agent.data.recordings import Demonstrations
    from agent.data.windows import DemonstrationSource

    frames = np.zeros((5, 96, 96, 3), np.uint8)
    demos = Demonstrations([frames] * 4, [np.full(5, 3)] * 4, [0, 1, 2, 3], [0.0] * 4)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="standstills"):
            DemonstrationSource(demos, standstills=bad)
    src = DemonstrationSource(demos, standstills=0.25)
    train_src, val_src = src.split(0.25, 0)
    assert train_src.standstills == 0.25 and val_src.standstills == 0.0, "held-out episodes are scored as they are"
    assert train_src.extend(demos).standstills == 0.25
    assert "25% of the windows synthetic standstills" in src.describe()


def test_train_with_standstills_learns_to_go_at_rest_and_refuses_a_visible_dashboard(tmp_path):
    """Demonstrations that never stop, brake labels only while moving slowly: with synthetic
    standstills the student learns gas at rest; without them it has never seen rest and brakes."""
    from agent.data.recordings import Demonstrations
    from agent.data.windows import DemonstrationSource
    from agent.nn.policy import default_config
    from agent.train.bc import TrainConfig
    from agent.train.run import train

    rng = np.random.default_rng(0)
    eps = [rng.integers(0, 256, (24, 96, 96, 3), dtype=np.uint8) for _ in range(4)]
    labels = [np.full(24, 4) for _ in eps]  # always brake (the frames keep moving)
    demos = Demonstrations(eps, labels, list(range(4)), [0.0] * 4)
    cfg = default_config("carracing", window=2, features_kwargs={"dropout": 0.0, "dashboard": "speed", "motion": True})
    tcfg = TrainConfig(epochs=4, batch_frames=16, lr=3e-3, val_fraction=0.0)
    still = eps[0][5].copy()
    still[84:, 12:15] = 0
    acts, margin = {}, {}
    for share in (0.0, 0.5, 1.0):
        torch.manual_seed(0)
        policy, report = train(DemonstrationSource(demos, standstills=share), cfg, tcfg)
        with torch.no_grad():
            out = policy(torch.from_numpy(np.stack([still, still])[None]), prev=torch.from_numpy(still[None]))
        acts[share] = int(out[0, -1].argmax())
        margin[share] = float(out[0, -1, 3] - out[0, -1, 4])  # gas logit - brake logit at rest
    # without standstills it brakes at rest by a wide margin; with them gas comes close (at 0.5, on this
    # tiny set, gas and brake are within a few logits, either way depending on the platform) or wins (1.0)
    assert acts[0.0] == 4 and margin[0.0] < -100
    assert margin[0.5] > margin[0.0] + 100 and abs(margin[0.5]) < 10
    assert acts[1.0] == 3
    visible = default_config("carracing", window=2, features_kwargs={"dashboard": "visible"})
    with pytest.raises(ValueError, match="--dashboard speed or hidden"):
        train(DemonstrationSource(demos, standstills=0.5), visible, tcfg)


def test_standstill_frame_is_what_carracing_shows_at_rest():
    """A car that never moved: the speed bar's pixels are black, as the synthetic standstills draw them."""
    from agent.nn.features import dashboard_rows, speed_bar_columns
    from envs.carracing import make_carracing

    env = make_carracing()
    obs, _ = env.reset(seed=5)
    for _ in range(60):
        obs, *_ = env.step(0)  # nothing: the car stays at rest
    c0, c1 = speed_bar_columns(96)
    assert (obs[96 - dashboard_rows(96):, c0:c1] == 0).all()
    env.close()


# ----------------------------------------------------------------------------- the teacher's start rule
class _FakeSB3Policy:
    """Stands in for SB3's ActorCriticPolicy inside ExpertPolicy: always the same discrete action."""

    def __init__(self, action: int):
        import gymnasium as gym

        self.action_space = gym.spaces.Discrete(5)
        self.action = action

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.full(np.shape(obs)[:-1], self.action, dtype=np.int64), None


@pytest.mark.parametrize("choice", ["left", "brake", "nothing"])
def test_start_rule_breaks_the_argmax_fixed_point(choice):
    from agent.experts.policy import ExpertPolicy
    from agent.experts.rules import BRAKE, CRAWL_SPEED, GAS
    from envs.carracing import ACTION_NAMES, make_carracing

    action = ACTION_NAMES.index(choice)
    env = make_carracing(render_pixels=False, max_episode_steps=80)
    try:
        plain = rollout(env, ExpertActor(ExpertPolicy(_FakeSB3Policy(action))), 0, keep_frames=False)
        ruled = rollout(env, ExpertActor(ExpertPolicy(_FakeSB3Policy(action), start_rule=True)), 0,
                        keep_frames=False)
    finally:
        env.close()
    # Without the rule a car that starts at rest never moves: steering or braking at rest does nothing.
    assert plain.longest_standstill == plain.steps == 80 and set(plain.actions) == {action}
    # With it the car gets gas whenever it stands, and instead of brake while it crawls; elsewhere
    # the network's own choice. The speed at each decision is the one before the step.
    speed = ruled.speeds[:-1]
    overridden = standstill(speed) | ((action == BRAKE) & (speed < CRAWL_SPEED))
    assert ruled.actions[0] == GAS and overridden.any() and (~overridden).any()
    assert set(ruled.actions[overridden]) == {GAS} and set(ruled.actions[~overridden]) == {action}
    assert ruled.longest_standstill < STALL_STEPS


class _FakeContinuousPolicy:
    """Stands in for a continuous expert's ActorCriticPolicy: always the same (steering, throttle)."""

    def __init__(self, steering: float, throttle: float):
        import gymnasium as gym

        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action = np.array([steering, throttle], np.float32)

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.broadcast_to(self.action, np.shape(obs)[:-1] + (2,)).copy(), None


@pytest.mark.parametrize("throttle", [-1.0, -0.3, 0.0])
def test_the_continuous_start_rule_breaks_the_fixed_point(throttle):
    from agent.experts.policy import ExpertPolicy
    from agent.experts.rules import CRAWL_SPEED, START_THROTTLE
    from envs.carracing import make_carracing

    env = make_carracing(render_pixels=False, continuous=True, max_episode_steps=80)
    try:
        plain = rollout(env, ExpertActor(ExpertPolicy(_FakeContinuousPolicy(0.4, throttle))), 0, keep_frames=False)
        ruled = rollout(env, ExpertActor(ExpertPolicy(_FakeContinuousPolicy(0.4, throttle), start_rule=True)), 0,
                        keep_frames=False)
    finally:
        env.close()
    # Without the rule a car that starts at rest and brakes (or coasts) never moves.
    assert plain.longest_standstill == plain.steps == 80
    actions, speed = np.asarray(ruled.actions), ruled.speeds[:-1]
    overridden = standstill(speed) | ((throttle < 0) & (speed < CRAWL_SPEED))
    assert overridden[0] and (~overridden).any()
    # Overridden steps get full throttle and keep the network's steering; the others are the network's.
    assert np.all(actions[overridden, 1] == START_THROTTLE) and np.all(actions[:, 0] == np.float32(0.4))
    assert np.all(actions[~overridden, 1] == np.float32(throttle))
    assert ruled.longest_standstill < STALL_STEPS


def test_the_continuous_start_rule_batched_as_one_at_a_time():
    from agent.experts.policy import ExpertPolicy
    from agent.experts.rules import START_THROTTLE
    from envs.carracing import PRIVILEGED_DIM

    expert = ExpertPolicy(_FakeContinuousPolicy(-0.2, -0.5), start_rule=True)
    speeds = np.array([0.0, 0.5, 5.0, 9.9, 10.0, 40.0, np.nan])
    out = expert.act_batch(np.zeros((len(speeds), PRIVILEGED_DIM), np.float32), speeds)
    assert out.shape == (len(speeds), 2) and np.all(out[:, 0] == np.float32(-0.2))
    assert out[:, 1].tolist() == [START_THROTTLE] * 4 + [-0.5] * 3
    # a positive throttle is only raised at a standstill, never lowered
    gentle = ExpertPolicy(_FakeContinuousPolicy(0.0, 0.3), start_rule=True)
    out = gentle.act_batch(np.zeros((3, PRIVILEGED_DIM), np.float32), np.array([0.0, 5.0, 40.0]))
    assert out[:, 1].tolist() == pytest.approx([START_THROTTLE, 0.3, 0.3])
    assert ExpertPolicy(_FakeContinuousPolicy(0.0, -0.5)).act_batch(
        np.zeros((1, PRIVILEGED_DIM), np.float32), np.array([0.0]))[0, 1] == -0.5  # off: the network's own


def test_the_start_rule_is_an_experts(tiny_expert, tmp_path, capsys):
    from agent.cli import main
    from agent.experts.policy import ExpertPolicy

    assert ExpertPolicy(_FakeContinuousPolicy(0.0, 0.0), start_rule=True).start_rule is True
    assert ExpertPolicy.load(tiny_expert).start_rule is False  # loading never adds the rule
    # agent evaluate: the rule is an expert's, asked for explicitly, and recorded in the JSON
    pol = _constant_policy(tmp_path / "const.pt", 0)
    assert main(["evaluate", "--policy", str(pol), "--episodes", "1", "--teacher.start-rule"]) == 2
    assert "PPO expert" in capsys.readouterr().err
    js = tmp_path / "expert.json"
    assert main(["evaluate", "--policy", str(tiny_expert), "--episodes", "1", "--track-seed", "1000000", "--max-steps",
                 "20", "--workers", "1", "--teacher.start-rule", "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["start_rule"] is True and res["steps"] == [20]


def test_the_start_rule_is_asked_for_explicitly():
    import tyro

    from agent.cli.collect import CollectRun
    from agent.cli.evaluate import EvaluateRun
    from agent.cli.recipe import parse_stages
    from agent.train.config import TrainRun

    # off by default where the shipped files were made without it (collect, train), on in compare's protocol
    assert tyro.cli(CollectRun, args=["--teacher.expert", "e.zip", "--out", "r/n/x-v0"]).teacher.start_rule is False
    assert tyro.cli(CollectRun, args=["--teacher.expert", "e.zip", "--out", "r/n/x-v0",
                                       "--teacher.start-rule"]).teacher.start_rule is True
    assert parse_stages(TrainRun, ["--data", "d"], prog="agent train", description="")[0][1].teacher.start_rule is False
    assert tyro.cli(TrainRun, args=["--data", "d", "--teacher.start-rule"]).teacher.start_rule is True
    assert tyro.cli(EvaluateRun, args=["--policy", "p.zip"]).teacher.start_rule is False
    from agent.compare.config import CompareConfig

    assert CompareConfig().teacher.start_rule is True and CompareConfig().protocol().start_rule is True


# ----------------------------------------------------------------------------- tiles, edge, lap ends
def test_a_lap_ends_only_once_every_tile_is_visited():
    """What ``tiles_missed`` explains: the expert's full lap visits every tile and ends early; the
    same lap with the car lifted past 12 tiles late in the lap never ends (the lap-complete rule needs every
    tile, the start tile being visited at the start), so it runs to the step limit, under 900."""
    from agent.actors.loading import load_policy, make_actor, make_carracing_for
    from agent.actors.rollout import tiles_missed

    expert = load_policy("carracing-expert-discrete-margin.zip")
    env = make_carracing_for(expert, render_pixels=False)
    try:
        full = rollout(env, make_actor(expert), 1_000_000, keep_frames=False)

        class Skip:
            """The expert, but at one step the car is carried 12 tiles along the track."""
            label, has_probs, traces_reason = "skip", False, None

            def __init__(self, at):
                self.inner, self.n, self.at = make_actor(expert), 0, at

            def reset(self):
                self.n = 0

            def act(self, obs, env, info=None):
                self.n += 1
                if self.n == self.at:
                    u = env.unwrapped
                    car = u.car
                    x, y = car.hull.position
                    i = int(np.argmin([(p[2] - x) ** 2 + (p[3] - y) ** 2 for p in u.track]))
                    j = (i + 12) % len(u.track)
                    dx, dy = u.track[j][2] - x, u.track[j][3] - y
                    for b in (car.hull, *car.wheels):
                        b.position = (b.position[0] + dx, b.position[1] + dy)
                return self.inner.act(obs, env, info)

        # the skip comes 100 steps before the lap's end, so a second lap cannot reach the missed
        # tiles before step 1000 (the expert's lap takes over 550 steps)
        skipped = rollout(env, Skip(full.steps - 100), 1_000_000, keep_frames=False)
        missed_now = tiles_missed(env)
    finally:
        env.close()
    assert full.tiles_missed == 0 and full.terminations[-1] and 550 < full.steps < 1000
    assert full.episode_return > 900
    assert skipped.tiles_missed == missed_now and skipped.tiles_missed > 0
    assert not skipped.terminations.any() and skipped.steps == 1000 and skipped.episode_return < 900
    assert full.wheels_off.dtype == np.int8 and set(np.unique(full.wheels_off)) <= {0, 1, 2, 3, 4}
    assert full.edge_steps == int(np.count_nonzero((full.wheels_off > 0) & (full.wheels_off < 4)))


def test_wheel_off_penalty_charges_each_wheel_on_the_grass():
    """The expert's reward shaping: the same actions give the env's reward minus penalty x wheels off."""
    from agent.train.ppo import WheelOffPenalty
    from envs.carracing import make_carracing

    actions = [np.array([0.0, 1.0], np.float32)] * 30 + [np.array([1.0, 0.5], np.float32)] * 90  # gas, then hard right
    plain, shaped = make_carracing(render_pixels=False, continuous=True), None
    try:
        shaped = WheelOffPenalty(make_carracing(render_pixels=False, continuous=True), 0.25)
        plain.reset(seed=1_000_001)
        shaped.reset(seed=1_000_001)
        offs = []
        for a in actions:
            _, r0, *_ = plain.step(a)
            _, r1, _, _, info = shaped.step(a)
            offs.append(info["wheels_off_road"])
            assert r1 == pytest.approx(r0 - 0.25 * info["wheels_off_road"], abs=1e-5)
    finally:
        plain.close()
        shaped.close()
    assert offs[0] == 0 and max(offs) == 4  # it starts on the road and ends on the grass
    with pytest.raises(ValueError, match="penalty"):
        WheelOffPenalty(make_carracing(render_pixels=False), -1.0)
