"""The closed-loop comparison of temporal cores: its cells, their protocol, and running them.

A *variant* is a temporal core with options (``nac-steady``, ``lstm``, ``nac-exact@wiring=fc``,
``nac-steady@T=16@topk=2``); a *cell* is one variant trained with one seed. Every cell gets the
same CNN (the default CarRacing features extractor), the same expert recordings, the same DAgger
protocol on its own rollouts (the same DAgger tracks), the same epochs and the same window T
(unless the variant sets ``T``), and is scored on the same unseen tracks. Each cell writes its
own folder ``OUT/<variant>__s<seed>/``:

- ``bc.pt`` (after behaviour cloning) and ``policy.pt`` (after DAgger);
- ``train.json`` once training is done (so an interrupted cell resumes at its evaluation);
- ``cell.json`` once everything is measured: the configuration, the parameters, the held-out
  per-frame accuracy (the paper's metric) of BC and of the final policy, the closed-loop returns
  per track with the longest standstill and the off-road steps, the BC policy's returns (the
  offline-only view), the streaming step latency p50/p99 and the training time.

``OUT/plan.json`` keeps the protocol and every cell asked for, so a comparison resumes after an
interruption, can be spread over sessions or machines (copy the cell folders into one OUT), and
:mod:`agent.compare.report` can name the missing cells.

Widths: NAC variants keep the policy's d_model (64); every other core gets the width (its d,
a multiple of 4) whose effective parameter count (:func:`agent.nn.cores.count_effective_parameters`)
is closest to NAC-Steady's at the same T, so the cores compare at about equal size (the issue asks
for a factor of 1.5 at most; ``@width=D`` forces one).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agent.actors.loading import is_continuous, load_policy, make_carracing_for, reads_speedometer
from agent.actors.rollout import PolicyActor
from agent.atomic import write_json_atomic
from agent.data.recordings import load_demonstrations
from agent.data.windows import DemonstrationSource
from agent.eval.closed_loop import evaluate
from agent.eval.offline import score_stream
from agent.experts.rules import TeacherRules
from agent.log import get_logger, progress as bar_for
from agent.nn.cores import CORES, count_effective_parameters, count_parameters
from agent.nn.policy import DrivingPolicy, default_config, default_core_kwargs
from agent.train.bc import TRAIN_DEFAULTS, TrainConfig, report_metadata
from agent.train.run import train

log = get_logger(__name__)

#: options a variant can set, with their types: window T (frames), core width d (``d_model``),
#: NAC wiring sparsity, NAC top-k, NAC wiring ("ncp" or "fc", the paper's NAC-FC)
VARIANT_OPTIONS: dict[str, type] = {"T": int, "width": int, "sparsity": float, "topk": int, "wiring": str}
#: options that only NAC cores take
NAC_ONLY = ("sparsity", "topk", "wiring")
#: the reference every other core is compared with
REFERENCE = "nac-steady"
#: the cores of the headline comparison (``agent compare``'s default ``--cores``)
DEFAULT_CORES = ("nac-steady", "nac-exact", "nac-euler", "lstm", "gru", "cfc", "ltc", "mha", "none")
#: width search range for the non-NAC cores (multiples of 4)
WIDTH_STEP, WIDTH_MAX = 4, 4096


@dataclass(frozen=True)
class Variant:
    """A core and its options; ``name`` is the canonical text (``core@key=value@...``, keys in
    :data:`VARIANT_OPTIONS` order)."""

    core: str
    options: tuple = ()

    @classmethod
    def parse(cls, text: str) -> "Variant":
        """``"nac-steady@T=8@topk=2"`` -> Variant("nac-steady", (("T", 8), ("topk", 2))).

        Raises:
            ValueError: an unknown core or option, a malformed or repeated option, a bad value, or
                a NAC-only option on another core.
        """
        parts = text.strip().split("@")
        core, opts = parts[0].strip(), {}
        if core not in CORES:
            raise ValueError(f"unknown core {core!r} in {text!r}; choose one of {', '.join(CORES)}")
        for part in parts[1:]:
            key, eq, value = part.partition("=")
            key = key.strip()
            if not eq or key not in VARIANT_OPTIONS:
                raise ValueError(f"bad option {part!r} in {text!r}: write core@key=value with key one of "
                                 f"{', '.join(VARIANT_OPTIONS)} (e.g. nac-steady@T=8@topk=2)")
            if key in opts:
                raise ValueError(f"option {key} given twice in {text!r}")
            try:
                opts[key] = VARIANT_OPTIONS[key](value.strip())
            except ValueError:
                raise ValueError(f"option {key} in {text!r} needs a {VARIANT_OPTIONS[key].__name__}, got {value!r}") \
                    from None
        if not core.startswith("nac-"):
            bad = [k for k in NAC_ONLY if k in opts]
            if bad:
                raise ValueError(f"{', '.join(bad)} only apply to the nac-* cores, not {core} ({text!r})")
        if opts.get("T", 1) < 1 or opts.get("width", 1) < 1 or opts.get("topk", 1) < 1:
            raise ValueError(f"T, width and topk must be >= 1 in {text!r}")
        if "sparsity" in opts and not 0.0 <= opts["sparsity"] < 1.0:
            raise ValueError(f"sparsity must be in [0, 1) in {text!r}")
        if "wiring" in opts and opts["wiring"] not in ("ncp", "fc"):
            raise ValueError(f"wiring must be ncp or fc in {text!r}")
        order = list(VARIANT_OPTIONS)
        return cls(core, tuple(sorted(opts.items(), key=lambda kv: order.index(kv[0]))))

    @property
    def name(self) -> str:
        return "@".join([self.core] + [f"{k}={_fmt(v)}" for k, v in self.options])

    def get(self, key: str, default=None):
        return dict(self.options).get(key, default)


def _fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def parse_variants(texts, windows=None) -> list[Variant]:
    """Variants from ``--cores`` entries (comma-separated strings or a list); ``windows`` (a list of
    T) expands each entry without its own T into one variant per window. Duplicates are dropped,
    order kept.

    Raises:
        ValueError: see :meth:`Variant.parse`; an empty list.
    """
    if isinstance(texts, str):
        texts = [texts]
    items = [t for text in texts for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError("no cores given; e.g. --cores nac-steady,lstm")
    out: list[Variant] = []
    for item in items:
        v = Variant.parse(item)
        expanded = [v] if not windows or v.get("T") is not None else \
            [Variant.parse(f"{item}@T={w}") for w in windows]
        out.extend(x for x in expanded if x not in out)
    return out


def cell_name(variant: Variant, seed: int) -> str:
    """The cell's folder name: ``<variant>__s<seed>``."""
    return f"{variant.name}__s{seed}"


