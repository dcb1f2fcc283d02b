"""Live interpretability: Grad-CAM saliency, NAC trace panel, runner keys, --dump-traces, plot-traces, wiring."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import gc
import struct

import numpy as np
import pytest
import torch

from agent.drive.config import DriveConfig, parse_drive_args
from agent.drive.hud import Renderer, StepView
from agent.drive.session import run_drive


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


@pytest.fixture(scope="module")
def policy():
    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    return DrivingPolicy(default_config("carracing", window=8)).eval()


@pytest.fixture(scope="module")
def policy_file(policy, tmp_path_factory):
    return policy.save(tmp_path_factory.mktemp("pol") / "tiny.pt")


@pytest.fixture
def same_policy(monkeypatch, policy, policy_file):
    """drive loads our module-scoped policy, whatever --policy says (ncps wirings take ~2.5 s to rebuild)."""
    import agent.drive.session  # run_drive loads the policy through these names

    monkeypatch.setattr(agent.drive.session, "load_policy", lambda name, device="cpu": policy)
    monkeypatch.setattr(agent.drive.session, "resolve_policy_path", lambda name: policy_file)
    return policy


def _frames(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.integers(0, 255, (n, 96, 96, 3), dtype=np.uint8)
    f[:, 30:60, 40:56] = (100, 100, 100)  # a "road" every frame shares
    return f


def _play(policy, frames, intermediates=True):
    """Step the policy through frames; returns per step (obs, state_before, output, state)."""
    out, st = [], None
    for f in frames:
        before = st
        y, st = policy.step(torch.as_tensor(f)[None], before, return_intermediates=intermediates)
        out.append((f, before, y, st))
    return out


# ----------------------------------------------------------------------------- saliency
def test_saliency_forward_equals_step(policy):
    steps = _play(policy, _frames(10))
    for f, before, y, _ in steps:
        with torch.no_grad():
            z = policy.saliency_forward(policy.saliency_input(f, before), before)
        torch.testing.assert_close(z, y, rtol=1e-5, atol=1e-5)


class SaliencyOnly(torch.nn.Module):
    """A policy's four saliency hooks and nothing else (no step, no saliency_step), over ``base``."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def saliency_layer(self):
        return self.base.saliency_layer()

    def saliency_input(self, frame, state_before=None):
        return self.base.saliency_input(frame, state_before)

    def saliency_forward(self, x, state_before=None, t=None):
        return self.base.saliency_forward(x, state_before, t)

    def saliency_region(self, hw):
        return self.base.saliency_region(hw)


def _tensors(x):
    from agent.nn.policy import PolicyState

    if isinstance(x, PolicyState):
        return _tensors(x.core) + _tensors(x.last) + _tensors(x.frame)
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for f in x.__dataclass_fields__ for t in _tensors(getattr(x, f))]
    return []


def test_fused_step_is_step_plus_compute(policy):
    """SaliencyOverlay.step (one forward) gives the outputs, next state and map of policy.step + compute,
    with nothing left on the autograd graph."""
    from agent.drive.saliency import SaliencyOverlay

    frames = _frames(7, seed=3)
    ref = _play(policy, frames)
    state = None
    with SaliencyOverlay(policy, policy.config.action_names) as ov:
        for i, (f, before, y, after) in enumerate(ref):
            want = ov.compute(f, before, y)
            out, state, sal = ov.step(f, state, return_intermediates=True)
            torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(sal.cam, want.cam, atol=1e-5)
            assert sal.target == want.target and sal.cam.max() > 0
            got, exp = _tensors(state), _tensors(after)
            assert len(got) == len(exp) > 0
            for a, b in zip(got, exp):
                assert not a.requires_grad and a.grad_fn is None
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            assert not ov.cam.activations_and_grads.activations


def test_begin_then_finish_is_step_plus_compute(policy):
    """The split fused step: begin's outputs are final before any backward (the runner sends the action
    then), finish's map is compute's, and the pending forward holds the graph until finished."""
    from agent.drive.saliency import PendingSaliency, SaliencyOverlay

    frames = _frames(5, seed=4)
    ref = _play(policy, frames)
    state = None
    with SaliencyOverlay(policy, policy.config.action_names) as ov:
        for f, before, y, after in ref:
            want = ov.compute(f, before, y)
            out, state, pending = ov.begin(f, state, return_intermediates=True)
            assert isinstance(pending, PendingSaliency)
            torch.testing.assert_close(out, y, rtol=1e-5, atol=1e-5)
            assert not out.requires_grad and pending.outputs.requires_grad  # the backward is still to come
            assert ov.grad_leaf.grad is None or not ov.cam.activations_and_grads.gradients
            sal = ov.finish(pending)
            np.testing.assert_allclose(sal.cam, want.cam, atol=1e-5)
            assert sal.target == want.target and sal.seconds >= pending.seconds > 0
            assert pending.outputs is None and not ov.cam.activations_and_grads.activations
    with pytest.raises(RuntimeError, match="closed"):
        ov.finish(pending)


