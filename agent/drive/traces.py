"""NAC neuron traces: what the layer computed for the newest query, step after step.

Per control step the runner asks the policy for the NAC intermediates
(:class:`agent.nn.nac.NACIntermediates`, returned by the layer on request, never read out of its
submodules) and keeps, for the newest query of every head h and kept key k:

- phi (content-target gate, (0, 1)), omega (time-constant gate, > 0), the logit a = ODE solution
  of da/dt = -omega a + phi (docs/design.md section 3, items 5-6; paper Eqs. for NAC-Steady/Exact) and
  the attention weight (softmax over the kept keys), each also as the mean over the kept keys;
- the activity of the NCP neuron groups: sensory (the q, k, v gates, 3 * d_model neurons) and,
  per head and averaged over the kept keys, inter, command and motor neurons.

:class:`TraceHistory` holds the last few hundred steps for the live panel; :class:`TraceWriter`
streams every step of a run to disk in chunks (``--dump-traces``: HDF5, or a plain ``.npz`` made
from it at the end; memory flat over any length of drive), read back with :func:`load_traces`
(without pickle); :class:`TraceRecorder` keeps steps in memory for :func:`save_traces`; :func:`plot_traces` draws the
paper's Figure 4 view (omega and the logits against the action taken) with matplotlib, offline.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.actors.rollout import longest_run, standstill
from agent.atomic import save_figure, write_atomic
from agent.bounded import check_zip_sizes
from agent.drive.config import TRACE_SUFFIXES

#: the most bytes a .npz trace file's members may declare inflated (about 11 hours of drive with the
#: Grad-CAM map, 37 KB a step uncompressed): a small file that declares more is refused unread
MAX_NPZ_BYTES = 8 << 30
#: the most members of a .npz trace file (it holds about 40 arrays)
MAX_NPZ_MEMBERS = 256

#: The pair quantities kept per (head, kept key), in plotting order.
PAIR_QUANTITIES = ("phi", "omega", "logits", "weights")
#: The NCP neuron groups, in wiring order.
NEURON_GROUPS = ("sensory", "inter", "command", "motor")
TRACE_FORMAT = "nac-drive-traces"
TRACE_FORMAT_VERSION = 1


def masked_mean(x: np.ndarray, valid: np.ndarray, axis: int = -1) -> np.ndarray:
    """Mean of ``x`` over ``axis`` counting only entries where ``valid``; NaN where none is valid."""
    v = valid.astype(np.float64)
    n = v.sum(axis=axis)
    s = np.where(valid, x, 0.0).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / np.maximum(n, 1), np.nan)


@dataclass(frozen=True)
class StepTraces:
    """The NAC's newest query in one step (one rollout: batch element ``b``).

    Attributes:
        phi, omega, logits, weights, t_gate: (H, K) float32 per head and kept key (rank order of
            the top-k selection); undefined where ``valid`` is False.
        indices: (H, K) int64 key positions in the window (0 = oldest cached frame).
        valid: (H, K) bool, the kept key exists (fewer than K frames early in an episode).
        ages: (H, K) int64 frames between the key and the query (0 = the newest frame itself).
        neurons: ``sensory`` (3 * d_model,) and ``inter``/``command``/``motor`` (H, N_group),
            the latter averaged over the kept keys.

    Raises:
        ValueError: inconsistent shapes.
    """

    phi: np.ndarray
    omega: np.ndarray
    logits: np.ndarray
    weights: np.ndarray
    t_gate: np.ndarray
    indices: np.ndarray
    valid: np.ndarray
    ages: np.ndarray
    neurons: dict = field(default_factory=dict)

    def __post_init__(self):
        shape = self.phi.shape
        if len(shape) != 2:
            raise ValueError(f"pair traces must be (H, K), got phi {shape}")
        for name in ("omega", "logits", "weights", "t_gate", "indices", "valid", "ages"):
            if getattr(self, name).shape != shape:
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, phi has {shape}")

    @property
    def num_heads(self) -> int:
        return self.phi.shape[0]

    def mean(self, name: str) -> np.ndarray:
        """(H,) mean of ``name`` (phi, omega, logits, weights, t_gate) over each head's kept keys."""
        return masked_mean(getattr(self, name).astype(np.float64), self.valid)


