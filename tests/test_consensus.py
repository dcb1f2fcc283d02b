"""The other drivers' consensus (agent.eval.consensus) and `agent lodo-consensus`."""

import json

import cv2
import numpy as np
import pytest
from cli_run import run_cli
from udacity_fixture import write_recording

from agent.data.udacity_cache import load_cached
from agent.eval.consensus import (ConsensusConfig, VoteInputs, consensus_predict, leave_one_out_votes, view_features,
                                  vote_inputs)
from agent.eval.steering import smooth_in_time
from agent.train.lodo import driver_names


def test_the_k_nearest_views_vote():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 10)).astype(np.float32) * 5
    db = np.concatenate([c + 0.1 * rng.normal(size=(8, 10)) for c in centres]).astype(np.float32)
    targets = np.repeat([-0.4, 0.0, 0.3], 8) + 0.01 * np.arange(24)
    query = centres + 0.1 * rng.normal(size=(3, 10)).astype(np.float32)
    pred = consensus_predict(query, db, targets, ConsensusConfig(k=8, dims=5))
    np.testing.assert_allclose(pred, [targets[i * 8:(i + 1) * 8].mean() for i in range(3)], atol=1e-9)
    # k = 1 picks the single closest frame; the full database averages everything
    one = consensus_predict(db[5:6], db, targets, ConsensusConfig(k=1, dims=10))
    assert one[0] == pytest.approx(targets[5])
    allk = consensus_predict(query, db, targets, ConsensusConfig(k=24, dims=3))
    np.testing.assert_allclose(allk, targets.mean())


def test_bad_input_is_refused_with_what_was_wrong():
    db = np.zeros((5, 4), np.float32)
    with pytest.raises(ValueError, match="same width"):
        consensus_predict(np.zeros((2, 3), np.float32), db, np.zeros(5), ConsensusConfig(k=1, dims=2))
    with pytest.raises(ValueError, match="one per database frame"):
        consensus_predict(np.zeros((2, 4), np.float32), db, np.zeros(4), ConsensusConfig(k=1, dims=2))
    with pytest.raises(ValueError, match="fewer than k = 6"):
        consensus_predict(np.zeros((2, 4), np.float32), db, np.zeros(5), ConsensusConfig(k=6, dims=2))
    with pytest.raises(ValueError, match="finite"):
        consensus_predict(np.full((2, 4), np.nan, np.float32), db, np.zeros(5), ConsensusConfig(k=1, dims=2))
    for bad in ({"k": 0}, {"dims": 0}, {"dims": 801}, {"min_speed": -1.0}, {"k": 2.5}):
        with pytest.raises(ValueError):
            ConsensusConfig(**bad)


def test_view_features_ignore_brightness_and_check_shape():
    rng = np.random.default_rng(1)
    small = rng.integers(40, 120, (3, 8, 25, 3), dtype=np.uint8)  # views with structure, as a road scene has
    crops = np.stack([cv2.resize(s, (200, 66), interpolation=cv2.INTER_LINEAR) for s in small])
    brighter = crops.copy()
    brighter[..., 0] = np.clip(crops[..., 0].astype(int) * 2 + 5, 0, 255)
    f, g = view_features(crops), view_features(brighter)
    assert f.shape == (3, 800) and f.dtype == np.float32
    np.testing.assert_allclose(f.mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(f.std(1), 1, atol=1e-3)
    np.testing.assert_allclose(f, g, atol=0.05)
    assert not np.allclose(f[0], f[1], atol=0.5)  # different views stay apart
    with pytest.raises(ValueError, match=r"\(N, 66, 200, 3\)"):
        view_features(np.zeros((2, 66, 100, 3), np.uint8))


def _drivers(tmp_path, n=3, rows=12):
    out = []
    for k in range(n):
        steer = [round(0.3 * np.sin(0.7 * i + k), 3) for i in range(rows)]
        root, _ = write_recording(tmp_path / "data" / f"driver{k}", n=rows, steering=steer)
        out.append(str(root))
    return out


def test_cli_consensus_writes_a_lodo_folder(tmp_path, capsys):
    data = _drivers(tmp_path)
    out, cache = tmp_path / "consensus", tmp_path / "cache"
    common = ["--data", *data, "--out", str(out), "--dims", "4", "--crop-cache", str(cache),
              "--tracks", "*", "lake", "driver2", "jungle"]
    argv = ["lodo-consensus", *common, "--k", "3"]
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    names = driver_names(data)
    recs = {n: load_cached(p, cache, progress=False) for n, p in zip(names, data)}
    for n in names:
        fold = json.loads((out / "folds" / f"{n}.json").read_text())
        assert fold["track"] == ("jungle" if n == "driver2" else "lake")
        assert fold["train_drivers"] == [m for m in names if m != n]
        # the fold's prediction is the vote of the OTHER drivers' smoothed steering, recomputed here
        others = [m for m in names if m != n]
        feats = {m: view_features(recs[m].camera("center")) for m in names}
        smooth = {m: smooth_in_time(recs[m].steering, recs[m].timestamps, segments=recs[m].segments) for m in names}
        want = consensus_predict(feats[n], np.concatenate([feats[m] for m in others]),
                                 np.concatenate([smooth[m] for m in others]), ConsensusConfig(k=3, dims=4))
        with np.load(out / "folds" / f"{n}.npz") as z:
            np.testing.assert_allclose(z["pred"], want, atol=1e-6)
            np.testing.assert_allclose(z["label"], recs[n].steering)
            pred = z["pred"].astype(np.float64)
        assert fold["mse"] == pytest.approx(np.mean((pred - recs[n].steering) ** 2), rel=1e-5)
    table = json.loads((out / "lodo.json").read_text())
    assert set(table["tracks"]) == {"lake", "jungle", "all"}
    assert "smoothed ratio" in (out / "lodo.md").read_text()
    # a rerun skips the written folds; other settings in the same folder are refused, nothing lost
    before = (out / "folds" / "driver0.json").read_bytes()
    rc, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert (out / "folds" / "driver0.json").read_bytes() == before
    rc, err = run_cli(["lodo-consensus", *common, "--k", "2"], capsys)
    assert rc != 0 and "other settings" in err and (out / "folds" / "driver0.json").read_bytes() == before
    # bad input: one recording, an unknown fold, k of 0
    rc, err = run_cli(["lodo-consensus", "--data", data[0], "--out", str(tmp_path / "x")], capsys)
    assert rc != 0 and "at least 2 recordings" in err
    rc, err = run_cli([*argv, "--folds", "nobody"], capsys)
    assert rc != 0 and "unknown driver(s) nobody" in err
    rc, err = run_cli(["lodo-consensus", "--data", *data, "--out", str(tmp_path / "y"), "--k", "0"], capsys)
    assert rc != 0 and "k (neighbours)" in err


def test_no_recording_votes_on_its_own_frames():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(6, 800)).astype(np.float32)
    far = feats + 50.0
    a = VoteInputs(feats, np.linspace(-0.5, 0.5, 6), np.ones(6, bool))
    b = VoteInputs(feats.copy(), np.linspace(0.4, -0.1, 6), np.ones(6, bool))  # the same views, other steering
    c = VoteInputs(far, np.full(6, 0.9), np.ones(6, bool))
    va, vb, vc = leave_one_out_votes([a, b, c], ConsensusConfig(k=1, dims=8))
    np.testing.assert_allclose(va, b.smoothed)  # a's frames get b's steering at the same views, never a's own
    np.testing.assert_allclose(vb, a.smoothed)
    assert vc.shape == (6,)
    # frames that are not voters (too slow, reversing) never vote
    b_slow = VoteInputs(b.features, b.smoothed, np.zeros(6, bool))
    va2 = leave_one_out_votes([a, b_slow, c], ConsensusConfig(k=1, dims=8))[0]
    np.testing.assert_allclose(va2, 0.9)
    with pytest.raises(ValueError, match="at least 2 recordings"):
        leave_one_out_votes([a])


