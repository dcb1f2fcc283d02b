"""Time and peak memory of our NAC layer against torch's attention and LSTM and the authors' port.

Configuration: B=1, input_dim = d_model = 64, 4 heads, top-k 8, "exact" ODE mode, inference under
``torch.no_grad()`` on the CPU. The peers, measured in the same run:

- ``mha``: ``torch.nn.MultiheadAttention(64, 4, batch_first=True)`` with a causal mask (the same
  width and heads), given in its fastest form: the float additive mask of
  ``torch.nn.Transformer.generate_square_subsequent_mask`` with ``is_causal=True`` (torch's fused
  scaled-dot-product kernel). A boolean mask sends it down a slower path: 1.4 ms against 0.5 ms at
  T=256 and 39 ms against 4.4 ms at T=1024 (measured on the 2-core development CPU); this
  benchmark used that boolean mask before, which flattered our ratios at long T;
- ``lstm``: ``torch.nn.LSTM(64, 64, batch_first=True)``;
- ``torch-nac``: the authors' PyTorch port (below).

Ours runs with the exact top-k selector at the ``sizes`` and with the sub-quadratic "blocks"
selector at ``sizes`` and ``block_sizes``; MHA and LSTM at the ``sizes``; torch-nac at the
``sizes`` up to ``peer_max_T``. Two more measurements (issue 12's layer targets):

- training: forward plus backward of the sum of the outputs, B=8, T=256 (``train_T``), train mode,
  ours (exact selector) against MHA and LSTM;
- streaming: one :meth:`agent.nn.nac.NAC.step` with a cache of ``step_window`` frames (the newest
  query over the cached keys), p50 and p99 over ``step_count`` steps, against one LSTM step and
  MHA on the newest query over the same window;
- threads (``paired_threads``): ours (exact selector) and MHA side by side in one process, the
  forward at the ``sizes`` and forward + backward at ``train_T``, at one thread and at torch's
  default thread count (every core). Our kernels take torch's thread count
  (:mod:`agent.nn.nac_kernels`), so the default-thread rows show whether the layer keeps its ratio
  to MHA when both may use every core; the one-thread rows, measured the same way, sit beside them.

How it is measured
------------------
Every (model, T) runs in a fresh Python subprocess, so one run's allocations, caches and imports
cannot leak into another's numbers (the threads rows: one subprocess per (thread count, task, T),
holding both models, see below). In the subprocess: imports, model construction, the input
tensor and one run (forward, or forward + backward for the train rows) on one sequence's first 4
steps (it absorbs the one-time allocations: torch's, about 7 MB, and the tens of MB of Numba's JIT
loading our layer's compiled kernels, which would otherwise dominate short T) come first; then the resident-set high-water mark is reset (Linux ``/proc/self/clear_refs``
``5``) and the resident set size (RSS) is read; then ``WARMUP`` warm-up forwards and ``repeats`` timed
forwards run, each on a fresh input (the same sequence of inputs for every model: one input
repeated let the CPU's branch predictor learn our ranking's data-dependent branches, which made
our layer read about 10 % faster than on new data; MHA has no such branches). Time is the median
of the timed forwards (``time.perf_counter``). Peak memory is the
kernel's peak RSS during the forwards (``getrusage(RUSAGE_SELF).ru_maxrss``, which the reset
lowers too) minus the RSS before them, so it counts what the forward itself allocates.
``tracemalloc`` would not do: it sees only Python allocations, not torch's CPU tensors. Where the
reset is not possible, the plain ``ru_maxrss`` difference (after minus before the forwards) is
used and the row says so (``mem_method``); it can read low when imports peaked higher.

The peer: what the installed package holds
------------------------------------------
``torch-nac`` 0.0.2 (PyPI, by Waleed Razzaq) is installed on demand with
``pip install --no-deps --target ~/.cache/nac-drive/peers/torch-nac-0.0.2 torch-nac==0.0.2`` and
imported from there via ``sys.path``, so it never changes the project's environment. Its code
imports only ``torch``, ``numpy`` and ``ncps.wirings`` (``AutoNCP``); it declares ``ncps==1.0.1``,
the version this project already has, and nothing else (``--no-deps`` keeps pip from pulling
another torch; the benchmark refuses a target folder that contains its own ``torch``).

- The layer is ``torch_nac.NAC`` (``torch_nac/layers/neuronal_attention_circuit.py``; also
  exported as ``torch_nac.layers.NAC``). Signature: ``NAC(d_model, num_heads, topk=8,
  mode='exact', euler_steps=5, sparsity=0.5, delta_t=0.5, activation=None, dropout=0.0,
  tau_epsilon=1e-6, use_bias=True, use_riemann_sum=True, return_attention=False,
  return_sequences=False, return_cell_state=False, input_dim=None)``; ``forward(inputs,
  mask=None)`` with ``inputs`` = x, (x, t), (q, k, v) or (q, k, v, t).
- Used here as ``NAC(d_model=64, num_heads=4, topk=8, mode="exact", input_dim=64,
  return_sequences=True)`` in eval mode, called as ``peer(x)`` (q = k = v = x, no timestamps,
  no mask). ``return_sequences=True`` makes it return (B, T, d_model) like ours; its default
  returns only the last step but computes every step anyway. Sparsity 0.5 and dropout 0 are its
  defaults and match ours; its ``delta_t`` only affects its "euler" mode.
- It has a single selector, the square-root partition (blocks of floor(sqrt(T)) keys, K // block
  + 1 blocks per query, not causal), so it is closest to our "blocks" selector; the ratio against
  our exact selector is given as well.
- Its q, k, v projections are NCP recurrent cells unrolled by a Python loop over T (3 T tiny
  steps); its backbone is one recurrent NCP step from a zero state over the B H T K pairs.

The threads rows: one subprocess per (thread count, task, T) builds ours and MHA, runs each once on
a short input (the one-time allocations and loads), then ``WARMUP`` + ``repeats`` rounds; in each
round both models run once, in alternating order (ours first in even rounds), each call on a fresh
input (the same inputs for both models, drawn before the timing), so that both see the same state of
the machine (its load, its clock speed, the caches' warmth). Time is the median per model, by
``time.perf_counter`` (wall time: at several threads the measuring thread's CPU time would miss
the others'); no peak memory.

Entry points: :func:`bench_nac` (returns rows), :func:`print_table` (prints them), and
``agent bench nac`` (its options: :class:`agent.bench.config.BenchNac`) for a quick run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from agent.nn import nac_kernels
from agent.nn.nac import NAC

PEER_PACKAGE = "torch-nac"
PEER_VERSION = "0.0.2"
DEFAULT_PEER_DIR = Path("~/.cache/nac-drive/peers/torch-nac-0.0.2").expanduser()
PEER_KWARGS = dict(d_model=64, num_heads=4, topk=8, mode="exact", input_dim=64, return_sequences=True)
OURS_KWARGS = dict(input_dim=64, d_model=64, num_heads=4, topk=8, mode="exact")
#: "ours-torch" is our exact layer with its fused CPU kernels switched off (agent.nn.nac_kernels):
#: the torch path, for the kernels' speed-up measured in the same run
MODELS = ("ours-exact", "ours-torch", "ours-blocks", "mha", "lstm", "torch-nac")
#: untimed runs before the timed ones: torch's first calls at a new shape are slow (oneDNN and
#: the allocator warm up: MHA's first five forwards at T=256 took 3.6, 2.4, 2.2, 1.7, 1.8 ms, then
#: 1.3 ms), and our layer's first call loads its compiled kernels
WARMUP = 3
#: what a row measures: "forward" (B=1, no grad), "train" (forward + backward, B=8) or "step"
TASKS = ("forward", "train", "step")
TRAIN_BATCH = 8
ROW_KEYS = ("model", "task", "T", "B", "time_ms", "times_ms", "p99_ms", "repeats", "peak_mb", "mem_method",
            "threads", "clock", "load1", "error", "paired")
#: the models of the threads rows, measured together in one process (see the module docstring)
PAIRED_MODELS = ("ours-exact", "mha")
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_RESULT_TAG = "BENCH_RESULT "


# --------------------------------------------------------------------------------------------
# The peer package
# --------------------------------------------------------------------------------------------


def ensure_peer(peer_dir: str | Path | None = None, install: bool = True,
                timeout_s: float = 300.0) -> tuple[Path | None, str]:
    """Make ``torch-nac`` 0.0.2 importable from its own folder, installing it there if needed.

    Args:
        peer_dir: target folder (default ``~/.cache/nac-drive/peers/torch-nac-0.0.2``).
        install: run ``pip install --no-deps --target`` when the package is not there yet.
        timeout_s: limit for pip and for the import check.

    Returns:
        (folder, "") when ``torch_nac.NAC`` imports from the folder with the project's own torch,
        else (None, reason).
    """
    folder = Path(peer_dir).expanduser() if peer_dir else DEFAULT_PEER_DIR
    spec = f"{PEER_PACKAGE}=={PEER_VERSION}"
    if not (folder / "torch_nac" / "__init__.py").exists():
        if not install:
            return None, f"{spec} is not installed in {folder} (installing was turned off)"
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check",
               "--retries", "2", "--timeout", "30", "--target", str(folder), spec]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"could not install {spec}: {e}"
        if res.returncode != 0 or not (folder / "torch_nac" / "__init__.py").exists():
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            return None, f"could not install {spec} into {folder}: {' | '.join(tail) or 'pip failed'}"
    if (folder / "torch").exists():
        return None, f"{folder} holds its own torch; refusing to import from it (reinstall with --no-deps)"
    check = ("import sys, json; sys.path.insert(0, sys.argv[1]); import torch, torch_nac; "
             "from torch_nac import NAC; print(json.dumps([torch.__file__, torch_nac.__file__]))")
    try:
        res = subprocess.run([sys.executable, "-c", check, str(folder)], capture_output=True, text=True,
                             timeout=timeout_s, env=_child_env(0))
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"could not import torch_nac from {folder}: {e}"
    if res.returncode != 0:
        tail = res.stderr.strip().splitlines()[-1:] or ["unknown error"]
        return None, f"could not import torch_nac from {folder}: {tail[0]}"
    torch_file, nac_file = json.loads(res.stdout.strip().splitlines()[-1])
    if Path(torch_file).resolve().is_relative_to(folder.resolve()):
        return None, f"torch would be imported from {folder}, not from the project environment"
    if not Path(nac_file).resolve().is_relative_to(folder.resolve()):
        return None, f"torch_nac resolved to {nac_file}, not to {folder}"
    return folder, ""


# --------------------------------------------------------------------------------------------
# One measurement (runs in a fresh subprocess)
# --------------------------------------------------------------------------------------------


def _rss_kb() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except (OSError, ValueError, IndexError):
        return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _build(model_name: str, causal_T: int):
    """(module, call(x) -> output) for one model; the call runs the model on x (B, T, 64)."""
    import torch

    if model_name == "torch-nac":
        from torch_nac import NAC as PeerNAC

        model = PeerNAC(**PEER_KWARGS)
        return model, model
    if model_name == "mha":
        model = torch.nn.MultiheadAttention(64, 4, batch_first=True)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(causal_T)  # 0 / -inf, float

        def call(x):
            return model(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return model, call
    if model_name == "lstm":
        model = torch.nn.LSTM(64, 64, batch_first=True)
        return model, lambda x: model(x)[0]

    if model_name == "ours-torch":
        nac_kernels.set_enabled(False)  # this subprocess measures the torch path
    model = NAC(**OURS_KWARGS, selector="exact" if model_name == "ours-torch" else model_name.split("-", 1)[1])
    return model, model


def _step_fn(model_name: str, model, window: int):
    """A streaming step for the "step" task: (newest x (1, 64), state) -> (y, state)."""
    import torch

    if model_name.startswith("ours"):
        return lambda x, st: model.step(x, st, window=window)
    if model_name == "lstm":
        def lstm_step(x, st):
            y, st = model(x[:, None], st)
            return y[:, 0], st
        return lstm_step

    def mha_step(x, st):  # the newest query over the last `window` inputs (MHA has no key cache)
        st = x[:, None] if st is None else torch.cat([st, x[:, None]], 1)[:, -window:]
        return model(x[:, None], st, st, need_weights=False)[0][:, 0], st
    return mha_step


def _worker(spec: dict) -> None:
    """Measure one (model, task, T) and print one tagged JSON line. Called in a fresh interpreter."""
    import gc
    import resource
    import time

    row = {k: None for k in ROW_KEYS}
    task = spec.get("task", "forward")
    B = TRAIN_BATCH if task == "train" else 1
    row.update(model=spec["model"], task=task, T=spec["T"], B=B, repeats=spec["repeats"], times_ms=[],
               clock=spec.get("clock", "wall"), paired=False)
    clock = time.thread_time if row["clock"] == "cpu" else time.perf_counter
    try:
        import torch

        if spec["threads"]:
            torch.set_num_threads(spec["threads"])
        row["threads"] = torch.get_num_threads()
        if row["clock"] == "cpu" and row["threads"] != 1:
            raise ValueError("clock 'cpu' (this thread's CPU time) needs threads=1")
        torch.manual_seed(0)
        if spec["model"] == "torch-nac":
            sys.path.insert(0, spec["peer_dir"])
        T = spec["T"]
        model, call = _build(spec["model"], T)
        model.train(task == "train")
        g = torch.Generator().manual_seed(1)
        x = torch.randn(B, T, 64, generator=g)
        if task == "step":
            step = _step_fn(spec["model"], model, T)
            with torch.no_grad():
                st = None
                for i in range(T):  # fill the window
                    _, st = step(x[:, i], st)
                xs = torch.randn(spec["repeats"] + 5, 1, 64, generator=g)
                for i, xi in enumerate(xs):
                    t0 = clock()
                    _, st = step(xi, st)
                    if i >= 5:  # 5 warm-up steps
                        row["times_ms"].append((clock() - t0) * 1e3)
            row["time_ms"] = statistics.median(row["times_ms"])
            row["p99_ms"] = float(torch.tensor(row["times_ms"]).quantile(0.99))
            print(_RESULT_TAG + json.dumps(row), flush=True)
            return
        # a tiny run first primes the one-time allocations (torch's thread pools and kernels, about
        # 7 MB; our layer's compiled kernels, loaded by Numba's LLVM JIT, tens of MB), which would
        # otherwise count as the memory of the measured runs
        prime = _build(spec["model"], min(4, T))[1] if spec["model"] == "mha" else call
        with torch.set_grad_enabled(task == "train"):
            y = prime(x[:1, :4])
            if task == "train":
                y.sum().backward()
        # fresh inputs, one a forward, allocated before the RSS baseline (not counted as peak memory)
        xs = [torch.randn(B, T, 64, generator=g) for _ in range(spec["repeats"] + WARMUP)]
        gc.collect()
        reset = _reset_peak_rss()
        rss0 = _rss_kb()
        max0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        with torch.set_grad_enabled(task == "train"):
            for i in range(spec["repeats"] + WARMUP):
                t0 = clock()
                y = call(xs[i])
                if task == "train":
                    y.sum().backward()
                dt = (clock() - t0) * 1e3
                if tuple(y.shape) != (B, T, 64):
                    raise RuntimeError(f"unexpected output shape {tuple(y.shape)}")
                del y
                if i >= WARMUP:
                    row["times_ms"].append(dt)
        max1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if reset and rss0 is not None:
            row["peak_mb"] = max(0, max1 - rss0) / 1024
            row["mem_method"] = "peak RSS (ru_maxrss after a high-water reset) - RSS before"
        else:
            row["peak_mb"] = max(0, max1 - max0) / 1024
            row["mem_method"] = "ru_maxrss after - before (no high-water reset; may read low)"
        row["time_ms"] = statistics.median(row["times_ms"])
    except Exception as e:  # reported in the row, the benchmark goes on
        row["error"] = f"{type(e).__name__}: {e}"
    print(_RESULT_TAG + json.dumps(row), flush=True)


def _paired_worker(spec: dict) -> None:
    """Measure ours and MHA together, interleaved, at one (task, T, thread count) and print one
    tagged JSON line per model. Called in a fresh interpreter (see the module docstring)."""
    import time

    task = spec.get("task", "forward")
    B = TRAIN_BATCH if task == "train" else 1
    rows = {}
    for name in PAIRED_MODELS:
        row = {k: None for k in ROW_KEYS}
        row.update(model=name, task=task, T=spec["T"], B=B, repeats=spec["repeats"], times_ms=[], clock="wall",
                   paired=True)
        rows[name] = row
    try:
        import torch

        if spec["threads"]:
            torch.set_num_threads(spec["threads"])
        for row in rows.values():
            row["threads"] = torch.get_num_threads()
        torch.manual_seed(0)
        T = spec["T"]
        calls = {}
        for name in PAIRED_MODELS:
            model, call = _build(name, T)
            model.train(task == "train")
            calls[name] = call
        g = torch.Generator().manual_seed(1)
        with torch.set_grad_enabled(task == "train"):
            for name in PAIRED_MODELS:  # the one-time allocations and loads (our compiled kernels)
                y = calls[name](torch.randn(B, T, 64, generator=g))
                if task == "train":
                    y.sum().backward()
            rounds = spec["repeats"] + WARMUP
            xs = [torch.randn(B, T, 64, generator=g) for _ in range(rounds)]  # a fresh input per round
            for i in range(rounds):
                for name in (PAIRED_MODELS if i % 2 == 0 else PAIRED_MODELS[::-1]):
                    t0 = time.perf_counter()
                    y = calls[name](xs[i])
                    if task == "train":
                        y.sum().backward()
                    dt = (time.perf_counter() - t0) * 1e3
                    if tuple(y.shape) != (B, T, 64):
                        raise RuntimeError(f"{name}: unexpected output shape {tuple(y.shape)}")
                    del y
                    if i >= WARMUP:
                        rows[name]["times_ms"].append(dt)
        for row in rows.values():
            row["time_ms"] = statistics.median(row["times_ms"])
    except Exception as e:  # reported in the rows, the benchmark goes on
        for row in rows.values():
            row["error"] = f"{type(e).__name__}: {e}"
    for row in rows.values():
        print(_RESULT_TAG + json.dumps(row), flush=True)


def _child_env(threads: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def _run_one(spec: dict, timeout_s: float) -> dict:
    return _run_worker("_worker", spec, timeout_s, (spec["model"],))[0]


def _run_paired(spec: dict, timeout_s: float) -> list[dict]:
    return _run_worker("_paired_worker", spec, timeout_s, PAIRED_MODELS)


def _run_worker(worker: str, spec: dict, timeout_s: float, models: tuple[str, ...]) -> list[dict]:
    """Run a worker of this module in a fresh interpreter; its rows (one per model; on failure,
    rows carrying the error)."""
    code = f"import json, sys; from agent.bench.nac import {worker}; {worker}(json.loads(sys.argv[1]))"
    paired = worker == "_paired_worker"
    bases = []
    for model in models:
        base = {k: None for k in ROW_KEYS}
        base.update(model=model, task=spec.get("task", "forward"), T=spec["T"], repeats=spec["repeats"],
                    times_ms=[], clock="wall" if paired else spec.get("clock", "wall"), paired=paired)
        bases.append(base)
    try:
        res = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], capture_output=True, text=True,
                             timeout=timeout_s, env=_child_env(spec["threads"]), cwd=str(_PROJECT_ROOT))
    except subprocess.TimeoutExpired:
        return [{**base, "error": f"timed out after {timeout_s:.0f} s"} for base in bases]
    found = [json.loads(line[len(_RESULT_TAG):]) for line in res.stdout.splitlines() if line.startswith(_RESULT_TAG)]
    if len(found) == len(models):
        return found
    tail = (res.stderr.strip().splitlines() or [f"exit code {res.returncode}"])[-1]
    return [{**base, "error": f"subprocess failed: {tail}"} for base in bases]


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def bench_nac(sizes=(16, 256, 1024), block_sizes=(4096, 16384), repeats: int = 3, peer: bool = True,
              peer_max_T: int = 1024, peer_repeats: int | None = None, threads: int = 0,
              peer_dir: str | Path | None = None, peer_install: bool = True, timeout_s: float = 1800.0,
              verbose: bool = True, baselines=("mha", "lstm"), train_T: int | None = 256,
              step_window: int | None = 16, step_count: int = 300, clock: str = "wall",
              paired_threads=(1, 0), paired_only: bool = False) -> list[dict]:
    """Benchmark our NAC against torch's MHA and LSTM and ``torch-nac`` 0.0.2, side by side.

    Each (model, task, T) runs in its own subprocess (see the module docstring for the method).

    Args:
        sizes: sequence lengths T for the forward of every model (B=1, no grad).
        block_sizes: extra, longer T for our blocks selector only.
        repeats: timed forwards (or forward+backward passes) per run, after one warm-up; the
            time is their median.
        peer: also run ``torch-nac`` (installed on demand into ``peer_dir``).
        peer_max_T: run the peer only at T <= this.
        peer_repeats: timed forwards for the peer; None means ``repeats`` below T=256 and 1 from
            T=256 on (the peer is slow at long T).
        threads: torch CPU threads in each subprocess (0: torch's default). On a busy CPU, 1 avoids
            multi-millisecond OpenMP hand-offs per large op that otherwise dominate the times.
        peer_dir: folder for the peer package (default ``~/.cache/nac-drive/peers/torch-nac-0.0.2``).
        peer_install: allow ``pip install --no-deps --target peer_dir torch-nac==0.0.2``.
        timeout_s: limit per subprocess.
        verbose: print one progress line per finished run to stderr.
        baselines: torch's own layers to run beside ours: any of "mha", "lstm".
        train_T: T of the forward+backward rows (B=8; ours exact and the baselines); None skips.
        step_window: cached frames of the streaming-step rows; None skips them.
        step_count: timed streaming steps (p50 and p99 over them).
        clock: "wall" (``time.perf_counter``) or "cpu" (the measuring thread's CPU time,
            ``time.thread_time``; needs threads=1). On a CPU shared with other work, "cpu"
            leaves out the time the process waited for a core.
        paired_threads: torch thread counts (0: torch's default) of the threads rows: ours (exact)
            and MHA interleaved in one process, the forward at ``sizes`` and forward + backward at
            ``train_T`` (``baselines`` without "mha" skips them, as does an empty tuple); always
            wall time.
        paired_only: only the threads rows (for a machine's thread scaling without the other rows).

    Returns:
        One dict per run with keys ``model`` (one of :data:`MODELS`), ``task`` ("forward",
        "train" or "step"), ``T``, ``B``, ``time_ms`` (median; None on failure), ``times_ms``,
        ``p99_ms`` (step rows), ``repeats``, ``peak_mb`` and ``mem_method`` (forward and train
        rows), ``threads``, ``clock``, ``load1`` (the 1-min load average when the benchmark
        started), ``error`` (None, or why the run has no numbers; when the peer is
        unavailable its rows carry the reason) and ``paired`` (True for the threads rows).

    Raises:
        ValueError: for repeats or step_count < 1, T < 1, an unknown baseline or clock, or clock
            "cpu" with threads other than 1.
    """
    if repeats < 1 or step_count < 1:
        raise ValueError(f"repeats and step_count must be >= 1, got {repeats} and {step_count}")
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if clock == "cpu" and threads != 1:
        raise ValueError("clock 'cpu' measures one thread's CPU time: use threads=1")
    unknown = set(baselines) - {"mha", "lstm"}
    if unknown:
        raise ValueError(f"unknown baselines {sorted(unknown)}; choose from mha, lstm")
    if any(int(n) < 0 for n in paired_threads):
        raise ValueError(f"paired_threads must be >= 0 (0: torch's default), got {list(paired_threads)}")
    sizes = sorted({int(T) for T in sizes})
    all_T = sorted(set(sizes) | {int(T) for T in block_sizes})
    extra_T = [t for t in (train_T, step_window) if t is not None]
    if not all_T or min(all_T + extra_T) < 1:
        raise ValueError(f"sequence lengths must be >= 1, got sizes={sizes}, block_sizes={list(block_sizes)}, "
                         f"train_T={train_T}, step_window={step_window}")
    peer_T = [T for T in sizes if T <= peer_max_T] if peer and not paired_only else []
    peer_path, peer_reason = (None, "")
    if peer_T:
        peer_path, peer_reason = ensure_peer(peer_dir, install=peer_install)
        if verbose and peer_path is None:
            print(f"[bench] torch-nac unavailable: {peer_reason}", file=sys.stderr, flush=True)

    try:
        load1 = round(os.getloadavg()[0], 2)  # 1-min load average when the benchmark starts
    except OSError:
        load1 = None
    plan = []  # (model, task, T, repeats)
    for T in all_T:
        models = (["ours-exact", "ours-torch"] if T in sizes else []) + ["ours-blocks"]
        models += [m for m in ("mha", "lstm") if m in baselines and T in sizes]
        for model in models:
            plan.append((model, "forward", T, repeats))
        if T in peer_T:
            plan.append(("torch-nac", "forward", T, peer_repeats if peer_repeats is not None
                         else (repeats if T < 256 else 1)))
    if train_T is not None:
        plan += [(m, "train", train_T, repeats)
                 for m in ["ours-exact", "ours-torch", *[b for b in ("mha", "lstm") if b in baselines]]]
    if step_window is not None:
        plan += [(m, "step", step_window, step_count) for m in ["ours-exact", *[b for b in ("mha", "lstm")
                                                                                if b in baselines]]]
    if paired_only:
        plan = []
    paired_plan = []  # (threads, task, T): ours and MHA in one process
    if "mha" in baselines:
        for n in dict.fromkeys(int(n) for n in paired_threads):
            paired_plan += [(n, "forward", T) for T in sizes]
            if train_T is not None:
                paired_plan.append((n, "train", train_T))
    rows = []
    for model, task, T, reps in plan:
        if model == "torch-nac" and peer_path is None:
            rows.append({**{k: None for k in ROW_KEYS}, "model": model, "task": task, "T": T, "B": 1,
                         "repeats": reps, "times_ms": [], "clock": clock, "load1": load1,
                         "error": f"peer unavailable: {peer_reason}"})
            continue
        spec = dict(model=model, task=task, T=T, repeats=max(1, int(reps)), threads=int(threads), clock=clock,
                    peer_dir=str(peer_path) if peer_path else None)
        row = _run_one(spec, timeout_s)
        row["load1"] = load1
        rows.append(row)
        if verbose:
            if row["error"]:
                msg = row["error"]
            elif task == "step":
                msg = f"p50 {row['time_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms"
            else:
                msg = f"{row['time_ms']:.2f} ms, peak {row['peak_mb']:.1f} MB"
            print(f"[bench] {model:11s} {task:7s} T={T:<6d} {msg}", file=sys.stderr, flush=True)
    for n, task, T in paired_plan:
        spec = dict(task=task, T=T, repeats=max(1, int(repeats)), threads=n)
        pair = _run_paired(spec, timeout_s)
        for row in pair:
            row["load1"] = load1
        rows += pair
        if verbose:
            msg = pair[0]["error"] or ", ".join(f"{r['model']} {r['time_ms']:.2f} ms" for r in pair)
            print(f"[bench] paired      {task:7s} T={T:<6d} threads {pair[0]['threads'] or n}: {msg}", file=sys.stderr,
                  flush=True)
    return rows


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


#: issue 12's layer targets: (what, ours, peer, task, T, most ours / peer)
TARGETS = (("forward at most 1.5x MHA", "ours-exact", "mha", "forward", None, 1.5),
           ("forward + backward at most 2x MHA", "ours-exact", "mha", "train", None, 2.0))


def print_table(rows: list[dict], file=None) -> None:
    """Print the rows of :func:`bench_nac`: forward per T with ratios against MHA and torch-nac,
    forward + backward, streaming step latency, which of issue 12's layer targets are met, and the
    threads rows (ours and MHA interleaved at each thread count, with their ratios)."""
    file = file or sys.stdout
    paired = [r for r in rows if r.get("paired")]
    rows = [r for r in rows if not r.get("paired")]
    if paired and not rows:  # paired_only: the threads rows alone
        _print_paired(paired, lambda *a: print(*a, file=file))
        return
    by = {(r["model"], r.get("task", "forward"), r["T"]): r for r in rows}
    fwd = [r for r in rows if r.get("task", "forward") == "forward"]
    Ts = sorted({r["T"] for r in fwd})
    threads = sorted({r["threads"] for r in rows if r.get("threads")})
    clocks = sorted({r.get("clock") or "wall" for r in rows})
    methods = sorted({r["mem_method"] for r in rows if r.get("mem_method")})
    peer_reps = sorted({r["repeats"] for r in fwd if r["model"] == "torch-nac" and r.get("time_ms") is not None})
    our_reps = sorted({r["repeats"] for r in fwd if r["model"] != "torch-nac" and r.get("time_ms") is not None})
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p(f"NAC layer benchmark: input_dim=d_model=64, 4 heads, top-k 8, exact mode, CPU, threads "
      f"{','.join(map(str, threads)) or '?'}, clock {'/'.join(clocks)} "
      f"({'CPU time of the measuring thread' if clocks == ['cpu'] else 'wall time'})")
    p(f"forward: B=1, torch.no_grad, median ms of {'/'.join(map(str, our_reps)) or '?'} forwards after {WARMUP} warm-ups "
      f"(torch-nac: {'/'.join(map(str, peer_reps)) or '-'}); each (model, task, T) in a fresh subprocess")
    p(f"memory: MB, {'; '.join(methods) or 'peak RSS delta'}")
    loads = [r["load1"] for r in rows if r.get("load1") is not None]
    ncpu = os.cpu_count() or 1
    if loads and max(loads) > 0.5 * ncpu:
        p(f"WARNING: 1-min load average {max(loads):.1f} on {ncpu} CPUs when the benchmark started; times on a "
          f"busy CPU are inflated (multi-threaded ops wait for cores); rerun when idle (threads=1 limits the damage)")

    def t(model, T, task="forward"):
        r = by.get((model, task, T))
        return r["time_ms"] if r else None

    def mb(model, T, task="forward"):
        r = by.get((model, task, T))
        return r["peak_mb"] if r else None

    def ratio(a, b):
        return f"{a / b:.2f}x" if a is not None and b else "-"

    cols = [("T", 6), ("ours exact ms", 13), ("ours torch ms", 13), ("ours blocks ms", 14), ("MHA ms", 8),
            ("LSTM ms", 8), ("torch-nac ms", 12), ("exact/MHA", 9), ("torch/exact", 11), ("blocks/MHA", 10),
            ("blocks/exact", 12), ("peer/exact", 10), ("exact MB", 8), ("blocks MB", 9), ("MHA MB", 7),
            ("torch-nac MB", 12)]
    p(" | ".join(name.rjust(w) for name, w in cols))
    p("-+-".join("-" * w for _, w in cols))
    for T in Ts:
        te, tt, tb, tm, tl, tp = (t(m, T) for m in ("ours-exact", "ours-torch", "ours-blocks", "mha", "lstm",
                                                    "torch-nac"))
        vals = [str(T), _fmt(te, ".2f"), _fmt(tt, ".2f"), _fmt(tb, ".2f"), _fmt(tm, ".2f"), _fmt(tl, ".2f"),
                _fmt(tp, ".1f"), ratio(te, tm), ratio(tt, te), ratio(tb, tm), ratio(tb, te), ratio(tp, te),
                _fmt(mb("ours-exact", T), ".1f"), _fmt(mb("ours-blocks", T), ".1f"), _fmt(mb("mha", T), ".1f"),
                _fmt(mb("torch-nac", T), ".1f")]
        p(" | ".join(v.rjust(w) for v, (_, w) in zip(vals, cols)))
    train = [r for r in rows if r.get("task") == "train"]
    for T in sorted({r["T"] for r in train}):
        te, tt, tm, tl = (t(m, T, "train") for m in ("ours-exact", "ours-torch", "mha", "lstm"))
        p(f"forward + backward, B={TRAIN_BATCH}, T={T}: ours exact {_fmt(te, '.1f')} ms (torch path "
          f"{_fmt(tt, '.1f')} ms), MHA {_fmt(tm, '.1f')} ms, LSTM {_fmt(tl, '.1f')} ms; ours/MHA {ratio(te, tm)}, "
          f"ours/LSTM {ratio(te, tl)}, torch path/ours {ratio(tt, te)}; peak MB ours "
          f"{_fmt(mb('ours-exact', T, 'train'), '.1f')} (torch path {_fmt(mb('ours-torch', T, 'train'), '.1f')}), "
          f"MHA {_fmt(mb('mha', T, 'train'), '.1f')}")
    for r in [r for r in rows if r.get("task") == "step" and r.get("time_ms") is not None]:
        p(f"streaming step, {r['model']}, window {r['T']}: p50 {r['time_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms "
          f"over {len(r['times_ms'])} steps")
    # issue 12's targets, from what this run measured
    verdicts = []
    for what, ours, peer, task, _, most in TARGETS:
        Tt = [r["T"] for r in rows if r["model"] == ours and r.get("task", "forward") == task]
        for T in sorted(Tt):
            a, b = t(ours, T, task), t(peer, T, task)
            if a is not None and b:
                verdicts.append(f"{what} (T={T}): {a / b:.2f}x, {'met' if a / b <= most else 'NOT met'}")
    step = by.get(("ours-exact", "step", next((r["T"] for r in rows if r.get("task") == "step"), None)))
    if step and step.get("p99_ms") is not None:
        verdicts.append(f"streaming step under 1 ms at p99: {step['p99_ms']:.3f} ms, "
                        f"{'met' if step['p99_ms'] < 1 else 'NOT met'}")
    big = [T for T in Ts if mb("ours-blocks", T) is not None and T >= 16384]
    for T in big:
        verdicts.append(f"blocks selector at T={T} under 100 MB: {mb('ours-blocks', T):.1f} MB, "
                        f"{'met' if mb('ours-blocks', T) < 100 else 'NOT met'}")
    if t("ours-blocks", 1024) and t("ours-exact", 1024):
        r_ = t("ours-blocks", 1024) / t("ours-exact", 1024)
        verdicts.append(f"blocks at most 2x exact at T=1024: {r_:.2f}x, {'met' if r_ <= 2 else 'NOT met'}")
    if verdicts:
        p("targets (issue 12):")
        for v in verdicts:
            p("  " + v)
    if paired:
        _print_paired(paired, p)
    errors = [r for r in rows if r.get("error")]
    peer_errors = {r["error"] for r in errors if r["model"] == "torch-nac" and r["error"].startswith("peer unavailable")}
    for e in sorted(peer_errors):
        p(f"torch-nac column missing: {e}")
    for r in errors:
        if r["error"] not in peer_errors:
            p(f"{r['model']} {r.get('task', 'forward')} at T={r['T']}: {r['error']}")


#: issue 42's CPU targets at the most threads of the paired rows: (task, smallest T, most ours / MHA
#: below 16 threads, most ours / MHA at 16 threads or more; None: no target there)
PAIRED_TARGETS = (("forward", 256, 1.5, 2.0), ("train", 256, 2.0, None))


def paired_verdicts(rows: list[dict]) -> list[str]:
    """Issue 42's CPU targets, judged on the paired rows at their most threads (torch's default
    when the thread counts include 0): forward at most 1.5x MHA at T >= 256 below 16 threads and 2x
    at 16 or more, forward + backward at most 2x below 16 threads. One line per judged row,
    headed by the thread count; [] when no row has a target."""
    by = {(r["model"], r["task"], r["T"], r["threads"]): r["time_ms"] for r in rows if r.get("time_ms") is not None}
    counts = sorted({r["threads"] for r in rows if r.get("threads")})
    if not counts:
        return []
    n = counts[-1]
    out = []
    for task, min_T, below16, at16 in PAIRED_TARGETS:
        most = at16 if n >= 16 else below16
        if most is None:
            continue
        for T in sorted({r["T"] for r in rows if r["task"] == task and r["T"] >= min_T}):
            a, b = by.get(("ours-exact", task, T, n)), by.get(("mha", task, T, n))
            if a is not None and b:
                what = "forward" if task == "forward" else "forward + backward"
                out.append(f"  {what} at T={T}: {a / b:.2f}x, at most {most:g}x: "
                           f"{'met' if a / b <= most else 'NOT met'}")
    return [f"targets (issue 42, at {n} threads):"] + out if out else []


def _print_paired(rows: list[dict], p) -> None:
    """The threads rows of :func:`print_table`: per (task, T), ours and MHA at each thread count,
    ours / MHA at each, and each model's speed-up from the fewest to the most threads."""
    by = {(r["model"], r["task"], r["T"], r["threads"]): r["time_ms"] for r in rows if r.get("time_ms") is not None}
    counts = sorted({r["threads"] for r in rows if r.get("threads")})
    reps = sorted({r["repeats"] for r in rows if r.get("time_ms") is not None})
    p(f"threads: ours (exact) and MHA in one process, interleaved, a fresh input per call, median wall ms of "
      f"{'/'.join(map(str, reps)) or '?'} rounds after {WARMUP}, at {', '.join(map(str, counts)) or '?'} threads "
      f"(torch's default: the most); forward B=1, forward + backward B={TRAIN_BATCH}; @n: at n threads, "
      f"a/@b: the time at a threads over the time at b (the speed-up)")
    cols = [("task", 7), ("T", 6)]
    for n in counts:
        cols += [(f"ours ms @{n}", 11), (f"MHA ms @{n}", 10), (f"ours/MHA @{n}", 12)]
    if len(counts) > 1:
        cols += [(f"ours @{counts[0]}/@{counts[-1]}", 14), (f"MHA @{counts[0]}/@{counts[-1]}", 13)]
    p(" | ".join(name.rjust(w) for name, w in cols))
    p("-+-".join("-" * w for _, w in cols))
    keys = sorted({(r["task"], r["T"]) for r in rows}, key=lambda k: (k[0] != "forward", k[1]))
    for task, T in keys:
        vals = [task, str(T)]
        for n in counts:
            a, b = by.get(("ours-exact", task, T, n)), by.get(("mha", task, T, n))
            vals += [_fmt(a, ".2f"), _fmt(b, ".2f"), f"{a / b:.2f}x" if a is not None and b else "-"]
        if len(counts) > 1:
            for m in PAIRED_MODELS:
                a, b = by.get((m, task, T, counts[0])), by.get((m, task, T, counts[-1]))
                vals.append(f"{a / b:.2f}x" if a is not None and b else "-")
        p(" | ".join(v.rjust(w) for v, (_, w) in zip(vals, cols)))
    for line in paired_verdicts(rows):
        p(line)
    seen = set()
    for r in rows:
        key = (r["task"], r["T"], r.get("threads"), r.get("error"))
        if r.get("error") and key not in seen:
            seen.add(key)
            p(f"threads row {r['task']} at T={r['T']} ({r.get('threads') or '?'} threads): {r['error']}")