def step_traces(inter, b: int = 0, query_pos: int | None = None, k: int | None = None) -> StepTraces:
    """Pull the newest query's traces out of :class:`agent.nn.nac.NACIntermediates` (batch element ``b``).

    Args:
        inter: intermediates of ``NAC.step`` (T = 1) or ``NAC.forward`` (the last position is used);
            pair tensors (B, H, T, K), ``neurons["sensory"]`` (B, T, 3 d_model), the other groups
            (B, H, T, K, N_group).
        b: the batch element.
        query_pos: the newest query's position among the keys (the cache length - 1 after
            ``NAC.step``, T - 1 after ``forward``); None: the newest kept key's position.
        k: pad the key axis to this many (the layer's top-k): early in an episode the layer keeps
            fewer keys than K, and padded entries are invalid. None: as returned.
    """
    def last(x):
        return x[b, :, -1].detach().cpu().numpy()

    valid = last(inter.valid).astype(bool)
    idx = last(inter.indices).astype(np.int64)
    # the query is the newest position; its position in the window is the largest valid index
    if query_pos is None:
        query_pos = int(inter.indices[b, :, -1].masked_fill(~inter.valid[b, :, -1], -1).max().item())
    qpos = int(query_pos)
    n = inter.neurons
    neurons = {}
    if "sensory" in n:
        neurons["sensory"] = n["sensory"][b, -1].detach().cpu().numpy().astype(np.float32)
    for g in ("inter", "command", "motor"):
        if g in n:
            x = n[g][b, :, -1].detach().cpu().numpy().astype(np.float64)  # (H, K, N)
            v = valid[..., None]
            cnt = np.maximum(v.sum(1), 1)
            neurons[g] = (np.where(v, x, 0.0).sum(1) / cnt).astype(np.float32)  # (H, N)
    pair = {name: last(getattr(inter, name)).astype(np.float32) for name in (*PAIR_QUANTITIES, "t_gate")}
    pair["indices"], pair["valid"] = idx, valid
    pair["ages"] = np.where(valid, qpos - idx, -1).astype(np.int64)
    kk = valid.shape[-1]
    if k is not None and kk < k:
        fill = {"indices": 0, "valid": False, "ages": -1}
        pair = {name: np.concatenate([a, np.full((a.shape[0], k - kk), fill.get(name, np.nan), a.dtype)], 1)
                for name, a in pair.items()}
    return StepTraces(**pair, neurons=neurons)


class TraceHistory:
    """Ring buffer of the last ``length`` steps of traces, for the live panel.

    Arrays are laid out oldest first when read with :meth:`view`. Per step it stores every head,
    so cycling the shown head redraws from history at once. Each step is written twice, at slots
    i and i + ``length`` of a buffer twice as long, so the last ``length`` steps are always one
    contiguous slice: :meth:`view` returns it without copying (the panel reads the history about
    twenty times per frame).

    Args:
        length: steps kept (the panel draws one pixel column per step).
    """

    def __init__(self, length: int = 360):
        if length < 2:
            raise ValueError(f"length must be >= 2, got {length}")
        self.length = int(length)
        self._data: dict[str, np.ndarray] | None = None
        self._n = 0  # steps pushed since clear()
        self._head = 0  # next write slot

    def clear(self) -> None:
        """Forget every step (a new episode starts)."""
        self._n, self._head = 0, 0

    def __len__(self) -> int:
        return min(self._n, self.length)

    @property
    def pushed(self) -> int:
        """Steps pushed since the last :meth:`clear` (keeps counting past ``length``)."""
        return self._n

    def _alloc(self, tr: StepTraces) -> None:
        L2 = 2 * self.length
        H, K = tr.phi.shape
        d = {name: np.full((L2, H, K), np.nan, np.float32) for name in PAIR_QUANTITIES}
        d["ages"] = np.full((L2, H, K), -1, np.int64)
        d["action_class"] = np.zeros(L2, np.int64)
        for g, x in tr.neurons.items():
            d["neuron_" + g] = np.zeros((L2, *x.shape), np.float32)
        self._data = d

    def push(self, tr: StepTraces, action_class: int) -> None:
        """Append one step's traces and the class of the action taken (colours the plots)."""
        if self._data is None or self._data["phi"].shape[1:] != tr.phi.shape:
            self._alloc(tr)
        d, i = self._data, self._head
        both = [i, i + self.length]  # the slot and its mirror
        for name in PAIR_QUANTITIES:
            d[name][both] = np.where(tr.valid, getattr(tr, name), np.nan)
        d["ages"][both] = tr.ages
        d["action_class"][both] = int(action_class)
        for g, x in tr.neurons.items():
            key = "neuron_" + g
            if key in d and d[key].shape[1:] == x.shape:
                d[key][both] = x
        self._head = (i + 1) % self.length
        self._n += 1

    def view(self, name: str) -> np.ndarray:
        """The stored steps of ``name`` (a pair quantity, "ages", "action_class" or "neuron_<group>"),
        oldest first: (n, ...) with n = len(self). A read-only view into the buffer, valid until the next push."""
        if self._data is None or name not in self._data:
            raise KeyError(f"no trace {name!r} recorded")
        n = len(self)
        a = self._data[name]
        out = a[:n] if self._n <= self.length else a[self._head:self._head + self.length]
        out = out.view()
        out.flags.writeable = False
        return out

    def by_age(self, name: str, head: int, max_age: int) -> np.ndarray:
        """(n, max_age) values of pair quantity ``name`` for ``head``, column j = the key j frames old."""
        vals, ages = self.view(name)[:, head], self.view("ages")[:, head]  # (n, K)
        out = np.full((vals.shape[0], max_age), np.nan, np.float32)
        rows, cols = np.nonzero((ages >= 0) & (ages < max_age))
        out[rows, ages[rows, cols]] = vals[rows, cols]
        return out

    def mean(self, name: str, head: int) -> np.ndarray:
        """(n,) mean of ``name`` over the kept keys of ``head`` at each stored step."""
        v = self.view(name)[:, head]
        return masked_mean(np.nan_to_num(v), np.isfinite(v))


