"""The speedometer: a legible speed drawn into CarRacing's dashboard strip (``--dashboard
speedometer``), in live frames (:class:`envs.carracing.Speedometer`) and in recorded ones, redrawn
from their recorded speeds (:meth:`agent.data.recordings.Demonstrations.with_speedometer`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent.cli import main
from agent.data.recordings import Demonstrations, load_demonstrations
from agent.nn.features import CarRacingCNN, dashboard_mask
from agent.nn.policy import DrivingPolicy, default_config
from envs.carracing import (SPEEDOMETER_FULL_SCALE, dashboard_rows, draw_speedometer, make_carracing,
                            speed_bar_columns, speedometer_region)

TOP, BOTTOM, LEFT, RIGHT = speedometer_region(96, 96)


def _bar(frame: np.ndarray) -> float:
    """The bar's length in columns, read back from one frame (the grey last column counts its share)."""
    return float(frame[(TOP + BOTTOM) // 2, LEFT:RIGHT, 0].astype(np.float64).sum() / 255.0)


def test_the_region_lies_in_the_strip_beside_the_speed_bar():
    strip_top = 96 - dashboard_rows(96)
    assert strip_top <= TOP < BOTTOM <= 96 and speed_bar_columns(96)[1] < LEFT < RIGHT == 96


def test_every_speed_has_its_own_length():
    speeds = np.array([0.0, 10.0, 15.0, 25.0, 25.4, 60.0, SPEEDOMETER_FULL_SCALE, 180.0])
    frames = np.full((len(speeds), 96, 96, 3), 77, np.uint8)
    out = draw_speedometer(frames, speeds)
    assert out is frames
    width = RIGHT - LEFT
    lengths = [_bar(f) for f in frames]
    expected = np.clip(speeds / SPEEDOMETER_FULL_SCALE, 0, 1) * width
    assert np.allclose(lengths, expected, atol=0.5 / 255 * 2)  # the last column rounds to a grey level
    assert lengths[3] - lengths[2] == pytest.approx(10 * width / SPEEDOMETER_FULL_SCALE, abs=0.01)  # 15 vs 25: 8 columns
    assert lengths[4] > lengths[3]  # 0.4 units/s shows, in the grey of the last column
    assert lengths[-1] == lengths[-2] == width  # above full scale: full
    # every row of the region carries the same bar; the rest of the frame is untouched
    assert (frames[:, TOP:BOTTOM] == frames[:, TOP:TOP + 1]).all()
    rest = np.ones((96, 96), bool)
    rest[TOP:BOTTOM, LEFT:RIGHT] = False
    assert (frames[:, rest] == 77).all()


def test_drawing_again_gives_the_same_frame():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 96, 96, 3), dtype=np.uint8)
    once = draw_speedometer(frames.copy(), [5.0, 33.3, 90.0])
    twice = draw_speedometer(once.copy(), [5.0, 33.3, 90.0])
    assert np.array_equal(once, twice)
    one = draw_speedometer(frames[0].copy(), 33.3)  # one (H, W, 3) frame and a scalar speed
    assert np.array_equal(one, draw_speedometer(frames[:1].copy(), [33.3])[0])


@pytest.mark.parametrize("frames,speeds,match", [
    (np.zeros((2, 96, 96, 3), np.uint8), [1.0], "one speed per frame"),
    (np.zeros((1, 96, 96, 3), np.uint8), [np.nan], "must be finite"),
    (np.zeros((1, 96, 96, 3), np.float32), [1.0], "uint8 frames"),
    (np.zeros((1, 96, 96), np.uint8), [1.0], "uint8 frames"),
])
def test_bad_input_is_refused(frames, speeds, match):
    with pytest.raises(ValueError, match=match):
        draw_speedometer(frames, speeds)


def test_the_env_draws_what_the_recorded_speed_would():
    """Live frames from make_carracing(speedometer=True) equal plain frames with the bar drawn from
    the speed the env reports: so recorded frames redrawn from their speeds are what a student saw."""
    actions = [3] * 30 + [4] * 5 + [2] * 5
    top = (0.0, None)
    plain, meter = make_carracing(state_info=True), make_carracing(state_info=True, speedometer=True)
    try:
        (a, ia), (b, ib) = plain.reset(seed=3), meter.reset(seed=3)
        assert np.array_equal(draw_speedometer(a.copy(), [ia["speed"]]), b)
        for act in actions:
            a, _, _, _, ia = plain.step(act)
            b, _, _, _, ib = meter.step(act)
            assert ia["speed"] == ib["speed"]
            assert np.array_equal(draw_speedometer(a.copy(), [ia["speed"]]), b)
            top = max(top, (ib["speed"], b), key=lambda x: x[0])
        assert top[0] > 5.0 and _bar(top[1]) == pytest.approx(top[0] * 0.8, abs=0.01)  # it moved; the bar shows it
    finally:
        plain.close(), meter.close()
    with pytest.raises(ValueError, match="privileged"):
        make_carracing(privileged=True, speedometer=True)