def test_fused_step_on_a_steering_output(policy):
    """The steering target is read off the output's sign; a policy without saliency_step is refused."""
    from agent.drive.saliency import ChosenOutputTarget, SaliencyOverlay

    t = ChosenOutputTarget("steering")
    assert float(t(torch.tensor([0.4]))) == pytest.approx(0.4) and t.chosen is True
    assert float(t(torch.tensor([-0.3]))) == pytest.approx(0.3) and t.chosen is False
    d = ChosenOutputTarget("discrete")
    assert float(d(torch.tensor([0.1, 2.0, -1.0]))) == pytest.approx(2.0) and d.chosen == 1

    class NoStep(SaliencyOnly):  # the saliency hooks of a policy without saliency_step
        output_kind = "discrete"

    with SaliencyOverlay(NoStep(policy)) as ov, pytest.raises(ValueError, match="no saliency_step"):
        ov.step(_frames(1)[0], None)


def test_runner_acts_through_grad_cam_while_it_is_on(policy):
    """The Overlays hand the driver the overlay while the saliency is on (one forward per step) and take
    it back when it is toggled off or closed; the actions are the plain driver's either way."""
    from agent.actors.rollout import PolicyActor
    from agent.drive.explain import Overlays

    frames = _frames(6, seed=5)
    plain = PolicyActor(policy)
    want = [plain.act(f) for f in frames]
    driver = PolicyActor(policy)
    ov = Overlays(policy, driver, Renderer(scale=1), saliency=True, traces=True,
                  class_names=policy.config.action_names)
    try:
        assert driver.saliency is ov.saliency
        for i, f in enumerate(frames):
            if i == 3:
                ov.toggle_saliency()
                assert driver.saliency is None
            d = driver.act(f)
            extras: dict = {}
            status = ov.explain(f, d, extras)
            assert d.action == want[i].action
            np.testing.assert_allclose(d.probs, want[i].probs, atol=1e-5)
            assert (d.saliency is not None) == (i < 3) and ("saliency" in extras) == (i < 3)
            if i < 3:  # the driver left Grad-CAM's backward to explain(), which ran it
                want_map = ov.saliency.compute(f, d.state_before, d.output, d.t)
                np.testing.assert_allclose(extras["saliency"].cam, want_map.cam, atol=1e-5)
            assert (f"{ov.saliency.label} off" in status) == (i >= 3) and "traces" in extras
            assert (status.startswith("HiResCAM @ conv1:")) == (i < 3)  # the HUD names the method and layer
        ov.toggle_saliency()
        assert driver.saliency is ov.saliency
    finally:
        ov.close()
    assert driver.saliency is None


def test_cam_is_for_the_newest_frame(policy):
    """Changing only the newest frame changes the CAM; the window's older frames enter via the fixed cache."""
    from agent.drive.saliency import SaliencyOverlay

    steps = _play(policy, _frames(6))
    f, before, y, _ = steps[-1]
    with SaliencyOverlay(policy, policy.config.action_names) as ov:
        a = ov.compute(f, before, y).cam
        g = f.copy()
        g[:48] = 255 - g[:48]
        yg, _ = policy.step(torch.as_tensor(g)[None], before)
        b = ov.compute(g, before, yg).cam
    assert a.shape == (96, 96) and a.max() > 0
    assert not np.allclose(a, b)


def test_overlay_frame_differs_where_the_cam_is_high(policy):
    from agent.drive.overlays import SaliencyDrawer
    from agent.drive.saliency import SaliencyOverlay

    import pygame

    steps = _play(policy, _frames(5))
    f, before, y, _ = steps[-1]
    with SaliencyOverlay(policy, policy.config.action_names) as ov:
        sal = ov.compute(f, before, y)
    assert sal.cam.max() == pytest.approx(1.0, abs=1e-4)
    r = Renderer(scale=4, panel_width=0)
    r.frame_filters.append(SaliencyDrawer(opacity=0.8))
    plain = pygame.surfarray.array3d(r.compose(StepView(frame=f, step=1)).subsurface(r.frame_rect)).copy()
    over = pygame.surfarray.array3d(r.compose(StepView(frame=f, step=1, extras={"saliency": sal}))
                                    .subsurface(r.frame_rect)).copy()
    # surfarray is (x, y); the CAM is (row, col) at frame resolution, scaled by 4
    diff = np.abs(over.astype(int) - plain.astype(int)).sum(-1).T  # (y, x)
    cam_big = np.kron(sal.cam, np.ones((4, 4)))
    assert diff[cam_big > 0.8].mean() > 30  # clearly changed where the CNN looks
    # unchanged where it does not (alpha = 0.8 * cam < 0.3 %: at most 1 level per channel after rounding)
    assert diff[cam_big < 0.004].max() <= 3 if (cam_big < 0.004).any() else True
    assert diff[cam_big > 0.8].mean() > 5 * diff[cam_big < 0.2].mean()


