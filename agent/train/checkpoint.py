"""Checkpoints of ``agent train``: one file in the run folder, rewritten atomically after every
epoch and every DAgger round, from which ``agent train --resume RUN_DIR`` continues the run.

``RUN_DIR/checkpoint.pt`` holds everything the rest of the run depends on, as tensors and plain
Python values (it is read with ``torch.load(weights_only=True)``: no code in a file ever runs):

- ``config``: the run's resolved config (the TOML text of ``RUN_DIR/config.toml``); ``what``:
  the point it was taken at, e.g. "bc epoch 2 of 3";
- ``stage``: ``"bc"`` (behaviour cloning in progress), ``"dagger"`` (behaviour cloning done,
  DAgger round ``round`` reached) or ``"done"`` (the policy file was written);
- ``fit``: the state of the :func:`agent.train.bc.fit` call in progress, or None: epochs done,
  whether it stopped early (time limit), the policy's weights, the optimizer's and the LR
  scheduler's state, the data loader's ``torch.Generator`` state, the best weights so far and
  their held-out metric;
- ``policy``: the policy's weights between two fits (after behaviour cloning, after a round);
- ``report``: the :class:`agent.train.bc.TrainReport` so far (epochs, best epoch, DAgger returns);
- ``rng``: torch's CPU (and CUDA) generator, numpy's global one, Python's ``random``, and
  DAgger's ``numpy.random.Generator`` (its bit generator's state);
- ``rounds``: DAgger's relabelled data, one pair of files per round, written once, atomically,
  when the round's rollouts end (:meth:`Checkpointer.save_round`): ``dagger-round-<r>.npy``, the
  frames (N, 96, 96, 3) uint8 back to back, and ``dagger-round-<r>.npz``, plain arrays (episode
  offsets, labels, seeds, returns, weights, speeds; read without pickle), the episode files of
  :mod:`agent.data.frame_cache`. The run trains on the round's frames memory-mapped from that
  ``.npy`` (so memory does not grow with the rounds), and the resumed run adds them back in order.
  The ``.npz`` also keeps each episode's executed actions and a digest of its frames
  (:class:`RoundReplay`): a run folder moved without its ``.npy`` files (a few MB instead of GBs)
  resumes, its frames replayed on the way (:func:`replay_round`, :mod:`agent.actors.replay`);
- ``elapsed``: seconds of training so far (the time limit counts them).

Every file is written to a hidden temporary file in the same folder and renamed over ``NAME``
(:func:`agent.atomic.write_atomic`: ``os.replace``, atomic on POSIX), so a kill, a Ctrl-C or a
full disk leaves the previous checkpoint whole and no temporary file behind. The pattern is the
usual one of training frameworks (e.g. PyTorch Lightning's ``last.ckpt``), with the RNG states
kept so that a resumed run gives the same weights, bit for bit, as one that was never stopped
(tests/test_train_resume.py).
"""
from __future__ import annotations

import io
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from agent.atomic import write_atomic
from agent.data.recordings import Demonstrations
from agent.log import get_logger

log = get_logger("agent.train.checkpoint")

#: the checkpoint's file name in the run folder
CHECKPOINT_NAME = "checkpoint.pt"
#: what a checkpoint file says it is
CHECKPOINT_KIND = "agent-train-checkpoint"
#: the layout version (a resumed run refuses another); 2: DAgger's rounds are .npy/.npz pairs, not .pt files
CHECKPOINT_VERSION = 2
#: the glob of DAgger's round data files in a run folder (every layout's)
ROUND_FILES = "dagger-round-*"


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, of another layout, or that does not fit the run.

    The message is one line and says what to do.
    """


def atomic_save(obj, path: str | Path, what: str = "checkpoint") -> Path:
    """``torch.save(obj)`` to ``path`` atomically: serialised in memory, written to a hidden
    temporary file in the same folder, flushed to disk (``fsync``), then renamed over ``path``
    (:func:`agent.atomic.write_atomic`).

    Args:
        obj: tensors and plain Python values (what ``torch.load(weights_only=True)`` reads back).
        path: the file to write (its folder is made).
        what: the file's role, for the error message.

    Returns:
        ``path``.

    Raises:
        OSError: the write failed (a full disk, a permission): one line that names ``what`` and
            says the previous file is kept; ``path`` is as it was and the temporary file is removed.
            Any other exception (a Ctrl-C inside the write) also removes the temporary file.
    """
    buf = io.BytesIO()  # serialised in memory first: torch's zip writer turns a full disk into a RuntimeError
    torch.save(obj, buf)
    return write_atomic(path, buf.getbuffer(), what=what, sync_folder=True)


def plain(x):
    """``x`` with numpy scalars made Python numbers and numpy arrays tensors, through dicts, lists
    and tuples (what ``torch.load(weights_only=True)`` reads back); tensors are kept as they are."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(plain(v) for v in x)
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


