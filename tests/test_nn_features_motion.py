"""Motion channels: the CNN also reads each frame's difference from the previous one (``--motion``)."""

import numpy as np
import pytest
import torch

from agent.cli import main
from agent.nn.features import CarRacingCNN
from agent.nn.policy import DrivingPolicy, default_config


def _frames(shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _policy(window=4, dashboard="speed"):
    torch.manual_seed(0)
    cfg = default_config("carracing", window=window,
                         features_kwargs={"dropout": 0.0, "dashboard": dashboard, "motion": True})
    return DrivingPolicy(cfg).eval()


def test_motion_channels_are_the_frame_difference_and_zero_at_a_standstill():
    cnn = CarRacingCNN(dashboard="visible", motion=True)
    assert cnn.uses_previous and cnn.cnn[0].in_channels == 6
    now, before = _frames((2, 96, 96, 3), 1), _frames((2, 96, 96, 3), 2)
    x = cnn.preprocess(now, before)
    assert x.shape == (2, 6, 96, 96)
    expect = (torch.from_numpy(now).float() - torch.from_numpy(before).float()).permute(0, 3, 1, 2) / 255
    assert torch.allclose(x[:, 3:], expect, atol=1e-6)
    assert torch.equal(x[:, :3], cnn.preprocess(now, now)[:, :3])
    assert cnn.preprocess(now, now)[:, 3:].abs().max() == 0, "the same frame again: no motion"
    assert cnn.preprocess(now)[:, 3:].abs().max() == 0, "no previous frame: no motion"
    with pytest.raises(ValueError, match="frames must be"):
        cnn.preprocess(now, before[:, :90])


@pytest.mark.parametrize("dashboard", CarRacingCNN.DASHBOARD_MODES)
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_the_in_place_preprocessing_equals_the_differentiable_one(dashboard, dtype):
    # frames without a gradient take the in-place path (fewer passes, no full-size temporaries);
    # frames that need one take the out-of-place path: the same values, in the same layout, and
    # the caller's frames are left as they were
    torch.manual_seed(0)
    cnn = CarRacingCNN(dashboard=dashboard, motion=True, dropout=0.0).eval()
    now = torch.from_numpy(_frames((3, 96, 96, 3), 1)).to(dtype)
    before = torch.from_numpy(_frames((3, 96, 96, 3), 2)).to(dtype)
    kept = now.clone(), before.clone()
    for prev in (before, None):
        fast = cnn.preprocess(now, prev)
        ref = cnn.preprocess(now.float().clone().requires_grad_(),
                             None if prev is None else prev.float().clone().requires_grad_())
        assert ref.requires_grad and not fast.requires_grad
        assert torch.equal(fast, ref.detach()) and fast.stride() == ref.stride()
        assert torch.equal(now, kept[0]) and torch.equal(before, kept[1])
        with torch.no_grad():
            # scratch=True may blank x in place: the same features as on an untouched copy
            assert torch.equal(cnn.from_preprocessed(fast.clone(), scratch=True), cnn.from_preprocessed(fast))
    x = cnn.preprocess(now, before)
    x.requires_grad_()
    y = cnn.from_preprocessed(x, scratch=True)  # x needs a gradient: never changed in place
    y.sum().backward()
    assert torch.equal(x.detach(), cnn.preprocess(now, before)) and x.grad is not None


def test_motion_channels_respect_the_dashboard_mask():
    """With dashboard="speed", the blanked indicators carry no motion either."""
    cnn = CarRacingCNN(dashboard="speed", motion=True)
    x = cnn.preprocess(_frames((1, 96, 96, 3), 3), _frames((1, 96, 96, 3), 4))
    assert x[:, :, 84:, :12].abs().max() == 0 and x[:, :, 84:, 15:].abs().max() == 0
    assert x[:, 3:, 84:, 12:15].abs().max() > 0, "the speed bar's change is read"


def test_the_output_depends_on_the_previous_frame_only_with_motion():
    frames = _frames((1, 96, 96, 3), 5)
    other = _frames((1, 96, 96, 3), 6)
    with torch.no_grad():
        p = _policy()
        assert not torch.allclose(p.features(frames, frames), p.features(frames, other))
        plain = DrivingPolicy(default_config("carracing", features_kwargs={"dropout": 0.0})).eval()
        assert torch.equal(plain.features(frames, frames), plain.features(frames, other))


def test_streaming_step_matches_the_window_forward_with_the_previous_frame():
    """Training sees (window, frame before it); driving keeps the last frame in the state: same outputs."""
    p = _policy(window=4)
    frames = _frames((2, 7, 96, 96, 3), 7)
    with torch.no_grad():
        state, outs = None, []
        for i in range(7):
            y, state = p.step(frames[:, i], state)
            outs.append(y)
        first = p(torch.from_numpy(frames[:, :4]))  # episode start: frame 0 is its own previous frame
        assert torch.allclose(first, torch.stack(outs[:4], 1), atol=1e-5)
        # position 6 sees frames 3..6, and frame 3's previous frame is frame 2
        late = p(torch.from_numpy(frames[:, 3:7]), prev=torch.from_numpy(frames[:, 2]))
        assert torch.allclose(late[:, -1], outs[6], atol=1e-5)
        wrong = p(torch.from_numpy(frames[:, 3:7]))  # without the previous frame it differs
        assert not torch.allclose(wrong[:, 0], late[:, 0], atol=1e-5)


def test_reset_rows_restart_motion_on_the_restarted_row_only():
    p = _policy(window=2)
    frames = _frames((2, 3, 96, 96, 3), 8)
    with torch.no_grad():
        _, state = p.step(frames[:, 0], None)
        _, state = p.step(frames[:, 1], state)
        state = p.reset_rows(state, np.array([True, False]))
        y, _ = p.step(frames[:, 2], state)
        fresh, _ = p.step(frames[:1, 2], None)  # row 0: a new episode, no motion
        assert torch.allclose(y[:1], fresh, atol=1e-5)
        kept = p(torch.from_numpy(frames[1:, 1:3]), prev=torch.from_numpy(frames[1:, 0]))
        assert torch.allclose(y[1:], kept[:, -1], atol=1e-5)


def test_window_dataset_gives_the_frame_before_each_window():
    from agent.data.windows import WindowDataset

    class Source:  # two sequences whose frames hold their own index in every pixel
        lengths = [5, 3]
        target_dtype = np.int64
        frames = [np.arange(5, dtype=np.uint8)[:, None, None, None] * np.ones((1, 4, 4, 3), np.uint8),
                  np.arange(3, dtype=np.uint8)[:, None, None, None] * np.ones((1, 4, 4, 3), np.uint8) + 100]

        def window(self, e, start, n, rng=None):
            return self.frames[e][start:start + n], np.zeros(n, np.int64), np.arange(n) * 0.02

        def previous_frame(self, e, start):
            return self.frames[e][max(start - 1, 0)]

    ds = WindowDataset(Source(), 2, shuffle_borders=False, previous=True)
    for i, (e, start, n) in enumerate(ds.items):
        item = ds[i]
        assert int(item["obs"][0, 0, 0, 0]) == int(Source.frames[e][start, 0, 0, 0])
        assert int(item["prev"][0, 0, 0]) == int(Source.frames[e][max(start - 1, 0), 0, 0, 0])
    assert "prev" not in WindowDataset(Source(), 2, shuffle_borders=False)[0]

    class NoPrevious(Source):
        previous_frame = None

    with pytest.raises(ValueError, match="cannot give previous frames"):
        WindowDataset(NoPrevious(), 2, previous=True)


def test_grad_cam_runs_on_a_motion_policy():
    from agent.drive.saliency import SaliencyOverlay

    p = _policy(window=2)
    frames = _frames((3, 96, 96, 3), 9)
    state = None
    with torch.no_grad():
        for f in frames[:2]:
            _, state = p.step(torch.as_tensor(f)[None], state)
    before = state
    y, _ = p.step(torch.as_tensor(frames[2])[None], before)
    assert p.saliency_input(frames[2], before).shape == (1, 6, 96, 96)
    # the differentiable twin reproduces the step from what saliency_input gives it
    assert torch.allclose(p.saliency_forward(p.saliency_input(frames[2], before), before), y, atol=1e-5)
    with SaliencyOverlay(p, p.config.action_names) as ov:
        cam = ov.compute(frames[2], before, y).cam
        out, after, sal = ov.step(frames[2], before)  # one forward: action, next state (with the frame) and map
    assert cam.shape == (96, 96) and cam[:84].max() > 0
    torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sal.cam, cam, atol=1e-5)
    assert torch.equal(after.frame, torch.as_tensor(frames[2])[None]) and not after.frame.requires_grad
    with pytest.raises(ValueError, match="motion"):
        p.saliency_step(p.saliency_input(frames[2], before), before)


