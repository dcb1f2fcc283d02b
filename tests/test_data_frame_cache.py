"""CarRacing frames memory-mapped from an on-disk cache (agent.data.frame_cache): the same data as
the in-memory load, reused while the recording is unchanged, rebuilt when it changes, never read
half-built; training on it gives the same weights; DAgger's round files round-trip."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.data import frame_cache
from agent.data.frame_cache import EpisodeArrays, mapped_buffer, read_episodes, write_episodes
from agent.data.recordings import Demonstrations, RecordingError, RecordingWriter, load_demonstrations

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "recordings" / "nac-drive" / "sample-v0"


def _episode(seed: int, n: int):
    from agent.actors.rollout import Episode

    rng = np.random.default_rng(seed)
    return Episode(seed, rng.integers(0, 256, (n + 1, 96, 96, 3), dtype=np.uint8),
                   rng.integers(0, 5, n).astype(np.int64), None, rng.normal(size=n).astype(np.float32),
                   np.zeros(n, bool), np.r_[np.zeros(n - 1, bool), True],
                   rng.uniform(0, 50, n + 1).astype(np.float32))


@pytest.fixture
def recording(tmp_path):
    """A two-episode recording of random frames (7 and 5 steps) and its open writer (to append more)."""
    from envs.carracing import make_carracing

    rec = tmp_path / "recordings" / "nac-drive" / "tiny-v0"
    env = make_carracing()
    writer = RecordingWriter(rec, env, "test")
    writer.add(_episode(0, 7))
    writer.add(_episode(1, 5))
    yield rec, writer
    env.close()


def _same(a: Demonstrations, b: Demonstrations) -> None:
    assert len(a.frames) == len(b.frames)
    for x, y in zip(a.frames, b.frames):
        assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)
    for x, y in zip(a.actions, b.actions):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    for x, y in zip(a.speeds, b.speeds):
        assert np.array_equal(x, y, equal_nan=True)
    assert a.seeds == b.seeds and a.returns == b.returns and a.action_space == b.action_space


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_mmap_load_gives_the_in_memory_frames_read_only(recording, tmp_path):
    rec, _ = recording
    cache = tmp_path / "cache"
    mem = load_demonstrations(rec)
    mapped = load_demonstrations(rec, frames="mmap", cache_dir=cache)
    _same(mem, mapped)
    assert [len(f) for f in mapped.frames] == [7, 5]
    assert all(mapped_buffer(f) is not None and not f.flags.writeable for f in mapped.frames)
    assert all(f.flags.writeable for f in mem.frames)
    npy, npz = frame_cache.cache_paths(rec / "data", cache)
    assert _files(cache) == sorted([npy.name, npz.name])
    assert np.load(npy, mmap_mode="r").shape == (12, 96, 96, 3)
    # a list of recordings: concatenated as in memory
    _same(load_demonstrations([rec, SAMPLE]), load_demonstrations([rec, SAMPLE], frames="mmap", cache_dir=cache))
    with pytest.raises(ValueError, match="frames must be one of"):
        load_demonstrations(rec, frames="disk")


def test_the_cache_is_reused_until_the_recording_changes(recording, tmp_path):
    rec, writer = recording
    cache = tmp_path / "cache"
    load_demonstrations(rec, frames="mmap", cache_dir=cache)
    npy, npz = frame_cache.cache_paths(rec / "data", cache)
    stamp = (npy.stat().st_mtime_ns, npy.stat().st_ino, npz.stat().st_mtime_ns)
    with open(npy, "r+b") as fh:  # mark the cached frames: a reused cache returns the mark
        fh.seek(-1, os.SEEK_END)
        fh.write(b"\x07")
    again = load_demonstrations(rec, frames="mmap", cache_dir=cache)
    assert (npy.stat().st_ino, npz.stat().st_mtime_ns) == stamp[1:]
    assert again.frames[-1][-1, -1, -1, -1] == 7

    writer.add(_episode(2, 4))  # the recording changes: a new cache, the stale one deleted
    mem = load_demonstrations(rec)
    mapped = load_demonstrations(rec, frames="mmap", cache_dir=cache)
    _same(mem, mapped)
    assert len(mapped.frames) == 3
    new_npy, new_npz = frame_cache.cache_paths(rec / "data", cache)
    assert new_npy != npy and _files(cache) == sorted([new_npy.name, new_npz.name])


def test_an_interrupted_build_leaves_nothing_that_is_read(recording, tmp_path, monkeypatch):
    rec, _ = recording
    cache = tmp_path / "cache"
    import agent.data.recordings as recordings

    real = recordings._read_episodes

    def cut(*args):  # the first episode, then a Ctrl-C
        it = real(*args)
        yield next(it)
        raise KeyboardInterrupt

    monkeypatch.setattr(recordings, "_read_episodes", cut)
    with pytest.raises(KeyboardInterrupt):
        load_demonstrations(rec, frames="mmap", cache_dir=cache)
    assert _files(cache) == []
    monkeypatch.setattr(recordings, "_read_episodes", real)

    # a build killed outright leaves its temporary file; a killed build between the two renames
    # leaves the .npy alone: neither is read, the next build replaces them
    npy, npz = frame_cache.cache_paths(rec / "data", cache)
    dead = cache / f".{npy.name}.999999999.tmp"
    dead.write_bytes(b"half a cache")
    npy.write_bytes(b"not a cache")
    mapped = load_demonstrations(rec, frames="mmap", cache_dir=cache)
    _same(load_demonstrations(rec), mapped)
    assert _files(cache) == sorted([npy.name, npz.name])


def test_a_damaged_cache_is_refused_with_what_to_do(recording, tmp_path):
    rec, _ = recording
    cache = tmp_path / "cache"
    load_demonstrations(rec, frames="mmap", cache_dir=cache)
    npy, npz = frame_cache.cache_paths(rec / "data", cache)
    whole = np.load(npy)
    np.save(npy, whole[:-1])  # one frame short of its index
    with pytest.raises(RecordingError, match="delete .* to rebuild"):
        load_demonstrations(rec, frames="mmap", cache_dir=cache)


def test_a_full_disk_is_one_error_and_no_file(recording, tmp_path, monkeypatch):
    rec, _ = recording
    cache = tmp_path / "cache"
    monkeypatch.setattr(frame_cache.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(RecordingError, match="NAC_FRAME_CACHE"):
        load_demonstrations(rec, frames="mmap", cache_dir=cache)
    assert _files(cache) == []


def test_the_default_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("NAC_FRAME_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert frame_cache.default_cache_dir() == tmp_path / "xdg" / "nac-drive" / "carracing-frames"
    monkeypatch.setenv("NAC_FRAME_CACHE", str(tmp_path / "here"))
    assert frame_cache.default_cache_dir() == tmp_path / "here"


def test_the_speedometer_draws_on_copies_and_leaves_the_cache_as_it_was(tmp_path):
    from envs.carracing import draw_speedometer

    cache = tmp_path / "cache"
    mapped = load_demonstrations(SAMPLE, frames="mmap", cache_dir=cache)
    npy, _ = frame_cache.cache_paths(SAMPLE / "data", cache)
    before = hashlib.sha256(npy.read_bytes()).hexdigest()
    expected = [draw_speedometer(np.array(f), v) for f, v in zip(mapped.frames, mapped.speeds)]
    assert mapped.with_speedometer() is mapped
    assert all(f.flags.writeable and mapped_buffer(f) is None for f in mapped.frames)
    assert all(np.array_equal(f, e) for f, e in zip(mapped.frames, expected))
    assert not all(np.array_equal(f, g) for f, g in zip(mapped.frames, load_demonstrations(SAMPLE).frames))
    assert hashlib.sha256(npy.read_bytes()).hexdigest() == before


def test_a_source_draws_the_speedometer_on_each_window_of_mapped_frames(tmp_path):
    from agent.data.windows import DemonstrationSource

    cache = tmp_path / "cache"
    mem = DemonstrationSource(load_demonstrations(SAMPLE)).draw_speedometer()
    mapped = DemonstrationSource(load_demonstrations(SAMPLE, frames="mmap", cache_dir=cache)).draw_speedometer()
    assert all(mapped_buffer(f) is not None for f in mapped.demos.frames), "the frames stay on disk"
    for a, b in [(mem, mapped), *zip(mem.split(0.5, 1), mapped.split(0.5, 1)),
                 (mem.extend(mem.demos.subset([0])), mapped.extend(mem.demos.subset([0])))]:
        assert a.lengths == b.lengths
        for e, n in enumerate(a.lengths):
            for start in (0, 1, n - 3):
                assert np.array_equal(a.window(e, start, 3)[0], b.window(e, start, 3)[0])
                assert np.array_equal(a.previous_frame(e, start), b.previous_frame(e, start))
    raw = load_demonstrations(SAMPLE)
    assert not np.array_equal(mapped.window(0, 0, 5)[0], raw.frames[0][:5]), "drawn"


def test_a_source_lets_go_of_the_mapped_pages_it_has_read(tmp_path, monkeypatch):
    from agent.data import windows
    from agent.data.windows import DemonstrationSource, make_windows

    mapped = DemonstrationSource(load_demonstrations(SAMPLE, frames="mmap", cache_dir=tmp_path / "cache"))
    mem = DemonstrationSource(load_demonstrations(SAMPLE))
    released = []
    real = frame_cache.release_pages
    monkeypatch.setattr(windows, "release_pages", lambda arrays: released.append(real(arrays)))
    monkeypatch.setattr(windows, "RELEASE_BYTES", 20 * 96 * 96 * 3)
    for e, start, n in make_windows(mapped.lengths, 8, None):  # 25 windows of 8 frames
        assert np.array_equal(mapped.window(e, start, n)[0], mem.window(e, start, n)[0])
    assert released == [1] * 8, "one map (the recording's cache) released after every 3rd window (24 frames)"
    assert real(mem.demos.frames) == 0, "frames in memory are not maps"


def _fit(demos: Demonstrations, dashboard: str = "hidden"):
    from agent.data.windows import DemonstrationSource
    from agent.nn.policy import default_config
    from agent.train.bc import TrainConfig
    from agent.train.run import train

    torch.manual_seed(0)
    cfg = default_config("carracing", window=4, features_kwargs={"dashboard": dashboard, "motion": True})
    policy, report = train(DemonstrationSource(demos, skip_stalls=True), cfg,
                           TrainConfig(epochs=1, batch_frames=32, val_fraction=0.5, seed=5, device="cpu"))
    return policy.state_dict(), report


def test_training_on_mapped_frames_gives_the_in_memory_weights(tmp_path):
    cache = tmp_path / "cache"
    w_mem, r_mem = _fit(load_demonstrations(SAMPLE))
    w_map, r_map = _fit(load_demonstrations(SAMPLE, frames="mmap", cache_dir=cache))
    assert w_mem.keys() == w_map.keys() and all(torch.equal(w_mem[k], w_map[k]) for k in w_mem)
    assert [e.train_loss for e in r_mem.epochs] == [e.train_loss for e in r_map.epochs]
    # a speedometer student: drawn on copies of the mapped frames, the same weights as drawn in memory
    w_mem, _ = _fit(load_demonstrations(SAMPLE), "speedometer")
    w_map, _ = _fit(load_demonstrations(SAMPLE, frames="mmap", cache_dir=cache), "speedometer")
    assert all(torch.equal(w_mem[k], w_map[k]) for k in w_mem)


def test_agent_train_builds_the_cache_in_the_cache_folder(tmp_path, monkeypatch):
    from agent.cli import main

    monkeypatch.setenv("NAC_FRAME_CACHE", str(tmp_path / "cache"))
    rc = main(["train", "--data", str(SAMPLE), "--out", str(tmp_path / "nac.pt"), "--run-dir", str(tmp_path / "run"),
               "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "16", "--train.val-fraction",
               "0", "--train.tensorboard", "", "--device", "cpu"])
    assert rc == 0
    npy, npz = frame_cache.cache_paths(SAMPLE / "data", tmp_path / "cache")
    assert npy.is_file() and npz.is_file()


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
def test_dagger_round_files_round_trip_memory_mapped(tmp_path, continuous):
    from agent.train.checkpoint import CheckpointError, Checkpointer, load_round

    rng = np.random.default_rng(3)
    lengths = [6, 0, 3]
    frames = [rng.integers(0, 256, (n, 96, 96, 3), dtype=np.uint8) for n in lengths]
    actions = [rng.uniform(-1, 1, (n, 2)).astype(np.float32) if continuous else rng.integers(0, 5, n)
               for n in lengths]
    weights = [rng.uniform(0, 3, n).astype(np.float32) for n in lengths]
    demos = Demonstrations(frames, actions, [10, 11, 12], [1.5, -2.0, 0.25], weights=weights if continuous else None,
                           speeds=[rng.uniform(0, 9, n).astype(np.float32) for n in lengths])
    ck = Checkpointer(tmp_path / "run", "config")
    name = ck.save_round(1, demos)
    assert name == "dagger-round-1.npz"
    back = load_round(tmp_path / "run", name)
    assert all(mapped_buffer(f) is not None or len(f) == 0 for f in back.frames)
    assert not any(f.flags.writeable for f in back.frames)
    for a, b in ((demos.frames, back.frames), (demos.actions, back.actions), (demos.speeds, back.speeds)):
        assert all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b))
    assert back.seeds == demos.seeds and back.returns == demos.returns
    if continuous:
        assert all(np.array_equal(x, y) for x, y in zip(demos.weights, back.weights))
    else:
        assert back.weights is None
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["dagger-round-1.npy", "dagger-round-1.npz"]

    (tmp_path / "run" / "dagger-round-1.npy").unlink()
    with pytest.raises(CheckpointError, match="keeps no executed actions to replay it from"):
        load_round(tmp_path / "run", name)
    ck.save_round(1, demos)
    ck.finish("out.pt", {})
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint.pt"]


def test_a_failed_round_write_leaves_no_file(tmp_path):
    from agent.train.checkpoint import Checkpointer

    good = np.zeros((2, 96, 96, 3), np.uint8)
    bad = np.zeros((2, 96, 96), np.uint8)  # not (N, H, W, C): refused after the first episode was written
    with pytest.raises(ValueError, match="episode 1: frames"):
        write_episodes(tmp_path / "r.npy", tmp_path / "r.npz",
                       [EpisodeArrays(good, np.zeros(2, np.int64), 0, 0.0), EpisodeArrays(bad, np.zeros(2), 1, 0.0)])
    assert list(tmp_path.iterdir()) == []
    ck = Checkpointer(tmp_path / "run", "config")
    ck.save_round(1, Demonstrations([good], [np.zeros(2, np.int64)], [0], [0.0]))
    # a new write of the same round removes the old index first: a cut write never pairs old and new files
    with pytest.raises(ValueError):
        write_episodes(tmp_path / "run" / "dagger-round-1.npy", tmp_path / "run" / "dagger-round-1.npz",
                       [EpisodeArrays(bad, np.zeros(2), 1, 0.0)])
    assert list((tmp_path / "run").iterdir()) == []
    with pytest.raises(FileNotFoundError):
        read_episodes(tmp_path / "run" / "dagger-round-1.npy", tmp_path / "run" / "dagger-round-1.npz")
