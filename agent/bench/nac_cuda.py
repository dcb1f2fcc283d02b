"""``agent bench nac --device cuda``: our NAC layer against torch's attention on a GPU (issue "NAC at attention's
speed", item 4).

Configuration: input_dim = d_model = 64, 4 heads, top-k 8, causal, the exact selector, "exact" ODE mode (the
CPU benchmark's layer, :data:`agent.bench.nac.OURS_KWARGS`), float32, at the (B, T) cells of
:data:`CUDA_CELLS` (B 8 and 64; T 256, 1024, 4096, and T 16 at B 8). The peers, measured in the same process:

- ``mha``: ``torch.nn.MultiheadAttention(64, 4, batch_first=True)``, given the float causal mask with
  ``is_causal=True`` (as on the CPU): with ``need_weights=False`` torch drops the mask and calls
  ``scaled_dot_product_attention`` with ``is_causal=True`` (its flash / memory-efficient kernels);
- ``sdpa``: the same layer written out: one ``Linear(64, 192)`` for q, k and v, then
  ``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)`` over 4 heads of 16, then
  ``Linear(64, 64)``; the issue states its targets against this too.

Per cell: the forward under ``torch.no_grad`` in eval mode, and the forward plus the backward of the
outputs' sum in train mode, each model's time the median of ``repeats`` timed calls after ``WARMUP``
untimed ones. Every timed call gets a fresh input (drawn on the GPU before the timing), the models are
interleaved call by call (the first model of each round rotates), and every call is timed by CUDA events
around it with the device synchronised before and after. Peak memory: ``torch.cuda.reset_peak_memory_stats``
before one more call of each model, then ``torch.cuda.max_memory_allocated`` minus the memory allocated
before it, so it counts what the call itself allocates (the weights, the input and, for the backward, the
gradients' buffers, already there, are not counted); the forward's (no grad) and the forward+backward's.

Streaming (``step_window`` frames cached): p50 and p99 of one :meth:`agent.nn.nac.NAC.step` of the layer
(B = 1) and of one :meth:`agent.nn.policy.DrivingPolicy.step` of a whole policy (``nac.pt`` by default,
loaded by :func:`agent.actors.loading.load_policy` onto the GPU; a fresh uint8 frame from the host each
step, as a drive gives it), wall time (``time.perf_counter``) with the device synchronised before and
after each step.

NAC paths (``nac_path``): "triton" is the layer as it runs on CUDA float32 tensors by default, the fused
Triton kernels of :mod:`agent.nn.nac_triton` (``NAC_TRITON=auto``); "torch" forces its torch path
(``NAC_TRITON=off``). Each path runs in its own subprocess (``NAC_TRITON`` is read at import); every row
records the path that actually ran (``nac_ran``, from :func:`agent.nn.nac_triton.applies`), and a row that
asked for "triton" where it could not run carries an error instead of torch-path numbers.

Targets (:data:`TARGETS`): forward at most 2x, forward + backward at most 2x, peak memory at most 1.5x
(against MHA and against SDPA, per cell), streaming step p99 at most 1 ms. :func:`print_cuda_table` prints
them beside the ratios with a pass / FAIL mark per cell.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: the (B, T) cells of the table, as "BxT"
CUDA_CELLS = ("8x16", "8x256", "8x1024", "8x4096", "64x256", "64x1024", "64x4096")
#: the models of a cell, in their first round's order
CUDA_MODELS = ("nac", "mha", "sdpa")
#: the peers our ratios are taken against
PEERS = ("mha", "sdpa")
#: the NAC paths: the Triton kernels (NAC_TRITON=auto) or the torch path (NAC_TRITON=off)
NAC_PATHS = {"triton": "auto", "torch": "off"}
#: untimed calls of each model before the timed ones (the first compiles Triton's kernels for the shape)
WARMUP = 3
#: the issue's targets: the most ours / peer may be (forward, forward + backward, peak memory of the
#: forward + backward), and the most the streaming step's p99 may take in ms
TARGETS = {"forward": 2.0, "train": 2.0, "memory": 1.5, "step_p99_ms": 1.0}
CELL_KEYS = ("kind", "nac_path", "nac_ran", "B", "T", "repeats", "fwd_ms", "train_ms", "fwd_times_ms",
             "train_times_ms", "peak_fwd_mb", "peak_train_mb", "device", "torch", "cuda", "triton", "error",
             "profile")
#: kernels kept per task in a cell's profile (the rest summed into one "other" entry)
PROFILE_TOP = 8
STEP_KEYS = ("kind", "nac_path", "nac_ran", "model", "window", "count", "p50_ms", "p99_ms", "device", "torch",
             "cuda", "triton", "error")
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_RESULT_TAG = "BENCH_CUDA_RESULT "


class CudaUnavailable(RuntimeError):
    """No CUDA device that torch can use: the message is one line for the user."""


def cuda_problem() -> str | None:
    """Why ``--device cuda`` cannot run here (one line), or None when torch sees a CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return (f"--device cuda: torch {torch.__version__} sees no CUDA GPU on this machine "
                f"(CUDA build: {torch.version.cuda or 'none, a CPU build'}); use --device cpu")
    return None