def action_number(action) -> float:
    """An action as the one number the trace file keeps: the discrete index, or the first component
    of a continuous action (the normalised steering, +1 = full right)."""
    return float(np.asarray(action, dtype=np.float64).reshape(-1)[0])


#: Steps kept in memory before :class:`TraceWriter` appends them to its file: about 55 KB a step with
#: a 96x96 Grad-CAM map, so 14 MB at most, whatever the length of the drive.
CHUNK_STEPS = 256
#: The HDF5 layout's version (attribute ``h5_layout``); the arrays :func:`load_traces` returns are
#: :data:`TRACE_FORMAT_VERSION`'s whatever the container.
H5_LAYOUT = 1
_H5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: The per-step scalars as stored: name -> (dtype, value for "unknown"). ``off_road`` is -1 (unknown),
#: 0 or 1; ``teacher_class`` -1 where the step had no teacher's label; ``speed`` NaN where unknown.
_SCALARS = {"action": (np.float64, np.nan), "action_class": (np.int64, 0), "reward": (np.float64, np.nan),
            "episode": (np.int64, 0), "step": (np.int64, 0), "time_s": (np.float64, np.nan),
            "speed": (np.float32, np.nan), "off_road": (np.int8, -1), "teacher_action": (np.float64, np.nan),
            "teacher_class": (np.int64, -1)}
#: HDF5 chunks of the per-step arrays hold about this many bytes (HDF5's advice: 10 KB to 1 MB).
_H5_CHUNK_BYTES = 1 << 20


def _row(tr: StepTraces | None, *, action: float, action_class: int, reward: float, episode: int, step: int,
         time_s: float, speed: float = float("nan"), off_road: bool | None = None,
         cam: np.ndarray | None = None, teacher: tuple[float, int] | None = None) -> dict:
    """One step as the trace writers keep it: the (H, K) and neuron arrays (none when ``tr`` is None: a
    policy without a NAC core), the scalars of :data:`_SCALARS` (unknowns encoded) and ``cam`` (an (H, W)
    float32 array or None)."""
    row = {}
    if tr is not None:
        row = {name: getattr(tr, name) for name in (*PAIR_QUANTITIES, "t_gate", "indices", "valid", "ages")}
        row.update({"neuron_" + g: x for g, x in tr.neurons.items()})
    row.update(action=float(action), action_class=int(action_class), reward=float(reward), episode=int(episode),
               step=int(step), time_s=float(time_s), speed=float(speed),
               off_road=-1 if off_road is None else int(bool(off_road)),
               teacher_action=np.nan if teacher is None else float(teacher[0]),
               teacher_class=-1 if teacher is None else int(teacher[1]),
               cam=None if cam is None else np.asarray(cam, np.float32))
    return row


class TraceRecorder:
    """Every step of a run, in memory: written by :func:`save_traces`. For short runs and tests;
    ``drive --dump-traces`` streams to disk with :class:`TraceWriter` instead (its memory stays flat).

    A step of a policy without a NAC core is recorded with ``tr`` None: its actions, rewards, stall
    figures, teacher labels and Grad-CAM map, without the NAC arrays.
    """

    def __init__(self):
        self.rows: list[dict] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, tr: StepTraces | None, *, action: float, action_class: int, reward: float, episode: int, step: int,
            time_s: float, speed: float = float("nan"), off_road: bool | None = None,
            cam: np.ndarray | None = None, teacher: tuple[float, int] | None = None) -> None:
        """Record one step: its traces (None for a policy without a NAC core), the action taken (an action index or normalised steering),
        the reward that followed, the 1-based episode and step, the frame time in seconds, the car's
        speed after the step (simulator units per second, NaN if unknown), whether all four wheels
        were off the road after it (None if unknown) and the step's Grad-CAM map, (H, W) float in
        [0, 1] over the raw frame (None if it was not computed) and the teacher's label of the state
        the step acted on, (action as one number, its class), from ``drive --teacher.expert`` (None without)."""
        self.rows.append(_row(tr, action=action, action_class=action_class, reward=reward, episode=episode, step=step,
                              time_s=time_s, speed=speed, off_road=off_road, cam=cam, teacher=teacher))


def _episode_blocks(step: np.ndarray) -> list[slice]:
    """The recorded episodes as slices of the step axis: a new one starts where ``step`` does not
    grow (step 1 after a finished or restarted episode)."""
    starts = [0] + [i for i in range(1, len(step)) if step[i] <= step[i - 1]]
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [len(step)])]