@dataclass
class Protocol:
    """What every cell of one comparison shares (kept in ``plan.json``; cells of one OUT must agree).

    The field names are the plan's (``plan.json``, ``cell.json``); ``agent compare``'s options map
    onto them (:class:`agent.compare.config.CompareConfig`: ``--teacher.expert`` is ``expert``,
    ``--dagger.track-seed`` is ``dagger_seed``, ``--track-seed`` is ``eval_seed``).

    Attributes:
        data: the expert recordings (Minari folders) behaviour cloning reads.
        expert: the PPO expert ``.zip`` that labels DAgger rollouts: by default
            ``carracing-expert-discrete-margin.zip``, the teacher of the shipped ``nac.pt``
            (the shipped comparison, results/compare-carracing, used ``carracing-expert.zip``).
        start_rule, creep_speed, brake_floor, grass_rule: the DAgger teacher's rules
            (:class:`agent.experts.rules.TeacherRules`; the recordings keep their labels). The start
            rule is on, as DAgger's teacher needs it: without it the expert labels a stopped
            student's states "stay" (README, "The expert's stalls").
        window: T, frames per window (a variant's ``T`` overrides it).
        epochs: behaviour-cloning epochs. dagger_*: as ``agent train`` (rounds, student episodes
            per round, epochs on the aggregate, beta and its decay, disturbances per 1000 steps,
            first DAgger track, episode cap).
        episodes, eval_seed, max_steps: the closed-loop tracks, eval_seed .. eval_seed+episodes-1,
            and the episode cap (None: 1000 steps).
        eval_bc: also drive the BC policy on the same tracks (the offline-only view).
        latency_steps: streaming steps timed for the latency figures.
    """

    data: list[str]
    expert: str | None = "carracing-expert-discrete-margin.zip"
    window: int = 4
    epochs: int = 4
    dagger_rounds: int = 2
    dagger_episodes: int = 8
    dagger_epochs: int = 2
    dagger_beta: float = 0.5
    dagger_beta_decay: float = 0.5
    dagger_disturb: float = 2.0
    dagger_seed: int = 500_000
    dagger_max_steps: int | None = None
    start_rule: bool = True
    creep_speed: float = 0.0
    brake_floor: float | None = None
    grass_rule: bool = False
    episodes: int = 30
    eval_seed: int = 1_000_000
    max_steps: int | None = None
    eval_bc: bool = True
    latency_steps: int = 200

    def __post_init__(self):
        self.data = [str(d) for d in self.data]
        if not self.data:
            raise ValueError("the comparison needs expert recordings (--data)")
        if self.window < 1 or self.epochs < 1 or self.dagger_rounds < 0 or self.episodes < 1:
            raise ValueError(f"window, epochs and episodes must be >= 1 and dagger_rounds >= 0, got {self.window}, "
                             f"{self.epochs}, {self.episodes} and {self.dagger_rounds}")
        if self.latency_steps < 10:
            raise ValueError(f"latency_steps must be >= 10, got {self.latency_steps}")

    def differences(self, other: "Protocol") -> list[str]:
        """The fields where ``other`` differs, as ``name: mine -> other``."""
        a, b = asdict(self), asdict(other)
        return [f"{k}: {a[k]!r} -> {b[k]!r}" for k in a if a[k] != b[k]]