@pytest.mark.parametrize("method,layer", [("gradcam", "last"), ("hirescam", "auto"), ("layercam", "conv2"), ("hirescam", "conv2"),
                                          ("gradcam++", "conv1")])
def test_cam_equals_the_input_gradient_cam(policy, method, layer):
    """The map with the gradient stopped at the target layer (only its bias trainable) is the library's
    map of the same class with the gradient taken from the input, all weights frozen (the earlier,
    costlier path), for each live method and at any layer."""
    import pytorch_grad_cam
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    from agent.drive.saliency import SALIENCY_METHODS, NewestFrameModel, SaliencyOverlay, resolve_saliency_layer

    steps = _play(policy, _frames(6))
    with SaliencyOverlay(policy, policy.config.action_names, method=method, layer=layer) as ov:
        fast = [ov.compute(f, before, y) for f, before, y, _ in steps]
    assert all(m.method == ov.label for m in fast)
    name, module = resolve_saliency_layer(policy, layer)
    assert ov.label == f"{SALIENCY_METHODS[method]} @ {name}"
    ref_model = NewestFrameModel(policy)
    policy.requires_grad_(False)
    ref = getattr(pytorch_grad_cam, SALIENCY_METHODS[method])(model=ref_model, target_layers=[module])
    ref.compute_input_gradient = True
    try:
        top, bottom, left, right = policy.saliency_region((96, 96))
        for (f, before, y, _), m in zip(steps, fast):
            ref_model.state_before = before
            want = ref(input_tensor=policy.saliency_input(f, before),
                       targets=[ClassifierOutputTarget(int(y.argmax()))])[0]
            got = m.cam[top:bottom, left:right]
            readable = got > 0
            np.testing.assert_allclose(got[readable], np.clip(want, 0, 1)[readable], atol=1e-5)
            assert want.max() > 0 and (got > 0).any()
    finally:
        ref.activations_and_grads.release()
        policy.requires_grad_(True)


def test_default_layer_is_the_first_convolution(policy):
    from agent.drive.saliency import conv_layers, resolve_saliency_layer

    convs = conv_layers(policy)
    assert list(convs) == ["conv1", "conv2", "conv3"]
    assert resolve_saliency_layer(policy) == ("conv1", convs["conv1"])
    assert resolve_saliency_layer(policy, "last") == ("conv3", convs["conv3"])
    assert convs["conv3"] is policy.saliency_layer()
    with pytest.raises(ValueError, match="conv7.*conv1, conv2, conv3"):
        resolve_saliency_layer(policy, "conv7")


def test_unknown_method_is_refused_with_the_choices(policy):
    from agent.drive.saliency import SaliencyOverlay

    with pytest.raises(ValueError, match="scorecam.*hirescam"):
        SaliencyOverlay(policy, policy.config.action_names, method="scorecam")
    assert all(p.requires_grad for p in policy.parameters())  # nothing was frozen by the refusal


def test_drive_options_offer_exactly_the_live_methods():
    import typing

    from agent.drive.config import DriveConfig, SaliencyMethod
    from agent.drive.saliency import DEFAULT_METHOD, SALIENCY_METHODS

    assert set(typing.get_args(SaliencyMethod)) == set(SALIENCY_METHODS)
    assert DriveConfig.saliency_method == DEFAULT_METHOD


@pytest.mark.parametrize("layer", ["conv0", "fc1", "conv", "3"])
def test_drive_refuses_a_malformed_layer(layer, capsys):
    from agent.train.config import ConfigError

    with pytest.raises(ConfigError, match="--saliency-layer takes conv1, conv2"):
        DriveConfig(headless=True, saliency_layer=layer)
    with pytest.raises(SystemExit) as e:  # on the command line tyro reports it
        _parse("--headless", "--saliency-layer", layer)
    assert e.value.code == 2 and "--saliency-layer" in capsys.readouterr().err


def test_an_empty_map_is_explained_not_drawn_cold():
    from agent.drive.saliency import SaliencyMap

    empty = SaliencyMap(np.zeros((96, 96), np.float32), "logit of 'gas'", 0.004, "HiResCAM @ conv2")
    assert empty.empty and empty.status() == "HiResCAM @ conv2: no positive evidence for 'gas' (empty map)"
    full = SaliencyMap(np.eye(96, dtype=np.float32), "steering to the left", 0.004, "LayerCAM @ conv4")
    assert not full.empty and full.status() == "LayerCAM @ conv4: steering to the left"


