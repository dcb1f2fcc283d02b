"""Demonstration recordings as Minari datasets: write episode by episode, read back for training.

Recordings are laid out as Minari expects, so Minari's own tools find them::

    recordings/                      <- the datasets root (MINARI_DATASETS_PATH=recordings)
      nac-drive/                     <- namespace (namespace_metadata.json)
        sample-v0/                   <- dataset "nac-drive/sample-v0"
          data/main_data.hdf5, data/metadata.json

``agent collect --out recordings/nac-drive/expert-0-19-v0`` writes dataset id
``nac-drive/expert-0-19-v0``: the last two components of the path are the namespace and
``name-vN``, and their parent is the root. Then ``MINARI_DATASETS_PATH=recordings minari list local``
lists it and ``minari.load_dataset("nac-drive/expert-0-19-v0")`` opens it.

A dataset is created with ``minari.create_dataset_from_buffers`` (no JAX needed) in a hidden staging
folder of the root and moved into place once its first episode is written (atomic: no half-made
dataset is ever visible), then extended with ``update_dataset_from_buffer`` after every finished
episode, so Ctrl-C or a crash keeps every finished episode. Frames are stored losslessly (no JPEG),
so the student trains on exactly the pixels it will see.

Nothing lost on an interruption. Minari rewrites ``data/metadata.json`` by truncating it and then
writing it, so a kill inside that write used to leave it empty and the whole dataset unreadable.
:class:`RecordingWriter` therefore never lets Minari write the live ``metadata.json``: each episode
is appended through a hidden ``.append/`` folder beside ``data/`` that holds a hard link (or a
symbolic link) to ``data/main_data.hdf5`` and a copy of ``metadata.json``; Minari appends the
episode to the HDF5 file through the link and rewrites the copy, the copy is checked (it parses
and counts the episodes and steps) and synced, and only then moves over ``data/metadata.json``
with ``os.replace`` (atomic). A kill at any moment leaves ``metadata.json`` counting exactly the
episodes written before; an episode half-written to the HDF5 file lies beyond that count and is
never read. SIGINT and SIGTERM are held back while an episode is written and delivered right after
(:func:`deferred_interrupts`). On a file system without links the episode is appended in place,
after a copy of the last good ``metadata.json`` is kept as ``.metadata.json.bak``;
:func:`load_demonstrations` restores from it, with a warning, when a kill left ``metadata.json``
empty or broken (:func:`recover_metadata`). A full disk is found before writing where it can be
(the free space against the episode's size) and stops the recording with one error that names the
file and the episodes kept; nothing is written after a failed write.

Per step the dataset stores the 96x96x3 frame the student sees, the action executed (the
expert's, or the person's with ``--keyboard``), the reward, termination and truncation; the
episode's track seed is Minari's per-episode ``seed``; ``infos["speed"]`` holds the car speed.
Actions are the env's: an int64 index for the five discrete actions (the default), or a float32
(steering, throttle) pair for the continuous configuration (``make_carracing(continuous=True)``);
the dataset's ``action_space`` says which, and :func:`load_demonstrations` reads both.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import tempfile
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agent.atomic import fsync_path, write_atomic
from agent.log import get_logger
from agent.data.frame_cache import HDF5_FILE, METADATA_FILE  # the files of a Minari dataset's data/
from envs.carracing import draw_speedometer

_log = get_logger(__name__)

#: the namespace of the project's recordings
NAMESPACE = "nac-drive"
#: the shipped datasets root: ``recordings/`` at the top of the repository
RECORDINGS_DIR = Path(__file__).resolve().parent.parent.parent / "recordings"

# Minari's own grammar of ids (minari.dataset.minari_dataset), one namespace level, version required
_NAMESPACE_RE = re.compile(r"[-_\w][-_\w]*[-_\w]")
_NAME_VERSION_RE = re.compile(r"(?P<name>[-_\w]+?)-v(?P<version>\d+)")


class RecordingError(ValueError):
    """A recording folder that is missing, malformed, or in the way."""


def _suggest(out: Path) -> Path:
    """A path of the valid layout close to ``out``: ``.../<namespace>/<name>-v<N>``."""
    m = _NAME_VERSION_RE.fullmatch(out.name)
    name = m.group(0) if m else (re.sub(r"[^-\w]+", "_", out.name).strip("_-") or "recording") + "-v0"
    parent = out.parent
    if len(out.parts) >= 2 and _NAMESPACE_RE.fullmatch(parent.name) and parent.name != "recordings":
        return parent / name
    return parent / NAMESPACE / name


def dataset_layout(out: str | Path) -> tuple[Path, str]:
    """Split a recording folder into its Minari datasets root and dataset id.

    ``recordings/nac-drive/expert-0-19-v0`` -> (``recordings`` made absolute, ``"nac-drive/expert-0-19-v0"``).

    Raises:
        RecordingError: the last two path components are not ``<namespace>/<name>-v<N>`` (letters,
            digits, ``-`` and ``_``; N a number); the message suggests a path that is.
    """
    given = Path(out)
    name, namespace = given.name, given.parent.name
    if len(given.parts) < 2 or not _NAME_VERSION_RE.fullmatch(name) or not _NAMESPACE_RE.fullmatch(namespace) \
            or namespace == "recordings":
        raise RecordingError(
            f"{given} is not a Minari dataset path: the last two folders must be <namespace>/<name>-v<N> "
            f"(e.g. recordings/{NAMESPACE}/expert-0-19-v0, dataset id {NAMESPACE}/expert-0-19-v0, read with "
            f"MINARI_DATASETS_PATH=recordings); try --out {_suggest(given)}")
    absolute = given.absolute()  # Minari mangles relative dataset paths
    return absolute.parent.parent, f"{namespace}/{name}"


#: beside ``data/``: where an episode is appended (links to the HDF5 file, a copy of the metadata)
APPEND_DIR = ".append"
#: beside ``data/``: the last good metadata, kept while an episode is appended in place (no links)
METADATA_BACKUP = ".metadata.json.bak"
#: free space asked for beyond an episode's HDF5 bytes and two copies of the metadata: HDF5's headers
_SPACE_MARGIN = 256 * 1024
#: an episode's bytes in the HDF5 file over its arrays' bytes, at most: Minari's chunked datasets
#: round up (measured 1.01 at 300+ steps, up to 1.58 at 13-64 steps, 2.0 at 2 steps, with 128 KB added)
_CHUNK_SLACK = 1.6


@contextlib.contextmanager
def deferred_interrupts(signums: Sequence[int] = (signal.SIGINT, signal.SIGTERM)):
    """Hold back SIGINT and SIGTERM while the block runs; deliver them as soon as it ends.

    For writes that must not stop half-way (Minari's HDF5 append and its metadata). The handlers in
    place before are restored, then each signal that arrived is raised again with
    :func:`signal.raise_signal`, so the old handler runs right after the block: Python's default
    SIGINT handler raises KeyboardInterrupt there (never inside an HDF5 object's finaliser, where
    it would be printed as "Exception ignored" and lost), and an unhandled SIGTERM ends the process
    after the write. Signals are handled only by the main thread, so in any other thread this does
    nothing. SIGKILL cannot be held back (see :class:`RecordingWriter` for what survives it).

    Source of the idea: the usual "critical section" idiom of deferring signals around a write.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def hold(signum, frame):
        arrived.append(signum)

    old = {s: signal.signal(s, hold) for s in signums}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: installed outside Python
        for s in dict.fromkeys(arrived):
            signal.raise_signal(s)


def _read_metadata(path: Path) -> dict | None:
    """The JSON object in ``path``, or None if it is missing, empty, not JSON or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and isinstance(meta.get("total_episodes"), int) else None


def _free_bytes(folder: Path) -> int:
    """Free bytes on the file system of ``folder`` (``shutil.disk_usage``)."""
    return shutil.disk_usage(folder).free


def _disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and (exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
                                         or "No space left" in str(exc))


def recover_metadata(path: str | Path) -> bool:
    """Restore a dataset's ``data/metadata.json`` that an interrupted write left empty or broken.

    The last good copy is ``.metadata.json.bak`` beside ``data/``, which :class:`RecordingWriter`
    keeps while it appends an episode in place (on a file system without links); it counts exactly
    the episodes written before that append. It is checked (it parses, names the same dataset id
    as its folder when it names one) and written back atomically, with a warning. An episode whose
    append was cut short may lie in the HDF5 file beyond that count; it is not read.

    Args:
        path: the dataset folder (holding ``data/``).

    Returns:
        True if ``metadata.json`` was restored, False if it was fine (nothing done).

    Raises:
        RecordingError: ``metadata.json`` is missing, empty or broken and there is no usable copy
            to restore it from (the message says to record the dataset again).
    """
    path = Path(path)
    data = path / "data"
    live = data / METADATA_FILE
    if _read_metadata(live) is not None:
        return False
    backup = _read_metadata(path / METADATA_BACKUP)
    what = "empty" if live.is_file() and live.stat().st_size == 0 else ("missing" if not live.exists() else "broken")
    if backup is None or not (data / HDF5_FILE).is_file():
        raise RecordingError(f"{live} is {what} (a write was interrupted, or the file was damaged) and there is no "
                             f"last good copy ({path / METADATA_BACKUP}) to restore it from; record this dataset "
                             "again with `agent collect --overwrite`")
    write_atomic(live, json.dumps(backup), what="recording metadata", sync_folder=True)
    _log.warning("%s was %s (an interrupted write): restored its last good copy, %d episode(s)", live, what,
                 backup["total_episodes"])
    return True


class RecordingWriter:
    """Writes episodes to a Minari dataset at ``out`` one at a time, so that no interruption loses one.

    Each :meth:`add` is all or nothing: once it returns, the episode is on disk and counted by
    ``data/metadata.json``; a kill (even SIGKILL) before that leaves the dataset exactly as it was
    (see the module's notes: the episode is appended through a hidden ``.append/`` folder and the
    metadata moved into place atomically, or on a file system without links appended in place with
    ``.metadata.json.bak`` kept for :func:`recover_metadata`). SIGINT and SIGTERM arriving during a
    write are delivered right after it (:func:`deferred_interrupts`). After a failed write nothing
    more is written. ``.episodes`` and ``.steps`` count what is on disk.

    Args:
        out: the dataset folder to create, ``ROOT/<namespace>/<name>-v<N>`` (see :func:`dataset_layout`);
            its dataset id is ``<namespace>/<name>-v<N>`` with ``ROOT`` as ``MINARI_DATASETS_PATH``.
        env: the env the episodes come from (its spec is stored).
        algorithm_name: who acted ("ppo-expert", "keyboard", ...).
        overwrite: replace an existing folder at ``out``.

    Raises:
        RecordingError: ``out`` is not a valid dataset path, exists and ``overwrite`` is False, or
            its parent is not a folder.
    """

    #: append through links to the HDF5 file (False: in place, with a backup of the metadata)
    use_links = True

    def __init__(self, out: str | Path, env, algorithm_name: str, overwrite: bool = False,
                 description: str | None = None):
        self.root, self.dataset_id = dataset_layout(out)
        self.out = self.root / self.dataset_id
        if self.out.exists() and not overwrite:
            raise RecordingError(f"{self.out} already exists; choose another --out or pass --overwrite")
        for folder in (self.out.parent, self.root):
            if folder.exists() and not folder.is_dir():
                raise RecordingError(f"{folder} is not a folder")
        self.env, self.algorithm_name, self.description = env, algorithm_name, description
        self.overwrite = overwrite
        self.created = False
        self.episodes = 0
        self.steps = 0
        #: the exception that stopped the recording (nothing is written after it), or None
        self.failed: BaseException | None = None
        #: set by the collect loops when Ctrl-C or SIGTERM stopped them
        self.interrupted = False

    @property
    def data(self) -> Path:
        """The dataset's ``data/`` folder (``main_data.hdf5`` and ``metadata.json``)."""
        return self.out / "data"

    @staticmethod
    def _buffer(ep):
        from minari.data_collector import EpisodeBuffer

        if ep.observations is None:
            raise RecordingError("an episode without frames cannot be recorded")
        n = len(ep.actions)
        lengths = {"frames": len(ep.observations), "rewards": len(ep.rewards), "terminations": len(ep.terminations),
                   "truncations": len(ep.truncations)}
        if lengths != {"frames": n + 1, "rewards": n, "terminations": n, "truncations": n}:
            raise RecordingError(f"an episode of {n} actions needs {n + 1} frames and {n} rewards, terminations and "
                                 f"truncations; got {lengths}")
        return EpisodeBuffer(
            id=None, seed=ep.seed, observations=ep.observations, actions=ep.actions, rewards=ep.rewards,
            terminations=ep.terminations, truncations=ep.truncations, infos={"speed": ep.speeds},
        )

    @staticmethod
    def _episode_bytes(ep) -> int:
        """The bytes of an episode's arrays: about what it takes in the HDF5 file (stored uncompressed)."""
        arrays = (ep.observations, ep.actions, ep.rewards, ep.terminations, ep.truncations, ep.speeds)
        return sum(np.asarray(a).nbytes for a in arrays if a is not None)

    def _check_space(self, ep) -> None:
        """Refuse to start a write the disk cannot hold, with room to spare: HDF5 fails badly when it
        runs out mid-write (a cascade of errors, then a segmentation fault when Minari closes the file).

        Raises:
            OSError: ENOSPC, with the sizes.
        """
        meta = self.data / METADATA_FILE
        if meta.is_file():
            meta_bytes = meta.stat().st_size
        else:  # not written yet: its bulk is the two spaces, serialized (the Box bounds, value by value)
            from minari.serialization import serialize_space

            meta_bytes = sum(len(json.dumps(serialize_space(sp))) for sp in
                             (self.env.observation_space, self.env.action_space)) + 16 * 1024
        need = int(_CHUNK_SLACK * self._episode_bytes(ep)) + 2 * meta_bytes + _SPACE_MARGIN
        free = _free_bytes(self.root)
        if free < need:
            raise OSError(errno.ENOSPC, f"episode {self.episodes + 1} needs about {need / 1e6:.1f} MB, "
                                        f"{free / 1e6:.1f} MB free", str(self.data / HDF5_FILE))

    def add(self, ep) -> None:
        """Append one finished episode (an :class:`agent.actors.rollout.Episode`), on disk before this returns.

        All or nothing: SIGINT and SIGTERM wait until the episode is written and counted (then
        KeyboardInterrupt is raised here); a kill leaves the dataset as it was before.

        Raises:
            RecordingError: an episode without frames, or whose frames, actions, rewards,
                terminations and truncations disagree in length (N + 1 frames for N actions); an
                earlier write failed; the metadata Minari wrote does not count the episodes written.
            OSError: the write failed: a full disk (errno ENOSPC, "No space left on device", found
                before writing when possible) or another file error. The message names the file
                and the finished episodes kept; nothing is written after it.
        """
        if self.failed is not None:
            raise RecordingError(f"{self.out}: nothing more is written after the failed write ({self.failed}); "
                                 f"it keeps {self.episodes} finished episode(s)")
        buffer = self._buffer(ep)
        with deferred_interrupts():
            try:
                if not self.created:
                    self._create(ep)
                    self.created = True
                else:
                    self._check_space(ep)
                    self._append(buffer, ep.steps)
            except Exception as exc:
                self.failed = exc
                kept = f"kept the {self.episodes} finished episode(s) in {self.out}" if self.episodes else \
                    f"no episode was finished, {self.out} was not made"
                if isinstance(exc, OSError):
                    detail = " ".join(str(exc.strerror or exc).split())  # HDF5's messages span lines
                    detail = detail if len(detail) <= 160 else detail[:160] + "..."
                    if _disk_full(exc):
                        detail = detail if detail.startswith("episode") else "No space left on device"
                        reason, code = "disk full", errno.ENOSPC
                    else:
                        reason, code = "write failed", exc.errno
                    raise OSError(code, f"{reason} while writing episode {self.episodes + 1} ({detail}); {kept}",
                                  exc.filename or str(self.data / HDF5_FILE)) from exc
                if isinstance(exc, RecordingError):
                    raise RecordingError(f"{exc}; {kept}") from exc
                raise RecordingError(f"could not write episode {self.episodes + 1} to {self.data / HDF5_FILE}: "
                                     f"{type(exc).__name__}: {exc}; {kept}") from exc
            self.episodes += 1
            self.steps += ep.steps

    def _create(self, ep) -> None:
        """Create the dataset holding ``ep`` in a hidden staging root, then move it into place."""
        import minari
        from minari.namespace import NAMESPACE_METADATA_FILENAME

        self.root.mkdir(parents=True, exist_ok=True)
        self._check_space(ep)
        # hidden (".") so Minari's listing skips it; in the root so the final move is a rename
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.root))
        old = os.environ.get("MINARI_DATASETS_PATH")
        os.environ["MINARI_DATASETS_PATH"] = str(staging)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # Minari's reminders about optional metadata
                minari.create_dataset_from_buffers(
                    self.dataset_id, [self._buffer(ep)], env=self.env, eval_env=self.env,
                    algorithm_name=self.algorithm_name, author="nac-drive", author_email="n/a",
                    code_permalink="n/a",
                    description=self.description or f"CarRacing demonstrations by {self.algorithm_name}",
                    jpeg_encoding=False, data_format="hdf5",
                )
            made = staging / self.dataset_id
            self._check_metadata(made / "data" / METADATA_FILE, 1, ep.steps)
            fsync_path(made / "data" / HDF5_FILE)
            fsync_path(made / "data" / METADATA_FILE)
            namespace = self.dataset_id.split("/")[0]
            self.out.parent.mkdir(parents=True, exist_ok=True)
            meta = self.out.parent / NAMESPACE_METADATA_FILENAME
            if not meta.exists():
                shutil.copyfile(staging / namespace / NAMESPACE_METADATA_FILENAME, meta)
            if self.out.exists() and self.overwrite:
                shutil.rmtree(self.out)
            made.replace(self.out)
            fsync_path(self.out.parent)
        finally:
            if old is None:
                os.environ.pop("MINARI_DATASETS_PATH", None)
            else:
                os.environ["MINARI_DATASETS_PATH"] = old
            shutil.rmtree(staging, ignore_errors=True)

    def _check_metadata(self, path: Path, episodes: int, steps: int) -> dict:
        """The metadata Minari wrote at ``path``, checked to count ``episodes`` episodes of ``steps`` steps in all.

        Raises:
            RecordingError: it does not parse, or counts other episodes or steps.
        """
        meta = _read_metadata(path)
        if meta is None or meta.get("total_episodes") != episodes or meta.get("total_steps") != steps:
            got = "unreadable" if meta is None else \
                f"{meta.get('total_episodes')} episode(s), {meta.get('total_steps')} steps"
            raise RecordingError(f"the metadata Minari wrote ({path}) is {got}, not {episodes} episode(s) of "
                                 f"{steps} steps in all; the dataset keeps its last good metadata")
        return meta

    def _link(self, source: Path, target: Path) -> bool:
        """Make ``target`` a hard link (or else a symbolic link) to ``source``; False if neither works."""
        if not self.use_links:
            return False
        for make in (os.link, os.symlink):
            try:
                make(source.absolute(), target)
                return True
            except (OSError, NotImplementedError):
                continue
        return False

    def _append(self, buffer, steps: int) -> None:
        """Append one episode so that a kill at any moment leaves a readable dataset (see the class)."""
        from minari import MinariDataset

        episodes, total = self.episodes + 1, self.steps + steps
        shadow = self.out / APPEND_DIR
        shutil.rmtree(shadow, ignore_errors=True)  # left by a kill
        shadow.mkdir()
        try:
            if self._link(self.data / HDF5_FILE, shadow / HDF5_FILE):
                shutil.copyfile(self.data / METADATA_FILE, shadow / METADATA_FILE)
                MinariDataset(shadow).update_dataset_from_buffer([buffer])
                self._commit(shadow / METADATA_FILE, episodes, total)
                return
        finally:
            shutil.rmtree(shadow, ignore_errors=True)
        self._append_in_place(buffer, episodes, total)

    def _commit(self, written: Path, episodes: int, steps: int) -> None:
        """Check the metadata Minari wrote at ``written``, sync, and move it over ``data/metadata.json``."""
        self._check_metadata(written, episodes, steps)
        fsync_path(self.data / HDF5_FILE)
        fsync_path(written)
        os.replace(written, self.data / METADATA_FILE)
        fsync_path(self.data)

    def _append_in_place(self, buffer, episodes: int, steps: int) -> None:
        """The append without links: Minari writes ``data/`` itself; the last good metadata is kept first."""
        from minari import MinariDataset

        live, backup = self.data / METADATA_FILE, self.out / METADATA_BACKUP
        good = _read_metadata(live)
        if good is None:
            raise RecordingError(f"{live} does not hold this dataset's metadata")
        write_atomic(backup, json.dumps(good), what="recording metadata backup", sync_folder=True)
        try:
            MinariDataset(self.data).update_dataset_from_buffer([buffer])
            self._check_metadata(live, episodes, steps)
            fsync_path(self.data / HDF5_FILE)
            fsync_path(live)
        except BaseException:
            if _read_metadata(live) != good:
                with contextlib.suppress(OSError):  # the last good one: the episodes counted before
                    write_atomic(live, json.dumps(good), what="recording metadata", sync_folder=True)
            raise
        os.unlink(backup)


