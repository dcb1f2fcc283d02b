"""``drive --dump-traces`` streams to disk (issue 38, item 6): :class:`agent.drive.traces.TraceWriter`.

Memory stays flat (at most ``chunk_steps`` steps in memory), the HDF5 file reads back after a kill
(its flushed chunks) and after Ctrl-C (all of it), and a ``.npz`` path still gives the plain
``.npz`` of before (converted from the stream at the end).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
import pytest

from agent.drive.config import DriveConfig
from agent.drive.traces import StepTraces, TraceRecorder, TraceWriter, load_traces, save_traces
from agent.train.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
H, K = 2, 3


def _step(i: int) -> StepTraces:
    """Step ``i``'s traces: every value derived from i, so a mixed-up row shows."""
    f = np.full((H, K), i, np.float32)
    valid = np.ones((H, K), bool)
    valid[:, -1] = i % 2 == 0
    return StepTraces(phi=f / 1e4, omega=f + 1, logits=-f, weights=f * 2, t_gate=f * 3,
                      indices=np.full((H, K), i, np.int64), valid=valid, ages=np.full((H, K), i % 5, np.int64),
                      neurons={"sensory": np.full(6, i, np.float32), "inter": np.full((H, 4), -i, np.float32)})


def _add(rec, i: int, *, cam: bool = True, episode_len: int = 7) -> None:
    rec.add(_step(i), action=i % 3, action_class=i % 3, reward=0.5 * i, episode=1 + i // episode_len,
            step=1 + i % episode_len, time_s=i / 50, speed=float(i % 4), off_road=i % 3 == 0,
            cam=np.full((8, 8), i / 1000, np.float32) if cam else None, teacher=(float(i % 3), i % 3))


META = dict(action_names=("left", "straight", "right"), class_names=("left", "straight", "right"), policy="p.pt",
            env="carracing", teacher="expert.zip")


