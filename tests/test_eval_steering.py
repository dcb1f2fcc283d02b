"""Steering scored against the driver's intent (agent.eval.steering) and its wiring into
`agent evaluate --env udacity` (per recording, per-track means, JSON, the --udacity.plot figure)."""

import json
import math

import numpy as np
import pytest
from udacity_fixture import write_recording

from agent.eval.offline import summarize_by_track
from agent.eval.steering import (curve_magnitude, error_split, intent_scores, pearson, right_way, smooth_in_time,
                                 smoothed_ratio, timing)

# a smoothed-label trace with left (negative) and right (positive) curves and straight parts
SMOOTH = np.array([0.0, 0.02, -0.1, -0.3, -0.2, 0.0, 0.04, 0.1, 0.25, 0.4, 0.2, -0.03])


def test_prediction_equal_to_the_intent_scores_perfectly():
    r = smoothed_ratio(SMOOTH, SMOOTH)
    assert r["mse"] == 0 and r["ratio"] == 0 and r["zero_mse"] == pytest.approx(np.mean(SMOOTH ** 2))
    assert pearson(SMOOTH, SMOOTH) == pytest.approx(1.0)
    w = right_way(SMOOTH, SMOOTH)
    assert (w["share"], w["left_share"], w["right_share"]) == (1.0, 1.0, 1.0)
    assert (w["n_curve"], w["n_left"], w["n_right"]) == (7, 3, 4)  # |s| > 0.05; negative is left
    m = curve_magnitude(SMOOTH, SMOOTH)
    assert m["ratio"] == pytest.approx(1.0) and m["n_curve"] == 7


def test_predict_zero_has_ratio_one_and_never_turns():
    assert smoothed_ratio(np.zeros_like(SMOOTH), SMOOTH)["ratio"] == pytest.approx(1.0)
    assert right_way(np.zeros_like(SMOOTH), SMOOTH)["share"] == 0.0  # 0 is no turn
    assert math.isnan(pearson(np.zeros_like(SMOOTH), SMOOTH))  # a constant has no correlation
    assert curve_magnitude(np.zeros_like(SMOOTH), SMOOTH)["mean_abs_pred"] == 0.0


def test_negated_prediction_turns_the_wrong_way_everywhere():
    w = right_way(-SMOOTH, SMOOTH)
    assert (w["share"], w["left_share"], w["right_share"]) == (0.0, 0.0, 0.0)
    assert pearson(-SMOOTH, SMOOTH) == pytest.approx(-1.0)
    assert smoothed_ratio(-SMOOTH, SMOOTH)["ratio"] == pytest.approx(4.0)  # (2s)^2 / s^2
    assert curve_magnitude(-SMOOTH, SMOOTH)["ratio"] == pytest.approx(1.0)  # the amount, not the sign


def test_half_scaled_prediction_steers_half_as_much():
    m = curve_magnitude(0.5 * SMOOTH, SMOOTH)
    assert m["mean_abs_pred"] == pytest.approx(0.5 * m["mean_abs_label"]) and m["ratio"] == pytest.approx(0.5)
    assert m["mean_abs_label"] == pytest.approx(np.mean(np.abs(SMOOTH[np.abs(SMOOTH) > 0.05])))
    assert pearson(0.5 * SMOOTH + 0.1, SMOOTH) == pytest.approx(1.0)  # blind to scale and offset
    assert smoothed_ratio(0.5 * SMOOTH, SMOOTH)["ratio"] == pytest.approx(0.25)
    assert right_way(0.5 * SMOOTH, SMOOTH)["share"] == 1.0


def test_measures_by_hand():
    assert pearson([1.0, 2.0, 3.0], [1.0, 3.0, 2.0]) == pytest.approx(0.5)
    s = [-0.2, -0.1, 0.0, 0.02, 0.1, 0.3]
    p = [-0.1, 0.05, 0.5, -0.5, 0.2, 0.1]  # left: right, wrong; straight (ignored) x2; right: right, right
    w = right_way(p, s)
    assert (w["share"], w["left_share"], w["right_share"]) == (0.75, 0.5, 1.0)
    assert (w["n_curve"], w["n_left"], w["n_right"]) == (4, 2, 2)
    m = curve_magnitude([0.1, 0.1, 0.9], [0.2, -0.4, 0.01])
    assert m["mean_abs_pred"] == pytest.approx(0.1) and m["mean_abs_label"] == pytest.approx(0.3)
    assert right_way(p, s, threshold=0.15)["n_curve"] == 2  # the threshold is on |smoothed|
    r = smoothed_ratio([0.1, 0.0], [0.2, 0.0])
    assert r["mse"] == pytest.approx(0.005) and r["zero_mse"] == pytest.approx(0.02)
    assert r["ratio"] == pytest.approx(0.25)


