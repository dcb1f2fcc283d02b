"""CarRacing frames on disk, memory-mapped: training sets larger than RAM.

A CarRacing frame is 96x96x3 uint8 (27 KB): 500,000 frames are 14 GB, more than a training
machine can hold in memory beside everything else. Minari stores a recording's frames as chunked
HDF5 datasets, which cannot be memory-mapped, so :func:`load_recording` streams them, episode by
episode, into one uint8 ``.npy`` per recording (a cache, built once) and reads it back with
a read-only memory map (:func:`open_frames`): the operating system pages frames in as windows are read and drops
them under memory pressure. The pattern is :mod:`agent.data.udacity_cache`'s.

Episode files (:func:`write_episodes`, :func:`read_episodes`) are a pair:

- ``STEM.npy``: (N, H, W, C) uint8, every episode's frames back to back (N = the sum of the
  episodes' N_e);
- ``STEM.npz`` (plain arrays, no pickle): ``offsets`` (E + 1,) int64, episode e being frames
  ``offsets[e]:offsets[e + 1]``; ``actions`` (N,) int64 or (N, A) float32; ``seeds`` (E,) int64;
  ``returns`` (E,) float64; optionally ``speeds`` (N,) float32 (units/s, NaN where unknown) and
  ``weights`` (N,) float32; ``format``, and whatever the writer adds (``source``).

Both are written to hidden temporary names (``.NAME.<pid>.tmp``) in the same folder, flushed to
disk and renamed into place, the ``.npz`` last: it marks a complete pair (an old ``.npz`` of the
same stem is deleted before the new ``.npy`` goes in). An interrupted write therefore leaves
nothing that is read later; a killed build's temporary file is deleted by the next build in that
folder. Frames are written with plain writes, not through a memory map, so a full disk is an
``OSError``, not a crash. The same files hold DAgger's relabelled rounds in a run folder
(:meth:`agent.train.checkpoint.Checkpointer.save_round`).

Recording caches: ``CACHE_DIR/<namespace>+<name>-<key>.npy`` and ``.npz``, where ``key`` hashes
:data:`CACHE_FORMAT`, the HDF5 file's resolved path, size and modification time (ns) and the
bytes of the dataset's ``metadata.json``: a recording appended to, rewritten or restored is never
read from a stale cache (the new cache replaces the old one, which is deleted). ``CACHE_DIR`` is
:func:`default_cache_dir`: ``$NAC_FRAME_CACHE`` if set, else
``$XDG_CACHE_HOME/nac-drive/carracing-frames`` (``~/.cache/...``). A cache takes 27.6 KB a frame
(the recording's frames uncompressed); deleting the folder is always safe (it is rebuilt).

Resident memory: a page of a file map that a process has touched counts in its resident set size
until the kernel reclaims it, and the kernel maps more than was touched: with the page cache's
large folios (Linux 6.x) one touch of a 110 KB window maps up to the 2 MB folio around it, so
reading windows at random through the map drove the resident set up to the size of the data
(8.5 GB for one-frame windows over a 12 GB aggregate, docs/experiments/2026-12-02-recipe-memory.md).
So the training windows are never read through the map: :func:`read_frames` and
:func:`take_frames` copy the frames a view covers from the file with positional reads
(``os.preadv``) into fresh memory, and the map's pages are never touched. The map stays for
everything that needs no frame: shapes, lengths, slicing into episodes. The pages of maps that
something else did read are let go of by :func:`release_pages` (``madvise(MADV_DONTNEED)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import struct
import weakref
import zipfile
from pathlib import Path
from typing import Callable, Iterable, NamedTuple

import numpy as np

from agent.bounded import ZipMemberTooLarge, check_zip_sizes
from agent.log import get_logger
from agent.log import progress as bar_for

#: the files Minari keeps in a dataset's ``data/`` folder (also :mod:`agent.data.recordings`' names; this
#: module is below it and cannot import them from there)
METADATA_FILE = "metadata.json"
HDF5_FILE = "main_data.hdf5"

_log = get_logger(__name__)

#: the recording cache's format (a cache of another format is never read: its key differs)
CACHE_FORMAT = 1
#: the episode files' layout, stored as ``format`` in every ``.npz``
EPISODES_FORMAT = 1
#: bytes: the most an episode index ``.npz`` may declare in all before it is read (about 20 bytes
#: a frame: 50 M frames); a larger one is not a file this module wrote (:func:`agent.bounded.check_zip_sizes`)
MAX_INDEX_BYTES = 1 << 30
#: the most members an index ``.npz`` holds (the keys below and a few the writer adds)
_MAX_INDEX_MEMBERS = 16
_REQUIRED = ("offsets", "actions", "seeds", "returns", "format")
#: the ``.npy`` header's fixed size (written last, once the frame count is known); 64-byte aligned as numpy's
_HEADER_BYTES = 128
#: free disk space kept beyond a cache's size
_SPACE_MARGIN = 256 * 2**20


class EpisodeArrays(NamedTuple):
    """One episode as :func:`write_episodes` takes it.

    Attributes:
        frames: (N_e, H, W, C) uint8. actions: (N_e,) int64 or (N_e, A) float32.
        seed: the track seed (-1: unknown). ret: the episode's return.
        speeds: (N_e,) float32 units/s, or None. weights: (N_e,) float32 loss weights, or None.
    """

    frames: np.ndarray
    actions: np.ndarray
    seed: int
    ret: float
    speeds: np.ndarray | None = None
    weights: np.ndarray | None = None


def default_cache_dir() -> Path:
    """Where recording caches live: ``$NAC_FRAME_CACHE``, else ``$XDG_CACHE_HOME/nac-drive/carracing-frames``
    (``$XDG_CACHE_HOME`` defaulting to ``~/.cache``); read from the environment at each call."""
    if os.environ.get("NAC_FRAME_CACHE"):
        return Path(os.environ["NAC_FRAME_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "nac-drive" / "carracing-frames"


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def _npy_header(shape: tuple[int, ...]) -> bytes:
    """A numpy format 1.0 header of exactly :data:`_HEADER_BYTES` bytes for a C-order uint8 array of ``shape``."""
    body = "{'descr': '|u1', 'fortran_order': False, 'shape': %r, }" % (tuple(int(s) for s in shape),)
    size = _HEADER_BYTES - 10  # magic (6), version (2), header length (2)
    if len(body) + 1 > size:
        raise ValueError(f"frame shape {shape} too long for the header")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", size) + (body.ljust(size - 1) + "\n").encode("latin1")


def _concat(parts: list[np.ndarray], dtype, tail: tuple[int, ...]) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros((0, *tail), dtype)


def write_episodes(npy: str | Path, npz: str | Path, episodes: Iterable[EpisodeArrays],
                   on_episode: Callable[[int], None] | None = None, **extra) -> int:
    """Write episodes as an episode-file pair (module docstring), streaming: one episode's frames
    in memory at a time.

    Args:
        npy, npz: the two files (their folder is made).
        episodes: the episodes in order; ``speeds`` and ``weights`` are kept when every episode
            gives them (a mix of given and None is refused).
        on_episode: called with each episode's frame count once it is written (a progress bar).
        extra: more plain arrays or values for the ``.npz`` (e.g. ``source``).

    Returns:
        N, the frames written.

    Raises:
        ValueError: frames that are not (N_e, H, W, C) uint8 of one shape, actions, speeds or
            weights of another length, or speeds/weights given for some episodes only.
        OSError: a write failed (a full disk); no file of the pair is left, nor any temporary one.
        Anything ``episodes`` raises; no file of the pair is left then either.
    """
    npy, npz = Path(npy), Path(npz)
    npy.parent.mkdir(parents=True, exist_ok=True)
    npz.unlink(missing_ok=True)  # an old pair's index must never describe the new frames
    tmp_npy, tmp_npz = _tmp(npy), _tmp(npz)
    offsets, actions, seeds, returns, speeds, weights = [0], [], [], [], [], []
    shape = None
    try:
        with open(tmp_npy, "wb") as fh:
            fh.write(b"\0" * _HEADER_BYTES)  # the header goes in once the frame count is known
            for e, ep in enumerate(episodes):
                f = ep.frames
                if f.ndim != 4 or f.dtype != np.uint8 or (shape is not None and f.shape[1:] != shape):
                    raise ValueError(f"episode {e}: frames must be (N, H, W, C) uint8"
                                     f"{'' if shape is None else ' of ' + str(shape)}, got {f.shape} {f.dtype}")
                shape = f.shape[1:]
                n = len(f)
                a = np.asarray(ep.actions)
                if len(a) != n:
                    raise ValueError(f"episode {e}: {n} frames but {len(a)} actions")
                if e == 0:  # kept when the first episode gives them; then every episode must
                    speeds = [] if ep.speeds is not None else None
                    weights = [] if ep.weights is not None else None
                for name, v, kept in (("speeds", ep.speeds, speeds), ("weights", ep.weights, weights)):
                    if (v is None) != (kept is None):
                        raise ValueError(f"episode {e}: {name} given for some episodes only")
                    if v is not None and np.shape(v) != (n,):
                        raise ValueError(f"episode {e}: {name} must be ({n},), got {np.shape(v)}")
                for start in range(0, n, 1024):  # a contiguous copy of a few MB at a time
                    fh.write(np.ascontiguousarray(f[start:start + 1024]).data)
                offsets.append(offsets[-1] + n)
                actions.append(a)
                seeds.append(int(ep.seed))
                returns.append(float(ep.ret))
                if speeds is not None:
                    speeds.append(np.asarray(ep.speeds, np.float32))
                if weights is not None:
                    weights.append(np.asarray(ep.weights, np.float32))
                if on_episode is not None:
                    on_episode(n)
            fh.seek(0)
            fh.write(_npy_header((offsets[-1], *(shape or (0, 0, 0)))))
            fh.flush()
            os.fsync(fh.fileno())
        tail = actions[0].shape[1:] if actions else ()
        arrays = {"offsets": np.asarray(offsets, np.int64),
                  "actions": _concat(actions, actions[0].dtype if actions else np.int64, tail),
                  "seeds": np.asarray(seeds, np.int64), "returns": np.asarray(returns, np.float64),
                  "format": np.asarray(EPISODES_FORMAT)}
        if speeds is not None:
            arrays["speeds"] = _concat(speeds, np.float32, ())
        if weights is not None:
            arrays["weights"] = _concat(weights, np.float32, ())
        arrays.update({k: np.asarray(v) for k, v in extra.items()})
        os.replace(tmp_npy, npy)
        with open(tmp_npz, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp_npz, npz)  # last: the pair is complete
    except BaseException:
        for p in (tmp_npy, tmp_npz, npy):
            try:
                p.unlink(missing_ok=True)
            except OSError:
                pass
        raise
    return offsets[-1]


class EpisodeFiles(NamedTuple):
    """An episode-file pair as :func:`read_episodes` reads it; lists have one entry per episode.

    Attributes:
        frames: (N_e, H, W, C) uint8 read-only memory maps of the ``.npy`` (in memory for N = 0).
        actions: (N_e,) int64 or (N_e, A) float32 (views of one array in memory).
        seeds: ints. returns: floats.
        speeds, weights: (N_e,) float32 each, or None when the pair holds none.
        extra: the ``.npz``'s other arrays by name.
    """

    frames: list
    actions: list
    seeds: list
    returns: list
    speeds: list | None
    weights: list | None
    extra: dict


def read_episodes(npy: str | Path, npz: str | Path) -> EpisodeFiles:
    """Read an episode-file pair written by :func:`write_episodes`; the frames memory-mapped.

    Only the headers and the index are read: no frame is paged in.

    Raises:
        FileNotFoundError: either file is missing.
        ValueError: an index that is not an ``.npz`` of this layout (missing arrays, another
            ``format``, more than :data:`MAX_INDEX_BYTES` declared) or that does not match the frames.
    """
    npy, npz = Path(npy), Path(npz)
    if not npz.is_file():
        raise FileNotFoundError(npz)
    try:
        is_zip = check_zip_sizes(npz, npz, MAX_INDEX_BYTES, _MAX_INDEX_MEMBERS)
    except ZipMemberTooLarge as exc:
        raise ValueError(str(exc)) from None
    if not is_zip:
        raise ValueError(f"{npz} is not an .npz file")
    try:
        with np.load(npz, allow_pickle=False) as z:
            idx = {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{npz} cannot be read ({type(exc).__name__}: {exc})") from None
    missing = [k for k in _REQUIRED if k not in idx]
    if missing:
        raise ValueError(f"{npz} lacks {missing}")
    if idx["format"].shape != () or int(idx["format"]) != EPISODES_FORMAT:
        raise ValueError(f"{npz} has episode-file format {idx['format'].tolist()}, this version reads "
                         f"{EPISODES_FORMAT}")
    off = idx["offsets"]
    if off.ndim != 1 or off.dtype != np.int64 or len(off) < 1 or off[0] != 0 or np.any(np.diff(off) < 0):
        raise ValueError(f"{npz}: offsets must rise from 0, got {off.dtype} {off.shape}")
    n, n_ep = int(off[-1]), len(off) - 1
    frames = open_frames(npy) if n else np.load(npy, allow_pickle=False)  # FileNotFoundError if missing
    if frames.ndim != 4 or frames.dtype != np.uint8 or len(frames) != n:
        raise ValueError(f"{npy} holds {frames.dtype} {frames.shape}, its index {n} frames (N, H, W, C) uint8")
    if not n:
        frames.flags.writeable = False
    for name, size in (("actions", n), ("seeds", n_ep), ("returns", n_ep), ("speeds", n), ("weights", n)):
        if name in idx and (idx[name].ndim < 1 or len(idx[name]) != size):
            raise ValueError(f"{npz}: {name} has {idx[name].shape}, want {size} entries")
    spans = list(zip(off[:-1].tolist(), off[1:].tolist()))

    def split(a):
        return [a[s:t] for s, t in spans]

    return EpisodeFiles(split(frames), split(idx["actions"]), [int(s) for s in idx["seeds"]],
                        [float(r) for r in idx["returns"]],
                        split(idx["speeds"]) if "speeds" in idx else None,
                        split(idx["weights"]) if "weights" in idx else None,
                        {k: v for k, v in idx.items() if k not in (*_REQUIRED, "speeds", "weights")})


#: the files behind the maps :func:`open_frames` made: id(map) -> (weak reference to the map, a read-only
#: file descriptor of its file, the address of the map's first byte); an entry and its descriptor go
#: when the map is garbage-collected (with the last array over it)
_FILES: dict[int, tuple[weakref.ref, int, int]] = {}


def _forget(key: int, fd: int) -> None:
    _FILES.pop(key, None)
    try:
        os.close(fd)
    except OSError:
        pass


def open_frames(npy: str | Path) -> np.ndarray:
    """A ``.npy`` file as a read-only array over a memory map of it (``mmap.mmap`` and
    ``np.frombuffer``; the header read with ``numpy.lib.format``), so :func:`release_pages` can
    reach the map through the array's ``base`` (public attributes only). The file stays open
    for :func:`read_frames`' positional reads while the map lives.

    Raises:
        FileNotFoundError: no such file. ValueError: not a C-ordered ``.npy`` of a plain dtype.
    """
    import mmap

    from numpy.lib import format as npy_format

    with open(npy, "rb") as f:
        version = npy_format.read_magic(f)
        read_header = npy_format.read_array_header_1_0 if version == (1, 0) else npy_format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        offset = f.tell()
        if fortran or dtype.hasobject:
            raise ValueError(f"{npy} is not a C-ordered array of a plain dtype")
        count = int(np.prod(shape))
        if not count:
            return np.zeros(shape, dtype)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # the map outlives the file object
        fd = os.dup(f.fileno())  # the same open file, for os.preadv (which moves no file position)
    arr = np.frombuffer(mm, dtype=dtype, count=count, offset=offset).reshape(shape)
    key = id(mm)
    _FILES[key] = (weakref.ref(mm), fd, arr.ctypes.data - offset)  # the address only: no page is touched
    weakref.finalize(mm, _forget, key, fd)
    return arr


def _file_of(a: np.ndarray) -> tuple[int, int] | None:
    """(file descriptor, byte offset in the file) of the C-contiguous view ``a`` of a map made by
    :func:`open_frames`, or None (not such a view, or no ``os.preadv`` here)."""
    if not hasattr(os, "preadv") or not a.flags.c_contiguous or not a.nbytes:
        return None
    m = mapped_buffer(a)
    entry = _FILES.get(id(m)) if m is not None else None
    if entry is None or entry[0]() is not m:
        return None
    return entry[1], a.ctypes.data - entry[2]


def _pread_into(fd: int, out: np.ndarray, pos: int) -> None:
    """Fill the C-contiguous ``out`` with the bytes at ``pos`` of ``fd`` (positional reads, repeated on a short read).

    Raises:
        OSError: the read failed, or the file ended first (it was truncated while open).
    """
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], pos + done)
        if got <= 0:
            raise OSError(f"a frame file ended {len(view) - done} bytes before the frames it holds "
                          f"(offset {pos + done}): was it truncated while training? Start the run anew")
        done += got


def read_frames(frames: np.ndarray) -> np.ndarray:
    """``frames`` (any shape, e.g. (n, H, W, C) uint8) as a writable array in this process's memory.

    For a C-contiguous view of a map made by :func:`open_frames` (an episode's frames, or a
    window of them) the bytes are read from the file with positional reads (``os.preadv``), so no
    page of the map is touched and none counts in the resident set (the module docstring says
    why this matters); anything else is copied with ``np.array``. The values are the same either way.

    Raises:
        OSError: the frame file cannot be read (truncated or gone from a disk that failed).
    """
    where = _file_of(frames)
    if where is None:
        return np.array(frames)
    out = np.empty(frames.shape, frames.dtype)
    _pread_into(where[0], out, where[1])
    return out


def _rows_of(frames: np.ndarray) -> tuple[int, int, int] | None:
    """(file descriptor, byte offset of row 0 in the file, byte stride between rows) of a view of a
    map made by :func:`open_frames` whose rows ``frames[i]`` are each C-contiguous (a slice of the
    frames, or one camera of a recording's (N, cameras, H, W, C) crops), or None (not such a view)."""
    if frames.ndim == 0 or not len(frames):
        return None
    where = _file_of(frames[0])
    return None if where is None else (where[0], where[1], frames.strides[0])


def take_frames(frames: np.ndarray, index) -> np.ndarray:
    """``frames[index]`` along the first axis (``index``: (n,) bool mask or integer indices) as an
    array in memory, read from the file as :func:`read_frames` reads, without touching the map.

    ``frames`` may be any view of a map made by :func:`open_frames` whose rows are each
    C-contiguous, strided along the first axis too (``crops[:, camera]`` of
    :mod:`agent.data.udacity_cache`): a run of consecutive indices over contiguous rows is one
    read, other rows one read each. Anything else is plain fancy indexing.

    Raises:
        IndexError: an index out of range. OSError: as :func:`read_frames`.
    """
    index = np.asarray(index)
    idx = np.flatnonzero(index) if index.dtype == bool else index.astype(np.int64).ravel()
    rows = _rows_of(frames)
    if rows is None:
        return frames[idx]
    fd, pos0, stride = rows
    n = len(frames)
    if len(idx) and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"frame index out of range for {n} frames")
    idx = np.where(idx < 0, idx + n, idx)
    out = np.empty((len(idx), *frames.shape[1:]), frames.dtype)
    if stride != out[:1].nbytes:  # rows apart in the file (one camera of several): one read a row
        for j, i in enumerate(idx.tolist()):
            _pread_into(fd, out[j], pos0 + i * stride)
        return out
    j = 0
    while j < len(idx):  # one read per run of consecutive indices, straight into its rows of ``out``
        k = j + 1
        while k < len(idx) and idx[k] == idx[k - 1] + 1:
            k += 1
        _pread_into(fd, out[j:k], pos0 + int(idx[j]) * stride)
        j = k
    return out