def test_the_writer_keeps_at_most_one_chunk_in_memory_and_the_file_grows_by_chunks(tmp_path):
    path = tmp_path / "t.h5"
    w = TraceWriter(path, chunk_steps=16, **META)
    assert not path.exists()  # made at the first write
    for i in range(100):
        _add(w, i, cam=i >= 20)  # Grad-CAM switched on after 20 steps: those read as NaN
        assert w.buffered <= 16 and w.written == 16 * ((i + 1) // 16) and len(w) == i + 1
    assert path.exists()
    assert w.close() == path and w.close() == path  # idempotent
    d = load_traces(path)
    assert d["phi"].shape == (100, H, K) and d["neuron_inter"].shape == (100, H, 4)
    np.testing.assert_array_equal(d["indices"][:, 0, 0], np.arange(100))  # every step once, in order
    assert np.isnan(d["cam"][:20]).all() and np.allclose(d["cam"][20:, 0, 0], np.arange(20, 100) / 1000)
    np.testing.assert_array_equal(d["episodes"], np.arange(1, 16))
    assert d["teacher_class"].tolist() == [i % 3 for i in range(100)] and str(d["teacher"]) == "expert.zip"
    assert list(d["class_names"]) == list(META["class_names"]) and str(d["policy"]) == "p.pt"


def test_h5_npz_and_the_in_memory_recorder_give_the_same_arrays(tmp_path):
    rec = TraceRecorder()
    with TraceWriter(tmp_path / "a.h5", chunk_steps=8, **META) as h5, \
            TraceWriter(tmp_path / "b.npz", chunk_steps=8, **META) as npz:
        for i in range(30):
            for r in (rec, h5, npz):
                _add(r, i)
    save_traces(tmp_path / "c.npz", rec, **META)
    assert not (tmp_path / "b.npz.partial.h5").exists()  # converted and removed
    a, b, c = (load_traces(tmp_path / n) for n in ("a.h5", "b.npz", "c.npz"))
    with np.load(tmp_path / "b.npz", allow_pickle=False) as z:  # a plain .npz, as before
        plain = {k: z[k] for k in z.files}
    assert set(a) == set(b) == set(c) == set(plain)
    for k in a:
        for other in (b, c, plain):
            np.testing.assert_array_equal(a[k], other[k], err_msg=k)
            assert a[k].dtype == other[k].dtype, k


def test_unknown_values_leave_out_what_the_old_npz_left_out(tmp_path):
    w = TraceWriter(tmp_path / "u.h5", chunk_steps=4)
    for i in range(6):
        w.add(_step(i), action=0.1, action_class=0, reward=0.0, episode=1, step=i + 1, time_s=i)  # Udacity-like
    w.close()
    d = load_traces(tmp_path / "u.h5")
    for k in ("speed", "standstill", "off_road", "episodes", "teacher_action", "teacher", "cam"):
        assert k not in d, k
    assert d["phi"].shape[0] == 6


def test_memory_stays_flat_however_many_steps(tmp_path):
    """2,000 steps with a 96x96 map (74 MB of cam) through a 32-step buffer: the peak of Python and
    numpy allocations stays near one chunk (1.2 MB of maps), far below the data written."""
    cam = np.random.default_rng(0).random((96, 96), np.float32)
    tr = _step(1)
    w = TraceWriter(tmp_path / "big.h5", chunk_steps=32)
    tracemalloc.start()
    try:
        for i in range(2000):
            w.add(tr, action=0, action_class=0, reward=0.0, episode=1, step=i + 1, time_s=i, cam=cam)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    w.close()
    assert peak < 2000 * cam.nbytes / 4, peak
    assert load_traces(tmp_path / "big.h5")["cam"].shape == (2000, 96, 96)


def test_a_killed_writer_leaves_its_flushed_chunks_readable(tmp_path):
    path = tmp_path / "k.npz"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from test_drive_traces_stream import _add
        from agent.drive.traces import TraceWriter
        w = TraceWriter({str(path)!r}, chunk_steps=8)
        for i in range(21):
            _add(w, i)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not path.exists()
    with pytest.warns(UserWarning, match="was not closed"):
        d = load_traces(tmp_path / "k.npz.partial.h5")
    np.testing.assert_array_equal(d["indices"][:, 0, 0], np.arange(16))  # two whole chunks of 8
    with pytest.raises(FileExistsError, match="interrupted drive"):  # the leftover is not overwritten silently
        TraceWriter(path)
    TraceWriter(path, overwrite=True).close()


def test_existing_files_and_other_suffixes_are_refused(tmp_path):
    (tmp_path / "x.h5").write_bytes(b"")
    with pytest.raises(FileExistsError, match="--overwrite"):
        TraceWriter(tmp_path / "x.h5")
    with pytest.raises(ValueError, match=r"\.h5"):
        TraceWriter(tmp_path / "x.txt")
    with pytest.raises(ValueError, match="chunk_steps"):
        TraceWriter(tmp_path / "y.h5", chunk_steps=0)
    with pytest.raises(ValueError, match="HDF5"):
        DriveConfig(dump_traces=str(tmp_path / "t.json"))
    DriveConfig(dump_traces=str(tmp_path / "t.hdf5")).check()
    (tmp_path / "t.npz.partial.h5").write_bytes(b"")
    with pytest.raises(ConfigError, match="partial.h5 already exists"):
        DriveConfig(dump_traces=str(tmp_path / "t.npz")).check()
    (tmp_path / "bad.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
    with pytest.raises(ValueError, match="readable HDF5"):
        load_traces(tmp_path / "bad.h5")


@pytest.mark.slow
def test_drive_interrupted_by_ctrl_c_writes_a_complete_dump(tmp_path):
    """The real ``drive`` (shipped nac.pt, headless, Grad-CAM on), stopped with SIGINT mid-episode."""
    out = tmp_path / "drive.h5"
    env = dict(os.environ, SDL_VIDEODRIVER="dummy", SDL_AUDIODRIVER="dummy", MPLBACKEND="Agg")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from agent.cli import drive_main; sys.exit(drive_main())",
                             "--policy", "nac.pt", "--headless", "--env-worker", "off", "--dump-traces", str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        banner = proc.stdout.readline()
        assert banner.startswith("policy "), banner
        time.sleep(4.0)  # a few dozen steps, part of the first chunk
        proc.send_signal(signal.SIGINT)
        printed, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, printed
    steps = int(printed.split(f"wrote {out} (NAC traces of ")[1].split()[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "was not closed": the buffered steps were written at the interrupt
        d = load_traces(out)
    assert steps >= 1 and d["phi"].shape[0] == steps and d["cam"].shape == (steps, 96, 96)
    np.testing.assert_array_equal(d["step"], np.arange(1, steps + 1))


def test_a_npz_trace_file_declaring_too_much_is_refused_unread(tmp_path, monkeypatch):
    """load_traces checks a .npz's declared inflated sizes before numpy reads it (a zip bomb)."""
    import numpy as np

    from agent.bounded import ZipMemberTooLarge
    from agent.drive import traces

    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, phi=np.zeros(1 << 16, np.float32))  # 256 KiB of zeros, a few hundred bytes on disk
    monkeypatch.setattr(traces, "MAX_NPZ_BYTES", 1 << 12)
    with pytest.raises(ZipMemberTooLarge, match="bomb.npz"):
        traces.load_traces(path)