def _public_small(raw: dict[str, np.ndarray], meta: dict) -> dict[str, np.ndarray]:
    """The per-step scalars and strings of a trace file as :func:`load_traces` returns them, from the
    stored scalars (:data:`_SCALARS`, unknowns encoded) and the metadata (names, policy, env, teacher):
    ``speed``/``standstill``/``longest_standstill_steps`` only when every speed is known, ``off_road``/
    ``off_road_steps`` only when every step's is, the teacher's arrays only when every step has a label."""
    out = {k: np.asarray(raw[k], dtype) for k, (dtype, _) in _SCALARS.items()
           if k in ("action", "reward", "time_s", "action_class", "episode", "step")}
    blocks = _episode_blocks(out["step"])
    speed = np.asarray(raw["speed"], np.float32)
    if np.isfinite(speed).all():
        out["speed"], out["standstill"] = speed, standstill(speed)
        out["longest_standstill_steps"] = np.array([longest_run(out["standstill"][b]) for b in blocks], np.int64)
    off = np.asarray(raw["off_road"])
    if (off >= 0).all():
        out["off_road"] = off.astype(bool)
        out["off_road_steps"] = np.array([int(out["off_road"][b].sum()) for b in blocks], np.int64)
    if "speed" in out or "off_road" in out:
        out["episodes"] = np.array([out["episode"][b.start] for b in blocks], np.int64)
    if (np.asarray(raw["teacher_class"]) >= 0).all():
        out["teacher_action"] = np.asarray(raw["teacher_action"], np.float64)
        out["teacher_class"] = np.asarray(raw["teacher_class"], np.int64)
        out["teacher"] = np.array(meta.get("teacher", ""))
    out.update(action_names=np.array(list(meta.get("action_names", ())), dtype=str),
               class_names=np.array(list(meta.get("class_names", ())), dtype=str),
               policy=np.array(meta.get("policy", "")), env=np.array(meta.get("env", "")),
               format=np.array(TRACE_FORMAT), format_version=np.array(TRACE_FORMAT_VERSION))
    return out


def _check_suffix(path: Path) -> None:
    if path.suffix.lower() not in TRACE_SUFFIXES:
        raise ValueError(f"a trace file is HDF5 (.h5, .hdf5: streamed, readable after an interrupt) or .npz "
                         f"(converted at the end); give a path ending in one of them, got {str(path)!r}")