def test_undefined_measures_are_nan():
    straight = np.array([0.0, 0.01, -0.04, 0.05])  # |s| <= 0.05 everywhere: no curve frame
    w = right_way(straight, straight)
    assert math.isnan(w["share"]) and math.isnan(w["left_share"]) and w["n_curve"] == 0
    m = curve_magnitude(straight, straight)
    assert math.isnan(m["mean_abs_pred"]) and math.isnan(m["ratio"]) and m["n_curve"] == 0
    assert math.isnan(smoothed_ratio([0.1, 0.2], [0.0, 0.0])["ratio"])
    assert math.isnan(pearson([0.1], [0.2]))
    w = right_way([0.1, 0.2], [0.2, 0.3])  # right curves only
    assert w["right_share"] == 1.0 and math.isnan(w["left_share"])


def test_error_split_tells_wandering_from_over_and_under_steering():
    curve = np.abs(SMOOTH) > 0.05
    assert math.isnan(error_split(SMOOTH, SMOOTH)["straight_error_share"])  # no error anywhere
    e = error_split(SMOOTH, SMOOTH)
    assert e["curve_signed_excess"] == pytest.approx(0.0) and e["n_straight"] == int((~curve).sum()) == 5
    wander = SMOOTH + np.where(curve, 0.0, 0.2)  # exact in curves, 0.2 off on every straight frame
    w = error_split(wander, SMOOTH)
    assert w["straight_error_share"] == pytest.approx(1.0) and w["curve_signed_excess"] == pytest.approx(0.0)
    assert w["straight_mean_abs_pred"] == pytest.approx(np.mean(np.abs(wander[~curve])))
    over = error_split(1.5 * SMOOTH, SMOOTH)
    assert over["curve_signed_excess"] == pytest.approx(0.5 * np.mean(np.abs(SMOOTH[curve])))
    assert over["curve_signed_excess"] > 0
    assert error_split(0.5 * SMOOTH, SMOOTH)["curve_signed_excess"] == pytest.approx(-over["curve_signed_excess"])
    wrong = error_split(-SMOOTH, SMOOTH)  # the wrong way counts as less than nothing
    assert wrong["curve_signed_excess"] == pytest.approx(-2 * np.mean(np.abs(SMOOTH[curve])))
    # by hand: squared errors 0.01 (straight) and 0.04 (curve): 20 % of the error on the straight
    h = error_split([0.1, 0.5], [0.0, 0.3])
    assert h["straight_error_share"] == pytest.approx(0.2) and h["curve_signed_excess"] == pytest.approx(0.2)
    assert h["straight_mean_abs_pred"] == pytest.approx(0.1) and h["n_straight"] == 1
    only_curves = error_split([0.2], [0.3])
    assert math.isnan(only_curves["straight_mean_abs_pred"]) and only_curves["straight_error_share"] == 0.0
    assert math.isnan(error_split([0.0], [0.01])["curve_signed_excess"])  # no curve frame


@pytest.mark.parametrize("fn", [smoothed_ratio, pearson, right_way, curve_magnitude, error_split])
@pytest.mark.parametrize("args, message", [
    (([0.1, 0.2, 0.3], [0.1, 0.2]), "3 frames but the smoothed labels 2"),
    (([], []), "no frames"),
    (([0.1, float("nan")], [0.1, 0.2]), "finite"),
    ((np.zeros((2, 2)), np.zeros((2, 2))), "1-D"),
])
def test_bad_input_is_refused_clearly(fn, args, message):
    with pytest.raises(ValueError, match=message):
        fn(*args)


def test_bad_threshold_is_refused():
    for fn in (right_way, curve_magnitude, error_split):
        with pytest.raises(ValueError, match="threshold"):
            fn([0.1], [0.1], threshold=-0.1)


