import numpy as np
import pytest
from udacity_fixture import frame, write_jpeg, write_recording

from agent.data.udacity import (AugmentConfig, AugmentParams, UdacityRecording, augment_frames, augment_steering,
                                     augmented_window, find_segments, load_recording, preprocess, timestamp_of)


def test_headerless_windows_paths(tmp_path):
    root, times = write_recording(tmp_path / "rec", n=6, steering=[0, 0.1, -0.2, 0.3, 0, -1])
    rec = load_recording(root, progress=False)
    assert len(rec) == 6 and rec.frames_center.shape == (6, 160, 320, 3) and rec.frames_center.dtype == np.uint8
    assert np.allclose(rec.steering, [0, 0.1, -0.2, 0.3, 0, -1])
    assert np.allclose(rec.throttle, 0.5) and np.allclose(rec.speed, 30.1)
    assert rec.rows.tolist() == [1, 2, 3, 4, 5, 6]  # CSV line numbers, no header
    assert np.allclose(rec.timestamps, times) and rec.timestamps.dtype == np.float64
    assert 0.066 <= np.diff(rec.timestamps).min() and np.diff(rec.timestamps).max() <= 0.075
    assert rec.segments.tolist() == [[0, 6]]
    # the three cameras are distinct files, decoded as RGB
    assert not np.array_equal(rec.frames_center[0], rec.frames_left[0])
    assert np.abs(rec.frames_right[2].astype(int) - frame(3 * 2 + 2).astype(int)).mean() < 6  # JPEG loss only
    # the CSV itself can be given instead of the folder
    assert len(load_recording(root / "driving_log.csv", progress=False)) == 6


def test_header_relative_paths_and_comma_space_separator(tmp_path):
    root, times = write_recording(tmp_path / "rec", n=4, header=True, windows_paths=False, sep=", ")
    text = (root / "driving_log.csv").read_text()
    assert text.startswith("center,left,right,steering") and ", IMG/left_" in text
    rec = load_recording(root, progress=False)
    assert len(rec) == 4 and rec.rows.tolist() == [2, 3, 4, 5]  # line 1 is the header
    assert np.allclose(rec.timestamps, times)


def test_rgb_channel_order(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=2, rgb=(220, 20, 30))  # red in RGB
    rec = load_recording(root, progress=False)
    r, g, b = rec.frames_center[0].reshape(-1, 3).mean(0)
    assert r > 200 and g < 50 and b < 50


def test_timestamps_and_session_breaks(tmp_path):
    assert timestamp_of("C:\\x\\IMG\\center_2018_07_16_17_11_43_382.jpg").microsecond == 382000
    assert timestamp_of("center.jpg") is None
    root, times = write_recording(tmp_path / "rec", n=6, gaps_ms=[70, 70, 5000, 70, 70])
    rec = load_recording(root, progress=False)
    assert rec.segments.tolist() == [[0, 3], [3, 6]]
    assert np.isclose(rec.timestamps[3] - rec.timestamps[2], 5.0)
    assert find_segments(np.array([0.0, 0.1, 0.05, 0.2])).tolist() == [[0, 2], [2, 4]]  # time going back
    part = rec.slice(2, 5)
    assert part.segments.tolist() == [[0, 1], [1, 3]] and part.rows.tolist() == [3, 4, 5]


def _corrupt(root):
    """Rows 2 (missing image), 3 (bad JPEG), 4 (non-numeric steering), 5 (wrong column count)."""
    csv = root / "driving_log.csv"
    lines = csv.read_text().splitlines()
    missing = lines[1].split(",")[1].split("\\")[-1]
    (root / "IMG" / missing).unlink()
    bad_jpeg = lines[2].split(",")[0].split("\\")[-1]
    (root / "IMG" / bad_jpeg).write_bytes(b"\xff\xd8 this is not a jpeg")
    f = lines[3].split(",")
    f[3] = "left-ish"
    lines[3] = ",".join(f)
    lines[4] = ",".join(lines[4].split(",")[:5])
    csv.write_text("\n".join(lines) + "\n")