def parse_cell(cell: str) -> tuple[int, int]:
    """"BxT" -> (B, T).

    Raises:
        ValueError: not two integers >= 1 joined by "x".
    """
    parts = str(cell).lower().split("x")
    try:
        B, T = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"a CUDA cell is BxT (e.g. 8x256), got {cell!r}") from None
    if B < 1 or T < 1:
        raise ValueError(f"a CUDA cell is BxT with B >= 1 and T >= 1, got {cell!r}")
    return B, T


def _versions() -> dict:
    import torch

    try:
        import triton
        tv = triton.__version__
    except ImportError:
        tv = None
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": tv}


# --------------------------------------------------------------------------------------------
# The measurements (in a subprocess per NAC path)
# --------------------------------------------------------------------------------------------


def _build(name: str, T: int, device):
    """(module, call(x) -> y) of one model on ``device``; x (B, T, 64) -> y (B, T, 64)."""
    import torch
    import torch.nn.functional as F

    if name == "nac":
        from agent.bench.nac import OURS_KWARGS
        from agent.nn.nac import NAC

        model = NAC(**OURS_KWARGS, selector="exact").to(device)
        return model, model
    if name == "mha":
        model = torch.nn.MultiheadAttention(64, 4, batch_first=True).to(device)
        mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device=device)

        def mha(x):
            return model(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return model, mha
    if name == "sdpa":
        model = torch.nn.ModuleDict({"qkv": torch.nn.Linear(64, 192), "out": torch.nn.Linear(64, 64)}).to(device)

        def sdpa(x):
            B, T_, _ = x.shape
            q, k, v = model["qkv"](x).view(B, T_, 3, 4, 16).permute(2, 0, 3, 1, 4)  # (B, H, T, 16) each
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return model["out"](y.transpose(1, 2).reshape(B, T_, 64))
        return model, sdpa
    raise ValueError(f"unknown model {name!r}")


def _error_text(e: BaseException) -> str:
    """An exception as one line for a row's ``error``: its type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def _elapsed_ms(fn, cuda: bool, torch):
    """(fn()'s result, its ms): by CUDA events with the device synchronised before and after when
    ``cuda``, else by ``time.perf_counter`` (tests on the CPU)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        end.record()
        torch.cuda.synchronize()
    return out, (start.elapsed_time(end) if cuda else (time.perf_counter() - t0) * 1e3)


def _timed(call, x, train: bool, torch) -> float:
    """ms of one call (forward, or forward + backward of the sum), by :func:`_elapsed_ms`."""

    def once():
        y = call(x)
        if train:
            y.sum().backward()
        return y

    y, dt = _elapsed_ms(once, x.is_cuda, torch)
    if tuple(y.shape) != tuple(x.shape):
        raise RuntimeError(f"unexpected output shape {tuple(y.shape)}")
    return dt


def _peak_mb(call, x, train: bool, torch) -> float | None:
    """MB the call allocates at its peak above what was allocated before it (CUDA; None on the CPU)."""
    if not x.is_cuda:
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    y = call(x)
    if train:
        y.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del y
    return max(0, peak) / 2 ** 20


def _nac_ran(torch, device="cuda") -> str:
    from agent.nn import nac_triton

    probe = torch.zeros(1, device=device)
    try:
        return "triton" if nac_triton.applies(probe) else "torch"
    except ImportError:
        return "torch"


def _profile(call, x, train: bool, torch) -> dict:
    """Where one NAC call spends its time, by ``torch.profiler`` (one profiled call after one
    unprofiled): the GPU kernels by total device time (the :data:`PROFILE_TOP` longest, the rest as
    "other"), how many kernels ran, their device-time sum, and the call's wall time, which a
    launch-bound call spends mostly on the host. Returns a dict (``error`` set if the profiler failed)."""
    from torch.profiler import ProfilerActivity, profile

    def once():
        y = call(x)
        if train:
            y.sum().backward()

    try:
        once()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if x.is_cuda else [])
        if x.is_cuda:
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            t0 = time.perf_counter()
            once()
            if x.is_cuda:
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3
        kernels = [(e.key, e.self_device_time_total / 1e3, e.count) for e in prof.key_averages()
                   if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total > 0]
    except Exception as e:  # noqa: BLE001 - a profiler that fails costs the profile only
        return {"error": _error_text(e)}
    kernels.sort(key=lambda k: -k[1])
    top = [{"kernel": n[:80], "ms": ms, "count": c} for n, ms, c in kernels[:PROFILE_TOP]]
    rest = kernels[PROFILE_TOP:]
    if rest:
        top.append({"kernel": f"other ({len(rest)} kinds)", "ms": sum(k[1] for k in rest),
                    "count": sum(k[2] for k in rest)})
    return {"wall_ms": wall, "device_ms": sum(k[1] for k in kernels), "launches": sum(k[2] for k in kernels),
            "kernels": top, "error": None}


def _cell(spec: dict, B: int, T: int, torch, device: str = "cuda") -> dict:
    """One (B, T) cell of one NAC path (``device`` "cpu" only for tests of this function)."""
    row = {k: None for k in CELL_KEYS}
    row.update(kind="cell", nac_path=spec["nac_path"], B=B, T=T, repeats=spec["repeats"], **_versions(),
               fwd_ms={}, train_ms={}, fwd_times_ms={}, train_times_ms={}, peak_fwd_mb={}, peak_train_mb={})
    row["nac_ran"] = _nac_ran(torch, device)
    if row["nac_ran"] != spec["nac_path"]:
        row["error"] = (f"the {spec['nac_path']} path was asked for but the {row['nac_ran']} path would run "
                        f"(NAC_TRITON={os.environ.get('NAC_TRITON', 'auto')}, triton {row['triton'] or 'not installed'})")
        return row
    models = {}
    try:
        torch.manual_seed(0)
        for name in CUDA_MODELS:
            models[name] = _build(name, T, device)
        g = torch.Generator(device=device).manual_seed(1)
        rounds = WARMUP + spec["repeats"]
        for task, train in (("fwd", False), ("train", True)):
            for m, _ in models.values():
                m.train(train)
            times = {name: [] for name in CUDA_MODELS}
            with torch.set_grad_enabled(train):
                xs = [torch.randn(B, T, 64, generator=g, device=device) for _ in range(rounds + 1)]
                for i in range(rounds):
                    order = CUDA_MODELS[i % len(CUDA_MODELS):] + CUDA_MODELS[:i % len(CUDA_MODELS)]
                    for name in order:
                        dt = _timed(models[name][1], xs[i], train, torch)
                        if i >= WARMUP:
                            times[name].append(dt)
                for name in CUDA_MODELS:
                    row[f"{task}_times_ms"][name] = times[name]
                    row[f"{task}_ms"][name] = statistics.median(times[name])
                    row[f"peak_{task}_mb"][name] = _peak_mb(models[name][1], xs[-1], train, torch)
                if spec.get("profile"):
                    row["profile"] = row["profile"] or {}
                    row["profile"][task] = _profile(models["nac"][1], xs[-1], train, torch)
            del xs
    except Exception as e:  # noqa: BLE001 - reported in the row (an OOM too), the benchmark goes on
        row["error"] = _error_text(e)
    finally:
        models.clear()
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def _percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def _steps(spec: dict, torch, device: str = "cuda") -> list[dict]:
    """The streaming rows: the layer's step and the policy's step, p50 and p99 (``device`` "cpu" only
    for tests of this function)."""
    import numpy as np

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    rows = []
    count, window = spec["step_count"], spec["step_window"]
    targets = [("nac-layer", None)] + ([("policy", spec["policy"])] if spec.get("policy") else [])
    for model_name, policy in targets:
        row = {k: None for k in STEP_KEYS}
        row.update(kind="step", nac_path=spec["nac_path"], nac_ran=_nac_ran(torch, device), model=model_name if not policy
                   else f"policy {policy}", window=window, count=count, **_versions())
        try:
            torch.manual_seed(0)
            if policy is None:
                from agent.bench.nac import OURS_KWARGS
                from agent.nn.nac import NAC

                layer = NAC(**OURS_KWARGS, selector="exact").to(device).eval()
                g = torch.Generator(device=device).manual_seed(2)
                xs = torch.randn(count + WARMUP + window, 1, 64, generator=g, device=device)

                def step(i, state):
                    return layer.step(xs[i], state, window=window)[1]
            else:
                from agent.actors.loading import load_policy

                pol = load_policy(policy, device=device)
                if not hasattr(pol, "config"):
                    raise ValueError(f"{policy} is not a DrivingPolicy (no streaming step)")
                pol.eval()
                rng = np.random.default_rng(2)
                frames = rng.integers(0, 256, (count + WARMUP + window, 1, *pol.config.obs_shape), dtype=np.uint8)

                def step(i, state):
                    return pol.step(frames[i], state)[1]
            times = []
            state = None
            with torch.no_grad():
                for i in range(WARMUP + window + count):  # the window fills first, untimed
                    sync()
                    t0 = time.perf_counter()
                    state = step(i, state)
                    sync()
                    if i >= WARMUP + window:
                        times.append((time.perf_counter() - t0) * 1e3)
            row["p50_ms"], row["p99_ms"] = statistics.median(times), _percentile(times, 99)
        except Exception as e:  # noqa: BLE001 - reported in the row
            row["error"] = _error_text(e)
        rows.append(row)
    return rows


def _worker(spec: dict) -> None:
    """One NAC path: every cell, then the streaming rows, one tagged JSON line per row as it finishes
    (so a run stopped by its time limit keeps what it measured). Called in a fresh interpreter."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 everywhere, as the kernels compute
    torch.backends.cudnn.allow_tf32 = False
    for cell in spec["cells"]:
        B, T = parse_cell(cell)
        print(_RESULT_TAG + json.dumps(_cell(spec, B, T, torch)), flush=True)
    if spec["step_window"]:
        for row in _steps(spec, torch):
            print(_RESULT_TAG + json.dumps(row), flush=True)


def _run_path(spec: dict, timeout_s: float) -> list[dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env["NAC_TRITON"] = NAC_PATHS[spec["nac_path"]]
    env.pop("TRITON_INTERPRET", None)
    code = "import json, sys; from agent.bench.nac_cuda import _worker; _worker(json.loads(sys.argv[1]))"
    cmd = [sys.executable, "-c", code, json.dumps(spec)]
    note = None
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env, cwd=str(_PROJECT_ROOT))
        out, err = res.stdout, res.stderr
        if res.returncode:
            note = f"subprocess failed: {(err.strip().splitlines() or [f'exit code {res.returncode}'])[-1]}"
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        note = f"timed out after {timeout_s:.0f} s"
    rows = [json.loads(line[len(_RESULT_TAG):]) for line in out.splitlines() if line.startswith(_RESULT_TAG)]
    done = {(r.get("B"), r.get("T")) for r in rows if r["kind"] == "cell"}
    for cell in spec["cells"]:  # the cells it never reached carry why
        B, T = parse_cell(cell)
        if (B, T) not in done:
            rows.append({**{k: None for k in CELL_KEYS}, "kind": "cell", "nac_path": spec["nac_path"], "B": B, "T": T,
                         "repeats": spec["repeats"], "error": note or "no result"})
    return rows


def bench_nac_cuda(cells=CUDA_CELLS, repeats: int = 20, nac_paths=("triton",), step_window: int | None = 16,
                   step_count: int = 300, policy: str | None = "nac.pt", timeout_s: float = 300.0,
                   verbose: bool = True, profile: bool = False) -> list[dict]:
    """Our NAC layer against MHA and SDPA on the GPU (see the module docstring), per NAC path.

    Args:
        cells: the (B, T) cells as "BxT" strings.
        repeats: timed calls per model, task and cell (median).
        nac_paths: any of "triton", "torch" (:data:`NAC_PATHS`), each in its own subprocess.
        step_window: cached frames of the streaming rows; None skips them.
        step_count: timed streaming steps (p50, p99).
        policy: the policy of the whole-policy streaming row (a bare name is looked up in policies/);
            None or "" skips it.
        timeout_s: limit per NAC path's subprocess; the rows it finished are kept.
        verbose: one progress line per row to stderr.
        profile: also profile one NAC forward and one forward + backward per cell (``torch.profiler``):
            the cell's ``profile`` holds the longest kernels, the launch count and the wall time.

    Returns:
        Rows of kind "cell" (:data:`CELL_KEYS`; per-model dicts keyed "nac", "mha", "sdpa") and
        "step" (:data:`STEP_KEYS`), each naming the GPU, torch, CUDA and triton versions.

    Raises:
        CudaUnavailable: torch sees no CUDA GPU (one line).
        ValueError: a bad cell, path, repeats or step_count.
    """
    problem = cuda_problem()
    if problem:
        raise CudaUnavailable(problem)
    for cell in cells:
        parse_cell(cell)
    unknown = [p for p in nac_paths if p not in NAC_PATHS]
    if unknown or not nac_paths:
        raise ValueError(f"NAC paths must be among {list(NAC_PATHS)}, got {list(nac_paths)}")
    if repeats < 1 or step_count < 1:
        raise ValueError(f"repeats and step_count must be >= 1, got {repeats} and {step_count}")
    rows = []
    for path in dict.fromkeys(nac_paths):
        spec = dict(nac_path=path, cells=list(cells), repeats=int(repeats), step_window=step_window or 0,
                    step_count=int(step_count), policy=policy or None, profile=bool(profile))
        got = _run_path(spec, timeout_s)
        if verbose:
            for r in got:
                what = f"B={r['B']} T={r['T']}" if r["kind"] == "cell" else f"step {r['model']}"
                print(f"[bench cuda] {path:6s} {what}: {r['error'] or 'ok'}", file=sys.stderr, flush=True)
        rows += got
    return rows


#: the exact selector's tunables that ``--selector-sweep`` times (block_k, num_warps, precheck)
SWEEP_CONFIGS = tuple((bk, w, pre) for bk in (32, 64, 128) for w in (1, 2, 4) for pre in (False, True))
SWEEP_CELLS = ("8x1024", "64x1024", "64x4096")


def sweep_selector(cells=SWEEP_CELLS, configs=SWEEP_CONFIGS, repeats: int = 10, device: str = "cuda",
                   heads: int = 4, d: int = 16, K: int = 8) -> list[dict]:
    """Time the exact selector's Triton kernel (:func:`agent.nn.nac_triton.topk_exact`, causal, no
    mask) under each tunable setting, side by side on the same fresh inputs: for the next change of
    :data:`agent.nn.nac_triton.SELECT_TUNING`, chosen by measurement in one GPU call.

    Args:
        cells: (B, T) as "BxT"; each is q, k of shape (B, heads, T, d) float32.
        configs: (block_k, num_warps, precheck) settings; the current default is always added first.
        repeats: timed calls per setting (median), each on new q, k, settings interleaved.
        device: "cuda" (CUDA events), or "cpu" under Triton's interpreter (tests; wall time).

    Returns:
        One row per (cell, setting): B, T, block_k, num_warps, precheck, ms (median), ``same``
        (its selection equals the default setting's on one input) and ``default``, with the
        versions of :func:`_versions`; ``error`` set where a setting failed.

    Raises:
        CudaUnavailable: device "cuda" without a CUDA GPU.
    """
    import torch

    from agent.nn import nac_triton

    if device == "cuda" and cuda_problem():
        raise CudaUnavailable(cuda_problem())
    default = (nac_triton.SELECT_TUNING["block_k"], nac_triton.SELECT_TUNING["num_warps"],
               nac_triton.SELECT_TUNING["precheck"])
    settings = [default] + [c for c in configs if tuple(c) != default]
    rows = []
    g = torch.Generator(device=device).manual_seed(0)
    for cell in cells:
        B, T = parse_cell(cell)
        qpos = torch.arange(T, device=device)

        def run(q, k, c):
            return nac_triton.topk_exact(q, k, min(K, T), qpos, None, True, block_k=c[0], num_warps=c[1],
                                         precheck=c[2])

        q0, k0 = (torch.randn(B, heads, T, d, generator=g, device=device) for _ in range(2))
        ref = None
        out = {c: dict(kind="sweep", B=B, T=T, block_k=c[0], num_warps=c[1], precheck=c[2], default=c == default,
                       ms=None, same=None, error=None, times_ms=[], **_versions()) for c in settings}
        for c in settings:  # compile, warm up, and check the selection against the default's
            try:
                idx, valid = run(q0, k0, c)
                got = torch.where(valid, idx, -1).sort(-1).values
                ref = got if ref is None else ref
                out[c]["same"] = bool(torch.equal(got, ref))
            except Exception as e:  # noqa: BLE001 - one setting that fails to build is reported, the rest go on
                out[c]["error"] = _error_text(e)
        live = [c for c in settings if out[c]["error"] is None]
        for i in range(repeats):
            q, k = (torch.randn(B, heads, T, d, generator=g, device=device) for _ in range(2))
            for c in live[i % len(live):] + live[:i % len(live)]:
                out[c]["times_ms"].append(_elapsed_ms(lambda: run(q, k, c), device == "cuda", torch)[1])
        for c in live:
            out[c]["ms"] = statistics.median(out[c]["times_ms"]) if out[c]["times_ms"] else None
        rows += list(out.values())
    return rows


def print_sweep_table(rows: list[dict], file=None) -> None:
    """The rows of :func:`sweep_selector` as Markdown, fastest first per cell, with the speed-up
    over the default setting and whether the selection is the default's."""
    file = file or sys.stdout
    p = lambda *a: print(*a, file=file)  # noqa: E731
    p("")
    p("The exact selector's tunables (topk_exact alone, causal, 4 heads, d = 16, K = 8; median of the timed calls):")
    p("")
    p("| B | T | block_k | warps | precheck | ms | vs default | same selection |")
    p("|---|---|---|---|---|---|---|---|")
    for cell in dict.fromkeys((r["B"], r["T"]) for r in rows):
        group = [r for r in rows if (r["B"], r["T"]) == cell]
        base = next((r["ms"] for r in group if r["default"]), None)
        for r in sorted(group, key=lambda r: (r["ms"] is None, r["ms"] or 0.0)):
            name = f"{r['block_k']}{' (default)' if r['default'] else ''}"
            if r["error"]:
                p(f"| {r['B']} | {r['T']} | {name} | {r['num_warps']} | {r['precheck']} | error: {r['error']} | | |")
                continue
            speed = f"{base / r['ms']:.2f}x" if base and r["ms"] else "-"
            p(f"| {r['B']} | {r['T']} | {name} | {r['num_warps']} | {r['precheck']} | {_num(r['ms'], '.3f')} | {speed} | "
              f"{'yes' if r['same'] else 'NO'} |")


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------


def _num(v, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def ratio_mark(ours: float | None, peer: float | None, most: float) -> tuple[float | None, str]:
    """(ours / peer, "1.23x pass" or "2.50x FAIL"), or (None, "-") when either is missing."""
    if ours is None or not peer:
        return None, "-"
    r = ours / peer
    return r, f"{r:.2f}x {'pass' if r <= most else 'FAIL'}"


def verdicts(rows: list[dict]) -> list[tuple[str, float, float, bool]]:
    """Every target checked in ``rows``: (what, measured, target, met)."""
    out = []
    for r in rows:
        if r.get("kind") == "cell" and not r.get("error"):
            for task, key in (("forward", "fwd_ms"), ("train", "train_ms"), ("memory", "peak_train_mb")):
                for peer in PEERS:
                    ratio, _ = ratio_mark(r[key].get("nac"), r[key].get(peer), TARGETS[task])
                    if ratio is not None:
                        out.append((f"{r['nac_path']} B={r['B']} T={r['T']} {task} nac/{peer}", ratio, TARGETS[task],
                                    ratio <= TARGETS[task]))
        elif r.get("kind") == "step" and r.get("p99_ms") is not None:
            out.append((f"{r['nac_path']} step {r['model']} p99 ms", r["p99_ms"], TARGETS["step_p99_ms"],
                        r["p99_ms"] <= TARGETS["step_p99_ms"]))
    return out


def print_cuda_table(rows: list[dict], file=None) -> None:
    """Print the rows of :func:`bench_nac_cuda` as Markdown: the device and versions, the targets, one
    table of cells and one of streaming steps, pass / FAIL per ratio, and a count of targets met."""
    file = file or sys.stdout
    p = lambda *a: print(*a, file=file)  # noqa: E731
    cells = [r for r in rows if r.get("kind") == "cell"]
    steps = [r for r in rows if r.get("kind") == "step"]
    envs = sorted({(r.get("device"), r.get("torch"), r.get("cuda"), r.get("triton")) for r in rows
                   if r.get("torch")}, key=str)
    for dev, tv, cv, trv in envs or [(None, None, None, None)]:
        p(f"device: {dev or '?'}; torch {tv or '?'} (CUDA {cv or '?'}); triton {trv or 'not installed'}")
    reps = sorted({r["repeats"] for r in cells if r.get("repeats")})
    p(f"NAC layer vs attention on CUDA: input_dim = d_model = 64, 4 heads, top-k 8, causal, exact selector, "
      f"float32 (no TF32); MHA = nn.MultiheadAttention with is_causal=True (SDPA inside); SDPA = Linear(64, 192) + "
      f"scaled_dot_product_attention(is_causal=True) + Linear(64, 64). Median ms of {'/'.join(map(str, reps)) or '?'} "
      f"CUDA-event-timed calls after {WARMUP} warm-ups, a fresh input each, models interleaved; forward under no_grad, "
      f"f+b = forward + backward of the sum; peak MB = max_memory_allocated over one forward + backward, above what "
      f"was allocated before it.")
    p(f"targets: forward <= {TARGETS['forward']:g}x, forward + backward <= {TARGETS['train']:g}x, peak memory <= "
      f"{TARGETS['memory']:g}x (each against MHA and against SDPA), streaming step p99 <= {TARGETS['step_p99_ms']:g} ms")
    if cells:
        p("")
        head = ["NAC path (ran)", "B", "T", "NAC fwd ms", "MHA fwd ms", "SDPA fwd ms",
                f"fwd NAC/MHA (<= {TARGETS['forward']:g}x)", f"fwd NAC/SDPA (<= {TARGETS['forward']:g}x)",
                "NAC f+b ms", "MHA f+b ms", "SDPA f+b ms", f"f+b NAC/MHA (<= {TARGETS['train']:g}x)",
                f"f+b NAC/SDPA (<= {TARGETS['train']:g}x)", "peak MB NAC / MHA / SDPA",
                f"mem NAC/MHA (<= {TARGETS['memory']:g}x)", f"mem NAC/SDPA (<= {TARGETS['memory']:g}x)"]
        p("| " + " | ".join(head) + " |")
        p("|" + "---|" * len(head))
        for r in cells:
            path = f"{r['nac_path']} ({r.get('nac_ran') or '?'})"
            if r.get("error"):
                p("| " + " | ".join([path, str(r["B"]), str(r["T"]), f"error: {r['error']}"] + [""] * (len(head) - 4))
                  + " |")
                continue
            f, t, m = r["fwd_ms"], r["train_ms"], r["peak_train_mb"]
            vals = [path, str(r["B"]), str(r["T"]), _num(f.get("nac")), _num(f.get("mha")), _num(f.get("sdpa")),
                    ratio_mark(f.get("nac"), f.get("mha"), TARGETS["forward"])[1],
                    ratio_mark(f.get("nac"), f.get("sdpa"), TARGETS["forward"])[1],
                    _num(t.get("nac")), _num(t.get("mha")), _num(t.get("sdpa")),
                    ratio_mark(t.get("nac"), t.get("mha"), TARGETS["train"])[1],
                    ratio_mark(t.get("nac"), t.get("sdpa"), TARGETS["train"])[1],
                    " / ".join(_num(m.get(k), ".1f") for k in CUDA_MODELS),
                    ratio_mark(m.get("nac"), m.get("mha"), TARGETS["memory"])[1],
                    ratio_mark(m.get("nac"), m.get("sdpa"), TARGETS["memory"])[1]]
            p("| " + " | ".join(vals) + " |")
    if steps:
        p("")
        p(f"| NAC path (ran) | streaming step | window | steps | p50 ms | p99 ms | p99 <= {TARGETS['step_p99_ms']:g} ms |")
        p("|---|---|---|---|---|---|---|")
        for r in steps:
            path = f"{r['nac_path']} ({r.get('nac_ran') or '?'})"
            if r.get("error"):
                p(f"| {path} | {r['model']} | {r['window']} | {r['count']} | error: {r['error']} | | |")
                continue
            mark = "pass" if r["p99_ms"] <= TARGETS["step_p99_ms"] else "FAIL"
            p(f"| {path} | {r['model']} | {r['window']} | {r['count']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {mark} |")
    profiled = [r for r in cells if r.get("profile")]
    if profiled:
        p("")
        p("Where NAC's time goes (torch.profiler, one call per task; device ms = the kernels' GPU time, wall ms = the "
          "call's host time to the end of its work; a wall time far above the device time means launch-bound):")
        p("")
        p("| NAC path | B | T | task | wall ms | device ms | launches | longest kernels (ms x count) |")
        p("|---|---|---|---|---|---|---|---|")
        for r in profiled:
            for task, pr in r["profile"].items():
                if pr.get("error"):
                    p(f"| {r['nac_path']} | {r['B']} | {r['T']} | {task} | error: {pr['error']} | | | |")
                    continue
                ks = "; ".join(f"{k['kernel'][:48]} {k['ms']:.3f} x{k['count']}" for k in pr["kernels"][:5])
                p(f"| {r['nac_path']} | {r['B']} | {r['T']} | {task} | {pr['wall_ms']:.2f} | {pr['device_ms']:.2f} | "
                  f"{pr['launches']} | {ks} |")
    v = verdicts(rows)
    failed = [w for w in v if not w[3]]
    errors = sum(1 for r in rows if r.get("error"))
    p("")
    p(f"targets met: {len(v) - len(failed)} of {len(v)}" + (f"; not met: {', '.join(w[0] for w in failed)}"
                                                             if failed else "")
      + (f"; {errors} row(s) without numbers (see their errors)" if errors else ""))


__all__ = ["CELL_KEYS", "CUDA_CELLS", "CUDA_MODELS", "CudaUnavailable", "NAC_PATHS", "PEERS", "STEP_KEYS", "SWEEP_CELLS",
           "SWEEP_CONFIGS", "TARGETS", "bench_nac_cuda", "cuda_problem", "parse_cell", "print_cuda_table",
           "print_sweep_table", "ratio_mark", "sweep_selector", "verdicts"]
