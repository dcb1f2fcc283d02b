import json

import numpy as np
import pytest
import torch
from udacity_fixture import write_recording

from agent.nn.policy import PolicyState
from agent.nn.udacity_policy import FILE_KIND, UdacityNACPolicy, UdacityPolicyConfig
from agent.data.udacity import load_recording, preprocess
from agent.train.udacity_bc import (evaluate_udacity, make_batch, predict_recording, segment_windows,
                                    smooth_steering, split_contiguous)


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return UdacityNACPolicy(UdacityPolicyConfig(window=4)).eval()


def _frames(n, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, 160, 320, 3), dtype=np.uint8))


def _times(n, seed=0):
    """Irregular capture times (seconds) around 15 Hz, on a large clock offset."""
    return 1000.0 + np.cumsum(np.random.default_rng(seed).uniform(0.05, 0.12, n))


def test_architecture_and_shapes(policy):
    convs = [m for m in policy.features.convs if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (24, (5, 5), (2, 2)), (36, (5, 5), (2, 2)), (48, (5, 5), (2, 2)), (64, (3, 3), (1, 1)), (64, (3, 3), (1, 1))]
    assert policy.features.features_dim == 64 * 1 * 18
    assert policy.nac.d_model == 100 and policy.nac.num_heads == 20
    assert policy.output_kind == "steering" and policy.config.env == "udacity"
    assert policy.config.obs_shape == (160, 320, 3)
    obs = _frames(10).view(2, 5, 160, 320, 3)
    with torch.no_grad():
        steer, inter = policy(obs, return_intermediates=True)
        pre = policy(torch.from_numpy(preprocess(obs.numpy())))  # already preprocessed input
    assert steer.shape == (2, 5, 1) and inter.phi.shape == (2, 20, 5, 5)  # K = min(topk 8, T 5)
    assert torch.allclose(steer, pre)
    with pytest.raises(ValueError, match="raw RGB"):
        policy(torch.zeros(1, 2, 96, 96, 3, dtype=torch.uint8))


def test_streaming_equals_forward_with_timestamps(policy):
    frames, ts = _frames(7, 1), _times(7, 1)
    state, outs = None, []
    for i in range(7):
        s, state = policy.step(frames[i:i + 1], state, t=torch.tensor([ts[i]], dtype=torch.float64))
        outs.append(s)
        assert s.shape == (1, 1) and state.last["output"] is s
    rel = torch.tensor(ts - ts[0], dtype=torch.float32)[None]  # relative to the window start
    with torch.no_grad():
        full = policy(frames[None, :4], rel[:, :4]).clamp(-1, 1)  # first 4 positions (growing window)
        last = policy(frames[None, 3:7], rel[:, 3:7] - rel[:, 3:4]).clamp(-1, 1)[:, -1]  # sliding window of 4
    assert torch.allclose(torch.cat(outs[:4], 1), full[..., 0], atol=1e-5)
    assert torch.allclose(outs[-1], last, atol=1e-5)
    assert isinstance(state, PolicyState) and state.cache.length == 4 and state.steps == 7
    # different frame times give a different output (the NAC reads them)
    st2 = None
    for i in range(7):
        s2, st2 = policy.step(frames[i:i + 1], st2, t=torch.tensor([ts[0] + 0.5 * i], dtype=torch.float64))
    assert not torch.allclose(s2, outs[-1])


def test_step_default_times_and_intermediates(policy):
    frames = _frames(3, 2)
    a = b = None
    for i in range(3):
        sa, a = policy.step(frames[i:i + 1], a, return_intermediates=True)
        sb, b = policy.step(frames[i:i + 1], b, t=torch.tensor([i * policy.config.frame_dt]))
    assert torch.allclose(sa, sb) and a.last["intermediates"].phi.shape == (1, 20, 1, 3)
    batch, st = policy.step(frames, None)  # batch of 3 independent drives
    assert batch.shape == (3, 1) and batch.abs().max() <= 1


def test_predict_single_batch_episode_start(policy):
    f = _frames(2, 3).numpy()
    s, st = policy.predict(f[0])
    assert isinstance(s, float) and -1 <= s <= 1 and st.steps == 1
    _, st = policy.predict(f[1], st, t=1.0)
    assert st.steps == 2
    _, st = policy.predict(f[1], st, episode_start=np.array([True]))
    assert st.steps == 1
    arr, _ = policy.predict(f)
    assert arr.shape == (2,) and arr.dtype == np.float32
    with pytest.raises(ValueError, match="160, 320, 3"):
        policy.predict(np.zeros((96, 96, 3), np.uint8))


