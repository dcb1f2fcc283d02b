import json

import numpy as np
import pytest
import torch
from udacity_fixture import write_recording

from agent.data.udacity import load_recording, preprocess
from agent.data.windows import UdacitySource, WindowDataset, make_windows, smooth_steering
from agent.eval.offline import evaluate_udacity, predict_recording
from agent.nn.policy import FILE_KIND, DrivingPolicy, default_config


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return DrivingPolicy(default_config("udacity", window=4)).eval()


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
        pre = policy(torch.from_numpy(preprocess(obs.reshape(-1, 160, 320, 3).numpy())).view(2, 5, 66, 200, 3))
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
    assert state.core.length == 4 and state.steps.tolist() == [7]
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
    assert isinstance(s, float) and -1 <= s <= 1 and st.steps.tolist() == [1]
    _, st = policy.predict(f[1], st, t=1.0)
    assert st.steps.tolist() == [2]
    _, st = policy.predict(f[1], st, episode_start=np.array([True]))
    assert st.steps.tolist() == [1]
    arr, _ = policy.predict(f)
    assert arr.shape == (2,) and arr.dtype == np.float32
    with pytest.raises(ValueError, match="160, 320, 3"):
        policy.predict(np.zeros((96, 96, 3), np.uint8))


def test_saliency_hooks_match_step(policy):
    frames, ts = _frames(5, 4), _times(5, 4)
    state = None
    for i in range(4):
        _, state = policy.step(frames[i:i + 1], state, t=torch.tensor([ts[i]]))
    k_before = state.core.k.clone()
    expected, _ = policy.step(frames[4:5], state, t=torch.tensor([ts[4]]))
    x = policy.saliency_input(frames[4].numpy())
    assert x.shape == (1, 3, 66, 200) and x.dtype == torch.float32 and -1 <= x.min() and x.max() <= 1
    x.requires_grad_(True)
    y = policy.saliency_forward(x, state, torch.tensor([ts[4]]))
    assert y.shape == (1, 1) and torch.allclose(y, expected, atol=1e-6)
    y.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert state.core.length == 4 and torch.equal(state.core.k, k_before) and state.steps.tolist() == [4]
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
    from agent.actors.loading import load_policy
    path = policy.save(tmp_path / "u.pt", metadata={"note": "x"})
    assert torch.load(path, weights_only=True)["kind"] == FILE_KIND
    loaded = DrivingPolicy.load(path)
    assert loaded.config == policy.config and loaded.metadata == {"note": "x"}
    via = load_policy(path)
    assert isinstance(via, DrivingPolicy) and via.output_kind == "steering"
    frames, ts = _frames(5, 5), _times(5, 5)
    s1 = s2 = None
    for i in range(5):
        a, s1 = policy.step(frames[i:i + 1], s1, t=torch.tensor([ts[i]]))
        b, s2 = via.step(frames[i:i + 1], s2, t=torch.tensor([ts[i]]))
        assert torch.equal(a, b)
    car = DrivingPolicy(default_config("carracing", window=2, obs_shape=(32, 32, 3))).save(tmp_path / "car.pt")
    assert load_policy(car).output_kind == "discrete"  # the same class and file kind serves CarRacing


def test_bad_policy_files(policy, tmp_path):
    from agent.actors.loading import load_policy

    with pytest.raises(FileNotFoundError):
        DrivingPolicy.load(tmp_path / "missing.pt")
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="not a readable policy file"):
        DrivingPolicy.load(junk)
    with pytest.raises(ValueError, match="not a readable policy file"):
        load_policy(junk)
    good = policy.save(tmp_path / "good.pt")
    payload = torch.load(good, weights_only=True)
    payload["format_version"] = 7
    torch.save(payload, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="format version 7"):
        load_policy(tmp_path / "future.pt")
    payload["format_version"] = 2
    payload["config"]["d_model"] = 40
    torch.save(payload, tmp_path / "mismatch.pt")
    with pytest.raises(ValueError, match="do not fit"):
        DrivingPolicy.load(tmp_path / "mismatch.pt")
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[:3000])
    with pytest.raises(ValueError):
        load_policy(tmp_path / "cut.pt")


