"""Frames of a frame file read past its memory map (agent.data.frame_cache.read_frames and
take_frames): the same values as through the map, in this process's own memory, and the map's pages
never touched, so a training run's resident set does not grow with its data; the Udacity crop
cache's windows too."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from agent.data.frame_cache import (EpisodeArrays, open_frames, read_episodes, read_frames, take_frames,
                                    write_episodes)
from agent.data.recordings import Demonstrations

LINUX_SMAPS = Path("/proc/self/smaps")


def _pair(tmp_path, lengths=(40, 0, 25), seed=0):
    rng = np.random.default_rng(seed)
    frames = [rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8) for n in lengths]
    eps = (EpisodeArrays(f, rng.integers(0, 5, len(f)), i, 0.0) for i, f in enumerate(frames))
    npy, npz = tmp_path / "frames.npy", tmp_path / "frames.npz"
    write_episodes(npy, npz, eps)
    return frames, read_episodes(npy, npz), npy


def _resident_kb(path: Path) -> int:
    """kB of this process's maps of ``path`` that are resident (/proc/self/smaps)."""
    total, ours = 0, False
    for line in LINUX_SMAPS.read_text().splitlines():
        head = line.split()
        if head and not head[0].endswith(":"):  # a map's header line ("start-end perms offset dev inode path")
            ours = line.rstrip().endswith(str(path))
        elif ours and head[0] == "Rss:":
            total += int(head[1])
    return total


def test_read_frames_gives_the_frames_as_a_writable_copy(tmp_path):
    frames, got, _ = _pair(tmp_path)
    for want, mapped in zip(frames, got.frames):
        for s, t in ((0, len(want)), (3, 7), (len(want) - 1, len(want)), (5, 5)):
            out = read_frames(mapped[s:t])
            assert out.dtype == np.uint8 and out.shape == want[s:t].shape
            assert np.array_equal(out, want[s:t])
            assert out.flags.writeable and out.flags.owndata
    memory = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    copy = read_frames(memory)  # not a map: a plain copy
    assert np.array_equal(copy, memory) and not np.shares_memory(copy, memory)
    strided = got.frames[0][::2]  # not C-contiguous: copied through the map, the same values
    assert np.array_equal(read_frames(strided), frames[0][::2])


def test_take_frames_is_fancy_indexing(tmp_path):
    frames, got, _ = _pair(tmp_path)
    want, mapped = frames[0], got.frames[0]
    mask = np.zeros(len(want), bool)
    mask[[0, 1, 2, 9, 20, 21, 39]] = True
    for index in (mask, [5, 6, 7, 30], [39, 0, 4], [-1, -2], np.array([], np.int64)):
        assert np.array_equal(take_frames(mapped, index), want[index])
        assert np.array_equal(take_frames(want, index), want[index])  # frames in memory
    with pytest.raises(IndexError, match="out of range"):
        take_frames(mapped, [40])


@pytest.mark.skipif(not LINUX_SMAPS.is_file(), reason="needs /proc/self/smaps (Linux)")
def test_reading_every_window_touches_no_page_of_the_map(tmp_path):
    from agent.data.windows import DemonstrationSource, WindowDataset

    frames, got, npy = _pair(tmp_path, lengths=(300, 200))
    demos = Demonstrations(got.frames, got.actions, got.seeds, got.returns)
    src = DemonstrationSource(demos, skip_stalls=True, standstills=0.2)
    ds = WindowDataset(src, 4, previous=True, seed=1)
    assert _resident_kb(npy) == 0
    for i in range(len(ds)):
        item = ds[i]
        e, start, n = ds.items[i]
        if not np.array_equal(item["obs"][:n].numpy(), frames[e][start:start + n]):  # a synthetic standstill
            assert item["learn"][:n].all()
    assert _resident_kb(npy) == 0, "the windows were read through the map"
    np.array(got.frames[0][:50])  # what the check would see of a read through the map
    assert _resident_kb(npy) > 0


def test_a_truncated_frame_file_is_a_clear_error(tmp_path):
    if sys.platform == "win32":
        pytest.skip("the file is mapped; Windows cannot truncate it")
    _, got, npy = _pair(tmp_path)
    with open(npy, "r+b") as fh:
        fh.truncate(128 + 10 * 96 * 96 * 3)
    with pytest.raises(OSError, match="truncated while training"):
        read_frames(got.frames[0][20:30])


def test_take_frames_reads_rows_strided_in_the_file(tmp_path):
    """One camera of (N, cameras, H, W, C) crops: rows 3 apart in the file, read one by one."""
    crops = np.random.default_rng(2).integers(0, 256, (12, 3, 6, 10, 3), dtype=np.uint8)
    np.save(tmp_path / "crops.npy", crops)
    mapped = open_frames(tmp_path / "crops.npy")
    mask = np.zeros(12, bool)
    mask[[1, 2, 3, 11]] = True
    for cam in range(3):
        for index in ([4, 5, 6, 7], [11, 0, 3], [-1], mask, np.array([], np.int64)):
            got = take_frames(mapped[:, cam], index)
            assert np.array_equal(got, crops[:, cam][index]) and got.flags.owndata
    assert np.array_equal(take_frames(mapped[::-1, 1], [0, 1, 2]), crops[::-1, 1][[0, 1, 2]])  # a reversed view
    assert np.array_equal(take_frames(mapped[2:9], [0, 1, 6]), crops[2:9][[0, 1, 6]])  # whole rows: runs
    with pytest.raises(IndexError, match="out of range"):
        take_frames(mapped[:, 0], [12])


@pytest.mark.skipif(not LINUX_SMAPS.is_file(), reason="needs /proc/self/smaps (Linux)")
def test_udacity_windows_touch_no_page_of_the_crop_cache(tmp_path):
    from udacity_fixture import write_recording

    from agent.data.udacity import AugmentConfig
    from agent.data.udacity_cache import cache_paths, load_cached
    from agent.data.windows import UdacitySource, WindowDataset

    root, _ = write_recording(tmp_path / "rec", n=40)
    rec = load_cached(root, tmp_path / "cache", progress=False)
    npy = cache_paths(root, tmp_path / "cache")[0]
    want = np.load(npy)  # the crops read into memory, not through the map under test
    src = UdacitySource([rec], AugmentConfig())
    plain = UdacitySource([rec])
    assert _resident_kb(npy) == 0
    for e, length in enumerate(plain.lengths):
        frames, _, _ = plain.window(e, 0, length)
        assert np.array_equal(frames, want[plain.index[e][1]:plain.index[e][1] + length, 0])  # the center camera
    ds = WindowDataset(src, 8, seed=3)
    for i in range(len(ds)):
        ds[i]  # augmented: the side cameras, flips and shifts
    assert _resident_kb(npy) == 0, "the crops were read through the map"
    np.array(rec.crops[:20])  # what the check would see of a read through the map
    assert _resident_kb(npy) > 0