def test_steering_policy_gets_both_signs(policy):
    """A regression output: Grad-CAM for the sign the policy steers to (BinaryClassifierOutputTarget)."""
    from agent.drive.saliency import SaliencyOverlay

    class Steering(SaliencyOnly):  # the Udacity policy's saliency API on the CarRacing CNN
        output_kind = "steering"

        def saliency_forward(self, x, state_before=None, t=None):
            logits = self.base.saliency_forward(x, state_before, t)
            return torch.tanh(logits[:, 2:3] - logits[:, 1:2])  # right minus left

        def saliency_region(self, hw):
            return 10, hw[0] - 10, 0, hw[1]

    s = Steering(policy)
    f, before, _, _ = _play(policy, _frames(3))[-1]
    with SaliencyOverlay(s) as ov:
        right = ov.compute(f, before, torch.tensor([[0.3]]))
        left = ov.compute(f, before, torch.tensor([[-0.3]]))
    assert right.target == "steering to the right" and left.target == "steering to the left"
    assert not np.allclose(right.cam, left.cam)
    assert right.cam[:10].max() == 0 and right.cam[-10:].max() == 0  # outside the region the CNN sees


def test_hooks_are_released_and_weights_unfrozen(policy):
    from agent.drive.saliency import SaliencyOverlay, resolve_saliency_layer

    layer = resolve_saliency_layer(policy)[1]
    before = len(layer._forward_hooks)
    ov = SaliencyOverlay(policy, policy.config.action_names)
    assert len(layer._forward_hooks) == before + 2 and len(ov.hooks) == 2
    # frozen but the target layer's bias: the backward stops at the target layer
    assert [p for p in policy.parameters() if p.requires_grad] == [layer.bias] and ov.grad_leaf is layer.bias
    ov.close()
    assert len(layer._forward_hooks) == before and not ov.hooks
    assert all(p.requires_grad for p in policy.parameters())
    ov.close()  # idempotent


def test_drive_releases_hooks(same_policy, capsys):
    from agent.drive.saliency import resolve_saliency_layer
    from agent.drive.session import DriveSession

    layer = resolve_saliency_layer(same_policy)[1]

    s = DriveSession(_parse("--headless", "--max-steps", "5"), same_policy, "tiny.pt", headless=True, force_draw=True)
    try:
        assert len(layer._forward_hooks) == 2
        s.play_episode(1_000_000, 1)
    finally:
        s.close()
    assert len(layer._forward_hooks) == 0


def test_memory_stays_flat_over_1000_steps(policy):
    """Grad-CAM every step (toggled off and on every 50 steps): no growth of Python or process memory."""
    from agent.actors.rollout import PolicyActor
    from agent.drive.explain import Overlays

    r = Renderer(scale=1)
    driver = PolicyActor(policy, label="tiny.pt")
    ov = Overlays(policy, driver, r, saliency=True, traces=True, class_names=policy.config.action_names)
    frames = _frames(16)

    def rss_mb():
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the runner does: one frame at a time gains nothing from intra-op threads
    try:
        for i in range(1000):
            if i % 50 == 0:
                ov.toggle_saliency()
            d = driver.act(frames[i % 16], None)
            extras: dict = {}
            ov.explain(frames[i % 16], d, extras)
            r.compose(StepView(frame=frames[i % 16], step=i + 1, extras=extras))
            assert not ov.saliency.cam.activations_and_grads.activations  # nothing kept between steps
            if i == 199:
                gc.collect()
                objects0, rss0 = len(gc.get_objects()), rss_mb()
        gc.collect()
        objects1, rss1 = len(gc.get_objects()), rss_mb()
    finally:
        ov.close()
        torch.set_num_threads(threads)
    assert objects1 - objects0 < 500, f"{objects1 - objects0} more live Python objects after 800 more steps"
    assert rss1 - rss0 < 16, f"process memory grew by {rss1 - rss0:.1f} MB over 800 steps"


