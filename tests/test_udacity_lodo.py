"""Crop cache, evaluation by recording and leave-one-driver-out, on tiny recordings the tests write."""

import json

import cv2
import numpy as np
import pytest
import torch
from cli_run import run_cli
from udacity_fixture import write_recording

from agent.data.frame_cache import mapped_buffer
from agent.data.udacity import AugmentParams, augment_frames, load_recording, preprocess
from agent.data.udacity_cache import augment_crops, build_cache, cache_paths, load_cached
from agent.data.windows import UdacitySource, WindowDataset, smooth_steering
from agent.train.lodo import driver_names, lodo_table, subsample_blocks


def _drivers(tmp_path, n=3, rows=14):
    """n recordings ("drivers"), each with its own steering pattern."""
    out = []
    for k in range(n):
        steer = [round(0.3 * np.sin(0.7 * i + k) * (i % (2 + k) == 0), 3) for i in range(rows)]
        root, _ = write_recording(tmp_path / "data" / f"driver{k}", n=rows, steering=steer)
        out.append(str(root))
    return out


def test_cache_equals_reader_and_is_reused(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=5, steering=[0, 0.1, -0.2, 0.3, 0])
    raw = load_recording(root, progress=False)
    rec = load_cached(root, tmp_path / "cache", progress=False)
    assert rec.crops.shape == (5, 3, 66, 200, 3) and mapped_buffer(rec.crops) is not None  # a map, not in memory
    assert not rec.crops.flags.writeable
    for c, cam in enumerate(("center", "left", "right")):
        assert np.array_equal(rec.crops[:, c], preprocess(raw.camera(cam)))
    for k in ("steering", "throttle", "speed", "timestamps", "rows", "segments"):
        assert np.array_equal(getattr(rec, k), getattr(raw, k)), k
    npy, npz = cache_paths(root, tmp_path / "cache")
    assert npy.is_file() and npz.is_file() and not list((tmp_path / "cache").glob(".*tmp*"))
    stamp = npy.stat().st_mtime_ns
    assert build_cache(root, tmp_path / "cache", progress=False) == (npy, npz) and npy.stat().st_mtime_ns == stamp
    # another CSV (one steering value edited) is another cache, never the stale one
    csv = root / "driving_log.csv"
    csv.write_text(csv.read_text().replace(",0.1,", ",0.15,", 1))
    assert cache_paths(root, tmp_path / "cache")[0] != npy
    assert np.isclose(load_cached(root, tmp_path / "cache", progress=False).steering[1], 0.15)


def test_cache_bad_rows_skip_and_error(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=5)
    lines = (root / "driving_log.csv").read_text().splitlines()
    (root / "IMG" / lines[1].split(",")[1].split("\\")[-1]).unlink()  # row 2: missing left image
    (root / "IMG" / lines[3].split(",")[2].split("\\")[-1]).write_bytes(b"not a jpeg")  # row 4: found on decoding
    with pytest.warns(UserWarning, match=r"skipped 2 bad row\(s\).*row 2: missing image.*row 4: unreadable"):
        rec = load_cached(root, tmp_path / "cache", progress=False)
    assert rec.rows.tolist() == [1, 3, 5] and rec.crops.shape[0] == 3 and [b.row for b in rec.bad_rows] == [2, 4]
    with pytest.raises(ValueError, match=r"2 bad row\(s\).*row 2.*row 4"):
        load_cached(root, tmp_path / "cache", on_bad_row="error", progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="driving_log.csv"):
        load_cached(tmp_path / "empty", tmp_path / "cache", progress=False)


def test_crop_augmentation_matches_raw_augmentation():
    rng = np.random.default_rng(0)
    small = rng.integers(30, 220, (8, 16, 3), dtype=np.uint8)
    raw = cv2.resize(small, (320, 160))[None]  # (1, 160, 320, 3) smooth RGB
    crop = preprocess(raw)
    flip = AugmentParams(flip=True)
    assert np.array_equal(augment_crops(crop, flip), crop[:, :, ::-1])
    assert np.abs(augment_crops(crop, flip).astype(int) - preprocess(augment_frames(raw, flip))).max() <= 1
    for params, tol in ((AugmentParams(brightness=1.15), 1.0), (AugmentParams(shadow=(100.0, 220.0, 1, 0.4)), 1.0),
                        (AugmentParams(shift=(30.0, 0.0)), 1.0)):
        a = augment_crops(crop, params).astype(float)
        b = preprocess(augment_frames(raw, params)).astype(float)
        assert np.abs(a - b)[:, 2:-2, 2:-2].mean() < tol, params  # the same picture up to resampling
        assert np.abs(a - crop).mean() > 2 * np.abs(a - b)[:, 2:-2, 2:-2].mean()  # and it did change
    with pytest.raises(ValueError, match="66, 200, 3"):
        augment_crops(raw, flip)


