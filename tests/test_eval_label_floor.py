"""The keyboard-noise floor (agent.eval.label_floor): the smoothed oracle, its wiring into the LODO
table and `agent evaluate --env udacity`, on synthetic labels and tiny recordings the tests write."""

import json

import numpy as np
import pytest
from udacity_fixture import write_recording

from agent.eval.label_floor import (floor_means, recording_floor, smoothed_oracle, smoothed_oracle_ratio,
                                    width_key)


def test_constant_labels_have_no_floor():
    t = np.cumsum(np.full(200, 0.07))
    for exclude_self in (False, True):
        r = smoothed_oracle_ratio(np.full(200, 0.3), t, 0.5, exclude_self=exclude_self)
        assert r["ratio"] == pytest.approx(0.0, abs=1e-12) and r["zero_mse"] == pytest.approx(0.09)
    # every label 0: predict-0 is perfect, the ratio is undefined
    assert smoothed_oracle_ratio(np.zeros(10), np.arange(10.0), 0.5)["ratio"] is None


def test_window_in_seconds_with_edges_by_hand():
    # one segment (gaps of exactly 1 s do not exceed MAX_GAP_S); the window is +-1 s, in seconds not frames
    s, t = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0]
    assert np.allclose(smoothed_oracle(s, t, 1.0), [1 / 2, 1 / 3, 0.0, 0.0])
    assert np.allclose(smoothed_oracle(s, t, 1.0, exclude_self=True), [0.0, 1 / 2, 0.0, 0.0])
    assert np.allclose(smoothed_oracle(s, t, 0.0), s)  # half-width 0: the labels themselves
    assert np.allclose(smoothed_oracle(s, [0.0, 0.5, 1.0, 1.5], 1.0), [1 / 3, 1 / 4, 1 / 4, 0.0])


def test_smooth_signal_sampled_densely_is_predictable():
    t = np.arange(2000) * 0.01  # 100 Hz for 20 s
    s = 0.5 * np.sin(2 * np.pi * 0.2 * t)
    assert smoothed_oracle_ratio(s, t, 0.05)["ratio"] < 1e-3
    assert smoothed_oracle_ratio(s, t, 2.0)["ratio"] > 0.05  # a window as wide as half a period blurs it


def _expected_tap_ratio(t, h, p, exclude_self):
    """(1 - p) times the mean over frames of (n - 1) / n, or n / (n - 1) leaving the frame out, for
    the n frames in each window (fewer at the ends): see the module docstring's worked example."""
    n = (np.searchsorted(t, t + h + 1e-9, "right") - np.searchsorted(t, t - h - 1e-9, "left")).astype(float)
    return (1 - p) * np.mean(n / (n - 1) if exclude_self else (n - 1) / n)


def test_iid_taps_leave_one_minus_duty_cycle():
    # taps of size a on each frame independently with probability p: E[(x - window mean)^2] = a^2 p (1 - p)(n - 1)/n
    # and predict-0 MSE = a^2 p, so the ratio is (1 - p)(n - 1)/n -> 1 - p for a wide window
    rng = np.random.default_rng(0)
    t = np.arange(40_000) * 0.1  # 10 Hz; a +-2 s window holds 41 frames
    for p in (0.3, 0.6):
        s = 0.4 * (rng.random(len(t)) < p)
        for exclude_self in (False, True):
            got = smoothed_oracle_ratio(s, t, 2.0, exclude_self=exclude_self)["ratio"]
            want = _expected_tap_ratio(t, 2.0, p, exclude_self)
            assert got == pytest.approx(want, abs=0.02), (p, exclude_self)
        assert abs(smoothed_oracle_ratio(s, t, 20.0)["ratio"] - (1 - p)) < 0.02  # 401 frames: about 1 - p
    # taps of random sign: the intent is 0, nothing is predictable (ratio (n - 1)/n, about 1)
    s = 0.4 * (rng.random(len(t)) < 0.3) * rng.choice([-1.0, 1.0], len(t))
    assert smoothed_oracle_ratio(s, t, 2.0)["ratio"] == pytest.approx(40 / 41, abs=0.03)