# ----------------------------------------------------------------------------- traces
def test_trace_values_drawn_equal_the_layer_intermediates(policy):
    """What the panel draws for the newest step equals NAC.forward's intermediates on the same window."""
    from agent.drive.overlays import TracePanel
    from agent.drive.traces import TraceHistory, step_traces

    frames = _frames(11)
    steps = _play(policy, frames)
    hist = TraceHistory(TracePanel.plot_width_for(420))
    panel = TracePanel((420, 744), hist, policy.nac.num_heads, policy.config.window, policy.config.action_names)
    import pygame

    surf = pygame.Surface((420, 744))
    for i, (_, _, y, st) in enumerate(steps):
        hist.push(step_traces(st.last["intermediates"], 0, st.core.length - 1, policy.nac.topk), int(y.argmax()))
    panel.head = 3
    panel(surf, StepView(frame=frames[-1], step=len(frames)))
    drawn = panel.last_drawn

    # the same input through the sequence model: the last T frames of the window, last position
    T = policy.config.window
    window = torch.as_tensor(frames[-T:])[None]  # (1, T, H, W, C)
    with torch.no_grad():
        before = torch.as_tensor(frames[-T - 1:-1])  # each frame's previous one (motion channels)
        feats = policy.features(window.reshape(T, 96, 96, 3), before).view(1, T, -1)
        t = (torch.arange(len(frames) - T, len(frames), dtype=feats.dtype) * policy.config.frame_dt)[None]
        _, inter = policy.nac(feats, t=t, return_intermediates=True)
    h = 3
    valid = inter.valid[0, h, -1]
    ages = (T - 1) - inter.indices[0, h, -1]
    for name in ("phi", "omega", "logits", "weights"):
        vals = getattr(inter, name)[0, h, -1]
        assert drawn["mean"][name] == pytest.approx(float(vals[valid].mean()), rel=1e-4, abs=1e-5), name
        by_age = np.full(T, np.nan)
        by_age[ages[valid].numpy()] = vals[valid].numpy()
        np.testing.assert_allclose(drawn["keys"][name], by_age, rtol=1e-4, atol=1e-5)
    motor = inter.neurons["motor"][0, h, -1][valid].mean(0).numpy()
    np.testing.assert_allclose(drawn["neurons"]["motor"], motor, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(drawn["neurons"]["sensory"], inter.neurons["sensory"][0, -1].numpy(), rtol=1e-4,
                               atol=1e-5)
    assert drawn["head"] == 3


def test_trace_history_wraps_and_keeps_order():
    from agent.drive.traces import StepTraces, TraceHistory

    hist = TraceHistory(4)
    for i in range(7):
        z = np.full((2, 3), float(i), np.float32)
        tr = StepTraces(phi=z, omega=z + 1, logits=z, weights=z, t_gate=z, indices=np.zeros((2, 3), np.int64),
                        valid=np.ones((2, 3), bool), ages=np.tile(np.arange(3), (2, 1)))
        hist.push(tr, action_class=i % 3)
    assert len(hist) == 4 and hist.pushed == 7
    np.testing.assert_array_equal(hist.mean("phi", 0), [3, 4, 5, 6])
    np.testing.assert_array_equal(hist.view("action_class"), [0, 1, 2, 0])
    assert hist.by_age("omega", 1, 3).shape == (4, 3)


def test_dump_traces_round_trips(same_policy, tmp_path, capsys):
    from agent.drive.traces import load_traces

    out = tmp_path / "traces.npz"
    code = run_drive(_parse("--policy", "tiny.pt", "--headless", "--max-steps", "12", "--episodes", "2",
                            "--dump-traces", str(out)))
    printed = capsys.readouterr().out
    assert code == 0 and f"wrote {out}" in printed
    d = load_traces(out)
    H, K = same_policy.nac.num_heads, same_policy.nac.topk
    assert d["phi"].shape == (24, H, K) and d["valid"].dtype == bool
    assert d["neuron_sensory"].shape == (24, 3 * same_policy.config.d_model)
    np.testing.assert_array_equal(d["episode"], [1] * 12 + [2] * 12)
    np.testing.assert_array_equal(d["step"], list(range(1, 13)) * 2)
    assert list(d["action_names"]) == list(same_policy.config.action_names)
    # the first step of an episode sees one frame: one valid key with weight 1
    assert d["valid"][0].sum(-1).tolist() == [1] * H and d["valid"][12].sum(-1).tolist() == [1] * H
    np.testing.assert_allclose(d["weights"][0][d["valid"][0]], 1.0, rtol=1e-5)
    # rewards: the printed episode returns
    for ep in (1, 2):
        ret = float(d["reward"][d["episode"] == ep].sum())
        assert f"return {ret:8.1f}" in printed
    # the recorded phi equals a replay of the same first frame through the policy
    phi = d["phi"][0][d["valid"][0]]
    assert np.all((phi > 0) & (phi < 1))


def test_load_traces_rejects_other_files(tmp_path):
    from agent.drive.traces import load_traces

    bad = tmp_path / "x.npz"
    np.savez(bad, a=np.zeros(3))
    with pytest.raises(ValueError, match="not a NAC trace file"):
        load_traces(bad)
    (tmp_path / "y.npz").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="readable"):
        load_traces(tmp_path / "y.npz")
    with pytest.raises(FileNotFoundError):
        load_traces(tmp_path / "missing.npz")


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_traces_writes_a_png_of_the_expected_size(same_policy, tmp_path, capsys):
    from agent.cli import main

    traces = tmp_path / "t.npz"
    assert run_drive(_parse("--headless", "--max-steps", "15", "--dump-traces", str(traces))) == 0
    png = tmp_path / "fig.png"
    assert main(["plot-traces", str(traces), "--out", str(png), "--size", "900", "600"]) == 0
    assert _png_size(png) == (900, 600)
    assert main(["plot-traces", str(traces), "--out", str(png)]) == 2  # the figure is there
    assert "--overwrite" in capsys.readouterr().err and _png_size(png) == (900, 600)
    assert main(["plot-traces", str(traces), "--out", str(png), "--overwrite"]) == 0 and _png_size(png) == (1600, 1000)
    assert main(["plot-traces", str(traces), "--out", str(tmp_path / "h.png"), "--head", "2"]) == 0
    assert _png_size(tmp_path / "h.png") == (1600, 1000)
    assert main(["plot-traces", str(traces), "--out", str(tmp_path / "z.png"), "--head", "99"]) == 2
    assert "--head" in capsys.readouterr().err