def test_windows_split_and_batches(tmp_path):
    lengths = [5, 10]
    rng = np.random.default_rng(0)
    for r in (None, rng, rng, rng):
        items = make_windows(lengths, 4, r)
        covered = sorted((e, i) for e, s, n in items for i in range(s, s + n))
        assert covered == [(0, i) for i in range(5)] + [(1, i) for i in range(10)]  # every frame once
        assert all(1 <= n <= 4 and s + n <= lengths[e] for e, s, n in items)  # never across a sequence end
    root, _ = write_recording(tmp_path / "rec", n=8, gaps_ms=[70, 70, 70, 3000, 70, 70, 70])
    rec = load_recording(root, progress=False)
    train, val = UdacitySource([rec]).split(0.25)
    assert train.lengths == [4, 2] and val.lengths == [2]  # the break splits the training rows in two segments
    assert val.recordings[0].rows.tolist() == [7, 8]  # the last rows, contiguous
    ds = WindowDataset(train, 3, shuffle_borders=False)
    assert len(ds) == 3 and [ds.items[i][1:] for i in range(3)] == [(0, 3), (3, 1), (0, 2)]
    item = ds[0]
    assert item["obs"].shape == (3, 66, 200, 3) and item["mask"].tolist() == [True, True, True]
    assert torch.allclose(item["t"], torch.tensor([0.0, 0.07, 0.14], dtype=torch.float64))
    assert torch.allclose(item["target"], torch.from_numpy(rec.steering[:3]))
    short = ds[1]
    assert short["mask"].tolist() == [True, False, False] and short["obs"][1:].sum() == 0
    # augmentation draws depend on (seed, epoch, item), never on the worker
    aug = WindowDataset(UdacitySource([rec]), 3, shuffle_borders=True, seed=4)
    again = WindowDataset(UdacitySource([rec]), 3, shuffle_borders=True, seed=4)
    assert torch.equal(aug[1]["obs"], again[1]["obs"])


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
    from agent.actors.loading import load_policy

    root, _ = write_recording(tmp_path / "rec", n=12)
    out = tmp_path / "udacity-nac.pt"
    rc = main(["train", "--env", "udacity", "--data", str(root), "--out", str(out), "--run-dir", str(tmp_path / "run"),
               "--train.epochs", "1", "--policy.window", "4", "--train.val-fraction", "0.25", "--train.tensorboard",
               str(tmp_path / "tb"), "--json", str(tmp_path / "r.json")])
    assert rc == 0 and out.is_file()
    p = load_policy(out)
    assert isinstance(p, DrivingPolicy) and p.config.window == 4 and p.config.core == "nac-exact"
    assert p.metadata["command"].startswith("agent train") and p.metadata["metric"] == "mse"
    assert json.loads((tmp_path / "r.json").read_text())["n_val_frames"] == 3
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
    assert main(["train", "--env", "udacity", "--data", str(root), "--out", str(out), "--run-dir",
                 str(tmp_path / "run"), "--train.epochs", "1"]) == 2
    assert "already exists" in capsys.readouterr().err
    sorted((root / "IMG").glob("left_*"))[0].unlink()  # the first row's left image
    rc = main(["train", "--env", "udacity", "--data", str(root), "--out", str(tmp_path / "x.pt"), "--run-dir",
               str(tmp_path / "x"), "--train.epochs", "1", "--udacity.on-bad-row", "error", "--train.tensorboard", ""])
    assert rc == 2 and "row 1: missing image" in capsys.readouterr().err
    assert main(["evaluate", "--env", "udacity", "--policy", str(out), "--data", str(tmp_path / "tb")]) == 2
    assert "is not a Udacity recording (no driving_log.csv in it)" in capsys.readouterr().err
    write_recording(tmp_path / "rec2", n=4)  # two recordings below one folder: which one is meant is not guessed
    assert main(["evaluate", "--env", "udacity", "--policy", str(out), "--data", str(tmp_path)]) == 2
    assert "holds 2 Udacity recordings" in capsys.readouterr().err
    assert main(["evaluate", "--env", "carracing", "--policy", str(out), "--episodes", "1"]) == 2
    assert "policy for --env udacity" in capsys.readouterr().err
    # options of the other simulator are refused with a clear message
    assert main(["train", "--env", "udacity", "--data", str(root), "--out", str(tmp_path / "z.pt"),
                 "--run-dir", str(tmp_path / "z"), "--dagger.rounds", "1"]) == 2
    assert "dagger.rounds only apply to env 'carracing'" in capsys.readouterr().err