def mapped_buffer(a):
    """The ``mmap.mmap`` an array reads (following its ``base`` chain: views of views), or None."""
    import mmap

    b = a
    while b is not None:
        if isinstance(b, mmap.mmap):
            return b
        b = getattr(b, "base", None) if isinstance(b, np.ndarray) else getattr(b, "obj", None)
    return None


def release_pages(arrays: Iterable) -> int:
    """Let go of this process's resident pages of the memory maps behind ``arrays``
    (``madvise(MADV_DONTNEED)`` on each distinct map); arrays that are not memory maps are skipped.

    The pages of a read-only file map that a process has read count in its resident set size
    until the kernel needs the memory back, so reading a 14 GB cache once would show up to 14 GB
    resident, though none of it is the process's own. After this call they count no more; they
    stay in the page cache (a later read costs no disk access when memory allows) and the arrays
    read as before. A no-op where ``madvise`` is missing (not Linux or macOS).

    Returns:
        the number of maps released.
    """
    import mmap

    maps = {}
    for a in arrays:
        m = mapped_buffer(a)
        if m is not None:
            maps[id(m)] = m
    done = 0
    for m in maps.values():
        try:
            m.madvise(mmap.MADV_DONTNEED)
            done += 1
        except (AttributeError, OSError, ValueError):  # no madvise here, or a closed map
            pass
    return done