def test_segments_are_not_smoothed_across():
    # 50 frames straight, a 1.5 s gap (over MAX_GAP_S: a new session segment), 50 frames full right; a +-2 s
    # window around the gap would reach across it
    t = np.concatenate([np.arange(50) * 0.1, 4.9 + 1.5 + np.arange(50) * 0.1])
    s = np.concatenate([np.zeros(50), np.ones(50)])
    r = smoothed_oracle_ratio(s, t, 2.0)
    assert r["n_segments"] == 2 and r["ratio"] == pytest.approx(0.0, abs=1e-12)
    merged = smoothed_oracle_ratio(s, t, 2.0, max_gap_s=2.0)  # without the split, the jump would be smoothed
    assert merged["n_segments"] == 1 and merged["ratio"] > 1e-3
    # explicit segments (as a loaded recording has them) may also split where time goes back
    t_back = np.concatenate([np.arange(50) * 0.1, np.arange(50) * 0.1])
    assert smoothed_oracle_ratio(s, t_back, 2.0, segments=[[0, 50], [50, 100]])["ratio"] == pytest.approx(0.0)


@pytest.mark.parametrize("args, kwargs, message", [
    (([0.1, 0.2, 0.3], [0.0, 0.1], 0.5), {}, "steering has 3 labels but timestamps has 2"),
    (([0.1, 0.2, 0.3], [0.0, 0.1, 0.1], 0.5), {}, r"increase strictly.*timestamps\[2\] = 0.1 follows"),
    (([0.1, 0.2, 0.3], [0.0, 0.2, 0.1], 0.5), {}, "increase strictly"),
    (([0.1, 0.2], [0.0, 0.1], -0.5), {}, "half_width_s must be a finite number of seconds >= 0"),
    (([0.1, 0.2], [0.0, 0.1], float("nan")), {}, "half_width_s must be"),
    (([[0.1, 0.2]], [[0.0, 0.1]], 0.5), {}, "must be 1-D"),
    (([0.1, float("nan")], [0.0, 0.1], 0.5), {}, "finite"),
    (([], [], 0.5), {}, "no labels"),
    (([0.1, 0.2], [0.0, 0.1], 0.5), {"max_gap_s": 0}, "max_gap_s must be > 0"),
    (([0.1, 0.2, 0.3], [0.0, 0.1, 0.2], 0.5), {"segments": [[0, 2]]}, "tiling frames 0..3"),
    (([0.1, 0.2, 0.3], [0.0, 0.1, 0.0], 0.5), {"segments": [[0, 3]]}, r"inside segment \[0, 3\)"),
])
def test_bad_input_is_refused_clearly(args, kwargs, message):
    for fn in (smoothed_oracle, smoothed_oracle_ratio):
        with pytest.raises(ValueError, match=message):
            fn(*args, **kwargs)


def _recording(tmp_path, name, steering, gaps_ms=None):
    root, _ = write_recording(tmp_path / "data" / name, n=len(steering), steering=steering, gaps_ms=gaps_ms)
    return str(root)


