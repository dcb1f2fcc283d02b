"""The one policy class: features extractor -> temporal core -> action head, for both simulators."""

import numpy as np
import pytest
import torch

from agent.nn.features import CarRacingCNN, PilotNet
from agent.nn.policy import DrivingPolicy, PolicyConfig, default_config


@pytest.fixture(scope="module")
def policy():
    return DrivingPolicy(default_config("carracing", window=6)).eval()


def test_cnn_flatten_size_from_dry_run():
    cnn = CarRacingCNN((96, 96, 3))
    assert cnn.features_dim == 30 * 9 * 9
    small = CarRacingCNN((64, 80, 3))
    assert small(torch.zeros(2, 64, 80, 3, dtype=torch.uint8)).shape == (2, small.features_dim)
    with pytest.raises(ValueError, match="too small"):
        CarRacingCNN((8, 8, 3))
    with pytest.raises(ValueError, match=r"\(H, W, C\)"):
        CarRacingCNN((10,))
    assert PilotNet().features_dim == 64 * 1 * 18


def test_heads_follow_the_action_space():
    car = DrivingPolicy(default_config("carracing", core="gru"))
    uda = DrivingPolicy(default_config("udacity", core="none", window=2))
    assert car.output_kind == "discrete" and car.head.metric == "accuracy" and car.head.higher_is_better
    assert uda.output_kind == "steering" and uda.head.metric == "mse" and not uda.head.higher_is_better
    assert car.head.better(0.9, 0.8) and not car.head.better(0.8, 0.9) and car.head.better(0.1, float("nan"))
    assert uda.head.better(0.1, 0.2) and not uda.head.better(float("nan"), 0.2)
    with pytest.raises(ValueError, match="unknown core"):
        default_config("carracing", core="transformer-xl")
    with pytest.raises(ValueError, match="unknown env"):
        default_config("duckietown")


def test_forward_shapes_and_intermediates(policy):
    obs = torch.randint(0, 255, (2, 6, 96, 96, 3), dtype=torch.uint8)
    logits, inter = policy(obs, return_intermediates=True)
    assert logits.shape == (2, 6, 5)
    assert inter.phi.shape == (2, 16, 6, 6)  # K = min(8, T)
    lstm = DrivingPolicy(default_config("carracing", core="lstm", window=3)).eval()
    out, inter = lstm(obs[:, :3], return_intermediates=True)
    assert out.shape == (2, 3, 5) and inter is None


def test_streaming_equals_window(policy):
    obs = torch.randint(0, 255, (1, 10, 96, 96, 3), dtype=torch.uint8)
    state, outs = None, []
    for i in range(10):
        logits, state = policy.step(obs[:, i], state)
        outs.append(logits)
    with torch.no_grad():
        ref = policy(obs[:, 4:10], prev=obs[:, 3])[:, -1]  # the last window of 6 frames (and the frame before it)
        ref0 = policy(obs[:, :6])
    assert torch.allclose(outs[-1], ref, atol=1e-5)
    assert torch.allclose(torch.stack(outs[:6], 1), ref0, atol=1e-5)
    assert state.core.length == 6 and state.steps.tolist() == [10]


@pytest.mark.parametrize("core", ["nac-steady", "lstm", "mha"])
def test_predict_batched_resets_only_the_started_rows(core):
    p = DrivingPolicy(default_config("carracing", core=core, window=4)).eval()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (6, 2, 96, 96, 3), dtype=np.uint8)
    state = None
    for i in range(5):
        acts, state = p.predict(frames[i], state)
    assert acts.shape == (2,) and acts.dtype == np.int64 and state.steps.tolist() == [5, 5]
    _, s_reset = p.predict(frames[5], state, episode_start=np.array([False, True]))
    _, s_keep = p.predict(frames[5], state)
    _, s_fresh = p.predict(frames[5, 1])
    assert s_reset.steps.tolist() == [6, 1]
    out_reset, out_keep = s_reset.last["output"], s_keep.last["output"]
    assert torch.allclose(out_reset[0], out_keep[0], atol=1e-5)  # row 0 kept its window
    assert torch.allclose(out_reset[1], s_fresh.last["output"][0], atol=1e-5)  # row 1 starts afresh
    assert not torch.allclose(out_reset[1], out_keep[1], atol=1e-5)
    a, st = p.predict(frames[0, 0])
    assert isinstance(a, int) and 0 <= a < 5
    with pytest.raises(ValueError, match="96, 96, 3"):
        p.predict(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="rows"):
        p.predict(frames[0], st)  # 2 frames against a 1-row state