def cache_key(data_dir: str | Path) -> str:
    """The cache key of the Minari dataset folder ``data_dir`` (the ``data/`` that holds
    ``main_data.hdf5`` and ``metadata.json``): 20 hex digits of a hash of :data:`CACHE_FORMAT`,
    the HDF5 file's resolved path, size and mtime_ns, and the metadata's bytes.

    Raises:
        FileNotFoundError: either file is missing.
    """
    data_dir = Path(data_dir)
    hdf5 = (data_dir / HDF5_FILE).resolve()
    st = hdf5.stat()
    h = hashlib.sha256(json.dumps({"format": CACHE_FORMAT, "path": str(hdf5), "size": st.st_size,
                                   "mtime_ns": st.st_mtime_ns}).encode())
    h.update((data_dir / METADATA_FILE).read_bytes())
    return h.hexdigest()[:20]


def _stem_name(data_dir: Path) -> str:
    """``<namespace>+<name>`` of a dataset's ``data/`` folder, made a safe file name."""
    folder = data_dir.resolve().parent if data_dir.name == "data" else data_dir.resolve()
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{folder.parent.name}+{folder.name}")[-80:]


def cache_paths(data_dir: str | Path, cache_dir: str | Path | None = None) -> tuple[Path, Path]:
    """(frames .npy, index .npz) of the cache of the dataset folder ``data_dir`` (they may not exist yet).

    Raises:
        FileNotFoundError: the dataset's HDF5 file or metadata is missing.
    """
    data_dir = Path(data_dir)
    stem = Path(cache_dir if cache_dir is not None else default_cache_dir()) / \
        f"{_stem_name(data_dir)}-{cache_key(data_dir)}"
    return stem.with_suffix(".npy"), stem.with_suffix(".npz")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def _tidy(cache_dir: Path, name: str, keep: Path, source: str) -> None:
    """Delete what earlier builds of the recording ``name`` left in ``cache_dir``: temporary files
    of processes that are gone, and complete caches of the same HDF5 file ``source`` under another
    key (a stale copy of the recording). Never raises."""
    try:
        for tmp in cache_dir.glob(f".{name}-*.tmp"):
            m = re.search(r"\.(\d+)\.tmp$", tmp.name)
            if m and not _pid_alive(int(m.group(1))):
                tmp.unlink(missing_ok=True)
        for npz in cache_dir.glob(f"{name}-*.npz"):
            if npz == keep:
                continue
            try:
                with np.load(npz, allow_pickle=False) as z:
                    same = "source" in z.files and str(z["source"]) == source
            except Exception:
                continue
            if same:
                npz.unlink(missing_ok=True)
                npz.with_suffix(".npy").unlink(missing_ok=True)
                _lock_path(npz).unlink(missing_ok=True)
                _log.info("deleted the stale frame cache %s", npz.with_suffix(".npy"))
    except OSError:
        pass