def test_smoothing_with_irregular_timestamps_by_hand():
    t = [0.0, 0.1, 0.45, 0.7, 1.3, 1.35]
    s = [0.3, 0.0, 0.0, 0.3, 0.0, 0.3]
    # +-0.5 s, label included: [0, .1, .45], [0, .1, .45], [0, .1, .45, .7], [.45, .7], [1.3, 1.35], [1.3, 1.35]
    assert np.allclose(smooth_in_time(s, t), [0.1, 0.1, 0.15, 0.15, 0.15, 0.15])
    assert np.allclose(smooth_in_time([0.3, 0.0, 0.6], [0.0, 0.5, 1.2]), [0.15, 0.15, 0.6])  # the edge is inside
    assert np.allclose(smooth_in_time([0.4], [3.0]), [0.4])  # alone in its window: the label itself
    # a gap over 1 s starts a new session segment: windows do not cross it
    assert np.allclose(smooth_in_time([0.2, 0.0, 0.6, 0.6], [0.0, 0.1, 1.2, 1.3]), [0.1, 0.1, 0.6, 0.6])
    assert np.allclose(smooth_in_time([0.2, 0.0, 0.6], [0.0, 0.1, 0.2], segments=[[0, 2], [2, 3]]), [0.1, 0.1, 0.6])
    with pytest.raises(ValueError, match="increase strictly"):
        smooth_in_time([0.1, 0.2], [0.5, 0.5])
    with pytest.raises(ValueError, match="2 labels but timestamps has 3"):
        smooth_in_time([0.1, 0.2], [0.0, 0.1, 0.2])


def test_intent_scores_of_one_recording():
    t = np.cumsum(np.r_[0.0, np.full(59, 0.07)])
    taps = np.where((np.arange(60) % 2 == 0) & (np.arange(60) < 30), -0.4, 0.0)  # left taps, then straight
    taps[40:] = np.where(np.arange(40, 60) % 3 == 0, 0.3, 0.0)  # right taps
    sm = smooth_in_time(taps, t)
    out = intent_scores(sm, taps, t)
    assert np.allclose(out["smoothed"], sm)
    sc = out["scores"]
    assert sc["smoothed_ratio"] == 0 and sc["smoothed_corr"] == pytest.approx(1.0) and sc["right_way"] == 1.0
    assert sc["n_left"] > 0 and sc["n_right"] > 0 and sc["half_width_s"] == 0.5 and sc["curve_threshold"] == 0.05
    raw = intent_scores(taps, taps, t)["scores"]  # the taps themselves are a worse match to the intent
    assert raw["smoothed_ratio"] > 0 and raw["smoothed_corr"] < 1
    with pytest.raises(ValueError, match="one prediction per label"):
        intent_scores(sm[:-1], taps, t)