def test_cached_source_windows_and_straight_sampling(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=12, steering=[0, 0, 0.2, 0, 0, 0, -0.3, 0, 0, 0, 0, 0.1])
    rec = load_cached(root, tmp_path / "cache", progress=False)
    src = UdacitySource([rec])
    frames, steer, t = src.window(0, 2, 4)
    assert frames.shape == (4, 66, 200, 3) and np.array_equal(frames, rec.crops[2:6, 0])
    assert np.allclose(steer, rec.steering[2:6]) and np.isclose(t[0], 0.0)
    assert src.loss_mask(0, 0, 12).all()
    keep = UdacitySource([rec], straight_keep=0.3, seed=1).loss_mask(0, 0, 12)
    assert keep[[2, 6, 11]].all() and keep.sum() < 12  # steering frames always count, some straight ones do not
    again = UdacitySource([rec], straight_keep=0.3, seed=1)
    assert np.array_equal(again.loss_mask(0, 0, 12), keep)
    item = WindowDataset(again, 4, shuffle_borders=False)[0]
    assert item["learn"].tolist() == keep[:4].tolist()
    with pytest.raises(ValueError, match="straight_keep"):
        UdacitySource([rec], straight_keep=0.0)
    # stopped frames (the driver waiting at the start line) leave the loss, and stay in the windows
    rec.speed[:3] = [0.0, 2.0, 4.9]
    moving = UdacitySource([rec], min_speed=5.0)
    assert moving.loss_mask(0, 0, 12).tolist() == [False] * 3 + [True] * 9
    assert moving.window(0, 0, 4)[0].shape[0] == 4 and "3 slower than 5 mph left out of the loss" in moving.describe()
    both = UdacitySource([rec], straight_keep=0.3, seed=1, min_speed=5.0).loss_mask(0, 0, 12)
    assert both.tolist() == (keep & (rec.speed >= 5.0)).tolist() and not both[2]  # steering, but stopped
    assert moving.split(0.25)[0].loss_mask(0, 0, 9).tolist() == [False] * 3 + [True] * 6
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="min_speed must be a speed in mph >= 0"):
            UdacitySource([rec], min_speed=bad)
    # reversing frames (the brake held past the stop, the car speeding up) leave the loss with skip_reversing
    rec.speed[:] = [30, 20, 10, 1, 3, 5, 7, 2, 10, 20, 30, 30]
    rec.brake[:], rec.throttle[:] = [0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    back = UdacitySource([rec], skip_reversing=True)
    assert back.loss_mask(0, 0, 12).tolist() == [True] * 3 + [False] * 4 + [True] * 5
    assert "4 reversing left out of the loss" in back.describe() and UdacitySource([rec]).loss_mask(0, 0, 12).all()
    assert back.split(0.25)[0].loss_mask(0, 0, 9).tolist() == [True] * 3 + [False] * 4 + [True] * 2


def test_causal_smoothing(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=6, gaps_ms=[70, 70, 4000, 70, 70], steering=[0, 0.3, 0, 0.6, 0, 0])
    rec = load_recording(root, progress=False)
    assert np.allclose(smooth_steering(rec, 2, "causal").steering, [0, 0.15, 0.15, 0.6, 0.3, 0.0])
    assert np.allclose(smooth_steering(rec, 3, "causal").steering, [0, 0.15, 0.1, 0.6, 0.3, 0.2])
    # a window longer than a segment (3 frames each here) averages what the segment has
    assert np.allclose(smooth_steering(rec, 7).steering, [0.1, 0.1, 0.1, 0.2, 0.2, 0.2])
    assert np.allclose(smooth_steering(rec, 9, "causal").steering, [0, 0.15, 0.1, 0.6, 0.3, 0.2])
    with pytest.raises(ValueError, match="centred"):
        smooth_steering(rec, 3, "future")


def test_driver_names_and_blocks(tmp_path):
    assert driver_names(["/d/u/a+X", "/d/u/b+Y/track2", "/d/u/c+Z/Data/driving_log.csv"]) == ["a+X", "b+Y", "c+Z"]
    assert driver_names(["/d/u/a/x", "/d/v/a/y"]) == ["u", "v"]
    assert driver_names(["/d/a", "/e/a"]) == ["d", "e"]
    root, _ = write_recording(tmp_path / "rec", n=40)
    rec = load_recording(root, progress=False)
    pieces = subsample_blocks(rec, 0.5, 8, np.random.default_rng(0))
    rows = np.concatenate([p.rows for p in pieces])
    assert len(rows) == 16  # round(0.5 * 5 blocks) = 2 blocks of 8
    assert len(set(rows.tolist())) == len(rows) and all((np.diff(p.rows) == 1).all() for p in pieces)
    assert all((p.rows[0] - 1) % 8 == 0 for p in pieces)  # blocks start on block borders
    assert subsample_blocks(rec, 1.0, 8, np.random.default_rng(0)) == [rec]


def test_cli_evaluate_many_recordings(tmp_path, capsys):
    from agent.cli import main
    from agent.nn.policy import DrivingPolicy, default_config

    data = _drivers(tmp_path, 2, rows=8)
    torch.manual_seed(0)
    pol = DrivingPolicy(default_config("udacity", core="none", window=2)).save(tmp_path / "p.pt")
    js = tmp_path / "many.json"
    rc = main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", *data, "--json", str(js),
               "--udacity.crop-cache", str(tmp_path / "cache")])
    assert rc == 0
    res = json.loads(js.read_text())
    assert [r["recording"] for r in res["recordings"]] == ["driver0", "driver1"]
    for r, d in zip(res["recordings"], data):
        steer = load_recording(d, progress=False).steering
        assert np.isclose(r["zero_mse"], np.mean(steer ** 2)) and np.isclose(r["ratio"], r["mse"] / r["zero_mse"])
    s = res["summary"]
    assert s["n_frames"] == 16 and np.isclose(s["mse"], np.mean([r["mse"] for r in res["recordings"]]))
    assert np.isclose(s["ratio_of_means"], s["mse"] / s["zero_mse"])
    assert "| driver1 | 8 |" in capsys.readouterr().out
    assert list((tmp_path / "cache").glob("*.npy"))  # the crop cache was used
    from agent.eval.card import identity

    ident = identity(pol)  # the JSON names the exact file and weights scored, as a CarRacing evaluation's does
    assert res["file_sha256"] == ident["file_sha256"] and res["weights_sha256"] == ident["weights_sha256"]
    # one recording: the flat result, now with the ratio
    rc = main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", data[0], "--json", str(js),
               "--overwrite"])
    one = json.loads(js.read_text())
    assert rc == 0 and one["n_frames"] == 8 and np.isclose(one["ratio"], one["mse"] / one["zero_mse"])
    assert (one["file_sha256"], one["weights_sha256"]) == (ident["file_sha256"], ident["weights_sha256"])
    (tmp_path / "empty").mkdir()
    assert main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", data[0], str(tmp_path / "empty")]) == 2
    assert "not a Udacity recording" in capsys.readouterr().err