def test_steering_policy_predicts_clipped_floats():
    p = DrivingPolicy(default_config("udacity", core="cfc", window=3)).eval()
    with torch.no_grad():
        p.head.net[-1].bias.fill_(5.0)  # push the output past the action box
    frame = np.random.default_rng(1).integers(0, 255, (160, 320, 3), dtype=np.uint8)
    a, _ = p.predict(frame)
    assert isinstance(a, float) and a == 1.0
    acts, _ = p.predict(np.stack([frame, frame]), t=np.array([0.0, 0.0]))
    assert acts.shape == (2,) and acts.dtype == np.float32 and np.all(acts == 1.0)


@pytest.mark.parametrize("core", ["nac-exact", "gru", "none"])
def test_save_load_same_actions(core, tmp_path):
    p = DrivingPolicy(default_config("carracing", core=core, window=3)).eval()
    path = p.save(tmp_path / "p.pt", metadata={"note": "test"})
    from agent.actors.loading import load_policy

    loaded = load_policy(path)
    assert type(loaded) is DrivingPolicy and loaded.config == p.config and loaded.metadata == {"note": "test"}
    frames = np.random.default_rng(2).integers(0, 255, (5, 96, 96, 3), dtype=np.uint8)
    s1 = s2 = None
    for f in frames:
        l1, s1 = p.step(f[None], s1)
        l2, s2 = loaded.step(f[None], s2)
        assert torch.equal(l1, l2)


def test_loading_takes_the_stored_sensory_masks_without_rebuilding_them(tmp_path, monkeypatch):
    """A policy file's sensory masks are buffers: loading reads them and does not build the ncps
    wirings again (seconds for CarRacing's 2430 CNN features); a file without them does not load."""
    import agent.nn.nac as nac
    from agent.actors.loading import load_policy

    p = DrivingPolicy(default_config("carracing", core="nac-steady", window=3)).eval()
    path = p.save(tmp_path / "p.pt")

    def no_build(*args, **kwargs):
        raise AssertionError("the sensory wiring was rebuilt while loading")

    monkeypatch.setattr(nac, "_sensory_mask", no_build)
    loaded = load_policy(path)
    for name, buf in p.named_buffers():
        if name.endswith(".mask"):
            assert torch.equal(dict(loaded.named_buffers())[name], buf), name
    assert not loaded.core.nac.sensory["q"].mask.all()  # the stored sparse mask, not the placeholder
    frames = np.random.default_rng(3).integers(0, 255, (4, 96, 96, 3), dtype=np.uint8)
    s1 = s2 = None
    for f in frames:
        l1, s1 = p.step(f[None], s1)
        l2, s2 = loaded.step(f[None], s2)
        assert torch.equal(l1, l2)
    # outside loading, a new layer builds its wiring as before
    with pytest.raises(AssertionError, match="rebuilt"):
        DrivingPolicy(default_config("carracing", core="nac-steady", window=3))
    # a file whose masks are missing is refused whole
    payload = torch.load(path, weights_only=True)
    del payload["state_dict"]["core.nac.sensory.k.mask"]
    torch.save(payload, tmp_path / "no-mask.pt")
    with pytest.raises(ValueError, match="do not fit"):
        load_policy(tmp_path / "no-mask.pt")


