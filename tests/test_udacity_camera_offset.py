"""Side cameras with a measured offset (`--udacity.camera-correction measured`, issue 41 item 4)."""

import json

import cv2
import numpy as np
import pytest
from cli_run import run_cli
from udacity_fixture import write_jpeg, write_recording

from agent.data.udacity import AugmentConfig, load_recording, measure_camera_offset


class _Views:
    """A recording-like object whose side cameras see a textured scene dx raw pixels from the center view."""

    def __init__(self, n=5, dx=40, seed=0):
        rng = np.random.default_rng(seed)
        self.frames = {}
        scenes = [cv2.resize(rng.integers(0, 256, (20, 50, 3), dtype=np.uint8), (400, 160)) for _ in range(n)]
        x0 = 40
        self.frames["center"] = np.stack([s[:, x0:x0 + 320] for s in scenes])
        self.frames["left"] = np.stack([s[:, x0 - dx:x0 - dx + 320] for s in scenes])  # the scene moves right
        self.frames["right"] = np.stack([s[:, x0 + dx:x0 + dx + 320] for s in scenes])

    def camera(self, name):
        return self.frames[name]

    def __len__(self):
        return len(self.frames["center"])


@pytest.mark.parametrize("dx", [24, 40])
def test_the_measured_offset_is_the_views_shift_in_the_shift_rules_steering(dx):
    m = measure_camera_offset([_Views(dx=dx)], frames_per_recording=5)
    assert m["left_px"] == pytest.approx(dx, abs=2.0) and m["right_px"] == pytest.approx(-dx, abs=2.0)
    assert m["frames"] == 5 and m["correction"] == pytest.approx(m["px"] * AugmentConfig.steering_per_pixel)


def test_identical_cameras_measure_no_offset_and_bad_input_is_refused(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=4, rgb=None)
    rec = load_recording(root, progress=False)
    for cam in ("left", "right"):  # every camera the center's image
        rec.camera(cam)[:] = rec.camera("center")
    m = measure_camera_offset([rec])
    assert abs(m["left_px"]) < 1 and abs(m["right_px"]) < 1
    with pytest.raises(ValueError, match="no frames"):
        measure_camera_offset([])
    with pytest.raises(ValueError, match="band"):
        measure_camera_offset([rec], band=(40, 80))


def _shifted_drivers(tmp_path, n=2, rows=10, dx=40):
    """Recordings whose side images are the center image's scene seen dx pixels beside it."""
    out = []
    for k in range(n):
        root, _ = write_recording(tmp_path / "data" / f"driver{k}", n=rows,
                                  steering=[round(0.3 * np.sin(0.7 * i + k), 3) for i in range(rows)])
        views = _Views(rows, dx, seed=k)
        lines = (root / "driving_log.csv").read_text().splitlines()
        for i, line in enumerate(lines):
            for j, cam in enumerate(("center", "left", "right")):
                write_jpeg(root / "IMG" / line.split(",")[j].split("\\")[-1], views.camera(cam)[i])
        out.append(str(root))
    return out


def test_cli_measures_the_correction_per_fold_and_records_it(tmp_path, capsys):
    data = _shifted_drivers(tmp_path)
    out = tmp_path / "lodo"
    common = ["train", "--env", "udacity", "--data", *data, "--policy.core", "none", "--policy.window", "2",
              "--train.epochs", "1", "--train.val-fraction", "0", "--udacity.crop-cache", str(tmp_path / "cache"),
              "--train.tensorboard", "", "--udacity.camera-correction", "measured"]
    rc, err = run_cli([*common, "--lodo.out", str(out)], capsys)
    assert rc == 0, err
    for k in range(2):
        f = json.loads((out / "folds" / f"driver{k}.json").read_text())
        assert f["camera_offset"]["left_px"] == pytest.approx(40, abs=3)  # measured in the other driver's frames
        assert f["settings"]["augment"]["camera_correction"] == "measured"
    rc, err = run_cli([*common, "--out", str(tmp_path / "p.pt"), "--run-dir", str(tmp_path / "run")], capsys)
    assert rc == 0 and (tmp_path / "p.pt").is_file()
    rc, err = run_cli([*common[:-1], "1.5", "--out", str(tmp_path / "q.pt")], capsys)
    assert rc == 2 and "udacity.camera_correction must be a steering in [0, 1] or 'measured'" in err