def test_cli_leave_one_driver_out(tmp_path, capsys, caplog):
    from agent.cli import main
    from agent.nn.policy import DrivingPolicy, default_config

    data = _drivers(tmp_path, 3)
    ref = DrivingPolicy(default_config("udacity", core="none", window=2)).save(tmp_path / "ref.pt")
    out = tmp_path / "lodo"
    args = ["train", "--env", "udacity", "--data", *data, "--lodo.out", str(out), "--policy.core", "none",
            "--policy.window", "2", "--train.epochs", "1", "--train.val-fraction", "0", "--udacity.subsample", "0.5",
            "--udacity.block", "4", "--udacity.crop-cache", str(tmp_path / "cache"), "--lodo.tracks", "*", "lake",
            "driver2", "jungle", "--lodo.reference", str(ref), "--train.tensorboard", ""]
    with caplog.at_level("INFO"):
        assert main(args) == 0
    epochs = [r.getMessage() for r in caplog.records if " epoch 1/1: " in r.getMessage()]
    assert len(epochs) == 3 and all("no held-out split (val_fraction 0: the last epoch is kept)" in m and "nan" not in m
                                    for m in epochs)
    folds = sorted(p.name for p in (out / "folds").glob("*.json"))
    assert folds == ["driver0.json", "driver1.json", "driver2.json"]
    for k in range(3):
        f = json.loads((out / "folds" / f"driver{k}.json").read_text())
        assert f["train_drivers"] == [f"driver{j}" for j in range(3) if j != k]
        steer = load_recording(data[k], progress=False).steering
        assert f["n_frames"] == 14 and np.isclose(f["zero_mse"], np.mean(steer ** 2))
        assert np.isclose(f["ratio"], f["mse"] / f["zero_mse"])
        assert 0 < f["n_train_frames"] < 28  # half of the other two drivers' frames, in blocks of 4
        assert f["track"] == ("jungle" if k == 2 else "lake")
        r = json.loads((out / "reference" / f"driver{k}.json").read_text())
        assert np.isclose(r["zero_mse"], f["zero_mse"])  # the reference is scored on the same frames
    table = json.loads((out / "lodo.json").read_text())
    assert [d["driver"] for d in table["drivers"]] == ["driver0", "driver1", "driver2"]
    lake = table["tracks"]["lake"]
    assert lake["folds"] == 2 and np.isclose(lake["mse"], np.mean([d["mse"] for d in table["drivers"][:2]]))
    assert table["tracks"]["all"]["folds"] == 3 and "reference_mse" in table["drivers"][0]
    md = (out / "lodo.md").read_text()
    assert "| driver2 | jungle | 14 |" in md and "**mean, lake** (2 folds)" in md
    # the scores against the driver's intent, per fold and as means per track (issue 41, item 2)
    from agent.eval.steering import intent_scores
    folds = [json.loads((out / "folds" / f"driver{k}.json").read_text()) for k in range(3)]
    for f in folds:
        assert np.isclose(f["smoothed_ratio"], f["smoothed_mse"] / f["smoothed_zero_mse"])
        assert f["n_curve"] == f["n_left"] + f["n_right"]
    rec0 = load_recording(data[0], progress=False)
    zero = intent_scores(np.zeros(len(rec0)), rec0.steering, rec0.timestamps, segments=rec0.segments)
    want, want_smooth = zero["scores"], zero["smoothed"]
    assert np.isclose(folds[0]["smoothed_zero_mse"], want["smoothed_zero_mse"])  # the same smoothed labels
    assert np.isclose(lake["smoothed_ratio_of_means"], np.mean([f["smoothed_mse"] for f in folds[:2]]) /
                      np.mean([f["smoothed_zero_mse"] for f in folds[:2]]))
    rw = [f["right_way_left"] for f in folds[:2] if f["right_way_left"] is not None]
    assert lake["right_way_left"] == (pytest.approx(np.mean(rw)) if rw else None)
    assert "smoothed ratio | r | right way" in md
    for f in folds:  # the timing diagnostic is kept per fold (a key even where undefined)
        assert "best_lag_s" in f and "smoothed_ratio_at_best_lag" in f
        assert f["best_lag_s"] is None or abs(f["best_lag_s"]) <= 1.0 + 0.5
    assert "timing (s), smoothed ratio there" in md
    with np.load(out / "folds" / "driver0.npz") as z:  # the held-out steering, kept for a look afterwards
        assert len(z["pred"]) == len(z["label"]) == len(z["smoothed"]) == folds[0]["n_frames"]
        assert np.allclose(z["label"], rec0.steering) and np.allclose(z["smoothed"], want_smooth, atol=1e-6)
        assert np.isclose(np.mean((z["pred"].astype(np.float64) - want_smooth) ** 2), folds[0]["smoothed_mse"],
                          rtol=1e-4)
    # on the frames driven forwards (the fixture never reverses): stored per fold, averaged as a ratio of means
    assert all(f["n_reversing"] == 0 and f["moving_smoothed_mse"] is not None for f in folds)
    assert np.isclose(lake["moving_smoothed_ratio_of_means"], np.mean([f["moving_smoothed_mse"] for f in folds[:2]]) /
                      np.mean([f["moving_smoothed_zero_mse"] for f in folds[:2]]))
    # a fold written before these scores existed gets them from its saved steering and its CSV
    old_fold = {k: v for k, v in folds[0].items() if k not in ("moving_smoothed_mse", "moving_smoothed_zero_mse",
                                                                "moving_smoothed_ratio", "moving_smoothed_corr",
                                                                "n_reversing")}
    (out / "folds" / "driver0.json").write_text(json.dumps(old_fold))
    again_table = lodo_table(out)
    assert again_table["drivers"][0]["moving_smoothed_mse"] == pytest.approx(folds[0]["moving_smoothed_mse"], rel=1e-5)
    assert again_table["tracks"]["lake"]["moving_smoothed_ratio_of_means"] == pytest.approx(
        lake["moving_smoothed_ratio_of_means"], rel=1e-5)
    (out / "folds" / "driver0.json").write_text(json.dumps(folds[0]))
    assert "driving forwards: smoothed ratio, r" in md
    # the fold's policy is kept: reloaded, it steers the held-out driver exactly as the fold scored it
    from agent.eval.offline import evaluate_udacity
    pol = DrivingPolicy.load(out / "folds" / "driver0.pt")
    assert pol.metadata["lodo_fold"] == "driver0" and pol.metadata["train_drivers"] == ["driver1", "driver2"]
    again = evaluate_udacity(pol, rec0, progress=False)
    assert np.isclose(again["mse"], folds[0]["mse"], rtol=1e-5)
    # resumable: finished folds are skipped (files untouched); other settings are refused
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "folds").glob("*.json")}
    capsys.readouterr()
    assert main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in (out / "folds").glob("*.json")} == stamps
    (out / "folds" / "driver1.json").unlink()
    assert main(args) == 0 and (out / "folds" / "driver1.json").is_file()
    assert lodo_table(out)["tracks"]["all"]["folds"] == 3
    other = [a if a != "0.5" else "1.0" for a in args]
    assert main(other) == 2 and "other settings (subsample differ" in capsys.readouterr().err
    # user errors
    assert main(["train", "--env", "udacity", "--data", data[0], "--lodo.folds", "driver0"]) == 2
    assert "lodo.folds only apply with lodo.out" in capsys.readouterr().err
    assert main(["train", "--env", "carracing", "--data", data[0], "--udacity.subsample", "0.5"]) == 2
    assert "udacity.subsample only apply to env 'udacity'" in capsys.readouterr().err
    assert main([*args[:-2], "--lodo.tracks", "nobody", "lake", "--train.tensorboard", ""]) == 2  # the last wins
    assert "unknown driver(s) nobody" in capsys.readouterr().err
    assert main(["train", "--env", "udacity", "--data", data[0], "--lodo.out", str(tmp_path / "x"),
                 "--train.tensorboard", ""]) == 2
    assert "at least 2 recordings" in capsys.readouterr().err