def test_recording_floor_reads_the_csv_like_the_reader(tmp_path):
    from agent.data.udacity import load_recording

    steer = [0, 0.3, 0, 0, 0.3, 0, 0, 0, -0.2, 0, 0, 0.1]
    gaps = [70] * 5 + [2500] + [70] * 5  # a 2.5 s gap: two segments
    root = _recording(tmp_path, "d", steer, gaps)
    fl = recording_floor(root, (0.1, 0.5))
    rec = load_recording(root, progress=False)
    assert fl["n_frames"] == 12 and fl["n_segments"] == 2 == len(rec.segments)
    assert fl["zero_share"] == pytest.approx(8 / 12) and fl["zero_mse"] == pytest.approx(np.mean(rec.steering ** 2.0))
    for w in (0.1, 0.5):
        want = smoothed_oracle_ratio(rec.steering, rec.timestamps, w, segments=rec.segments)
        assert fl["oracle_ratio"][width_key(w)] == pytest.approx(want["ratio"])
        assert fl["oracle_mse"][width_key(w)] == pytest.approx(want["mse"])
    means = floor_means([{**fl, "track": "lake"}, {**fl, "track": "lake"}], (0.5,))
    assert means["lake"]["n_recordings"] == 2 and means["all"]["ratio_of_means"]["0.5"] == pytest.approx(
        fl["oracle_ratio"]["0.5"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="driving_log.csv"):
        recording_floor(tmp_path / "empty")


def _fold(out, driver, track, mse, zero, **extra):
    d = {"driver": driver, "track": track, "n_frames": extra.pop("n_frames", 100), "mse": mse, "mae": 0.1,
         "zero_mse": zero, "ratio": mse / zero, "seconds": {"train": 1.0}, **extra}
    (out / "folds").mkdir(parents=True, exist_ok=True)
    (out / "folds" / f"{driver}.json").write_text(json.dumps(d))


def test_lodo_table_gains_the_floor_column(tmp_path):
    from agent.train.lodo import ORACLE_COLUMN, write_table

    out = tmp_path / "lodo"
    steer = [0, 0.3, 0, 0.3, 0, 0, 0.2, 0, 0, 0]
    root = _recording(tmp_path, "c", steer)
    fl = recording_floor(root, (0.5,))
    # a: a new fold, floor stored; b: an old fold without it and without its recording (blank);
    # c: an old fold without it whose recording is still there (computed from the CSV)
    _fold(out, "a", "lake", 0.04, 0.05, oracle_half_width_s=0.5, oracle_mse=0.02, oracle_ratio=0.4)
    _fold(out, "b", "jungle", 0.09, 0.10)
    _fold(out, "c", "lake", 0.03, fl["zero_mse"], n_frames=10, data=str(tmp_path / "data" / "c" / "driving_log.csv"))
    table = write_table(out)
    rows = {r["driver"]: r for r in table["drivers"]}
    assert rows["a"]["oracle_ratio"] == 0.4 and rows["b"]["oracle_ratio"] is None
    assert rows["c"]["oracle_ratio"] == pytest.approx(fl["oracle_ratio"]["0.5"])
    lake = table["tracks"]["lake"]
    assert lake["oracle_ratio_of_means"] == pytest.approx((0.02 + fl["oracle_mse"]["0.5"]) / (0.05 + fl["zero_mse"]))
    assert table["tracks"]["jungle"]["oracle_ratio_of_means"] is None  # not known for every fold: blank
    assert table["tracks"]["all"]["oracle_ratio_of_means"] is None
    md = (out / "lodo.md").read_text()
    assert f"| predict-0 MSE | ratio | {ORACLE_COLUMN} |" in md and ORACLE_COLUMN == "smoothed-oracle ratio (±0.5 s)"
    assert "| a | lake | 100 | 0.0400 | 0.1000 | 0.0500 | 0.80 | 0.40 |" in md
    assert "| b | jungle | 100 | 0.0900 | 0.1000 | 0.1000 | 0.90 |  |" in md
    assert (f"| {lake['ratio_of_means']:.2f} (mean of ratios {lake['mean_ratio']:.2f}) | "
            f"{lake['oracle_ratio_of_means']:.2f} (mean of ratios {lake['oracle_mean_ratio']:.2f}) |") in md
    assert "| **mean, jungle** (1 folds) | jungle | | 0.0900 | 0.1000 | 0.1000 | 0.90 (mean of ratios 0.90) |  |" in md
    assert json.loads((out / "lodo.json").read_text())["drivers"][2]["oracle_ratio"] == pytest.approx(
        fl["oracle_ratio"]["0.5"])
    # a recording that now reads another number of frames than the fold scored: blank, not a wrong floor
    _fold(out, "c", "lake", 0.03, fl["zero_mse"], n_frames=11, data=str(tmp_path / "data" / "c" / "driving_log.csv"))
    assert {r["driver"]: r for r in write_table(out)["drivers"]}["c"]["oracle_ratio"] is None


def _unboxed(err: str) -> str:
    """tyro's error box as one line (its borders and wrapping removed)."""
    return " ".join("".join(" " if c in "│╭╮╰╯─" else c for c in err).split())


def test_cli_floor_table(tmp_path, capsys):
    from agent.cli import main

    data = [_recording(tmp_path, "driver0", [0, 0.2, 0, 0.2, 0, 0, 0.1, 0]),
            _recording(tmp_path, "driver1", [0.1, 0, -0.3, 0, 0, -0.3, 0, 0])]
    js = tmp_path / "floor.json"
    assert main(["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--udacity.half-width", "0.1",
                 "0.5", "--udacity.tracks", "*", "lake", "driver1", "jungle", "--json", str(js)]) == 0
    printed = capsys.readouterr().out
    assert "| oracle ratio ±0.1 s | oracle ratio ±0.5 s |" in printed and "| driver1 | jungle | 8 |" in printed
    assert "**mean, lake** (1 recordings)" in printed
    res = json.loads(js.read_text())
    for r, d in zip(res["recordings"], data):
        assert r["oracle_ratio"] == pytest.approx(recording_floor(d, (0.1, 0.5))["oracle_ratio"])
    assert set(res["means"]) == {"lake", "jungle", "all"}
    # user errors: one line, exit code 2
    for argv, message in [
        (["evaluate", "--env", "udacity", "--data", *data], "--policy is required"),
        (["evaluate", "--env", "udacity", "--udacity.floor"], "--udacity.floor needs --data"),
        (["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--policy", "x.pt"], "drop --policy"),
        (["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--udacity.tracks", "nobody", "lake"],
         "--udacity.tracks names unknown driver(s) nobody"),
        (["evaluate", "--env", "udacity", "--data", *data, "--policy", "x.pt", "--udacity.half-width", "1"],
         "--udacity.half-width only apply with --udacity.floor"),
        (["evaluate", "--data", *data, "--policy", "x.pt"], "--data is for --env udacity"),
        (["evaluate", "--policy", "x.pt", "--udacity.crop-cache", ""],
         "--udacity.crop-cache only apply to --env udacity"),
        (["evaluate", "--udacity.floor"], "--udacity.floor is for --env udacity"),
    ]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    with pytest.raises(SystemExit) as exc:  # a value the field refuses: tyro's parser reports it
        main(["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--udacity.half-width", "-1"])
    assert exc.value.code == 2 and "--udacity.half-width takes seconds >= 0" in _unboxed(capsys.readouterr().err)


def test_cli_evaluate_threads_sets_torch_threads_and_refuses_a_negative_count(tmp_path, capsys):
    import torch

    from agent.cli import main

    data = [_recording(tmp_path, "driver0", [0, 0.2, 0, 0.2, 0, 0, 0.1, 0])]
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    try:
        assert main(["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--threads", str(want)]) == 0
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # refused when the options are built, before anything runs
        main(["evaluate", "--env", "udacity", "--udacity.floor", "--data", *data, "--threads", "-1"])
    assert exc.value.code == 2 and "--threads must be >= 0" in _unboxed(capsys.readouterr().err)
    assert torch.get_num_threads() == before


def test_cli_evaluate_many_prints_the_floor_beside_the_ratio(tmp_path, capsys):
    import torch

    from agent.cli import main
    from agent.nn.policy import DrivingPolicy, default_config

    data = [_recording(tmp_path, "driver0", [0, 0.2, 0, 0.2, 0, 0, 0.1, 0]),
            _recording(tmp_path, "driver1", [0.1, 0, -0.3, 0, 0, -0.3, 0, 0])]
    torch.manual_seed(0)
    pol = DrivingPolicy(default_config("udacity", core="none", window=2)).save(tmp_path / "p.pt")
    js = tmp_path / "many.json"
    assert main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", *data, "--json", str(js),
                 "--udacity.crop-cache", ""]) == 0
    assert "| ratio | smoothed-oracle ratio (±0.5 s) |" in capsys.readouterr().out
    res = json.loads(js.read_text())
    for r, d in zip(res["recordings"], data):
        assert r["oracle_half_width_s"] == 0.5
        assert r["oracle_ratio"] == pytest.approx(recording_floor(d, (0.5,))["oracle_ratio"]["0.5"], rel=1e-5)
    s = res["summary"]
    assert s["oracle_ratio_of_means"] == pytest.approx(np.mean([r["oracle_mse"] for r in res["recordings"]]) /
                                                       s["zero_mse"])