def rng_state(dagger_rng: np.random.Generator | None = None) -> dict:
    """The global random generators' states (and DAgger's), as tensors and plain values.

    Returns:
        ``{"torch": ByteTensor, "cuda": [ByteTensor per device], "numpy": {...}, "python": tuple,
        "dagger": dict or None}``.
    """
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "gauss": float(gauss)},
            "python": random.getstate(),
            "dagger": dagger_rng.bit_generator.state if dagger_rng is not None else None}


def restore_rng(state: dict) -> None:
    """Set the global generators from :func:`rng_state`'s dict (DAgger's is set by :mod:`agent.train.dagger`)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    random.setstate(state["python"])


def load_checkpoint(run_dir: str | Path) -> dict:
    """Read ``RUN_DIR/checkpoint.pt`` with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: no checkpoint there, an unreadable file, or one of another kind or layout.
    """
    path = Path(run_dir) / CHECKPOINT_NAME
    if not path.is_file():
        raise CheckpointError(f"{run_dir} holds no checkpoint ({CHECKPOINT_NAME}): the run stopped before its "
                              "first epoch ended, or this is not a run folder of `agent train`; start the run anew")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: torch raises several kinds
        raise CheckpointError(f"{path} cannot be read as a checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(state, dict) or state.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(f"{path} is not a checkpoint of `agent train`")
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path} has checkpoint layout {state.get('version')!r}; this version reads "
                              f"{CHECKPOINT_VERSION} only: start the run anew")
    return state


class Checkpointer:
    """Writes a run's checkpoints into its run folder (one process, or rank 0 alone writes).

    Args:
        run_dir: the run folder.
        config: the run's resolved config as TOML text (stored in every checkpoint).

    Attributes:
        path: ``RUN_DIR/checkpoint.pt``.
        saved: what the last checkpoint written holds, e.g. "bc epoch 2 of 3", or None before the first.
    """

    def __init__(self, run_dir: str | Path, config: str):
        self.run_dir, self.config = Path(run_dir), config
        self.path = self.run_dir / CHECKPOINT_NAME
        self.saved: str | None = None
        self._pending: tuple[dict, str] | None = None

    def save(self, what: str, dagger_rng: np.random.Generator | None = None, **state) -> None:
        """Write a checkpoint of ``state`` (the fields of the module's docstring) with the RNG states now.

        Args:
            what: a short description for the log and the resume message ("bc epoch 2 of 3").
            dagger_rng: DAgger's generator, when it exists.
            state: ``stage``, ``fit``, ``policy``, ``report``, ``rounds``, ``elapsed``, ...

        Raises:
            OSError: as :func:`atomic_save`; the previous checkpoint stays.
        """
        payload = {"kind": CHECKPOINT_KIND, "version": CHECKPOINT_VERSION, "config": self.config, "what": what,
                   "rng": rng_state(dagger_rng), **plain(state)}
        self._pending = (payload, what)  # rewritten by flush() if a Ctrl-C cuts this write
        atomic_save(payload, self.path)
        self._pending, self.saved = None, what

    def flush(self) -> None:
        """Write the checkpoint whose write was cut short (by a Ctrl-C), if any."""
        if self._pending is not None:
            payload, what = self._pending
            atomic_save(payload, self.path)
            self._pending, self.saved = None, what

    def finish(self, out: str, report: dict) -> None:
        """Mark the run finished (stage "done": ``--resume`` then refuses, naming ``out``) and delete
        DAgger's round data files, which only a resume reads.

        Raises:
            OSError: as :func:`atomic_save`.
        """
        self.save("the finished run", stage="done", out=out, report=report)
        for f in self.run_dir.glob(ROUND_FILES):
            if f.suffix in (".npy", ".npz", ".pt", ".tmp"):
                f.unlink(missing_ok=True)

    def save_round(self, r: int, demos: Demonstrations, replay: RoundReplay | None = None) -> str:
        """Write DAgger round ``r``'s relabelled episodes to ``RUN_DIR/dagger-round-<r>.npy`` (frames)
        and ``.npz`` (the rest; written last, it marks the pair complete); the ``.npz``'s file
        name, which :func:`load_round` takes.

        Args:
            demos: frames (N_e, H, W, C) uint8, actions, seeds, returns, and weights and speeds
                when given (both kept as given: None stays None).
            replay: what replays the round's frames (:class:`RoundReplay`), kept in the ``.npz``
                (a few bytes a step, with a digest of each episode's frames): then the ``.npy`` may
                be deleted and :func:`load_round` makes it again. None: the ``.npy`` is needed.

        Raises:
            OSError: a write failed (a full disk): one line that names the round; no file of the
                round and no temporary file is left.
        """
        from agent.data.frame_cache import EpisodeArrays, write_episodes

        stem = self.run_dir / f"dagger-round-{r}"
        weights, speeds = demos.weights, demos.speeds
        episodes = (EpisodeArrays(f, a, s, ret, None if speeds is None else speeds[i],
                                  None if weights is None else weights[i])
                    for i, (f, a, s, ret) in enumerate(zip(demos.frames, demos.actions, demos.seeds, demos.returns)))
        extra = replay.arrays(demos.frames) if replay is not None else {}
        try:
            write_episodes(stem.with_suffix(".npy"), stem.with_suffix(".npz"), episodes, **extra)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot write DAgger round {r}'s data ({exc.strerror or exc}); nothing was "
                                     "written", str(stem.with_suffix(".npy"))) from exc
        return stem.with_suffix(".npz").name


@dataclass(frozen=True)
class RoundReplay:
    """What replays a DAgger round's frames (:func:`agent.actors.replay.replay_frames`): the envs'
    configuration, the step limit and each episode's executed actions, in the order of the
    round's episodes. :meth:`Checkpointer.save_round` keeps it in the round's ``.npz`` as
    ``executed`` (the actions back to back, on the frames' offsets), ``frame_digests`` (one
    :func:`agent.actors.replay.frame_digest` per episode) and ``replay_envs`` (JSON text).

    Attributes:
        envs: :func:`agent.actors.replay.envs_fields` of the rollouts' ``CarRacingEnvs``.
        max_steps: the rounds' step limit (None: the env's).
        executed: per episode, its (N_e,) or (N_e, A) executed actions.
    """

    envs: dict
    max_steps: int | None
    executed: list

    def arrays(self, frames: list) -> dict:
        """The ``.npz`` arrays for the round whose episodes' frames are ``frames``.

        Raises:
            ValueError: an episode whose executed actions and frames differ in length.
        """
        from agent.actors.replay import frame_digest

        if len(self.executed) != len(frames) or any(len(a) != len(f) for a, f in zip(self.executed, frames)):
            raise ValueError("RoundReplay.executed needs one action per frame of each episode")
        executed = np.concatenate([np.asarray(a) for a in self.executed]) if self.executed else np.zeros(0, np.int64)
        return {"executed": executed, "frame_digests": np.asarray([frame_digest(f) for f in frames]),
                "replay_envs": np.asarray(json.dumps({**self.envs, "max_steps": self.max_steps}))}


def _read_index(npz: Path) -> dict:
    """A round's ``.npz`` arrays (read without pickle)."""
    with np.load(npz, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def replay_round(run_dir: str | Path, name: str, n_envs: int = 2) -> Path:
    """Make a DAgger round's frames file (``.npy``) again from its ``.npz``: each episode replayed
    from its track's seed and executed actions (:func:`agent.actors.replay.replay_frames`), its
    frames checked against the digest taken when they were recorded, then written atomically.

    Args:
        run_dir: the run folder. name: the round's ``.npz`` file name (``dagger-round-<r>.npz``).
        n_envs: envs replaying at once when the round does not say how many it was recorded on.

    Returns:
        The ``.npy`` written.

    Raises:
        CheckpointError: the ``.npz`` is missing, unreadable, or holds no replay (a round written
            before replays were kept, or by the one-env path); or the replay does not reproduce
            the recorded frames (another gymnasium, Box2D or pygame build).
        OSError: the ``.npy`` cannot be written (nothing is left behind).
    """
    import shutil
    import tempfile

    from agent.actors.replay import ReplayError, replay_frames
    from agent.actors.vector import CarRacingEnvs
    from agent.data.frame_cache import EpisodeArrays, write_episodes

    npz = Path(run_dir) / name
    npy = npz.with_suffix(".npy")
    try:
        idx = _read_index(npz)
    except FileNotFoundError as exc:
        raise CheckpointError(f"the checkpoint needs DAgger's round data {npz}, which is gone; start the run anew") \
            from exc
    except Exception as exc:
        raise CheckpointError(f"{npz} cannot be read as DAgger round data ({type(exc).__name__}: {exc})") from exc
    if not {"executed", "frame_digests", "replay_envs"} <= set(idx):
        raise CheckpointError(f"{npy.name} is gone and {npz.name} keeps no executed actions to replay it from (a round "
                              "written before replays were kept): put the .npy back or start the run anew")
    off = idx["offsets"].tolist()
    spans = list(zip(off[:-1], off[1:]))
    cfg = json.loads(str(idx["replay_envs"]))
    max_steps = cfg.pop("max_steps")
    n_envs = cfg.pop("n", n_envs)  # the rollouts' own count when kept (each env then replays its own history)
    seeds = [int(s) for s in idx["seeds"]]
    executed = [idx["executed"][s:t] for s, t in spans]
    log.info("replaying DAgger round data %s: %d episodes, %d steps", npz.name, len(seeds), off[-1])
    try:
        frames = replay_frames(CarRacingEnvs(max(1, min(n_envs, len(seeds))), **cfg), seeds, executed,
                               max_steps=max_steps, digests=[str(d) for d in idx["frame_digests"]])
    except ReplayError as exc:
        raise CheckpointError(f"{npz.name} cannot be replayed: {exc}; put {npy.name} back or start the run anew") \
            from exc
    split = (lambda key: [idx[key][s:t] for s, t in spans] if key in idx else [None] * len(spans))
    episodes = (EpisodeArrays(f, a, s, ret, sp, w) for f, a, s, ret, sp, w in
                zip(frames, split("actions"), seeds, idx["returns"].tolist(), split("speeds"), split("weights")))
    tmp = Path(tempfile.mkdtemp(prefix=".replay-", dir=npz.parent))
    try:
        write_episodes(tmp / npy.name, tmp / npz.name, episodes)
        os.replace(tmp / npy.name, npy)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return npy


def load_round(run_dir: str | Path, name: str) -> Demonstrations:
    """One DAgger round's episodes written by :meth:`Checkpointer.save_round`, its frames read-only
    memory maps of the round's ``.npy`` (nothing but the index is read into memory). A round
    whose ``.npy`` is gone but whose ``.npz`` keeps the executed actions has its frames replayed
    first (:func:`replay_round`): a run folder copied without its ``*.npy`` files still resumes.

    Args:
        run_dir: the run folder. name: what :meth:`Checkpointer.save_round` returned (``dagger-round-<r>.npz``).

    Raises:
        CheckpointError: either file of the round is missing (the ``.npy`` with no replay kept),
            unreadable, does not match the other, or cannot be replayed.
    """
    from agent.data.frame_cache import read_episodes

    npz = Path(run_dir) / name
    npy = npz.with_suffix(".npy")
    if npz.is_file() and not npy.exists():
        replay_round(run_dir, name)
    try:
        got = read_episodes(npy, npz)
        return Demonstrations(got.frames, got.actions, got.seeds, got.returns, weights=got.weights,
                              speeds=got.speeds)
    except FileNotFoundError as exc:
        raise CheckpointError(f"the checkpoint needs DAgger's round data {npz} and {npy.name}, one of which is gone; "
                              "start the run anew") from exc
    except Exception as exc:
        raise CheckpointError(f"{npz} cannot be read as DAgger round data ({type(exc).__name__}: {exc})") from exc


__all__ = ["CHECKPOINT_NAME", "CHECKPOINT_VERSION", "CheckpointError", "Checkpointer", "ROUND_FILES", "RoundReplay",
           "atomic_save", "load_checkpoint", "load_round", "plain", "replay_round", "restore_rng", "rng_state"]