def test_cli_train_on_cached_recordings(tmp_path, capsys):
    from agent.cli import main
    from agent.actors.loading import load_policy

    data = _drivers(tmp_path, 2, rows=10)
    out = tmp_path / "two.pt"
    rc = main(["train", "--env", "udacity", "--data", *data, "--out", str(out), "--run-dir", str(tmp_path / "run"),
               "--policy.core", "none", "--policy.window", "2", "--train.epochs", "1", "--train.val-fraction", "0.2",
               "--udacity.crop-cache", str(tmp_path / "cache"), "--udacity.smooth-labels", "4",
               "--udacity.smooth-mode", "causal", "--udacity.straight-keep", "0.5", "--train.tensorboard", "",
               "--json", str(tmp_path / "r.json")])
    assert rc == 0 and load_policy(out).config.core == "none"
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 2  # several --data folders: read from the crop cache
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["n_train_frames"] == 16 and rep["n_val_frames"] == 4
    common = ["train", "--env", "udacity", "--data", *data, "--out", str(tmp_path / "x.pt"), "--run-dir",
              str(tmp_path / "x"), "--train.tensorboard", ""]
    rc, err = run_cli([*common, "--udacity.straight-keep", "0"], capsys)  # refused by tyro's parser
    assert rc == 2 and "udacity.straight_keep must be in (0, 1]" in err
    rc, err = run_cli([*common, "--udacity.smooth-labels", "4"], capsys)
    assert rc == 2 and "udacity.smooth_labels must be an odd number" in err
    rc, err = run_cli([*common, "--udacity.min-speed", "-1"], capsys)
    assert rc == 2 and "udacity.min_speed must be a speed in mph >= 0" in err