def test_wiring_picture(policy_file, tmp_path, capsys):
    from agent.cli import main

    png = tmp_path / "wiring.png"
    assert main(["wiring", "--policy", str(policy_file), "--out", str(png)]) == 0
    assert _png_size(png) == (1200, 900)
    assert "motor" in capsys.readouterr().out
    assert main(["wiring", "--policy", str(policy_file), "--out", str(png)]) == 2
    assert "already exists; choose another --out or pass --overwrite" in capsys.readouterr().err


# ----------------------------------------------------------------------------- degraded policies
def test_policy_without_conv_or_intermediates_runs_with_overlays_off(policy, monkeypatch, tmp_path, capsys):
    import agent.drive.session  # run_drive loads the policy through these names
    from agent.nn.policy import DrivingPolicy, default_config

    class Plain(DrivingPolicy):
        """An LSTM-core policy (no NAC intermediates) whose 'last layer' is not a convolution."""

        def saliency_layer(self):
            return self.head.net[0]

    plain = Plain(default_config("carracing", core="lstm", window=4)).eval()
    monkeypatch.setattr(agent.drive.session, "load_policy", lambda name, device="cpu": plain)
    monkeypatch.setattr(agent.drive.session, "resolve_policy_path", lambda name: tmp_path / "plain.pt")
    code = run_drive(_parse("--policy", "plain.pt", "--headless", "--max-steps", "6", "--dump-traces",
                            str(tmp_path / "steps.npz"), "--record", str(tmp_path / "v.mp4")))
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert code == 0 and (tmp_path / "v.mp4").stat().st_size > 0
    assert "saliency overlay off" in err and "no convolution layer" in err
    # the steps are dumped without NAC traces (and without a map: no convolution), and the reason is given
    assert "6 steps: actions, rewards, speeds and labels; no NAC traces" in out and "lstm core has no NAC neurons" in out
    from agent.drive.traces import has_nac_traces, load_traces

    d = load_traces(tmp_path / "steps.npz")
    assert not has_nac_traces(d) and d["action"].shape == (6,) and "cam" not in d


def test_expert_runs_with_overlays_off_and_says_why(tiny_expert, capsys):
    from agent.actors.loading import load_policy
    from agent.drive.session import DriveSession

    s = DriveSession(_parse("--headless", "--max-steps", "5"), load_policy(tiny_expert), "expert.zip",
                     headless=True, force_draw=True)
    try:
        how, _, steps = s.play_episode(1_000_000, 1)
    finally:
        s.close()
    err = capsys.readouterr().err
    assert how == "done" and steps == 5
    assert "saliency overlay off" in err and "traces overlay off" in err
    assert s.overlays.saliency is None and s.overlays.panel is None