def test_train_cli_motion(tiny_expert, tmp_path):
    from agent.actors.loading import load_policy

    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "2", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    out = tmp_path / "motion.pt"
    assert main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "motion"),
                 "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "8", "--policy.dashboard",
                 "speed", "--policy.motion", "True", "--train.tensorboard", "", "--teacher.expert", str(tiny_expert),
                 "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1",
                 "--dagger.max-steps", "20"]) == 0
    policy = load_policy(out)
    assert policy.features.motion and policy.features.dashboard == "speed"
    assert main(["evaluate", "--policy", str(out), "--episodes", "1", "--max-steps", "20", "--track-seed",
                 "700000"]) == 0
    assert main(["train", "--data", str(rec), "--init", str(out), "--train.epochs", "0", "--policy.motion", "True",
                 "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x")]) == 2


def test_carracing_defaults_mask_the_dashboard_and_read_motion(tmp_path):
    """The recipe of the shipped nac.pt is the default; --policy.motion False / --policy.dashboard visible give the
    paper's input."""
    import tyro

    from agent.train.config import TrainRun

    kw = default_config("carracing").features_kwargs
    assert kw["dashboard"] == "speed" and kw["motion"] is True
    assert default_config("carracing", continuous=True).features_kwargs == kw
    assert "motion" not in default_config("udacity").features_kwargs
    run = tyro.cli(TrainRun, args=["--data", "x", "--policy.motion", "False"])
    assert run.policy.motion is False and run.resolved().policy.motion is False
    run = tyro.cli(TrainRun, args=["--data", "x"])
    assert run.policy.motion is None and run.resolved().policy.motion is True  # unset: the env's default