def test_bad_rows_skipped_with_row_numbers(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=7)
    _corrupt(root)
    with pytest.warns(UserWarning, match=r"skipped 4 bad row\(s\).*row 2: missing image IMG/left_.*"
                                         r"row 3: unreadable image.*row 4: steering 'left-ish'.*"
                                         r"row 5: expected 7 columns"):
        rec = load_recording(root, progress=False)
    assert rec.rows.tolist() == [1, 6, 7]
    assert [b.row for b in rec.bad_rows] == [2, 3, 4, 5]
    assert len(rec) == 3 and rec.frames_left.shape == (3, 160, 320, 3)


def test_bad_rows_rejected_in_error_mode(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=7)
    _corrupt(root)
    with pytest.raises(ValueError, match=r"4 bad row\(s\).*row 2: missing.*row 3: unreadable.*row 4:.*row 5:"):
        load_recording(root, on_bad_row="error", progress=False)
    # a decode failure alone (found only when decoding) is also rejected, never half-loaded
    root2, _ = write_recording(tmp_path / "rec2", n=3)
    name = (root2 / "driving_log.csv").read_text().splitlines()[2].split(",")[2].split("\\")[-1]
    (root2 / "IMG" / name).write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"1 bad row\(s\).*row 3: unreadable image IMG/right_"):
        load_recording(root2, on_bad_row="error", progress=False)


def test_reader_input_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="driving_log.csv"):
        load_recording(tmp_path, progress=False)
    root, _ = write_recording(tmp_path / "rec", n=2)
    with pytest.raises(ValueError, match="on_bad_row"):
        load_recording(root, on_bad_row="ignore", progress=False)
    (root / "driving_log.csv").write_text("center,left,right,steering,throttle,brake,speed\n")
    with pytest.raises(ValueError, match="no usable rows"):
        load_recording(root, progress=False)