# ----------------------------------------------------------------------------- keys
def test_window_keys_pause_step_toggle_restart_quit(same_policy, monkeypatch, capsys):
    """Scripted key presses on SDL's dummy driver: P pauses, N steps once, S and T toggle, H cycles
    heads, ] raises the opacity, R restarts the episode, Q quits."""
    import pygame

    from agent.drive import session, window

    monkeypatch.setattr(session, "display_unavailable_reason", lambda: None)
    monkeypatch.setattr(window, "_NO_WINDOW_DRIVERS", ())
    script = iter([[pygame.K_s, pygame.K_t, pygame.K_h, pygame.K_RIGHTBRACKET], [pygame.K_p], [], [pygame.K_n],
                   [pygame.K_p], [pygame.K_r], [], [pygame.K_q]])
    seen = []
    present = window.Window.present

    def scripted_present(self, canvas):
        present(self, canvas)
        keys = next(script, [pygame.K_q])
        seen.append(keys)
        for k in keys:
            pygame.event.post(pygame.event.Event(pygame.KEYDOWN, key=k))

    sessions = []
    init = session.DriveSession.__init__

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        sessions.append(self)

    monkeypatch.setattr(window.Window, "present", scripted_present)
    monkeypatch.setattr(session.DriveSession, "__init__", keep)
    code = run_drive(_parse("--policy", "tiny.pt", "--max-steps", "50", "--fps-limit", "0"))
    out = capsys.readouterr().out
    s = sessions[0]
    assert code == 0
    assert not s.overlays.saliency_on and not s.overlays.panel.enabled
    assert s.overlays.panel.head == 1
    assert s.overlays.saliency_drawer.opacity == pytest.approx(0.6)
    assert "(restarted)" in out and "(stopped)" in out
    # steps: 1 (S T H ]), 2 (P: paused; N in the pause advances one step), 3 (P: resume), 4 (R) -> restart
    assert "steps    4" in out
    assert "P pause" in window.HELP_TEXT


def test_no_overlay_has_no_panel(same_policy, tmp_path):
    from agent.drive.session import DriveSession

    s = DriveSession(_parse("--headless", "--no-overlay", "--max-steps", "3"), same_policy, "tiny.pt", headless=True,
                     force_draw=True)
    try:
        s.play_episode(1_000_000, 1)
        assert s.renderer.panel_rect.width == 0 and not s.renderer.panels and not s.renderer.frame_filters
        assert s.overlays.saliency is None and s.driver.want_intermediates is False
    finally:
        s.close()


def test_record_contains_the_overlays(same_policy, tmp_path):
    """Headless --record: the video shows the panel with traces (not the empty panel background)."""
    import imageio.v2 as imageio

    out = tmp_path / "o.mp4"
    assert run_drive(_parse("--headless", "--max-steps", "20", "--record", str(out))) == 0
    plain = tmp_path / "p.mp4"
    assert run_drive(_parse("--headless", "--max-steps", "20", "--record", str(plain), "--no-traces",
                            "--no-saliency")) == 0
    last = [f for f in imageio.get_reader(str(out), format="FFMPEG")][-1]
    last_plain = [f for f in imageio.get_reader(str(plain), format="FFMPEG")][-1]
    r = Renderer()
    panel = (slice(r.panel_rect.top + 60, r.panel_rect.bottom - 200), slice(r.panel_rect.left + 20, r.panel_rect.right - 80))
    assert np.abs(last[panel].astype(int) - last_plain[panel].astype(int)).mean() > 2
    frame = (slice(0, r.frame_rect.height), slice(r.frame_rect.left, r.frame_rect.right))
    assert np.abs(last[frame].astype(int) - last_plain[frame].astype(int)).mean() > 1  # the heat map


def test_bench_drive_prints_four_configurations(policy_file, same_policy, capsys):
    from agent.bench.drive import CONFIGS, bench_drive, print_drive_table

    rows = bench_drive(str(policy_file), steps=10, warmup=2, saliency_variants=("gradcam@last",))
    print_drive_table(rows)
    out = capsys.readouterr().out
    assert [r["config"] for r in rows] == [c[0] for c in CONFIGS] + ["all on, gradcam@last"]
    assert all(r["fps"] > 0 and r["steps"] == 10 and r["step_p99_ms"] >= r["step_p50_ms"] for r in rows)
    assert "| all on |" in out and "FPS target" in out


@pytest.mark.parametrize("variant,match", [("gradcam", "METHOD@LAYER"), ("gradcam@", "METHOD@LAYER"),
                                           ("scorecam@conv2", "not one the live loop runs")])
def test_bench_drive_refuses_a_malformed_saliency_variant(variant, match):
    from agent.bench.drive import saliency_config

    with pytest.raises(ValueError, match=match):
        saliency_config(variant)
    assert saliency_config("layercam@auto") == ("all on, layercam@auto",
                                                {"saliency_method": "layercam", "saliency_layer": "auto"})