def test_cli_train_subsample_follows_the_lodo_cut(tmp_path, capsys):
    """Plain udacity training with --udacity.subsample keeps the same share of each recording, in blocks,
    as a leave-one-driver-out fold does (so a shipped policy can follow a measured recipe)."""
    from agent.cli import main

    data = _drivers(tmp_path, 2, rows=40)
    common = ["train", "--env", "udacity", "--data", *data, "--policy.core", "none", "--policy.window", "2",
              "--train.epochs", "1", "--train.val-fraction", "0", "--udacity.crop-cache", str(tmp_path / "cache"),
              "--train.tensorboard", ""]
    reports = {}
    for frac in ("1.0", "0.25"):
        rep = tmp_path / f"r{frac}.json"
        assert main([*common, "--out", str(tmp_path / f"p{frac}.pt"), "--run-dir", str(tmp_path / f"run{frac}"),
                     "--udacity.subsample", frac, "--udacity.block", "4", "--json", str(rep)]) == 0
        reports[frac] = json.loads(rep.read_text())["n_train_frames"]
    assert reports["1.0"] == 80
    assert reports["0.25"] == 2 * 4 * round(0.25 * 10)  # per recording: 10 blocks of 4, a quarter of them kept
    common += ["--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x")]
    rc, err = run_cli([*common, "--udacity.subsample", "0.5", "--udacity.block", "1"], capsys)
    assert rc == 2 and "udacity.block (1) must be at least the window (2 frames)" in err
    rc, err = run_cli([*common, "--udacity.subsample", "1.5"], capsys)  # refused by tyro's parser
    assert rc == 2 and "udacity.subsample must be in (0, 1]" in err


def test_cli_core_option_reaches_the_saved_policy(tmp_path, capsys):
    """--policy.core-options KEY VALUE overrides the env's core defaults in the trained policy's config
    (and so in the file); a malformed or unsuitable option is refused before any data loads."""
    from agent.cli import main
    from agent.actors.loading import load_policy

    data = _drivers(tmp_path, 1, rows=12)
    out = tmp_path / "normed.pt"
    common = ["train", "--env", "udacity", "--data", *data, "--policy.window", "2", "--train.epochs", "1",
              "--train.val-fraction", "0", "--train.tensorboard", "", "--run-dir", str(tmp_path / "run")]
    assert main([*common, "--policy.core", "nac-exact", "--policy.core-options", "input_norm", "True", "topk", "4",
                 "--out", str(out)]) == 0
    pol = load_policy(out)
    assert pol.config.core_kwargs == {"num_heads": 20, "topk": 4, "sparsity": 0.5, "input_norm": True}
    assert pol.core.norm is not None and pol.core.nac.topk == 4
    rc, err = run_cli([*common, "--policy.core-options", "input_norm", "--out", str(tmp_path / "x.pt")], capsys)
    assert rc == 2 and "--policy.core-options: Failed to parse key-value pairs" in err  # a key without its value
    rc, err = run_cli([*common, "--policy.core", "lstm", "--policy.core-options", "topk", "4", "--out",
                       str(tmp_path / "x.pt")], capsys)
    assert rc == 2 and "policy.core_options {'topk': 4} do not suit the lstm core" in err