def test_saliency_hooks_match_step(policy):
    frames, ts = _frames(5, 4), _times(5, 4)
    state = None
    for i in range(4):
        _, state = policy.step(frames[i:i + 1], state, t=torch.tensor([ts[i]]))
    k_before = state.cache.k.clone()
    expected, _ = policy.step(frames[4:5], state, t=torch.tensor([ts[4]]))
    x = policy.saliency_input(frames[4].numpy())
    assert x.shape == (1, 3, 66, 200) and x.dtype == torch.float32 and -1 <= x.min() and x.max() <= 1
    x.requires_grad_(True)
    y = policy.saliency_forward(x, state, torch.tensor([ts[4]]))
    assert y.shape == (1, 1) and torch.allclose(y, expected, atol=1e-6)
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert state.cache.length == 4 and torch.equal(state.cache.k, k_before) and state.steps == 4  # not mutated
    first, _ = policy.step(frames[:1], None)
    assert torch.allclose(policy.saliency_forward(policy.saliency_input(frames[0].numpy()), None, None), first)
    layer = policy.saliency_layer()
    assert isinstance(layer, torch.nn.Conv2d) and layer.out_channels == 64 and layer is policy.features.convs[-2]
    assert policy.saliency_region((160, 320)) == (60, 135, 0, 320)
    policy.train()
    try:  # eval-mode even when the module is in training mode (no dropout)
        assert torch.allclose(policy.saliency_forward(policy.saliency_input(frames[0].numpy())), first)
        assert policy.training
    finally:
        policy.eval()


def test_save_load_roundtrip_and_dispatch(policy, tmp_path):
    from agent.loading import load_policy
    from agent.nn.policy import NACPolicy, PolicyConfig

    path = policy.save(tmp_path / "u.pt", metadata={"note": "x"})
    assert torch.load(path, weights_only=True)["kind"] == FILE_KIND
    loaded = UdacityNACPolicy.load(path)
    assert loaded.config == policy.config and loaded.metadata == {"note": "x"}
    via = load_policy(path)
    assert isinstance(via, UdacityNACPolicy)
    frames, ts = _frames(5, 5), _times(5, 5)
    s1 = s2 = None
    for i in range(5):
        a, s1 = policy.step(frames[i:i + 1], s1, t=torch.tensor([ts[i]]))
        b, s2 = via.step(frames[i:i + 1], s2, t=torch.tensor([ts[i]]))
        assert torch.equal(a, b)
    car = NACPolicy(PolicyConfig(window=2, obs_shape=(32, 32, 3))).save(tmp_path / "car.pt")
    assert isinstance(load_policy(car), NACPolicy)  # the CarRacing policy still loads as before
    with pytest.raises(ValueError, match="not a Udacity NAC policy file"):
        UdacityNACPolicy.load(car)


def test_bad_policy_files(policy, tmp_path):
    from agent.loading import load_policy

    with pytest.raises(FileNotFoundError):
        UdacityNACPolicy.load(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a readable policy file"):
        UdacityNACPolicy.load(junk)
    with pytest.raises(ValueError, match="not a readable policy file"):
        load_policy(junk)
    good = policy.save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    payload["format_version"] = 7
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="format version 7"):
        load_policy(tmp_path / "future.pt")
    payload["format_version"] = 1
    payload["config"]["d_model"] = 40
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match="do not fit"):
        UdacityNACPolicy.load(tmp_path / "mismatch.pt")
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[:3000])
    with pytest.raises(ValueError):
        load_policy(tmp_path / "cut.pt")


def test_windows_split_and_batches(tmp_path):
    segs = np.array([[0, 5], [5, 15]])
    rng = np.random.default_rng(0)
    for r in (None, rng, rng, rng):
        items = segment_windows(segs, 4, r)
        covered = sorted(i for s, n in items for i in range(s, s + n))
        assert covered == list(range(15))  # every frame once
        assert all(n <= 4 and (s + n <= 5 or s >= 5) for s, n in items)  # never across the segment break
    root, _ = write_recording(tmp_path / "rec", n=8, gaps_ms=[70, 70, 70, 3000, 70, 70, 70])
    rec = load_recording(root, progress=False)
    train, val = split_contiguous(rec, 0.25)
    assert len(train) == 6 and len(val) == 2 and val.rows.tolist() == [7, 8]  # the last rows, contiguous
    obs, t, y, mask = make_batch(train, [(2, 2), (4, 2)], 3, None, None)
    assert obs.shape == (2, 3, 66, 200, 3) and mask.tolist() == [[True, True, False]] * 2
    assert torch.allclose(t[0, :2], torch.tensor([0.0, 0.07])) and torch.allclose(y[:, :2], torch.from_numpy(
        np.stack([train.steering[2:4], train.steering[4:6]])))