def test_non_nac_core_gets_saliency_and_a_reason_in_the_panel():
    from agent.drive.explain import Overlays
    from agent.drive.overlays import PanelNote
    from agent.nn.policy import DrivingPolicy, default_config
    from agent.actors.rollout import PolicyActor

    gru = DrivingPolicy(default_config("carracing", core="gru", window=3)).eval()
    actor = PolicyActor(gru, label="gru.pt")
    r = Renderer(scale=4, panel_width=300)
    ov = Overlays(gru, actor, r, saliency=True, traces=True)
    try:
        assert ov.saliency is not None and "saliency" not in ov.reasons  # Grad-CAM attributes to the CNN
        assert "gru core has no NAC neurons" in ov.reasons["traces"]
        notes = [p for p in r.panels if isinstance(p, PanelNote)]
        assert len(notes) == 1 and "gru" in notes[0].text and notes[0].surfaces
        frame = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
        d = actor.act(frame, None)
        extras: dict = {}
        ov.explain(frame, d, extras)
        assert extras["saliency"].cam.shape == (96, 96) and d.intermediates is None
    finally:
        ov.close()


def test_plot_labels_never_overlap():
    """The newest value's label and the range labels never share rows: a range label the value
    would cover is left out (the omega panel printed its lower bound under the current value)."""
    import pygame as pg

    from agent.drive.overlays import plot_label_layout

    r = pg.Rect(10, 40, 200, 60)
    for last in [None, -5.0, 0.0, 0.01, 0.5, 0.99, 1.0, 7.0]:
        lay = plot_label_layout(r, last, 0.0, 1.0, None if last is None else 14, 11, 11)
        rows = {k: (y, y + (14 if k == "value" else 11)) for k, y in lay.items() if y is not None}
        spans = sorted(rows.values())
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (last, rows)
        if last is not None:
            assert r.top - 7 <= lay["value"] <= r.bottom, (last, lay)
    low = plot_label_layout(r, 0.0, 0.0, 1.0, 14, 11, 11)
    mid = plot_label_layout(r, 0.5, 0.0, 1.0, 14, 11, 11)
    assert low["lo"] is None and low["hi"] is not None  # the value at the bottom hides the lower bound
    assert mid["lo"] is not None and mid["hi"] is not None  # in the middle all three show


def test_text_caches_keep_the_strings_that_repeat_and_stay_bounded():
    """Issue 38: the HUD's and the panel's text caches filled to 4,096 and 2,048 surfaces (about 30 MB
    of pixels: drive --record grew over its first episodes); they are LRUs of TEXT_CACHE_ENTRIES now."""
    import pygame

    from agent.drive.hud import TEXT_CACHE_ENTRIES, TextCache

    pygame.font.init()
    font = pygame.font.Font(None, 18)
    cache = TextCache(8)
    hot = cache.render(font, "speed", (255, 255, 255))
    for i in range(100):
        cache.render(font, f"return {i:7.1f}", (255, 255, 255))
        assert cache.render(font, "speed", (255, 255, 255)) is hot  # used every frame: never dropped
        assert len(cache) <= 8
    assert cache.pixel_bytes() > 0
    with pytest.raises(ValueError, match="capacity"):
        TextCache(0)
    r = Renderer(scale=2)
    frame = np.zeros((96, 96, 3), np.uint8)
    for i in range(3 * TEXT_CACHE_ENTRIES):  # every number new, as over a long drive
        r.compose(StepView(frame=frame, step=i + 1, episode_return=i / 10, fps=40 + i / 100, latency_ms=i / 7))
    assert len(r.text_cache) == TEXT_CACHE_ENTRIES


def test_hud_status_wraps_left_of_the_probability_bars():
    """A long status line (the saliency method, its target, its time) breaks into at most two lines that
    end before the probability bars, instead of running into them."""
    import pygame

    from agent.drive.hud import wrap_text

    pygame.font.init()
    font = pygame.font.Font(None, 20)
    text = "HiResCAM @ conv1: logit of 'gas', 8.8 ms, opacity 0.5"
    lines = wrap_text(font, text, 240)
    assert len(lines) == 2 and " ".join(lines) == text and all(font.size(s)[0] <= 240 for s in lines)
    assert wrap_text(font, "short", 240) == ["short"]
    cut = wrap_text(font, " ".join(["word"] * 80), 120, max_lines=2)
    assert len(cut) == 2 and cut[-1].endswith(" ...") and font.size(cut[-1])[0] <= 120
    r = Renderer(scale=4, panel_width=0)
    frame = np.zeros((96, 96, 3), np.uint8)
    plain = pygame.surfarray.array3d(r.compose(StepView(frame=frame, step=1))).copy()
    shown = pygame.surfarray.array3d(r.compose(StepView(frame=frame, step=1, status=text + "   traces on"))).copy()
    xs, ys = np.nonzero(np.abs(shown.astype(int) - plain.astype(int)).sum(-1))  # surfarray is (x, y)
    assert xs.size and ys.min() >= r.hud_rect.top
    assert xs.max() < r.hud_rect.left + 8 + r.status_width + 12  # nothing drawn over the bars
    assert np.unique(ys // 18).size >= 2  # two lines