def test_lodo_folds_train_on_the_other_training_drivers_vote(tmp_path):
    from agent.cli import main
    data = _drivers(tmp_path)
    cache = tmp_path / "cache"

    def lodo(out, *extra):
        args = ["train", "--env", "udacity", "--data", *data, "--lodo.out", str(out), "--policy.core", "none",
                "--policy.window", "2", "--train.epochs", "1", "--train.val-fraction", "0",
                "--udacity.augment-prob", "0", "--udacity.crop-cache", str(cache), "--train.tensorboard", "", *extra]
        assert main(args) == 0
        return {k: json.loads((out / "folds" / f"driver{k}.json").read_text()) for k in range(3)}

    voted = lodo(tmp_path / "voted", "--udacity.consensus-k", "2")
    own = lodo(tmp_path / "own")
    recs = [load_cached(p, cache, progress=False) for p in data]
    for k in range(3):
        train = [j for j in range(3) if j != k]  # the held-out driver neither votes nor is voted on
        votes = leave_one_out_votes([vote_inputs(recs[j]) for j in train], ConsensusConfig(k=2))
        assert voted[k]["settings"]["consensus_k"] == 2 and "consensus_k" not in own[k]["settings"]
        assert voted[k]["train_mean_steering"] == pytest.approx(np.mean(np.concatenate(votes)), abs=1e-5)
        assert own[k]["train_mean_steering"] == pytest.approx(np.mean(np.concatenate([recs[j].steering for j in train])),
                                                              abs=1e-5)
        assert voted[k]["train_mean_steering"] != pytest.approx(own[k]["train_mean_steering"], abs=1e-3)


def test_train_on_the_vote_of_the_other_drivers(tmp_path, capsys):
    from agent.nn.policy import DrivingPolicy
    data = _drivers(tmp_path)
    cache = tmp_path / "cache"
    common = ["train", "--env", "udacity", "--policy.core", "none", "--policy.window", "2", "--train.epochs", "1",
              "--train.val-fraction", "0", "--udacity.augment-prob", "0", "--udacity.crop-cache", str(cache),
              "--train.tensorboard", "", "--udacity.consensus-k", "2"]
    rc, err = run_cli([*common, "--data", *data, "--out", str(tmp_path / "p.pt"), "--run-dir", str(tmp_path / "p")],
                      capsys)
    assert rc == 0, err
    recs = [load_cached(p, cache, progress=False) for p in data]
    votes = leave_one_out_votes([vote_inputs(r) for r in recs], ConsensusConfig(k=2))
    meta = DrivingPolicy.load(tmp_path / "p.pt").metadata
    assert meta["train_mean_steering"] == pytest.approx(np.mean(np.concatenate(votes)), abs=1e-5)
    rc, err = run_cli([*common, "--data", data[0], "--out", str(tmp_path / "q.pt"), "--run-dir", str(tmp_path / "q")],
                      capsys)
    assert rc != 0 and "at least 2 recordings" in err and not (tmp_path / "q.pt").exists()
    rc, err = run_cli([*common[:-1], "-1", "--data", *data, "--out", str(tmp_path / "r.pt"), "--run-dir",
                       str(tmp_path / "r")], capsys)
    assert rc != 0 and "consensus_k must be" in err