def build_cache(data_dir: str | Path, episodes: Callable[[], Iterable[EpisodeArrays]], total_frames: int,
                frame_bytes: int, cache_dir: str | Path | None = None, progress: bool = True) -> tuple[Path, Path]:
    """Write the cache of a recording from its episodes (if it is not there yet); its two paths.

    Args:
        data_dir: the dataset's ``data/`` folder. episodes: called once, yields the episodes
            in order (their frames streamed, one episode in memory at a time).
        total_frames: the frames expected (the progress bar's total and the space check).
        frame_bytes: bytes of one frame (27,648 for 96x96x3).
        cache_dir: None: :func:`default_cache_dir`. progress: a progress bar while building.

    Raises:
        OSError: the cache folder cannot be made or written, or its disk has less free space than
            the cache needs (the message names the folder, the bytes and ``NAC_FRAME_CACHE``).
        Anything ``episodes`` raises; nothing is left in the cache folder then.
    """
    data_dir = Path(data_dir)
    cache_dir = Path(cache_dir if cache_dir is not None else default_cache_dir())
    npy, npz = cache_paths(data_dir, cache_dir)
    if npy.is_file() and npz.is_file():
        return npy, npz
    name = _stem_name(data_dir)
    source = str((data_dir / "main_data.hdf5").resolve())
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(_lock_path(npz)):  # processes that load the same recording at once (torchrun ranks) build it once
        if npy.is_file() and npz.is_file():  # built by another process meanwhile
            return npy, npz
        _tidy(cache_dir, name, npz, source)
        need = total_frames * frame_bytes
        free = shutil.disk_usage(cache_dir).free
        if free < need + _SPACE_MARGIN:
            raise OSError(28, f"the frame cache of {data_dir.parent} needs {need / 2**30:.1f} GiB and {cache_dir} "
                              f"has {free / 2**30:.1f} GiB free: free space, or set NAC_FRAME_CACHE to a folder on a "
                              "larger disk", str(cache_dir))
        bar = bar_for(total=total_frames, desc=f"caching {data_dir.parent.name} frames", unit="frame",
                      disable=not progress, leave=False)
        try:
            write_episodes(npy, npz, episodes(), on_episode=bar.update, source=np.array(source),
                           cache_format=np.array(CACHE_FORMAT))
        finally:
            bar.close()
    _log.info("cached the frames of %s in %s (%.0f MiB)", data_dir.parent, npy, npy.stat().st_size / 2**20)
    return npy, npz


def _lock_path(npz: Path) -> Path:
    return npz.with_name(f".{npz.stem}.lock")


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive ``flock`` on ``path`` (made if missing) while the block runs; no lock where
    ``fcntl`` does not exist (Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


__all__ = ["CACHE_FORMAT", "EPISODES_FORMAT", "EpisodeArrays", "EpisodeFiles", "MAX_INDEX_BYTES", "build_cache",
           "cache_key", "cache_paths", "default_cache_dir", "read_episodes", "read_frames", "release_pages",
           "take_frames", "write_episodes"]