def test_recordings_are_redrawn_from_their_speeds_or_not_at_all():
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 256, (4, 96, 96, 3), dtype=np.uint8), rng.integers(0, 256, (3, 96, 96, 3), dtype=np.uint8)]
    before = [f.copy() for f in frames]
    speeds = [np.array([0.0, 12.0, 24.0, 48.0], np.float32), np.array([5.0, np.nan, 7.0], np.float32)]
    demos = Demonstrations(frames, [np.zeros(4, np.int64), np.zeros(3, np.int64)], [0, 1], [0.0, 0.0], speeds=speeds)
    with pytest.raises(ValueError, match="episode 1 .*without a recorded speed"):
        demos.with_speedometer()
    assert all(np.array_equal(f, b) for f, b in zip(demos.frames, before))  # checked before drawing: nothing changed
    speeds[1][1] = 6.0
    assert demos.with_speedometer() is demos
    assert [round(_bar(f), 2) for f in demos.frames[0]] == [round(v * 0.8, 2) for v in (0.0, 12.0, 24.0, 48.0)]
    with pytest.raises(ValueError, match="without a recorded speed"):
        Demonstrations([f.copy() for f in before], [np.zeros(4, np.int64), np.zeros(3, np.int64)], [0, 1],
                       [0.0, 0.0]).with_speedometer()


def test_the_cnn_reads_the_speedometer_and_nothing_else_of_the_strip():
    mask = dashboard_mask(96, 96, "speedometer")
    speed_mask = dashboard_mask(96, 96, "speed")
    assert (mask[TOP:BOTTOM, LEFT:RIGHT] == 1).all()
    assert (mask[:84] == 1).all()  # the road is read as before
    c0, c1 = speed_bar_columns(96)
    assert (mask[84:, c0:c1] == 1).all() and mask[84:, :c0].sum() == 0
    assert mask[84:TOP, LEFT:].sum() == 0 and mask[BOTTOM:, LEFT:].sum() == 0  # the strip around it stays blank
    assert speed_mask[TOP:BOTTOM, LEFT:RIGHT].sum() == 0
    torch.manual_seed(0)
    cnn = CarRacingCNN(dashboard="speedometer", motion=True, dropout=0.0).eval()
    blind = CarRacingCNN(dashboard="speed", motion=True, dropout=0.0).eval()
    blind.load_state_dict(cnn.state_dict())
    frames = np.random.default_rng(2).integers(0, 256, (2, 96, 96, 3), dtype=np.uint8)
    slow, fast = draw_speedometer(frames.copy(), [15.0, 15.0]), draw_speedometer(frames.copy(), [25.0, 25.0])
    with torch.no_grad():
        assert not torch.allclose(cnn(slow, slow), cnn(fast, fast))  # it tells 15 from 25 units/s
        assert torch.allclose(blind(slow, slow), blind(fast, fast))  # the "speed" student cannot


def test_with_dashboard_keeps_the_weights():
    policy = DrivingPolicy(default_config("carracing")).eval()
    assert policy.features.dashboard == "speed"
    meter = policy.with_dashboard("speedometer")
    assert meter.features.dashboard == "speedometer" and meter.config.features_kwargs["dashboard"] == "speedometer"
    sd, new = policy.state_dict(), meter.state_dict()
    assert sd.keys() == new.keys() and all(torch.equal(sd[k], new[k]) for k in sd)
    frames = np.random.default_rng(3).integers(0, 256, (1, 4, 96, 96, 3), dtype=np.uint8)
    frames[..., TOP:BOTTOM, LEFT:RIGHT, :] = 0  # the speedometer at rest: both read the same pixels
    with torch.no_grad():
        assert torch.allclose(policy(frames)[0], meter(frames)[0])
    with pytest.raises(ValueError, match="hidden"):
        policy.with_dashboard("hidden")
    with pytest.raises(ValueError, match="dashboard must be one of"):
        policy.with_dashboard("dials")


def test_a_speedometer_student_trains_dagger_and_evaluates_through_the_cli(tiny_expert, tmp_path, capsys):
    import json

    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    plain = tmp_path / "plain.pt"
    assert main(["train", "--data", str(rec), "--out", str(plain), "--run-dir", str(tmp_path / "plain"),
                 "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "8", "--train.val-fraction",
                 "0", "--train.tensorboard", ""]) == 0
    out, rounds = tmp_path / "meter.pt", tmp_path / "meter-dagger"
    # from the plain student: its mode switched, its weights kept, then DAgger in the speedometer's env
    assert main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "meter"), "--init",
                 str(plain), "--policy.dashboard", "speedometer", "--train.epochs", "1", "--train.batch-frames", "8",
                 "--train.val-fraction", "0", "--teacher.expert", str(tiny_expert), "--teacher.start-rule",
                 "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1", "--dagger.max-steps", "30",
                 "--dagger.save-rounds", str(rounds), "--train.tensorboard", ""]) == 0
    policy = DrivingPolicy.load(out)
    assert policy.features.dashboard == "speedometer"
    dag = load_demonstrations(f"{rounds}-r1-v0")
    frames, speeds = dag.frames[0], dag.frame_speeds()[0]
    assert np.all(np.isfinite(speeds)) and speeds.max() > 0
    # the student's rollout frames carry the speedometer of their recorded speeds
    assert np.array_equal(draw_speedometer(frames.copy(), speeds), frames)
    assert _bar(frames[int(np.argmax(speeds))]) == pytest.approx(float(speeds.max()) * 0.8, abs=0.02)
    js = tmp_path / "e.json"
    assert main(["evaluate", "--policy", str(out), "--episodes", "1", "--max-steps", "15", "--workers", "1",
                 "--track-seed", "5", "--json", str(js)]) == 0
    assert len(json.loads(js.read_text())["returns"]) == 1
    capsys.readouterr()
    assert main(["train", "--data", str(rec), "--out", str(tmp_path / "h.pt"), "--run-dir", str(tmp_path / "h"),
                 "--init", str(plain), "--policy.dashboard", "hidden", "--train.epochs", "1"]) == 2
    assert "crops the strip" in capsys.readouterr().err