def test_cli_leave_one_driver_out_over_seeds(tmp_path, capsys):
    """--lodo.seeds 0 1: every fold once per seed, into OUT/s<seed>, and the table over the seeds against the
    issue's targets (seeds.md, seeds.json)."""
    from agent.cli import main
    from agent.train.lodo import lodo_table, seed_folders, seeds_table

    data = _drivers(tmp_path, 3, rows=12)
    out = tmp_path / "lodo"
    args = ["train", "--env", "udacity", "--data", *data, "--lodo.out", str(out), "--policy.core", "none",
            "--policy.window", "2", "--train.epochs", "1", "--train.val-fraction", "0", "--udacity.crop-cache",
            str(tmp_path / "cache"), "--lodo.tracks", "*", "lake", "driver2", "jungle", "--train.tensorboard", "",
            "--lodo.seeds", "0", "1"]
    assert main(args) == 0
    per = {s: lodo_table(out / f"s{s}") for s in (0, 1)}
    assert all(len(per[s]["drivers"]) == 3 for s in (0, 1))
    # another seed trains other weights: the held-out MSEs differ
    assert [d["mse"] for d in per[0]["drivers"]] != [d["mse"] for d in per[1]["drivers"]]
    over = json.loads((out / "seeds.json").read_text())
    assert over["seeds"] == [0, 1] and set(over["tracks"]) == {"jungle", "lake", "all"}
    for track in ("lake", "jungle"):
        cell = over["tracks"][track]["ratio_of_means"]
        want = [per[s]["tracks"][track]["ratio_of_means"] for s in (0, 1)]
        assert cell["per_seed"] == pytest.approx(want) and cell["mean"] == pytest.approx(np.mean(want))
        assert cell["met"] == all(v <= 0.7 for v in want) and cell["target"] == "<= 0.7"
    lake = over["tracks"]["lake"]["smoothed_ratio_of_means"]
    assert lake["target"] == "<= 0.5" and over["tracks"]["jungle"]["smoothed_ratio_of_means"]["target"] == "<= 0.6"
    assert over["tracks"]["all"]["smoothed_corr"]["met"] is None  # targets are per track
    md = (out / "seeds.md").read_text()
    assert "over 2 training seeds (0, 1)" in md and "fewer than 3 seeds no interval" in md
    assert "| lake | 2/2 |" in md
    # a seed that failed a target shows ✗ (a fixed table, through the same function)
    assert ("✗" in md) == any(c["met"] is False for t in over["tracks"].values() for c in t.values())
    # each fold's scores per seed, and the seed-to-seed spread a one-seed screen works against
    paired = over["paired"]
    assert sorted(paired["drivers"]) == sorted(d["driver"] for d in per[0]["drivers"]) and not paired["missing"]
    ratios = []
    for d in per[0]["drivers"]:
        want = [next(r["smoothed_ratio"] for r in per[s]["drivers"] if r["driver"] == d["driver"]) for s in (0, 1)]
        assert paired["drivers"][d["driver"]]["smoothed_ratio"] == pytest.approx(want)
        ratios.append(want)
    sp = paired["spread"]["smoothed_ratio"]
    assert sp["folds"] == 3 and sp["max_range"] == pytest.approx(max(abs(a - b) for a, b in ratios))
    assert sp["pooled_sd"] == pytest.approx(np.sqrt(np.mean([np.var(r, ddof=1) for r in ratios])))
    assert f"pooled standard deviation {sp['pooled_sd']:.3f}" in md
    # a seed with a fold not yet finished: the table says its means are over other drivers
    import shutil
    part = tmp_path / "part"
    shutil.copytree(out / "s1", part)
    gone = per[1]["drivers"][0]["driver"]
    (part / "folds" / f"{gone}.json").unlink()
    half = seeds_table({0: out / "s0", 1: part})
    assert half["paired"]["missing"] == {1: [gone]} and gone not in half["paired"]["drivers"]
    assert "finished different folds" in half["markdown"] and f"seed 1: {gone}" in half["markdown"]
    with pytest.raises(ValueError, match="no finished fold"):
        seeds_table({0: out / "s0", 5: tmp_path / "empty"})
    # a rerun of one seed (its folds finished: skipped) tabulates every seed folder there, not that seed alone
    (out / "s7").mkdir()  # a folder with no finished fold is not a seed of the table
    assert seed_folders(out) == {0: out / "s0", 1: out / "s1"}
    assert main([*args[:-2], "--lodo.seeds", "1"]) == 0
    assert json.loads((out / "seeds.json").read_text())["seeds"] == [0, 1]
    assert "over 2 training seeds (0, 1)" in (out / "seeds.md").read_text()
    capsys.readouterr()
    assert main([*args[:-2], "--lodo.seeds", "1", "1"]) == 2
    assert "lodo.seeds must be distinct seeds" in capsys.readouterr().err


