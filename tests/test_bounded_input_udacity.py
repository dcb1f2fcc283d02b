"""Bounded input (issue 38, item 4) for Udacity recordings: absurd values are skipped as bad rows, over-long CSV
lines give an error naming the file and the line, and the crop cache and offline evaluation read through the same
checks. Recordings are tiny ones written into tmp_path (tests/udacity_fixture.py)."""

import math
import warnings

import numpy as np
import pytest
from udacity_fixture import write_recording

from agent.data.udacity import (MAX_CSV_LINE_CHARS, MAX_SPEED_MPH, load_recording, parse_log,
                                value_out_of_range)
from agent.data.udacity_cache import load_cached
from agent.eval.label_floor import recording_floor

#: (column index, value, what the warning says) of each crafted row, in CSV rows 2..9
ABSURD = [
    (3, "1e9", r"steering 1e\+09 is outside \[-1, 1\]"),  # the case: MSE 3.7e16
    (3, "-1.5", r"steering -1.5 is outside \[-1, 1\]"),
    (4, "2", r"throttle 2 is outside \[-1, 1\]"),
    (4, "nan", r"throttle 'nan' is not a finite number"),
    (5, "-7", r"brake -7 is outside \[-1, 1\]"),
    (6, "-0.5", r"speed -0.5 mph is outside \[0, 200\] mph"),
    (6, "1e300", r"speed 1e\+300 mph is outside \[0, 200\] mph"),  # finite in float64, inf in float32
    (6, "inf", r"speed 'inf' is not a finite number"),
]


def _absurd_recording(root):
    """A 10-row recording whose rows 2..9 each carry one absurd value (ABSURD); rows 1 and 10 are good."""
    root, _ = write_recording(root, n=10)
    csv = root / "driving_log.csv"
    lines = csv.read_text().splitlines()
    for i, (col, value, _) in enumerate(ABSURD, start=1):
        fields = lines[i].split(",")
        fields[col] = value
        lines[i] = ",".join(fields)
    csv.write_text("\n".join(lines) + "\n")
    return root


def _expected_warning() -> str:
    return r"skipped 8 bad row\(s\): " + "; ".join(f"row {i}: {m}" for i, (_, _, m) in enumerate(ABSURD, start=2))


def test_value_ranges():
    assert value_out_of_range([1.0, -1.0, 0.0, MAX_SPEED_MPH]) == ""
    assert value_out_of_range([-1.0, 1.0, 1.0, 0.0]) == ""
    assert value_out_of_range([1.0000001, 0, 0, 0]).startswith("steering")
    assert value_out_of_range([0, 0, 0, MAX_SPEED_MPH + 1]).startswith("speed")
    assert value_out_of_range([0, math.nan, 0, 0]).startswith("throttle")
    assert value_out_of_range([0, 0, 0, 1e300]).startswith("speed")


def test_absurd_values_are_skipped_with_the_bad_row_warning(tmp_path):
    root = _absurd_recording(tmp_path / "rec")
    with pytest.warns(UserWarning, match=_expected_warning()):
        rec = load_recording(root, progress=False)
    assert rec.rows.tolist() == [1, 10]
    assert np.abs(rec.steering).max() <= 1 and np.isfinite(rec.speed).all()
    with pytest.raises(ValueError, match=r"found 8 bad row\(s\).*row 2: steering 1e\+09"):
        load_recording(root, on_bad_row="error", progress=False)
    _, good, bad = parse_log(root)
    assert [g[0] for g in good] == [1, 10] and [b.row for b in bad] == list(range(2, 10))


def test_the_crop_cache_and_the_label_floor_skip_them_too(tmp_path):
    root = _absurd_recording(tmp_path / "rec")
    with pytest.warns(UserWarning, match=_expected_warning()):
        rec = load_cached(root, tmp_path / "cache", progress=False)
    assert rec.rows.tolist() == [1, 10] and np.abs(rec.steering).max() <= 1
    with pytest.warns(UserWarning, match=r"skipped 8 bad row"):  # read into memory: the same rows
        assert load_cached(root, tmp_path / "cache", progress=False, mmap=False).rows.tolist() == [1, 10]
    floor = recording_floor(root)
    assert floor["n_frames"] == 2 and floor["n_bad_rows_skipped"] == 8 and floor["zero_mse"] < 1