class TraceWriter:
    """Every step of a run streamed to disk (``drive --dump-traces``): memory stays flat however long the drive.

    Steps are kept in memory :data:`CHUNK_STEPS` at a time, then appended to an HDF5 file (h5py,
    which the project has through Minari) and the file is flushed; its attribute ``steps`` counts
    the steps written whole, so a file whose process was killed still reads back (with
    :func:`load_traces`, to the last flushed chunk). The file is created at the first step (a run
    that records nothing leaves no file). :meth:`close` writes the rest and marks the file complete.

    For a ``.h5``/``.hdf5`` path the steps go straight there. For a ``.npz`` path they go to
    ``PATH.partial.h5`` beside it, which :meth:`close` converts into the ``.npz`` (array by array,
    chunk by chunk: memory stays flat) and removes; after a kill the ``.partial.h5`` is what is left.

    HDF5 layout (:data:`H5_LAYOUT`): one dataset per step array, first axis the step (resizable,
    chunked): the :class:`StepTraces` arrays, ``neuron_<group>``, ``cam`` (NaN rows where Grad-CAM
    was off; created at the first map; LZF-compressed, about 10 KB a 96x96 map) and the scalars of :data:`_SCALARS` with their unknowns
    encoded; attributes ``format``, ``h5_layout``, ``steps``, ``complete``, ``policy``, ``env``,
    ``teacher`` and ``action_names``/``class_names`` (JSON lists). :func:`load_traces` turns it into
    the arrays documented in :func:`save_traces`.

    Args:
        path: the file to write (.h5, .hdf5 or .npz; its folder is created).
        action_names, class_names, policy, env, teacher: stored as in :func:`save_traces`.
        chunk_steps: steps buffered before each append (>= 1).
        overwrite: replace an existing ``path`` (and ``PATH.partial.h5``).

    Raises:
        ValueError: another suffix, or ``chunk_steps`` < 1.
        FileExistsError: ``path`` or the ``.partial.h5`` beside a ``.npz`` exists and not ``overwrite``.
    """

    def __init__(self, path: str | Path, *, action_names: tuple[str, ...] = (), class_names: tuple[str, ...] = (),
                 policy: str = "", env: str = "", teacher: str = "", chunk_steps: int = CHUNK_STEPS,
                 overwrite: bool = False):
        path = Path(path)
        _check_suffix(path)
        if int(chunk_steps) < 1:
            raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}")
        self.path = path
        self.npz = path.suffix.lower() == ".npz"
        #: the HDF5 file the steps stream to: ``path`` itself, or ``PATH.partial.h5`` for a .npz
        self.h5_path = path.with_name(path.name + ".partial.h5") if self.npz else path
        for p in dict.fromkeys((path, self.h5_path)):
            if p.exists() and not overwrite:
                what = " (left by an interrupted drive: read it with load_traces, or delete it)" if p != path else ""
                raise FileExistsError(f"{p} already exists{what}; choose another path or pass --overwrite")
        self.chunk_steps = int(chunk_steps)
        self.meta = dict(action_names=[str(n) for n in action_names], class_names=[str(n) for n in class_names],
                         policy=str(policy), env=str(env), teacher=str(teacher))
        self._rows: list[dict] = []
        self._file = None
        self._committed = 0
        self._closed = False
        self._result: Path | None = None

    def __len__(self) -> int:
        """Steps added so far (written or buffered)."""
        return self._committed + len(self._rows)

    @property
    def buffered(self) -> int:
        """Steps held in memory, not yet in the file (at most ``chunk_steps``)."""
        return len(self._rows)

    @property
    def written(self) -> int:
        """Steps in the file, flushed (what a reader gets if the process dies now)."""
        return self._committed

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, tr: StepTraces | None, *, action: float, action_class: int, reward: float, episode: int, step: int,
            time_s: float, speed: float = float("nan"), off_road: bool | None = None,
            cam: np.ndarray | None = None, teacher: tuple[float, int] | None = None) -> None:
        """Record one step (the arguments of :meth:`TraceRecorder.add`); every ``chunk_steps`` steps
        the buffer is appended to the file and flushed.

        Raises:
            RuntimeError: the writer is closed.
            ValueError: a step whose arrays have other shapes than the first step's.
            OSError: the file cannot be written (a full disk: the steps flushed before stay readable).
        """
        self._add_row(_row(tr, action=action, action_class=action_class, reward=reward, episode=episode, step=step,
                           time_s=time_s, speed=speed, off_road=off_road, cam=cam, teacher=teacher))

    def _add_row(self, row: dict) -> None:
        if self._closed:
            raise RuntimeError(f"the trace writer of {self.path} is closed")
        self._rows.append(row)
        if len(self._rows) >= self.chunk_steps:
            self.flush()

    def flush(self) -> None:
        """Append the buffered steps to the file and flush it (nothing to do when none is buffered)."""
        if self._rows:
            self._append(self._rows)
            self._rows = []

    def _open(self, first: dict):
        import h5py

        self.h5_path.parent.mkdir(parents=True, exist_ok=True)
        f = h5py.File(self.h5_path, "w")
        f.attrs.update(format=TRACE_FORMAT, h5_layout=H5_LAYOUT, steps=0, complete=False, policy=self.meta["policy"],
                       env=self.meta["env"], teacher=self.meta["teacher"],
                       action_names=json.dumps(self.meta["action_names"]),
                       class_names=json.dumps(self.meta["class_names"]))
        for name, x in first.items():
            if isinstance(x, np.ndarray) and name != "cam":
                self._create(f, name, x.shape, x.dtype)
        for name, (dtype, fill) in _SCALARS.items():
            self._create(f, name, (), np.dtype(dtype), fill)
        return f

    def _create(self, f, name: str, shape: tuple, dtype, fill=None, compression: str | None = None):
        """A resizable dataset of steps of ``shape``, in HDF5 chunks of about :data:`_H5_CHUNK_BYTES` that
        tile the appends of ``chunk_steps`` steps (a divisor or a multiple of it: no chunk is rewritten)."""
        row_bytes = max(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, 1)
        rows = max(1, min(self.chunk_steps * 16, _H5_CHUNK_BYTES // row_bytes))
        if rows < self.chunk_steps:
            rows = max(d for d in range(1, rows + 1) if self.chunk_steps % d == 0)
        else:
            rows -= rows % self.chunk_steps
        return f.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=dtype,
                                chunks=(rows, *shape), fillvalue=fill, compression=compression)

    def _append(self, rows: list[dict]) -> None:
        """Write ``rows`` after the committed steps, then commit them (``steps``) and flush the file.

        Idempotent until it returns: an interrupt in the middle (Ctrl-C) leaves the committed steps
        as they were, and the next flush or :meth:`close` writes the same rows again.
        """
        if self._file is None:
            self._file = self._open(rows[0])
        f, start = self._file, self._committed
        end = start + len(rows)
        for name, x in rows[0].items():
            if not isinstance(x, np.ndarray) or name == "cam":
                continue
            ds = f[name]
            block = np.stack([r[name] for r in rows])
            if block.shape[1:] != ds.shape[1:] or block.dtype != ds.dtype:
                raise ValueError(f"trace {name!r} of this step is {block.shape[1:]} {block.dtype}, the file's is "
                                 f"{ds.shape[1:]} {ds.dtype} (the policy changed within one dump?)")
            ds.resize(end, axis=0)
            ds[start:end] = block
        for name, (dtype, _) in _SCALARS.items():
            ds = f[name]
            ds.resize(end, axis=0)
            ds[start:end] = np.array([r[name] for r in rows], dtype)
        cams = [r["cam"] for r in rows]
        shape = next((c.shape for c in cams if c is not None), None)
        if shape is not None and "cam" not in f:
            # the steps before read as NaN (HDF5's fill value); LZF (h5py's own filter, about 0.25 ms a 96x96 map
            # here) keeps a quarter of the bytes: the map is 0 outside the region the CNN sees
            self._create(f, "cam", shape, np.float32, np.nan, compression="lzf")
        if "cam" in f:
            ds = f["cam"]
            if shape is not None and shape != ds.shape[1:]:
                raise ValueError(f"a Grad-CAM map of shape {shape}, the file's are {ds.shape[1:]}")
            nan = np.full(ds.shape[1:], np.nan, np.float32)
            ds.resize(end, axis=0)
            ds[start:end] = np.stack([nan if c is None else c for c in cams])
        f.attrs["steps"] = end
        f.flush()
        self._committed = end

    def close(self) -> Path | None:
        """Write the buffered steps, mark the file complete and close it; for a ``.npz`` path, convert
        the ``.partial.h5`` into it and remove the ``.partial.h5``. Idempotent.

        Returns:
            The file written, or None when no step was recorded (no file is left).

        Raises:
            OSError: the file cannot be written (the steps flushed before stay readable in
                :attr:`h5_path`).
        """
        if self._closed:
            return self._result
        self._closed = True
        try:
            if self._rows:
                self._append(self._rows)
                self._rows = []
            if self._file is not None:
                self._file.attrs["complete"] = True
        finally:
            f, self._file = self._file, None
            if f is not None:
                f.close()
        if f is None:
            return None
        if self.npz:
            _h5_to_npz(self.h5_path, self.path)
            self.h5_path.unlink()
        self._result = self.path
        return self.path


def _h5_meta(attrs) -> dict:
    return dict(action_names=json.loads(attrs.get("action_names", "[]")),
                class_names=json.loads(attrs.get("class_names", "[]")), policy=str(attrs.get("policy", "")),
                env=str(attrs.get("env", "")), teacher=str(attrs.get("teacher", "")))


def _per_step_arrays(f) -> list[str]:
    """The names of an HDF5 trace file's big per-step datasets (the traces, neurons and cam)."""
    return [name for name in f if name not in _SCALARS]


def _h5_to_npz(src: Path, dst: Path, rows: int = CHUNK_STEPS) -> None:
    """Convert the HDF5 trace file ``src`` into the .npz ``dst`` (written atomically with
    :func:`agent.atomic.write_atomic`: a synced temporary file renamed over ``dst``), copying each
    array ``rows`` steps at a time into its ``.npy`` member (deflated), so memory stays flat for
    any length of file."""
    import zipfile

    import h5py

    def write(out) -> None:
        with h5py.File(src, "r") as f, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as z:
            steps = int(f.attrs["steps"])
            for name in _per_step_arrays(f):
                ds = f[name]
                header = {"descr": np.lib.format.dtype_to_descr(ds.dtype), "fortran_order": False,
                          "shape": (steps, *ds.shape[1:])}
                with z.open(name + ".npy", "w", force_zip64=True) as fp:
                    np.lib.format.write_array_header_1_0(fp, header)
                    for i in range(0, steps, rows):
                        fp.write(np.ascontiguousarray(ds[i:min(i + rows, steps)]).tobytes())
            small = _public_small({k: f[k][:steps] for k in _SCALARS}, _h5_meta(f.attrs))
            for name, a in small.items():
                with z.open(name + ".npy", "w", force_zip64=True) as fp:
                    np.lib.format.write_array(fp, np.asanyarray(a), allow_pickle=False)

    write_atomic(dst, write, what="trace file")


def save_traces(path: str | Path, recorder: TraceRecorder, *, action_names: tuple[str, ...], class_names: tuple[str, ...],
                policy: str = "", env: str = "", teacher: str = "", overwrite: bool = False) -> Path:
    """Write the steps of an in-memory :class:`TraceRecorder` to ``path`` (.npz, or .h5/.hdf5),
    through :class:`TraceWriter` (a path with another suffix gets ``.npz`` appended).

    Arrays, as :func:`load_traces` returns them (S steps, H heads, K kept keys), for a policy with a NAC
    core (absent for any other; :func:`has_nac_traces`): ``phi``, ``omega``,
    ``logits``, ``weights``, ``t_gate`` (S, H, K) float32; ``indices``, ``ages`` (S, H, K) int64;
    ``valid`` (S, H, K) bool; ``neuron_sensory`` (S, 3 d_model), ``neuron_inter``/``command``/``motor``
    (S, H, N). For every policy: ``action`` (S,) float (an action index or normalised steering), ``action_class`` (S,)
    int, ``reward`` (S,), ``episode`` and ``step`` (S,) int (1-based), ``time_s`` (S,) seconds; and
    the strings ``action_names``, ``class_names``, ``policy``, ``env``, ``format``.

    Grad-CAM: ``cam`` (S, H_frame, W_frame) float32 in [0, 1], each step's map at the raw frame's
    resolution (96 x 96 for CarRacing), 0 outside the region the CNN sees and NaN on steps where
    Grad-CAM was switched off (key S); absent when it never ran (``--no-saliency``, ``--no-overlay``,
    a policy without a convolution).

    Stalls (see :class:`agent.actors.rollout.Episode`), where the env reports them (CarRacing; absent for
    Udacity): per step ``speed`` (S,) float32, the car's speed after the step in simulator units per
    second, ``standstill`` (S,) bool (``speed`` below :data:`agent.actors.rollout.STANDSTILL_SPEED`) and
    ``off_road`` (S,) bool (all four wheels off the road after the step); per recorded episode E
    (a restarted episode counts again): ``episodes`` (E,) its 1-based number, ``longest_standstill_steps``
    and ``off_road_steps`` (E,) int64.

    Teacher (``drive --teacher.expert``; absent without it): ``teacher_action`` (S,) float64, the expert's
    action for the state each step acted on (an action index or normalised steering),
    ``teacher_class`` (S,) int64 (the class ``action_class`` is compared with) and the string
    ``teacher``, the expert's file name.

    Raises:
        ValueError: nothing was recorded.
        FileExistsError: ``path`` exists and not ``overwrite``.
    """
    if not len(recorder):
        raise ValueError("no step was recorded (no step ran)")
    path = Path(path)
    if path.suffix.lower() not in TRACE_SUFFIXES:
        path = path.with_name(path.name + ".npz")
    with TraceWriter(path, action_names=action_names, class_names=class_names, policy=policy, env=env,
                     teacher=teacher, overwrite=overwrite) as writer:
        for row in recorder.rows:
            writer._add_row(row)
    return path


def _load_h5(path: Path) -> dict[str, np.ndarray]:
    import h5py

    try:
        with h5py.File(path, "r") as f:
            if str(f.attrs.get("format", "")) != TRACE_FORMAT:
                raise ValueError(f"{path} is not a NAC trace file of this project (written by drive --dump-traces)")
            steps = int(f.attrs.get("steps", 0))
            complete = bool(f.attrs.get("complete", False))
            missing = [k for k in _SCALARS if k not in f]
            if missing:
                raise ValueError(f"{path} lacks the arrays {', '.join(missing)}")
            data = {name: f[name][:steps] for name in _per_step_arrays(f)}
            data.update(_public_small({k: f[k][:steps] for k in _SCALARS}, _h5_meta(f.attrs)))
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not a readable HDF5 trace file: {type(exc).__name__}: {exc}") from exc
    if not steps:
        raise ValueError(f"{path} holds no complete chunk of steps (the drive was killed before its first flush)")
    if not complete:
        warnings.warn(f"{path} was not closed (the drive was killed?): read its first {steps} steps, the last "
                      f"chunk flushed", stacklevel=3)
    return data


def load_traces(path: str | Path) -> dict[str, np.ndarray]:
    """Read a trace file written by ``drive --dump-traces`` (:class:`TraceWriter`, :func:`save_traces`):
    HDF5 (also a ``.partial.h5`` or a file whose drive was killed: its flushed steps, with a warning)
    or .npz (no pickle). The container is told by its first bytes, not by the suffix.

    Returns:
        The arrays documented in :func:`save_traces`, in memory.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a trace file of this project, or arrays missing or of mismatched lengths;
            :class:`agent.bounded.ZipMemberTooLarge` (a ValueError): a .npz whose members declare
            more than :data:`MAX_NPZ_BYTES` inflated, or more than :data:`MAX_NPZ_MEMBERS` members.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file {path} does not exist (write one with drive --dump-traces)")
    with open(path, "rb") as fh:
        magic = fh.read(len(_H5_SIGNATURE))
    if magic == _H5_SIGNATURE:
        data = _load_h5(path)
    else:
        check_zip_sizes(path, path, MAX_NPZ_BYTES, MAX_NPZ_MEMBERS)  # before numpy inflates anything
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
        except Exception as exc:
            raise ValueError(f"{path} is not a readable .npz trace file: {type(exc).__name__}: {exc}") from exc
        if str(data.get("format", "")) != TRACE_FORMAT:
            raise ValueError(f"{path} is not a NAC trace file of this project (written by drive --dump-traces)")
    need = ("action", "action_class", "reward", "step", "episode")
    if has_nac_traces(data):  # a NAC policy's file: its traces whole
        need = (*PAIR_QUANTITIES, "valid", *need)
    missing = [k for k in need if k not in data]
    if missing:
        raise ValueError(f"{path} lacks the arrays {', '.join(missing)}")
    S = data["action"].shape[0]
    bad = [k for k in need if data[k].shape[0] != S]
    if bad:
        raise ValueError(f"{path}: arrays {', '.join(bad)} do not have {S} steps like action")
    return data


def has_nac_traces(data: dict) -> bool:
    """Whether a trace file's arrays hold NAC traces (``phi`` and the rest), not only the steps of a policy
    without a NAC core (any one of them present counts: :func:`load_traces` then requires them all)."""
    return any(k in data for k in (*PAIR_QUANTITIES, "valid"))


#: Colours of the action classes (matplotlib and the live panel share them), RGB 0..255.
CLASS_COLORS = ((150, 150, 160), (70, 140, 255), (255, 90, 80), (90, 210, 110), (250, 190, 60), (200, 110, 240))


def plot_traces(path: str | Path, out: str | Path, head: int | None = None, size: tuple[int, int] = (1600, 1000),
                dpi: int = 100) -> Path:
    """Figure-4-style PNG of a trace file: omega, logits, phi and attention over the run, by action.

    Left column: the mean over kept keys (of ``head``, or over all heads) against the step, one
    dot per step coloured by the action taken; for the attention weights (whose mean over the
    kept keys is 1/K by construction) the weight on the newest frame. Right column: the distribution of each quantity
    per action class (box plots), the way the paper's Figure 4 reads omega and the logits against
    left, straight and right.

    Args:
        path: a trace file (``drive --dump-traces``).
        out: the PNG to write; exactly ``size`` pixels (width, height).
        head: the head to plot (0-based), or None for the mean over heads.

    Raises:
        FileNotFoundError, ValueError: see :func:`load_traces`; ``head`` out of range.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_traces(path)
    if not has_nac_traces(data):
        raise ValueError(f"{path} holds no NAC traces (its policy, {str(data.get('policy', '')) or 'unnamed'}, has no "
                         f"NAC core): only the steps' actions, speeds and labels; nothing to plot here")
    H = data["phi"].shape[1]
    if head is not None and not 0 <= head < H:
        raise ValueError(f"--head must be in 0..{H - 1} (the policy has {H} heads), got {head}")
    valid = data["valid"]
    classes = data["action_class"]
    class_names = [str(c) for c in data.get("class_names", np.array([]))] or [str(c) for c in np.unique(classes)]
    x = np.arange(len(classes))
    fig, axes = plt.subplots(4, 2, figsize=(size[0] / dpi, size[1] / dpi), dpi=dpi,
                             gridspec_kw={"width_ratios": [3, 1]}, sharex="col")
    labels = {"omega": "omega (time-constant gate)", "logits": "logit a (ODE solution)",
              "phi": "phi (content gate)", "weights": "weight on the newest frame"}
    for row, name in enumerate(("omega", "logits", "phi", "weights")):
        if name == "weights":  # the mean weight over kept keys is 1/K by construction: show the newest key's
            newest = valid & (data["ages"] == 0) if "ages" in data else valid
            per_head = np.where(newest, data[name], 0.0).sum(-1)  # (S, H)
        else:
            per_head = masked_mean(data[name].astype(np.float64), valid)  # (S, H)
        y = per_head[:, head] if head is not None else np.nanmean(per_head, axis=1)
        ax, bx = axes[row]
        for c in np.unique(classes):
            sel = classes == c
            color = np.array(CLASS_COLORS[int(c) % len(CLASS_COLORS)]) / 255
            label = class_names[int(c)] if int(c) < len(class_names) else str(c)
            ax.scatter(x[sel], y[sel], s=4, color=color, label=label)
        ax.set_ylabel(labels[name], fontsize=9)
        ax.grid(alpha=0.3)
        present = [int(c) for c in np.unique(classes)]
        groups = [y[(classes == c) & np.isfinite(y)] for c in present]
        bp = bx.boxplot(groups, showfliers=False, patch_artist=True)
        bx.set_xticks(range(1, len(present) + 1),
                      [class_names[c] if c < len(class_names) else str(c) for c in present], fontsize=8)
        for patch, c in zip(bp["boxes"], present):
            patch.set_facecolor(np.array(CLASS_COLORS[c % len(CLASS_COLORS)]) / 255)
        bx.grid(alpha=0.3)
    for e in np.unique(data["episode"])[1:]:  # episode boundaries
        for ax in axes[:, 0]:
            ax.axvline(int(np.argmax(data["episode"] == e)), color="k", lw=0.6, ls="--")
    axes[-1, 0].set_xlabel("step")
    axes[0, 0].legend(loc="upper right", markerscale=3, fontsize=8, ncol=len(np.unique(classes)))
    what = f"head {head}" if head is not None else f"mean over {H} heads"
    env = str(data.get("env", ""))
    fig.suptitle(f"NAC traces ({what}, mean over kept keys) - {str(data.get('policy', ''))} {env}, "
                 f"{len(classes)} steps", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, out, dpi=dpi, what="traces figure")  # no bbox_inches="tight": the size stays `size`


__all__ = ["CHUNK_STEPS", "CLASS_COLORS", "H5_LAYOUT", "NEURON_GROUPS", "PAIR_QUANTITIES", "StepTraces", "TRACE_SUFFIXES",
           "TraceHistory", "TraceRecorder", "TraceWriter", "action_number", "has_nac_traces", "load_traces", "masked_mean", "plot_traces", "save_traces", "step_traces"]