def test_recording_validates_shapes():
    z = np.zeros((2, 160, 320, 3), np.uint8)
    v = np.zeros(2, np.float32)
    ok = dict(frames_center=z, frames_left=z, frames_right=z, steering=v, throttle=v, brake=v, speed=v,
              timestamps=np.array([0.0, 0.07]), rows=np.array([1, 2]), segments=np.array([[0, 2]]))
    UdacityRecording(**ok)
    with pytest.raises(ValueError, match="frames_left"):
        UdacityRecording(**{**ok, "frames_left": np.zeros((2, 66, 200, 3), np.uint8)})
    with pytest.raises(ValueError, match="speed"):
        UdacityRecording(**{**ok, "speed": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="segments"):
        UdacityRecording(**{**ok, "segments": np.array([[0, 1]])})


def test_preprocessing_crop_resize_yuv():
    f = np.zeros((160, 320, 3), np.uint8)
    f[:60] = 255  # sky and bonnet: cropped away
    f[135:] = 255
    out = preprocess(f[None])
    assert out.shape == (1, 66, 200, 3) and out.dtype == np.uint8
    assert out[..., 0].max() == 0  # Y of black: only rows 60..134 remain
    assert preprocess(np.zeros((2, 3, 160, 320, 3), np.uint8)).shape == (2, 3, 66, 200, 3)
    grey = preprocess(np.full((1, 160, 320, 3), 128, np.uint8))
    assert np.allclose(grey, 128, atol=1)  # YUV of mid-grey: Y 128, U = V = 128
    with pytest.raises(ValueError, match="160, 320, 3"):
        preprocess(np.zeros((1, 96, 96, 3), np.uint8))


def test_augmentation_steering_corrections():
    s = np.array([0.1, -0.3], np.float32)
    assert np.allclose(augment_steering(s, AugmentParams()), s)
    assert np.allclose(augment_steering(s, AugmentParams(camera="left")), s + 0.2)
    assert np.allclose(augment_steering(s, AugmentParams(camera="right")), s - 0.2)
    assert np.allclose(augment_steering(s, AugmentParams(flip=True)), -s)
    assert np.allclose(augment_steering(s, AugmentParams(camera="left", flip=True)), -(s + 0.2))
    assert np.allclose(augment_steering(s, AugmentParams(shift=(10.0, 3.0))), s + 0.02)
    assert np.allclose(augment_steering(s, AugmentParams(flip=True, shift=(-25.0, 0.0))), -s - 0.05)


def test_augmentation_frames(tmp_path):
    f = np.zeros((1, 160, 320, 3), np.uint8)
    f[:, :, :100] = 200  # bright left part
    flipped = augment_frames(f, AugmentParams(flip=True))
    assert flipped[0, :, -100:].min() == 200 and flipped[0, :, :-100].max() == 0
    shifted = augment_frames(f, AugmentParams(shift=(20.0, 0.0)))
    assert shifted[0, 80, 110, 0] == 200 and shifted[0, 80, 5, 0] == 0  # content moved right by 20 px
    bright = augment_frames(np.full((1, 160, 320, 3), 100, np.uint8), AugmentParams(brightness=1.2))
    assert np.all(bright == 120)
    shadow = augment_frames(np.full((1, 160, 320, 3), 100, np.uint8), AugmentParams(shadow=(160.0, 160.0, 1, 0.5)))
    assert set(np.unique(shadow)) == {50, 100}  # one side of the vertical line x = 160 darkened
    assert (shadow[0, :, :150] == 50).all() != (shadow[0, :, 170:] == 50).all()
    assert f.max() == 200 and f[0, 0, 0, 0] == 200  # input untouched


def test_augmented_window_and_sampling(tmp_path):
    root, _ = write_recording(tmp_path / "rec", n=4, steering=[0.1, 0.2, 0.3, 0.4])
    rec = load_recording(root, progress=False)
    frames, steer = augmented_window(rec, np.arange(1, 4), AugmentParams(camera="right", flip=True))
    assert frames.shape == (3, 160, 320, 3)
    assert np.array_equal(frames, rec.frames_right[1:4, :, ::-1])
    assert np.allclose(steer, [-(0.2 - 0.2), -(0.3 - 0.2), -(0.4 - 0.2)])
    rng = np.random.default_rng(0)
    assert AugmentParams.sample(rng, AugmentConfig(p_augment=0.0)) == AugmentParams()
    draws = [AugmentParams.sample(rng, AugmentConfig(p_augment=1.0)) for _ in range(60)]
    assert {d.camera for d in draws} == {"center", "left", "right"} and {d.flip for d in draws} == {True, False}
    assert all(abs(d.shift[0]) <= 50 and abs(d.shift[1]) <= 5 and 0.8 <= d.brightness <= 1.2 for d in draws)


def test_jpeg_writer_roundtrip(tmp_path):
    write_jpeg(tmp_path / "x.jpg", frame(0))
    assert (tmp_path / "x.jpg").read_bytes()[:2] == b"\xff\xd8"


def test_recording_found_below_a_wrapping_folder(tmp_path):
    """Public recordings unpack as driver+repo/Data/driving_log.csv: the top folder is enough, but only
    when it holds one recording (several: an error that lists them)."""
    from agent.data.udacity import SEARCH_DEPTH, find_driving_log

    root, _ = write_recording(tmp_path / "driver" / "Data" / "track", n=3)
    assert find_driving_log(tmp_path / "driver") == root / "driving_log.csv"
    assert len(load_recording(tmp_path / "driver", progress=False)) == 3
    write_recording(tmp_path / "driver" / "Other", n=2)  # a shallower one is found first
    assert find_driving_log(tmp_path / "driver") == tmp_path / "driver" / "Other" / "driving_log.csv"
    write_recording(tmp_path / "driver" / "Data2", n=2)
    with pytest.raises(ValueError, match=r"holds 2 Udacity recordings .*Data2.*Other.*pass each one"):
        load_recording(tmp_path / "driver", progress=False)
    deep = tmp_path / "deep"
    write_recording(deep.joinpath(*["d"] * (SEARCH_DEPTH + 1)), n=2)
    with pytest.raises(FileNotFoundError, match=f"up to {SEARCH_DEPTH} levels below"):
        find_driving_log(deep)
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        find_driving_log(tmp_path / "missing")