# ---------------------------------------------------------------------------------------------- sizes
def _config(variant: Variant, seed: int, protocol: Protocol, width: int):
    core_kwargs = default_core_kwargs("carracing", variant.core)
    core_kwargs.update({k: v for k, v in variant.options if k in NAC_ONLY})
    return default_config("carracing", core=variant.core, window=variant.get("T", protocol.window), d_model=width,
                          core_kwargs=core_kwargs, seed=22222 + seed)


def core_parameters(variant: Variant, protocol: Protocol, width: int, seed: int = 0) -> int:
    """Effective parameters of the variant's core at width d (:func:`agent.nn.cores.count_effective_parameters`)."""
    return count_effective_parameters(DrivingPolicy(_config(variant, seed, protocol, width)).core)


def choose_width(variant: Variant, protocol: Protocol) -> tuple[int, int, int]:
    """(width d, the core's effective parameters, NAC-Steady's at the same T).

    NAC variants (and torch-nac) keep the default d_model; ``@width=`` is kept as given; every
    other core gets the multiple of 4 whose effective parameter count is closest to the reference's
    (in ratio), found by doubling and bisection (the count grows with d).
    """
    default_width = default_config("carracing").d_model
    ref_variant = Variant(REFERENCE, tuple((k, v) for k, v in variant.options if k == "T"))
    reference = core_parameters(ref_variant, protocol, default_width)
    if variant.get("width") is not None:
        d = int(variant.get("width"))
        return d, core_parameters(variant, protocol, d), reference
    if variant.core.startswith("nac-") or variant.core == "torch-nac":
        return default_width, core_parameters(variant, protocol, default_width), reference

    def count(k: int) -> int:
        return core_parameters(variant, protocol, k * WIDTH_STEP)

    # doubling, then bisection (wide LTC wirings are slow to build, so never start from the top)
    top = WIDTH_MAX // WIDTH_STEP
    hi = 1
    while hi < top and count(hi) < reference:
        hi = min(2 * hi, top)
    lo = max(1, hi // 2)
    if count(hi) < reference:
        lo = hi
    else:
        while lo < hi:  # smallest k with count(k) >= reference
            mid = (lo + hi) // 2
            if count(mid) >= reference:
                hi = mid
            else:
                lo = mid + 1
    candidates = {k: count(k) for k in {max(1, lo - 1), lo}}
    k = min(candidates, key=lambda c: abs(math.log(candidates[c] / reference)))
    return k * WIDTH_STEP, candidates[k], reference


# ---------------------------------------------------------------------------------------------- latency
def step_latency(policy, steps: int = 200, warmup: int = 10, seed: int = 0) -> tuple[float, float]:
    """Streaming step latency of a policy, (p50, p99) in milliseconds: one
    :class:`agent.actors.rollout.PolicyActor` ``act`` per frame (the CNN, the core's streaming ``step`` and
    the head; no env, no overlays) on random 96x96x3 frames, after ``warmup`` steps, in this
    process's torch threads."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, size=(8, 96, 96, 3), dtype=np.uint8)
    actor = PolicyActor(policy)
    actor.reset()
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        actor.act(frames[i % len(frames)], None, None)
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1000.0)
    return float(np.percentile(times, 50)), float(np.percentile(times, 99))


# ---------------------------------------------------------------------------------------------- one cell
def read_json(path: Path) -> dict | None:
    """A cell file, or None if it is missing or unreadable (a cell that never finished)."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class CellResult:
    """What :func:`run_cell` returns to the driver: the cell, whether it ran or was already done,
    and its ``cell.json`` contents."""

    name: str
    status: str  # "done" (ran now), "kept" (already finished), "failed"
    cell: dict = field(default_factory=dict)
    error: str = ""


def _return_summary(returns: list[float]) -> dict:
    r = np.asarray(returns, dtype=np.float64)
    return {"mean": float(r.mean()), "std": float(r.std()), "median": float(np.median(r)), "worst": float(r.min()),
            "at_least_900": int((r >= 900).sum())}


def _closed_loop(path: Path, protocol: Protocol) -> dict:
    res = evaluate(path, protocol.episodes, protocol.eval_seed, max_steps=protocol.max_steps, workers=1,
                   progress=False)
    return {"seeds": res.seeds, "returns": res.returns, "steps": res.steps,
            "longest_standstill_steps": res.longest_standstill_steps, "off_road_steps": res.off_road_steps,
            "episodes_with_stall": res.episodes_with_stall, "mean_off_road_steps": res.mean_off_road_steps,
            "seconds": res.seconds, **_return_summary(res.returns)}


def run_cell(variant: Variant | str, seed: int, protocol: Protocol, out: str | Path, threads: int = 1,
             device: str = "cpu") -> CellResult:
    """Train, score and drive one cell; skip whatever its folder already holds.

    Steps: behaviour cloning on ``protocol.data`` (``bc.pt``), DAgger (``policy.pt``,
    ``train.json``), held-out per-frame accuracy of both on the held-out demonstration episodes
    of this seed's split, closed-loop returns on the protocol's tracks (and the BC policy's, with
    ``eval_bc``), streaming step latency; then ``cell.json``.

    Args:
        variant: the variant (or its text). seed: the training seed (weights, split, batches,
            DAgger's mixing draws). protocol: the shared :class:`Protocol`. out: the comparison folder.
        threads: torch CPU threads for this cell (0: torch's default).
        device: the torch device that trains the cell (scoring, driving and the latency run on the CPU).

    Returns:
        the :class:`CellResult` (status "done" or "kept").

    Raises:
        FileNotFoundError, ValueError (RecordingError): missing or malformed recordings or expert.
    """
    import torch

    variant = Variant.parse(variant) if isinstance(variant, str) else variant
    name = cell_name(variant, seed)
    folder = Path(out) / name
    done = read_json(folder / "cell.json")
    if done is not None:
        return CellResult(name, "kept", done)
    folder.mkdir(parents=True, exist_ok=True)
    if threads:
        torch.set_num_threads(threads)
    width, params, reference = choose_width(variant, protocol)
    pcfg = _config(variant, seed, protocol, width)
    defaults = {k: v for k, v in TRAIN_DEFAULTS["carracing"].items() if k != "epochs"}
    cfg = TrainConfig(**defaults, epochs=protocol.epochs, seed=seed, dagger_rounds=protocol.dagger_rounds,
                      dagger_episodes=protocol.dagger_episodes, dagger_epochs=protocol.dagger_epochs,
                      dagger_seed=protocol.dagger_seed, dagger_beta=protocol.dagger_beta,
                      dagger_beta_decay=protocol.dagger_beta_decay, dagger_max_steps=protocol.dagger_max_steps,
                      dagger_disturb=protocol.dagger_disturb, device=device)
    source = DemonstrationSource(load_demonstrations(protocol.data))
    _, val_src = source.split(cfg.val_fraction, cfg.seed)
    trained = read_json(folder / "train.json")
    if trained is None or not (folder / "policy.pt").is_file():
        expert = env = None
        if protocol.dagger_rounds:
            expert = load_policy(protocol.expert)
            if is_continuous(expert):
                raise ValueError(f"{protocol.expert} is a continuous expert; the comparison uses the discrete one")
            TeacherRules(start_rule=protocol.start_rule, creep_speed=protocol.creep_speed,
                         brake_floor=protocol.brake_floor, grass_rule=protocol.grass_rule).apply(expert)
            env = make_carracing_for(expert, speedometer=reads_speedometer(pcfg))
        t0 = time.time()
        log.info("cell %s: training (%s, width %d, %d core parameters)", name, variant.core, width, params)
        policy, report = train(source, pcfg, cfg, tensorboard_dir=None, expert=expert, env=env,
                               bc_checkpoint=folder / "bc.pt")
        train_seconds = time.time() - t0
        if env is not None:
            env.close()
        policy.save(folder / "policy.pt", metadata=json.loads(json.dumps(
            report_metadata(report, command=f"agent compare (cell {name})", recordings=protocol.data), default=str)))
        if not protocol.dagger_rounds:
            (folder / "bc.pt").unlink(missing_ok=True)  # the same policy as policy.pt
        trained = {"train_seconds": train_seconds, "bc_seconds": report.seconds.get("bc"),
                   "dagger_returns": report.dagger_returns, "n_train_frames": report.n_train_frames,
                   "n_val_frames": report.n_val_frames, "epochs": [asdict(e) for e in report.epochs]}
        write_json_atomic(folder / "train.json", trained)
    policy = load_policy(folder / "policy.pt")
    if not isinstance(policy, DrivingPolicy):
        raise ValueError(f"{folder / 'policy.pt'} is not a driving policy; delete the cell folder to retrain it")
    log.info("cell %s: held-out accuracy and closed loop on %d tracks", name, protocol.episodes)
    accuracy, frames = score_stream(policy, val_src)
    bc_path = folder / "bc.pt" if protocol.dagger_rounds else folder / "policy.pt"
    bc_accuracy = score_stream(load_policy(bc_path), val_src)[0] if protocol.dagger_rounds else accuracy
    t0 = time.time()
    closed = _closed_loop(folder / "policy.pt", protocol)
    closed_bc = _closed_loop(bc_path, protocol) if protocol.eval_bc and protocol.dagger_rounds else \
        (closed if protocol.eval_bc else None)
    eval_seconds = time.time() - t0
    p50, p99 = step_latency(policy, protocol.latency_steps)
    cell = {
        "cell": name, "variant": variant.name, "core": variant.core, "options": dict(variant.options),
        "seed": seed, "protocol": asdict(protocol), "window": pcfg.window, "width": width,
        "core_kwargs": pcfg.core_kwargs, "topk_effective": (min(pcfg.core_kwargs["topk"], pcfg.window)
                                                            if "topk" in pcfg.core_kwargs else None),
        "core_parameters": params, "reference_core_parameters": reference,
        "core_parameter_ratio": params / reference, "core_parameters_all_entries": count_parameters(policy.core),
        "policy_parameters": count_parameters(policy),
        "heldout_accuracy": float(accuracy), "heldout_accuracy_bc": float(bc_accuracy), "heldout_frames": int(frames),
        "closed_loop": closed, "closed_loop_bc": closed_bc,
        "latency_ms": {"p50": p50, "p99": p99, "steps": protocol.latency_steps, "threads": torch.get_num_threads()},
        **{k: trained[k] for k in ("train_seconds", "bc_seconds", "dagger_returns", "n_train_frames")},
        "eval_seconds": eval_seconds, "torch": torch.__version__,
    }
    write_json_atomic(folder / "cell.json", cell)
    log.info("cell %s: return %.1f ± %.1f, held-out accuracy %.3f", name, closed["mean"], closed["std"], accuracy)
    return CellResult(name, "done", cell)


def _run_cell_job(args) -> CellResult:
    """Worker entry point for ``--workers`` (a spawned process): never raises, reports the failure."""
    variant, seed, protocol, out, threads, device = args
    try:
        return run_cell(variant, seed, Protocol(**protocol), out, threads, device)
    except Exception as exc:  # noqa: BLE001 - one failed cell must not stop the others
        import traceback

        return CellResult(cell_name(Variant.parse(variant), seed), "failed", error="".join(
            traceback.format_exception_only(type(exc), exc)).strip())


# ---------------------------------------------------------------------------------------------- the plan
def load_plan(out: str | Path) -> dict | None:
    """``OUT/plan.json``: {"protocol": {...}, "cells": [names...]}, or None."""
    return read_json(Path(out) / "plan.json")


def update_plan(out: str | Path, protocol: Protocol, cells: list[str]) -> dict:
    """Record the protocol and add ``cells`` to the plan; the same OUT keeps one protocol.

    Raises:
        ValueError: OUT holds a comparison made with another protocol (the message lists the
            differences).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    plan = load_plan(out)
    if plan is not None:
        old = Protocol(**plan["protocol"])
        diff = old.differences(protocol)
        if diff:
            raise ValueError(f"{out} holds a comparison made with another protocol ({'; '.join(diff)}); its cells "
                             "would not be comparable. Use another --out, or the same settings")
        names = list(plan["cells"]) + [c for c in cells if c not in plan["cells"]]
    else:
        names = list(cells)
    plan = {"protocol": asdict(protocol), "cells": names}
    write_json_atomic(out / "plan.json", plan)
    return plan


def run_comparison(variants: list[Variant], seeds: list[int], protocol: Protocol, out: str | Path, workers: int = 1,
                   threads: int = 1, progress: bool = True, device: str = "cpu") -> list[CellResult]:
    """Run every (variant, seed) cell not finished yet, ``workers`` at a time (spawned processes), training on
    ``device``.

    Raises:
        ValueError: see :func:`update_plan`; no variants or seeds.
    """
    if not variants or not seeds:
        raise ValueError("the comparison needs at least one core and one seed")
    cells = [(v, s) for s in seeds for v in variants]
    update_plan(out, protocol, [cell_name(v, s) for v, s in cells])
    results: list[CellResult] = []
    bar = bar_for(total=len(cells), desc="compare", unit="cell", disable=not progress)
    if workers <= 1:
        for v, s in cells:
            results.append(run_cell(v, s, protocol, out, threads, device))
            bar.update(1)
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
            futures = [pool.submit(_run_cell_job, (v.name, s, asdict(protocol), str(out), threads, device))
                       for v, s in cells]
            for f in as_completed(futures):
                r = f.result()
                if r.status == "failed":
                    log.error("cell %s failed: %s", r.name, r.error)
                results.append(r)
                bar.update(1)
    bar.close()
    return results


__all__ = ["CellResult", "DEFAULT_CORES", "Protocol", "REFERENCE", "VARIANT_OPTIONS", "Variant", "cell_name",
           "choose_width", "core_parameters", "load_plan", "parse_variants", "read_json", "run_cell",
           "run_comparison", "step_latency", "update_plan"]