def _fake_fold(folder, driver, track, smoothed_ratio, corr, seed):
    """A finished fold's JSON as run_lodo writes it, with chosen scores (predict-0 MSE 0.1 everywhere)."""
    folds = folder / "folds"
    folds.mkdir(parents=True, exist_ok=True)
    d = {"driver": driver, "track": track, "n_frames": 100, "mse": 0.08, "mae": 0.2, "zero_mse": 0.1, "ratio": 0.8,
         "n_train_frames": 1000, "smoothed_mse": 0.1 * smoothed_ratio, "smoothed_zero_mse": 0.1,
         "smoothed_ratio": smoothed_ratio, "smoothed_corr": corr, "curve_abs_ratio": 1.0, "data": None,
         "settings": {"train": {"seed": seed}}}
    (folds / f"{driver}.json").write_text(json.dumps(d))


def test_compare_settings_fold_by_fold_with_seed_noise(tmp_path, capsys):
    """compare_settings / agent lodo-compare: per-fold seed means, their difference, and a t interval from the
    seed-to-seed spread pooled over both settings; folds not finished by every seed are left out."""
    from scipy import stats

    from agent.cli import main
    from agent.train.lodo import compare_settings, runs_of

    base = {0: {"a": 0.6, "b": 0.7, "j": 1.0, "x": 0.5}, 1: {"a": 0.8, "b": 0.7, "j": 1.2}}
    new = {0: {"a": 0.5, "b": 0.5, "j": 1.0}, 1: {"a": 0.5, "b": 0.7, "j": 0.8}}
    for name, seeds in (("base", base), ("new", new)):
        for seed, folds in seeds.items():
            for driver, v in folds.items():
                _fake_fold(tmp_path / name / f"s{seed}", driver, "jungle" if driver == "j" else "lake", v, 1 - v, seed)
    r = compare_settings(runs_of(tmp_path / "base"), runs_of(tmp_path / "new"))
    assert r["base_seeds"] == [0, 1] and r["new_seeds"] == [0, 1] and r["missing"] == ["x"]
    assert r["drivers"]["a"]["smoothed_ratio"]["diff"] == pytest.approx(0.5 - 0.7)
    assert r["drivers"]["b"]["smoothed_ratio"]["diff"] == pytest.approx(0.6 - 0.7)
    # pooled within-(setting, driver) variance: sums of squares 0.02 + 0 + 0.02 + 0 + 0.02 + 0.02 over 6 df
    sd = np.sqrt(0.08 / 6)
    assert r["noise"]["smoothed_ratio"] == pytest.approx({"sd": sd, "df": 6})
    lake = r["tracks"]["lake"]["smoothed_ratio"]
    half = stats.t.ppf(0.975, 6) * sd * np.sqrt(1 / 2 + 1 / 2) / np.sqrt(2)
    assert lake["diff"] == pytest.approx(-0.15) and lake["ci95"] == pytest.approx([-0.15 - half, -0.15 + half])
    assert r["tracks"]["lake"]["smoothed_corr"]["diff"] == pytest.approx(0.15)  # r = 1 - ratio here
    assert r["tracks"]["jungle"]["folds"] == 1 and r["tracks"]["all"]["folds"] == 3
    # the target's measure: mean smoothed MSE / mean predict-0 per seed, then the mean over the seeds
    assert r["tracks"]["lake"]["smoothed_ratio_of_means"] == pytest.approx({"base": 0.7, "new": 0.55})
    assert "-0.150" in r["markdown"] and "not finished by every seed" in r["markdown"]
    # one seed a setting: differences, no interval
    one = compare_settings({0: tmp_path / "base" / "s0"}, {0: tmp_path / "new" / "s0"})
    assert one["tracks"]["lake"]["smoothed_ratio"]["diff"] == pytest.approx(-0.15)
    assert one["tracks"]["lake"]["smoothed_ratio"]["ci95"] is None and one["noise"]["smoothed_ratio"] is None
    # a single LODO folder is one seed, read from its folds
    assert runs_of(tmp_path / "new" / "s1") == {1: tmp_path / "new" / "s1"}
    with pytest.raises(ValueError, match="no finished fold"):
        runs_of(tmp_path)
    _fake_fold(tmp_path / "other", "z", "lake", 0.5, 0.5, 0)
    with pytest.raises(ValueError, match="no held-out driver"):
        compare_settings(runs_of(tmp_path / "base"), runs_of(tmp_path / "other"))
    # the command: writes compare.md/json, refuses to overwrite them, explains a wrong folder
    out = tmp_path / "cmp"
    assert main(["lodo-compare", str(tmp_path / "base"), str(tmp_path / "new"), "--out", str(out)]) == 0
    saved = json.loads((out / "compare.json").read_text())
    assert saved["tracks"]["lake"]["smoothed_ratio"]["diff"] == pytest.approx(-0.15)
    assert saved["drivers"]["a"]["smoothed_ratio"]["base_seeds"] == pytest.approx([0.6, 0.8])
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the figure beside the table
    assert main(["lodo-compare", str(tmp_path / "base"), str(tmp_path / "new"), "--out", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["lodo-compare", str(tmp_path / "base"), str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    # agent lodo-table: the table over the seeds from the finished folds, written only with --write
    assert main(["lodo-table", str(tmp_path / "new")]) == 0
    assert "over 2 training seeds (0, 1)" in capsys.readouterr().out and not (tmp_path / "new" / "seeds.md").exists()
    assert main(["lodo-table", str(tmp_path / "new"), "--write"]) == 0
    assert (tmp_path / "new" / "seeds.md").is_file() and (tmp_path / "new" / "s0" / "lodo.md").is_file()


def test_a_killed_fold_continues_from_its_last_epoch(tmp_path, caplog, capsys):
    """A fold killed mid-training (SIGKILL, in a subprocess) leaves its checkpoint in folds/<driver>.run; the rerun
    continues it and ends with the weights and scores of a fold never interrupted; the checkpoint then goes.
    A checkpoint of other settings is not continued."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from agent.actors.loading import load_policy
    from agent.cli import main
    from agent.train.checkpoint import CHECKPOINT_NAME, load_checkpoint

    data = _drivers(tmp_path, 3, rows=90)

    def args(out, epochs=6):
        return ["train", "--env", "udacity", "--data", *data, "--lodo.out", str(out), "--lodo.folds", "driver0",
                "--policy.core", "none", "--policy.window", "2", "--train.epochs", str(epochs),
                "--train.val-fraction", "0", "--train.batch-frames", "8", "--udacity.crop-cache", str(tmp_path / "cache"),
                "--train.tensorboard", "", "--threads", "1", "--seed", "2"]

    assert main(args(tmp_path / "whole")) == 0
    assert not (tmp_path / "whole" / "folds" / "driver0.run").exists()  # removed once the fold is written
    run_dir = tmp_path / "cut" / "folds" / "driver0.run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "NAC_PROGRESS": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "agent.cli", *args(tmp_path / "cut")],
                            cwd=Path(__file__).resolve().parents[1], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (run_dir / CHECKPOINT_NAME).exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    err = proc.communicate(timeout=300)[1]
    state = load_checkpoint(run_dir)
    assert state["stage"] == "bc" and state["fit"]["epochs_done"] < 6, err
    assert not (tmp_path / "cut" / "folds" / "driver0.json").exists()
    done = state["fit"]["epochs_done"]
    rc, err = run_cli(["train", "--resume", str(run_dir)], capsys)  # not for --resume: the LODO command continues it
    assert rc != 0 and "leave-one-driver-out fold's checkpoint" in err
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main(args(tmp_path / "cut")) == 0
    assert any("holds a checkpoint of this fold" in r.getMessage() for r in caplog.records)
    epochs = [r.getMessage() for r in caplog.records if "bc epoch" in r.getMessage()]
    assert not any(f"bc epoch {done}/6" in m for m in epochs) and any("bc epoch 6/6" in m for m in epochs)
    a, b = (load_policy(tmp_path / k / "folds" / "driver0.pt").state_dict() for k in ("whole", "cut"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    fa, fb = (json.loads((tmp_path / k / "folds" / "driver0.json").read_text()) for k in ("whole", "cut"))
    assert fa["mse"] == fb["mse"] and [e["train_loss"] for e in fa["epochs"]] == [e["train_loss"] for e in fb["epochs"]]
    assert not run_dir.exists()

    # a checkpoint of other settings (6 epochs) in a fold of 2: trained anew, not continued
    other = tmp_path / "other" / "folds" / "driver0.run"
    from agent.train.checkpoint import Checkpointer

    Checkpointer(other, '{"another": "config"}').save("bc epoch 1 of 6", stage="bc", fit=state["fit"],
                                                       policy=None, rounds=[], report=state["report"], elapsed=1.0)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert main(args(tmp_path / "other", epochs=2)) == 0
    assert any("checkpoint of other settings; the fold starts anew" in r.getMessage() for r in caplog.records)
    assert len(json.loads((tmp_path / "other" / "folds" / "driver0.json").read_text())["epochs"]) == 2