def test_label_smoothing_stays_inside_segments(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=6, gaps_ms=[70, 70, 4000, 70, 70], steering=[0, 0.3, 0, 0.6, 0, 0])
    rec = load_recording(root, progress=False)
    sm = smooth_steering(rec, 3)
    assert np.allclose(sm.steering, [0.15, 0.1, 0.15, 0.3, 0.2, 0.0])  # ends average over fewer frames
    assert smooth_steering(rec, 1) is rec and np.allclose(rec.steering, [0, 0.3, 0, 0.6, 0, 0])  # input untouched
    with pytest.raises(ValueError, match="odd"):
        smooth_steering(rec, 4)


def test_predict_recording_restarts_at_breaks(policy, tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=6, gaps_ms=[70, 70, 4000, 70, 70])
    rec = load_recording(root, progress=False)
    pred = predict_recording(policy, rec)
    state = None
    for i in range(3, 6):  # the second segment alone, from an empty window
        s, state = policy.step(rec.frames_center[i:i + 1], state, t=torch.tensor([rec.timestamps[i]]))
    assert np.isclose(pred[5], float(s), atol=1e-6)
    res = evaluate_udacity(policy, rec, progress=False, train_mean=0.0)
    assert res["n_frames"] == 6 and res["n_segments"] == 2
    assert np.isclose(res["mse"], np.mean((pred - rec.steering) ** 2)) and res["train_mean_mse"] == res["zero_mse"]
    assert res["n_moving"] == 6 and np.isclose(res["moving_mse"], res["mse"])  # the fixture drives at 30 mph
    still = evaluate_udacity(policy, rec, progress=False, min_speed=40)
    assert still["n_moving"] == 0 and still["moving_mse"] is None


def test_cli_train_and_evaluate_smoke(tmp_path, capsys):
    from agent.cli import main
    from agent.loading import load_policy

    root, _ = write_recording(tmp_path / "rec", n=12)
    out = tmp_path / "udacity-nac.pt"
    rc = main(["train", "--env", "udacity", "--data", str(root), "--out", str(out), "--epochs", "1", "--window", "4",
               "--val-fraction", "0.25", "--tensorboard", str(tmp_path / "tb"), "--report", str(tmp_path / "r.json")])
    assert rc == 0 and out.is_file()
    p = load_policy(out)
    assert isinstance(p, UdacityNACPolicy) and p.config.window == 4 and p.config.mode == "exact"
    assert p.metadata["command"].startswith("agent train") and p.metadata["n_val_frames"] == 3
    assert len(json.loads((tmp_path / "r.json").read_text())["epochs"]) == 1
    assert any(f.name.startswith("events") for f in (tmp_path / "tb").rglob("*"))
    js = tmp_path / "eval.json"
    rc = main(["evaluate", "--env", "udacity", "--policy", str(out), "--data", str(root), "--json", str(js)])
    assert rc == 0
    res = json.loads(js.read_text())
    assert res["n_frames"] == 12 and res["mse"] >= 0 and res["mae"] >= 0 and "train_mean_mse" in res
    assert "steering MSE" in capsys.readouterr().out
    # user errors: one line, exit code 2
    assert main(["evaluate", "--env", "udacity", "--policy", str(out)]) == 2
    assert "needs --data" in capsys.readouterr().err
    assert main(["train", "--env", "udacity", "--data", str(root), "--out", str(out), "--epochs", "1"]) == 2
    assert "already exists" in capsys.readouterr().err
    sorted((root / "IMG").glob("left_*"))[0].unlink()  # the first row's left image
    rc = main(["train", "--env", "udacity", "--data", str(root), "--out", str(tmp_path / "x.pt"), "--epochs", "1",
               "--on-bad-row", "error", "--tensorboard", ""])
    assert rc == 2 and "row 1: missing image" in capsys.readouterr().err
    assert main(["evaluate", "--env", "udacity", "--policy", str(out), "--data", str(tmp_path)]) == 2
    assert main(["evaluate", "--env", "carracing", "--policy", str(out), "--episodes", "1"]) == 2
    assert "is a Udacity steering policy" in capsys.readouterr().err