def test_offline_evaluation_reports_a_sane_error(tmp_path):
    """The issue's case: steering 1e9 in a recording gave an offline MSE of 3.7e16."""
    from agent.eval.offline import evaluate_udacity
    from agent.nn.policy import DrivingPolicy, default_config

    root, _ = write_recording(tmp_path / "rec", n=6)
    csv = root / "driving_log.csv"
    lines = csv.read_text().splitlines()
    fields = lines[2].split(",")
    fields[3] = "1e9"
    lines[2] = ",".join(fields)
    csv.write_text("\n".join(lines) + "\n")
    policy = DrivingPolicy(default_config("udacity", core="lstm")).eval()
    with pytest.warns(UserWarning, match=r"row 3: steering 1e\+09 is outside"):
        res = evaluate_udacity(policy, root, progress=False)
    assert res["n_frames"] == 5 and res["n_bad_rows_skipped"] == 1
    assert res["mse"] <= 4.0  # both the prediction and the labels lie in [-1, 1]


def test_tampered_cache_labels_are_refused(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=4)
    load_cached(root, tmp_path / "cache", progress=False)
    (npz,) = (tmp_path / "cache").glob("*.npz")
    with np.load(npz) as z:
        lab = {k: z[k] for k in z.files}
    lab["steering"] = lab["steering"].copy()
    lab["steering"][1] = 1e9
    with open(npz, "wb") as fh:
        np.savez(fh, **lab)
    with pytest.raises(ValueError, match=r"hold steering values outside \[-1, 1\].*delete .* to rebuild"):
        load_cached(root, tmp_path / "cache", progress=False)
    with open(npz, "wb") as fh:
        np.savez(fh, **lab, extra1=np.zeros(1), extra2=np.zeros(1))
    with pytest.raises(ValueError, match=r"labels are refused: .* holds 12 zip members \(limit 10\)"):
        load_cached(root, tmp_path / "cache", progress=False)


def _long_line_recording(root, line: str, at: int = 3):
    root, _ = write_recording(root, n=5)
    csv = root / "driving_log.csv"
    lines = csv.read_text().splitlines()
    lines.insert(at - 1, line)
    csv.write_text("\n".join(lines) + "\n")
    return root


def test_an_over_long_line_gives_an_error_naming_the_file_and_line(tmp_path):
    root = _long_line_recording(tmp_path / "rec", "x" * (MAX_CSV_LINE_CHARS + 10))
    match = rf"driving_log.csv, line 3: longer than {MAX_CSV_LINE_CHARS:,} characters"
    with pytest.raises(ValueError, match=match):
        load_recording(root, progress=False)
    with pytest.raises(ValueError, match=match):
        load_cached(root, tmp_path / "cache", progress=False)
    with pytest.raises(ValueError, match=match):
        recording_floor(root)
    # just below the limit it is one bad row among good ones (wrong column count), not an error
    ok = _long_line_recording(tmp_path / "ok", "x" * (MAX_CSV_LINE_CHARS - 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(load_recording(ok, progress=False)) == 5
    assert any("row 3: expected 7 columns" in str(w.message) for w in caught)


def test_a_field_over_the_csv_modules_limit_gives_an_error_naming_the_file_and_line(tmp_path):
    """A quoted field spread over short lines passes the line limit but not csv's field limit (131,072)."""
    part = "y" * 50_000
    root = _long_line_recording(tmp_path / "rec", f'"{part}\n{part}\n{part}",a,b,0,0,0,0', at=2)
    with pytest.raises(ValueError, match=r"driving_log.csv, line 4: cannot parse the CSV \(field larger than field "
                                         r"limit \(131072\)\)"):
        load_recording(root, progress=False)