def describe_actions(space) -> str:
    """A short human description of an action space: "discrete (5 actions)" or "continuous Box(-1.0, 1.0, (2,))"."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return f"discrete ({int(space.n)} actions)"
    if isinstance(space, gym.spaces.Box):
        return f"continuous {space}"
    return str(space)


@dataclass
class Demonstrations:
    """Episodes read back from a recording, ready for behaviour cloning.

    One kind of action throughout: discrete (every ``actions[e]`` is (N_e,) int64) or
    continuous (every ``actions[e]`` is (N_e, A) float32, CarRacing's continuous configuration:
    A = 2, steering and throttle in [-1, 1]).

    Attributes:
        frames: list of (N_e, H, W, C) uint8 arrays (the last frame of each episode dropped, so
            frames[e][i] is the observation on which actions[e][i] was taken); in memory, or
            read-only memory maps (``load_demonstrations(frames="mmap")``, DAgger's saved rounds).
            Validation reads shapes and dtypes only, never the frames.
        actions: list of (N_e,) int64 or (N_e, A) float32 arrays.
        seeds: the track seed of each episode.
        returns: the episode return of each episode.
        action_space: the recording's gymnasium action space (``Discrete(5)`` or
            ``Box(-1, 1, (2,))``), or None when not known (DAgger's relabelled episodes); then the
            kind is read from the arrays.
        weights: None (every frame weighs 1 in the loss), or a list of (N_e,) float32 per-frame
            loss weights (DAgger's edge weights, :func:`agent.train.dagger.edge_weights`); kept
            in memory only, never written to a recording.
        speeds: None, or a list of (N_e,) float32 car speeds in simulator units per second, the
            speed at each labelled frame (``infos["speed"]`` of the recording; NaN where unknown).
            :func:`agent.experts.rules.relabel_creep` reads them.

    Raises:
        ValueError: lists of different lengths, frames that do not match their actions.
        RecordingError: discrete and continuous episodes mixed.
    """

    frames: list[np.ndarray]
    actions: list[np.ndarray]
    seeds: list[int]
    returns: list[float]
    action_space: Any = None
    weights: list[np.ndarray] | None = None
    speeds: list[np.ndarray] | None = None

    def __post_init__(self):
        if not (len(self.frames) == len(self.actions) == len(self.seeds) == len(self.returns)):
            raise ValueError("frames, actions, seeds and returns need one entry per episode")
        if self.weights is not None:
            if len(self.weights) != len(self.actions):
                raise ValueError(f"weights need one entry per episode: {len(self.weights)} for {len(self.actions)}")
            for i, (w, a) in enumerate(zip(self.weights, self.actions)):
                if np.shape(w) != (len(a),) or not np.all(np.isfinite(w)) or np.any(np.asarray(w) < 0):
                    raise ValueError(f"episode {i}: weights must be ({len(a)},) finite and >= 0, got shape "
                                     f"{np.shape(w)}")
        if self.speeds is not None:
            if len(self.speeds) != len(self.actions):
                raise ValueError(f"speeds need one entry per episode: {len(self.speeds)} for {len(self.actions)}")
            for i, (v, a) in enumerate(zip(self.speeds, self.actions)):
                if np.shape(v) != (len(a),):
                    raise ValueError(f"episode {i}: speeds must be ({len(a)},), got shape {np.shape(v)}")
        for i, (f, a) in enumerate(zip(self.frames, self.actions)):
            if f.ndim != 4 or f.dtype != np.uint8 or len(f) != len(a):
                raise ValueError(f"episode {i}: frames {f.shape} {f.dtype} do not match {len(a)} actions")
        shapes = {tuple(np.shape(a)[1:]) for a in self.actions}
        if len(shapes) > 1:
            raise RecordingError(f"the episodes mix actions of shapes {sorted(shapes)}: discrete and continuous "
                                 "recordings (or continuous ones of different sizes) cannot be trained on together")
        if self.action_space is not None and shapes and shapes != {tuple(self.action_space.shape)}:
            raise RecordingError(f"actions of shape {shapes.pop()} per step do not fit the action space "
                                 f"{self.action_space}")

    @property
    def continuous(self) -> bool:
        """Whether the actions are continuous ((N_e, A) float32) rather than discrete indices."""
        import gymnasium as gym

        if self.action_space is not None:
            return isinstance(self.action_space, gym.spaces.Box)
        return bool(self.actions) and np.ndim(self.actions[0]) == 2

    @property
    def n_frames(self) -> int:
        return sum(len(a) for a in self.actions)

    def subset(self, episodes: list[int]) -> "Demonstrations":
        """The given episodes (by index), in that order."""
        return Demonstrations([self.frames[i] for i in episodes], [self.actions[i] for i in episodes],
                              [self.seeds[i] for i in episodes], [self.returns[i] for i in episodes],
                              self.action_space,
                              None if self.weights is None else [self.weights[i] for i in episodes],
                              None if self.speeds is None else [self.speeds[i] for i in episodes])

    def frame_speeds(self) -> list[np.ndarray]:
        """(N_e,) float32 speeds of every episode in units/s (NaN where none were recorded)."""
        if self.speeds is not None:
            return [np.asarray(v, dtype=np.float32) for v in self.speeds]
        return [np.full(len(a), np.nan, np.float32) for a in self.actions]

    def with_speedometer(self) -> "Demonstrations":
        """Draw each frame's recorded speed into its dashboard strip, in place
        (:func:`envs.carracing.draw_speedometer`): the frames a student with ``--dashboard
        speedometer`` would have seen. Idempotent (frames recorded with the speedometer on are
        redrawn the same), and checked before any frame changes. Read-only frames (the memory
        maps of ``load_demonstrations(frames="mmap")``, whose cache is never written to) are
        copied into memory first, episode by episode: the demonstrations then hold all their
        frames in memory (27.6 KB a frame); :meth:`agent.data.windows.DemonstrationSource.draw_speedometer`
        draws on each window as it is read instead.

        Returns:
            these demonstrations.

        Raises:
            ValueError: as :meth:`speedometer_speeds`; nothing has been drawn then.
        """
        speeds = self.speedometer_speeds()
        for i, v in enumerate(speeds):
            if not self.frames[i].flags.writeable:
                self.frames[i] = np.array(self.frames[i])  # a memory map of the frame cache: drawn on a copy
            draw_speedometer(self.frames[i], v)
        return self

    def speedometer_speeds(self) -> list[np.ndarray]:
        """(N_e,) float32 speeds (units/s) to draw into every episode's frames, checked; no frame is read.

        Raises:
            ValueError: an episode whose speeds were not recorded (NaN), or frames that are not
                CarRacing's (N, H, W, 3) uint8.
        """
        speeds = self.frame_speeds()
        for i, (f, v) in enumerate(zip(self.frames, speeds)):
            if not np.all(np.isfinite(v)):
                raise ValueError(f"episode {i} (track {self.seeds[i]}) has frames without a recorded speed, so "
                                 "--dashboard speedometer cannot draw them: record them again with `agent collect` "
                                 "or leave that recording out")
            if np.ndim(f) != 4 or np.shape(f)[-1] != 3 or f.dtype != np.uint8:
                raise ValueError(f"episode {i}: the speedometer draws into (N, H, W, 3) uint8 frames, got "
                                 f"{f.dtype} {np.shape(f)}")
        return speeds

    def frame_weights(self) -> list[np.ndarray]:
        """(N_e,) float32 loss weights of every episode (ones where none were given)."""
        if self.weights is not None:
            return [np.asarray(w, dtype=np.float32) for w in self.weights]
        return [np.ones(len(a), np.float32) for a in self.actions]

    def extend(self, other: "Demonstrations") -> "Demonstrations":
        """These episodes followed by ``other``'s.

        Raises:
            RecordingError: the two hold different kinds of actions (discrete and continuous) or
                different action spaces.
        """
        a, b = self.action_space, other.action_space
        if (a is not None and b is not None and a != b) or \
                (self.actions and other.actions and self.continuous != other.continuous):
            raise RecordingError(
                f"cannot train on discrete and continuous recordings together: one holds "
                f"{describe_actions(a) if a is not None else ('continuous' if self.continuous else 'discrete')} "
                f"actions, the other "
                f"{describe_actions(b) if b is not None else ('continuous' if other.continuous else 'discrete')}")
        weights = None
        if self.weights is not None or other.weights is not None:
            weights = self.frame_weights() + other.frame_weights()
        speeds = None
        if self.speeds is not None or other.speeds is not None:
            speeds = self.frame_speeds() + other.frame_speeds()
        return Demonstrations(self.frames + other.frames, self.actions + other.actions,
                              self.seeds + other.seeds, self.returns + other.returns,
                              a if a is not None else b, weights, speeds)


def resolve_recording(path: str | Path) -> Path:
    """The dataset folder of a recording given as a folder or as a Minari dataset id.

    Tried in order: ``path`` as a folder (the dataset folder or its ``data/``); then, when ``path``
    reads as an id ``<namespace>/<name>-v<N>``, ``$MINARI_DATASETS_PATH/<id>``, ``recordings/<id>``
    below the working directory, and the repository's ``recordings/<id>``.

    Raises:
        RecordingError: nothing found; the message lists where it looked.
    """
    p = Path(path)
    if p.exists():
        return p.parent if p.name == "data" and (p / "metadata.json").is_file() else p
    tried = [str(p)]
    text = str(path).replace("\\", "/")
    if re.fullmatch(r"[-_\w]+(/[-_\w]+)*/[-_\w]+?-v\d+", text):
        roots = [Path(os.environ["MINARI_DATASETS_PATH"])] if os.environ.get("MINARI_DATASETS_PATH") else []
        roots += [Path("recordings"), RECORDINGS_DIR]
        for root in roots:
            if (root / text).exists():
                return root / text
            tried.append(str(root / text))
    raise RecordingError(f"recording {path} does not exist (looked at {', '.join(dict.fromkeys(tried))}; make one "
                         f"with `agent collect --out recordings/{NAMESPACE}/NAME-v0`)")


def _read_episodes(ds, metas: list, path: Path, as_actions):
    """The episodes of the open Minari dataset ``ds``, one at a time, as
    :class:`agent.data.frame_cache.EpisodeArrays` (the N_e frames that have actions, speeds NaN
    where none were recorded).

    Raises:
        RecordingError: an episode that cannot be read, or whose frames, actions and rewards disagree in length.
    """
    from agent.data.frame_cache import EpisodeArrays

    it = iter(ds.iterate_episodes())
    for meta in metas:
        try:
            ep = next(it)
            obs = np.asarray(ep.observations)
            act = as_actions(ep.actions)
            rewards = np.asarray(ep.rewards).reshape(-1)
            if len(obs) != len(act) + 1 or len(rewards) != len(act):
                raise RecordingError(
                    f"recording {path}, episode {ep.id}: {len(obs)} frames, {len(act)} actions and {len(rewards)} "
                    f"rewards disagree (an episode of N steps holds N + 1 frames, N actions and N rewards); the "
                    "recording is damaged: record it again with `agent collect`")
            infos = ep.infos if isinstance(ep.infos, dict) else {}
            speed = np.asarray(infos["speed"], dtype=np.float32).reshape(-1) if "speed" in infos else None
            speed = (speed[: len(act)] if speed is not None and len(speed) >= len(act)
                     else np.full(len(act), np.nan, np.float32))
            seed = int(meta.get("seed", -1)) if meta.get("seed") is not None else -1
        except RecordingError:
            raise
        except StopIteration:
            raise RecordingError(f"could not read recording {path}: fewer episodes than its metadata lists") from None
        except Exception as exc:
            raise RecordingError(f"could not read recording {path}: {type(exc).__name__}: {exc}") from exc
        yield EpisodeArrays(obs[: len(act)], act, seed, float(np.sum(rewards)), speed)


def _cached_episodes(ds, data: Path, path: Path, episodes, cache_dir, progress: bool):
    """(frames, actions, seeds, returns, speeds) of a recording from its frame cache, built first
    from ``episodes`` if missing; frames are read-only memory maps.

    Raises:
        RecordingError: the cache cannot be written or read (the message says what to do), or
            anything reading the episodes raises.
    """
    from agent.data.frame_cache import build_cache, read_episodes

    shape = tuple(getattr(ds.observation_space, "shape", None) or (96, 96, 3))
    try:
        npy, npz = build_cache(data, lambda: episodes, int(ds.total_steps), int(np.prod(shape)), cache_dir,
                               progress)
    except OSError as exc:
        raise RecordingError(f"cannot cache the frames of {path}: {exc.strerror or exc}"
                             f"{f' ({exc.filename})' if exc.filename else ''}") from exc
    try:
        got = read_episodes(npy, npz)
    except (OSError, ValueError) as exc:
        raise RecordingError(f"the frame cache of {path} cannot be read ({exc}): delete {npy} and {npz} to rebuild "
                             "it") from exc
    if got.speeds is None:
        raise RecordingError(f"the frame cache {npz} of {path} holds no speeds: delete {npy} and {npz} to rebuild it")
    return got.frames, got.actions, got.seeds, got.returns, got.speeds


#: how :func:`load_demonstrations` holds the frames
FRAME_MODES = ("memory", "mmap")


def load_demonstrations(path: str | Path | Sequence[str | Path], n_actions: int | None = 5, frames: str = "memory",
                        cache_dir: str | Path | None = None, progress: bool = True) -> Demonstrations:
    """Read every episode of one recording, or of several of the same kind.

    Args:
        path: the dataset folder (``recordings/nac-drive/sample-v0``, or its ``data/``), or a Minari
            dataset id (``nac-drive/sample-v0``) resolved by :func:`resolve_recording`; or a list
            of them, read in order and concatenated.
        n_actions: discrete recordings: actions must lie in [0, n_actions) (None: no check).
            Continuous recordings are checked against their own action space instead.
        frames: "memory": the frames are read into memory (27.6 KB a frame). "mmap": they are
            read-only memory maps of the recording's frame cache (:mod:`agent.data.frame_cache`,
            built on the first load, streamed episode by episode, then reused until the recording
            changes): memory holds only the frames being read. Labels, speeds and returns are
            the same either way.
        cache_dir: "mmap": the cache folder (None: :func:`agent.data.frame_cache.default_cache_dir`).
        progress: "mmap": a progress bar while a cache is built.

    Returns:
        :class:`Demonstrations`: per episode (N_e, 96, 96, 3) uint8 frames, the car's speed at
        each (``speeds``, units/s, from ``infos["speed"]``; NaN where a recording has none) and the actions, as
        the dataset's ``action_space`` says: a ``Discrete`` space gives (N_e,) int64 indices; a
        1-D ``Box`` of A values (the continuous configuration: A = 2, steering and throttle)
        gives (N_e, A) float32. ``action_space`` is set to the dataset's.

    Raises:
        RecordingError: the folder is missing, is not a Minari dataset, holds no episodes, has an
            action space that is neither Discrete nor a 1-D Box, holds an episode whose frames,
            actions and rewards disagree in length (N + 1 frames, N actions, N rewards), holds
            discrete actions outside [0, n_actions) or continuous actions that are not finite or
            lie outside the space's bounds; its ``metadata.json`` is empty or broken with no last
            good copy to restore (:func:`recover_metadata`, which restores one with a warning); or
            the recordings of a list mix discrete and continuous actions (or Boxes of different
            bounds); "mmap": a frame cache that cannot be written (a full disk: the message names
            the folder) or that does not match its index (delete it to rebuild). Nothing is
            returned half-read, and no half-built cache is left.
        ValueError: ``frames`` not one of :data:`FRAME_MODES`.
    """
    if frames not in FRAME_MODES:
        raise ValueError(f"frames must be one of {FRAME_MODES}, got {frames!r}")
    if not isinstance(path, (str, Path)):
        paths = list(path)
        if not paths:
            raise RecordingError("no recording given")
        parts = [(p, load_demonstrations(p, n_actions, frames, cache_dir, progress)) for p in paths]
        first_path, demos = parts[0]
        for p, part in parts[1:]:
            if part.action_space != demos.action_space:
                raise RecordingError(
                    f"cannot train on {first_path} and {p} together: {first_path} holds "
                    f"{describe_actions(demos.action_space)} actions, {p} holds "
                    f"{describe_actions(part.action_space)} actions (record both with the same kind of "
                    "expert: discrete, or continuous with `agent expert train --ppo.continuous`)")
            demos = demos.extend(part)
        return demos

    import gymnasium as gym
    from minari import MinariDataset

    path = resolve_recording(path)
    data = path / "data" if (path / "data").is_dir() else path
    if data.name == "data" and (data / HDF5_FILE).is_file():
        recover_metadata(data.parent)  # a metadata.json an interrupted write emptied: its last good copy
    if not (data / "metadata.json").is_file():
        raise RecordingError(f"{path} is not a Minari dataset (no data/metadata.json)")
    try:
        ds = MinariDataset(data)
        space = ds.action_space
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            def as_actions(a):  # (N, A) float32
                return np.asarray(a, dtype=np.float32).reshape(-1, space.shape[0])
        elif isinstance(space, gym.spaces.Discrete):
            def as_actions(a):  # (N,) int64
                return np.asarray(a).astype(np.int64).reshape(-1)
        else:
            raise RecordingError(f"{path} has actions in {space}; only Discrete and 1-D Box action spaces can "
                                 "be trained on")
        metas = list(ds.storage.get_episode_metadata(ds.episode_indices))
    except RecordingError:
        raise
    except Exception as exc:
        raise RecordingError(f"could not read recording {path}: {type(exc).__name__}: {exc}") from exc
    episodes = _read_episodes(ds, metas, path, as_actions)
    if frames == "mmap":
        frame_list, actions, seeds, returns, speeds = _cached_episodes(ds, data, path, episodes, cache_dir, progress)
    else:
        frame_list, actions, seeds, returns, speeds = [], [], [], [], []
        for ep in episodes:
            frame_list.append(ep.frames)
            actions.append(ep.actions)
            seeds.append(ep.seed)
            returns.append(ep.ret)
            speeds.append(ep.speeds)
    if not actions:
        raise RecordingError(f"recording {path} holds no episodes")
    if isinstance(space, gym.spaces.Box):
        low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
        for i, a in enumerate(actions):
            if not np.all(np.isfinite(a)):
                raise RecordingError(f"{path}: episode {i} has non-finite actions (NaN or inf)")
            if a.size and (np.any(a < low) or np.any(a > high)):
                raise RecordingError(f"{path}: episode {i} has actions outside the action space "
                                     f"[{low.tolist()}, {high.tolist()}] (min {a.min(0).tolist()}, "
                                     f"max {a.max(0).tolist()})")
    elif n_actions is not None:
        for i, a in enumerate(actions):
            if a.size and (a.min() < 0 or a.max() >= n_actions):
                raise RecordingError(f"{path}: episode {i} has actions outside 0..{n_actions - 1}")
    return Demonstrations(frame_list, actions, seeds, returns, space, speeds=speeds)