def test_bad_policy_files_give_clear_errors(policy, tmp_path):
    from agent.actors.loading import load_policy

    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file at all")
    with pytest.raises(ValueError, match="not a readable policy file"):
        load_policy(junk)
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    with pytest.raises(ValueError, match="no kind"):
        load_policy(other)
    torch.save({"kind": "someone-elses-model"}, other)
    with pytest.raises(ValueError, match="someone-elses-model"):
        load_policy(other)
    good = policy.save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    payload["format_version"] = 99
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="format version 99"):
        load_policy(tmp_path / "future.pt")
    payload["format_version"] = 2
    payload["config"]["d_model"] = 32
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match="do not fit"):
        load_policy(tmp_path / "mismatch.pt")
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:2000])
    with pytest.raises(ValueError):
        load_policy(truncated)


def _as_format_1(p: DrivingPolicy) -> dict:
    """A format-1 (pre-unification NACPolicy) file's contents with ``p``'s weights."""
    c = p.config
    old = {"obs_shape": list(c.obs_shape), "n_actions": 5, "window": c.window, "frame_dt": c.frame_dt,
           "d_model": c.d_model, "num_heads": c.core_kwargs["num_heads"], "topk": c.core_kwargs["topk"],
           "sparsity": c.core_kwargs["sparsity"], "mode": c.core.split("-")[1], "hidden": c.head_hidden,
           "dropout": c.features_kwargs["dropout"], "seed": c.seed, "env": "carracing",
           "action_names": list(c.action_names)}
    state = {}
    for k, v in p.state_dict().items():
        k = k.replace("core.nac.", "nac.", 1) if k.startswith("core.") else k.replace("head.net.", "head.", 1)
        state[k] = v
    return {"kind": "nac-drive-policy", "format_version": 1, "config": old, "state_dict": state, "metadata": {"x": 1}}


def test_format_1_files_convert_to_the_same_policy(tmp_path):
    from agent.cli import main
    from agent.actors.loading import load_policy

    # format-1 files predate the dashboard mask and the motion channels: the paper's input
    p = DrivingPolicy(default_config("carracing", window=3, seed=5, features_kwargs={"dropout": 0.2})).eval()
    torch.save(_as_format_1(p), tmp_path / "old.pt")
    in_memory = load_policy(tmp_path / "old.pt")
    assert main(["convert-policy", str(tmp_path / "old.pt"), str(tmp_path / "new.pt")]) == 0
    converted = load_policy(tmp_path / "new.pt")
    assert converted.metadata["converted_from"]["format_version"] == 1 and converted.metadata["x"] == 1
    frames = np.random.default_rng(3).integers(0, 255, (4, 96, 96, 3), dtype=np.uint8)
    s = [None, None, None]
    for f in frames:
        outs = []
        for i, q in enumerate((p, in_memory, converted)):
            o, s[i] = q.step(f[None], s[i])
            outs.append(o)
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert main(["convert-policy", str(tmp_path / "new.pt"), str(tmp_path / "again.pt")]) == 2  # already format 2
    assert main(["convert-policy", str(tmp_path / "old.pt"), str(tmp_path / "new.pt")]) == 2  # DST is there
    assert load_policy(tmp_path / "new.pt").metadata["converted_from"]["format_version"] == 1


def test_policy_config_validates():
    with pytest.raises(ValueError, match="window"):
        PolicyConfig(window=0)
    with pytest.raises(ValueError, match="action_names"):
        PolicyConfig(action_names=("a", "b"))
    with pytest.raises(ValueError, match="unknown policy option"):
        default_config("carracing", windoww=3)


def test_a_failed_save_leaves_no_temporary_file_and_keeps_the_old_one(policy, tmp_path):
    """save() writes NAME.tmp and renames it: when the rename fails (here the target is a folder),
    the OSError reaches the caller and no NAME.tmp is left behind."""
    target = tmp_path / "policy.pt"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        policy.save(target)
    assert not (tmp_path / "policy.pt.tmp").exists() and (target / "keep").read_text() == "x"
    good = policy.save(tmp_path / "ok.pt")
    assert good.exists() and not (tmp_path / "ok.pt.tmp").exists()