def test_means_per_track():
    rows = [{"track": "lake", "n_frames": 10, "mse": 0.02, "mae": 0.1, "zero_mse": 0.04, "ratio": 0.5,
             "smoothed_mse": 0.01, "smoothed_zero_mse": 0.02, "smoothed_ratio": 0.5, "smoothed_corr": 0.6,
             "right_way": 0.8, "right_way_left": 0.7, "right_way_right": 0.9, "n_curve": 5, "n_left": 2, "n_right": 3,
             "curve_mean_abs_pred": 0.05, "curve_mean_abs_label": 0.1, "curve_abs_ratio": 0.5},
            {"track": "lake", "n_frames": 10, "mse": 0.04, "mae": 0.2, "zero_mse": 0.04, "ratio": 1.0,
             "smoothed_mse": 0.03, "smoothed_zero_mse": 0.02, "smoothed_ratio": 1.5, "smoothed_corr": 0.2,
             "right_way": 0.6, "right_way_left": None, "right_way_right": 0.6, "n_curve": 4, "n_left": 0,
             "n_right": 4, "curve_mean_abs_pred": 0.03, "curve_mean_abs_label": 0.1, "curve_abs_ratio": 0.3},
            {"n_frames": 5, "mse": 0.01, "mae": 0.1, "zero_mse": 0.02, "ratio": 0.5, "smoothed_mse": 0.0,
             "smoothed_zero_mse": 0.0, "smoothed_ratio": None, "smoothed_corr": None, "right_way": None,
             "right_way_left": None, "right_way_right": None, "n_curve": 0, "n_left": 0, "n_right": 0,
             "curve_mean_abs_pred": None, "curve_mean_abs_label": None, "curve_abs_ratio": None}]
    g = summarize_by_track(rows)
    assert list(g) == ["-", "lake", "all"]
    lake = g["lake"]
    assert lake["n_recordings"] == 2 and lake["smoothed_ratio_of_means"] == pytest.approx(1.0)
    assert lake["smoothed_mean_ratio"] == pytest.approx(1.0) and lake["smoothed_corr"] == pytest.approx(0.4)
    assert lake["right_way"] == pytest.approx(0.7) and lake["right_way_left"] == pytest.approx(0.7)
    assert lake["n_curve"] == 9 and lake["n_left"] == 2 and lake["curve_abs_ratio"] == pytest.approx(0.4)
    assert g["-"]["smoothed_ratio_of_means"] is None and g["-"]["right_way"] is None
    assert g["all"]["n_recordings"] == 3 and g["all"]["smoothed_corr"] == pytest.approx(0.4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Two fixture recordings (right taps; left taps) and an untrained frame-only policy file."""
    import torch

    from agent.nn.policy import DrivingPolicy, default_config

    tmp = tmp_path_factory.mktemp("steer")
    right = [0.3, 0, 0.3, 0.3, 0, 0.3, 0, 0.3, 0.3, 0]
    data = [str(write_recording(tmp / "data" / "driverR", n=10, steering=right)[0]),
            str(write_recording(tmp / "data" / "driverL", n=10, steering=[-0.2, 0, -0.2, 0, -0.2, 0, 0, -0.2, 0, 0],
                                gaps_ms=[70] * 4 + [1500] + [70] * 4)[0])]
    torch.manual_seed(0)
    pol = DrivingPolicy(default_config("udacity", core="none", window=2)).save(tmp / "p.pt")
    return tmp, data, pol


INTENT_KEYS = ("intent_half_width_s", "curve_threshold", "smoothed_mse", "smoothed_zero_mse", "smoothed_ratio",
               "smoothed_corr", "right_way", "right_way_left", "right_way_right", "n_curve", "n_left", "n_right",
               "curve_mean_abs_pred", "curve_mean_abs_label", "curve_abs_ratio", "straight_error_share",
               "straight_mean_abs_pred", "curve_signed_excess", "n_straight")


def test_evaluate_udacity_scores_its_own_predictions(tiny):
    from agent.data.udacity import load_recording
    from agent.eval.offline import evaluate_udacity, predict_recording
    from agent.nn.policy import DrivingPolicy

    _, data, pol = tiny
    policy = DrivingPolicy.load(pol)
    rec = load_recording(data[1], progress=False)
    res = evaluate_udacity(policy, rec, progress=False, series=True)
    pred = predict_recording(policy, rec)
    sm = smooth_in_time(rec.steering, rec.timestamps, segments=rec.segments)
    assert len(rec.segments) == 2 and np.allclose(res["series"]["smoothed"], sm)
    assert np.allclose(res["series"]["pred"], pred) and np.allclose(res["series"]["label"], rec.steering)
    assert res["smoothed_ratio"] == pytest.approx(smoothed_ratio(pred, sm)["ratio"], rel=1e-6)
    assert res["smoothed_corr"] == pytest.approx(pearson(pred, sm), rel=1e-6, abs=1e-9)
    assert res["right_way"] == right_way(pred, sm)["share"] and res["n_right"] == 0 and res["n_left"] > 0
    assert res["right_way_right"] is None  # no right curve on a left-only recording: None in the JSON
    split = error_split(pred, sm)
    assert res["straight_error_share"] == pytest.approx(split["straight_error_share"], rel=1e-6)
    assert res["curve_signed_excess"] == pytest.approx(split["curve_signed_excess"], rel=1e-6)
    assert res["n_straight"] + res["n_curve"] == res["n_frames"]
    moving = rec.speed >= 5.0
    assert moving.all() and res["moving_smoothed_ratio"] == pytest.approx(res["smoothed_ratio"], rel=1e-9)
    rec.speed[: len(rec) // 2] = 0.0  # the car stopped for the first half: scored on the second half only
    half = evaluate_udacity(policy, rec, progress=False)
    later = slice(len(rec) // 2, None)
    assert half["n_moving"] == len(rec) - len(rec) // 2 and half["moving_smoothed_ratio"] is not None
    for key, want in (("moving_smoothed_ratio", smoothed_ratio(pred[later], sm[later])["ratio"]),
                      ("moving_smoothed_corr", pearson(pred[later], sm[later]))):
        if math.isnan(want):  # undefined (e.g. a constant prediction): None in the JSON
            assert half[key] is None, key
        else:
            assert half[key] == pytest.approx(want, rel=1e-6, abs=1e-9), key
    assert half["smoothed_ratio"] == pytest.approx(res["smoothed_ratio"], rel=1e-9)  # the headline keeps every frame
    # a reversing stretch (brake held from the stop, the car speeding up) is left out of the driving frames too
    n, h = len(rec), len(rec) // 2
    rec.speed[:h] = 0.0
    rec.speed[h:] = 5.0 + np.arange(n - h)  # from the stop, faster every frame ...
    rec.brake[h:], rec.throttle[h:] = 1.0, 0.0  # ... on the brake: backwards
    back = evaluate_udacity(policy, rec, progress=False)
    assert back["n_reversing"] == n - h and back["n_moving"] == 0 and back["moving_smoothed_ratio"] is None
    rec.brake[h:], rec.throttle[h:] = 0.0, 1.0  # the same on the throttle: forwards, scored again
    fwd = evaluate_udacity(policy, rec, progress=False)
    assert fwd["n_reversing"] == 0 and fwd["n_moving"] == n - h
    assert "series" not in evaluate_udacity(policy, rec, progress=False)


def test_cli_reports_the_intent_scores_per_recording_and_track(tiny, capsys):
    from agent.cli import main

    tmp, data, pol = tiny
    js, png = tmp / "many.json", tmp / "fig" / "steer.png"
    assert main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", *data, "--json", str(js),
                 "--udacity.crop-cache", "", "--udacity.tracks", "*", "lake", "driverL", "jungle",
                 "--udacity.plot", str(png), "--udacity.plot-recording", "driverL"]) == 0
    out = capsys.readouterr().out
    assert "| ratio | smoothed-oracle ratio (±0.5 s) |" in out  # the raw-label table stays
    assert "| smoothed ratio | Pearson r | right way (left / right) |" in out
    assert "**mean, jungle** (1 recordings)" in out and "**mean** (2 recordings)" in out
    assert out.count("| driverL | jungle |") == 2  # both tables carry the track column when tracks are given
    res = json.loads(js.read_text())
    for r in res["recordings"]:
        assert all(k in r for k in INTENT_KEYS) and "series" not in r
        assert r["intent_half_width_s"] == 0.5 and r["curve_threshold"] == 0.05
        assert r["oracle_ratio"] is not None and r["ratio"] is not None  # the raw-label ratio and floor remain
    by = {r["recording"]: r for r in res["recordings"]}
    assert by["driverL"]["track"] == "jungle" and by["driverR"]["track"] == "lake"
    assert by["driverL"]["n_left"] > 0 == by["driverL"]["n_right"]
    assert by["driverR"]["n_right"] > 0 == by["driverR"]["n_left"]
    assert set(res["tracks"]) == {"lake", "jungle", "all"} and res["summary"] == res["tracks"]["all"]
    assert res["tracks"]["jungle"]["smoothed_corr"] == by["driverL"]["smoothed_corr"]
    assert res["tracks"]["all"]["right_way"] == pytest.approx(np.mean([r["right_way"] for r in res["recordings"]]))
    assert res["tracks"]["all"]["smoothed_ratio_of_means"] == pytest.approx(
        np.mean([r["smoothed_mse"] for r in res["recordings"]]) /
        np.mean([r["smoothed_zero_mse"] for r in res["recordings"]]))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one recording: the flat JSON gains the same fields
    js1 = tmp / "one.json"
    assert main(["evaluate", "--env", "udacity", "--policy", str(pol), "--data", data[0], "--json", str(js1),
                 "--udacity.crop-cache", ""]) == 0
    printed = capsys.readouterr().out
    assert "against the driver's intent" in printed and "of it on straight frames" in printed
    one = json.loads(js1.read_text())
    assert all(k in one for k in INTENT_KEYS) and one["n_curve"] == one["n_right"] > 0


def test_cli_plot_options_are_checked(tiny, capsys):
    from agent.cli import main

    tmp, data, pol = tiny
    base = ["evaluate", "--env", "udacity", "--data", *data, "--udacity.crop-cache", ""]
    for argv, message in [
        (base + ["--policy", str(pol), "--udacity.plot", str(tmp / "x.png"), "--udacity.plot-recording", "nobody"],
         "--udacity.plot-recording nobody: not one of the recordings (driverR, driverL)"),
        (base + ["--policy", str(pol), "--udacity.plot-recording", "driverL"], "add --udacity.plot PATH.png"),
        (base + ["--udacity.floor", "--udacity.plot", str(tmp / "x.png")], "drop --udacity.plot"),
        (base + ["--policy", str(pol), "--udacity.tracks", "nobody", "lake"], "--udacity.tracks names unknown"),
        (["evaluate", "--policy", str(pol), "--udacity.plot", str(tmp / "x.png")], "only apply to --env udacity"),
    ]:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    assert not (tmp / "x.png").exists()


def _curves(n=400, dt=0.1):
    t = np.arange(n) * dt
    return t, 0.3 * np.sin(t / 1.5) + 0.1 * np.sin(t / 0.4)


@pytest.mark.parametrize("shift", [-4, -1, 3, 7])
def test_timing_finds_how_late_or_early_the_policy_steers(shift):
    t, s = _curves()
    p = np.roll(s, shift)  # p[i] = s[i - shift]: late by shift frames when shift > 0
    keep = slice(10, -10)  # no frame wrapped round by the roll
    out = timing(p[keep], s[keep], t[keep])
    assert out["lag_frames"] == shift and out["lag_s"] == pytest.approx(shift * 0.1)
    assert out["corr_at_lag"] == pytest.approx(1.0) and out["ratio_at_lag"] == pytest.approx(0.0, abs=1e-12)
    assert out["corr_at_0"] < 1.0 and out["ratio_at_0"] > 0.0  # unshifted it loses


def test_timing_pairs_frames_only_inside_one_segment():
    t, s = _curves(200)
    t2 = np.concatenate([t, t + 100.0])  # two sessions, a 80 s gap between them
    s2 = np.concatenate([s, -s])  # the second session steers the other way
    p2 = np.concatenate([np.roll(s, 2), np.roll(-s, 2)])
    out = timing(p2, s2, t2)
    assert out["lag_frames"] == 2  # a pair across the gap would break the perfect fit
    whole = timing(p2, s2, t2, segments=[[0, 400]])  # told it is one segment: the cross pairs count
    assert whole["corr_at_lag"] <= out["corr_at_lag"]


def test_timing_of_a_constant_or_bad_input():
    t, s = _curves(50)
    assert math.isnan(timing(np.zeros(50), s, t)["lag_s"])
    with pytest.raises(ValueError, match="max_lag_s"):
        timing(s, s, t, max_lag_s=0)
    with pytest.raises(ValueError, match="timestamps"):
        timing(s, s, t[:-1])
    with pytest.raises(ValueError, match="increase"):
        timing(s, s, t[::-1])


def test_intent_scores_carry_the_timing():
    t, s = _curves()
    sc = intent_scores(np.roll(s, 3), s, t)["scores"]
    assert {"best_lag_s", "corr_at_best_lag", "smoothed_ratio_at_best_lag"} <= set(sc)
    assert sc["best_lag_s"] == pytest.approx(0.3)  # the policy three frames late, against the smoothed labels
    assert sc["smoothed_ratio_at_best_lag"] < sc["smoothed_ratio"]


def test_reversing_frames_finds_the_brake_driven_stretches():
    from agent.data.udacity import reversing_frames

    # forwards at 30 mph, brake to a stop (frame 9), reverse on the brake (10-14), stop (15), forwards on the throttle
    speed = np.array([30, 30, 30, 25, 20, 15, 10, 6, 3, 0.5, 2, 4, 6, 8, 6, 1, 4, 10, 20, 30], float)
    brake = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0], float)
    throttle = np.array([1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1], float)
    rev = reversing_frames(speed, throttle, brake)
    assert rev.tolist() == [False] * 9 + [True] * 6 + [False] * 5  # stop to stop: frames 9..14 go backwards
    # braking hard while driving forwards never counts, however slow the car gets
    assert not reversing_frames(speed[:10], throttle[:10], brake[:10]).any()
    # a segment boundary ends a stretch: the first segment alone has no brake-driven speed-up
    seg = np.array([[0, 10], [10, 20]])
    assert reversing_frames(speed, throttle, brake, seg)[:10].sum() == 0
    assert reversing_frames(speed, throttle, brake, seg)[10:15].all()
    # creeping on the brake below a stop's speed (the car barely moves) is not counted
    assert not reversing_frames(np.array([0, 0.5, 1.0, 1.5, 0.2]), np.zeros(5), np.ones(5)).any()
    with pytest.raises(ValueError, match="one value per frame"):
        reversing_frames(speed, throttle[:5], brake)
