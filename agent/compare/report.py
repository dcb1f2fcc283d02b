"""The comparison's report: the table (markdown and JSON) and the figure, from whatever cells exist.

For each variant (a core and its options, :mod:`agent.compare.cells`) over its seeds:

- the held-out per-frame accuracy (the paper's metric), after BC and after DAgger;
- the closed-loop return over tracks x seeds: mean ± std, median, worst track, tracks at 900 or
  above, and a 95% two-level bootstrap confidence interval of the mean (training seeds resampled,
  then tracks within each seed: :func:`hierarchical_bootstrap_ci`);
- the difference from NAC-Steady's mean with its 95% interval at the level of training seeds
  (:func:`seed_level_difference`: each training run's mean over the same tracks is one
  observation, the between-run variance is pooled over the variants, Student-t), whether it
  excludes 0, and the smallest difference the design detects (:func:`minimum_detectable_effect`,
  80 % power); the two-level bootstrap of the same difference, paired on the (seed, track)
  episodes, is kept in the JSON: with 2 training seeds it covers less than it says (the bootstrap
  draws from 2 values; simulated coverage 0.87-0.89 at a nominal 0.95);
- stalls (episodes with a standstill over 50 steps), mean off-road steps, streaming step latency
  p50/p99, training time and the core's effective parameters;
- the offline-only view: the BC policy's held-out accuracy beside its own closed-loop return.

Missing cells (in ``plan.json`` but without a ``cell.json``) are named. The bootstrap is
Efron & Tibshirani's percentile interval, 10,000 resamples, a fixed seed (the report repeats).

The seed-level analysis is the usual one for comparing training recipes over a few runs (e.g.
Agarwal et al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice",
NeurIPS 2021; Colas, Sigaud and Oudeyer, "How Many Random Seeds?", 2018): the run, not the
episode, is the unit that is resampled by a retraining.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from agent.atomic import save_figure
from agent.compare.cells import REFERENCE, Variant, load_plan, read_json

#: bootstrap resamples and seed
BOOTSTRAP, BOOTSTRAP_SEED = 10_000, 0


def load_cells(out: str | Path) -> list[dict]:
    """Every finished cell (``*/cell.json``) in the comparison folder, sorted by name."""
    cells = [read_json(p) for p in sorted(Path(out).glob("*/cell.json"))]
    return [c for c in cells if c is not None]


def bootstrap_ci(values, n: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (N,); (nan, nan) for none."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(n, v.size))].mean(axis=1)
    a = (1.0 - level) / 2.0
    return float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))


def hierarchical_bootstrap_ci(episodes: dict[tuple[int, int], float], n: int = BOOTSTRAP, seed: int = BOOTSTRAP_SEED,
                              level: float = 0.95) -> tuple[float, float]:
    """Two-level percentile bootstrap of the mean over {(training seed, track): value}.

    Each resample draws the training seeds with replacement, then, within each drawn seed, its
    tracks with replacement (Davison & Hinkley 1997, section 3.8, "multistage sampling"), so the
    interval holds both sources of variation: how a training run turned out and which tracks it
    met. With a single training seed it is the plain bootstrap over tracks, which says nothing
    about training-seed variation. (nan, nan) for no episodes.
    """
    groups: dict[int, list[float]] = {}
    for (s, _track), v in sorted(episodes.items()):
        groups.setdefault(s, []).append(v)
    if not groups:
        return float("nan"), float("nan")
    arrays = [np.asarray(g, dtype=np.float64) for g in groups.values()]
    G = len(arrays)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, G, size=(n, G))  # (n, G) the seeds of each resample
    sums = np.zeros(n)
    counts = np.zeros(n)
    for g, arr in enumerate(arrays):  # resample the tracks of every seed once, use where it was drawn
        track_means = arr[rng.integers(0, arr.size, size=(n, arr.size))].sum(axis=1)  # (n,)
        times = (pick == g).sum(axis=1)  # how often seed g was drawn in each resample
        sums += times * track_means
        counts += times * arr.size
    means = sums / counts
    a = (1.0 - level) / 2.0
    return float(np.quantile(means, a)), float(np.quantile(means, 1.0 - a))


def _episodes(cells: list[dict], key: str = "closed_loop") -> dict[tuple[int, int], float]:
    """{(training seed, track): return} over a variant's cells."""
    out = {}
    for c in cells:
        block = c.get(key)
        if block:
            for track, r in zip(block["seeds"], block["returns"]):
                out[(int(c["seed"]), int(track))] = float(r)
    return out


def paired_difference(a: dict, b: dict, **kw) -> dict | None:
    """Mean of a - b over the (training seed, track) episodes both have, with its two-level
    bootstrap interval (:func:`hierarchical_bootstrap_ci`); None if none shared.

    ``real`` is True when the interval excludes 0 and at least two training seeds are shared:
    with one seed the interval covers the tracks only, not how another training run would do.
    """
    keys = sorted(set(a) & set(b))
    if not keys:
        return None
    d = {k: a[k] - b[k] for k in keys}
    lo, hi = hierarchical_bootstrap_ci(d, **kw)
    n_seeds = len({s for s, _ in keys})
    excludes_zero = bool(lo > 0 or hi < 0)
    return {"mean": float(np.mean(list(d.values()))), "ci95": [lo, hi], "episodes": len(keys), "seeds": n_seeds,
            "excludes_zero": excludes_zero, "real": excludes_zero and n_seeds >= 2}


def pooled_seed_sd(seed_means: dict[str, list[float]]) -> tuple[float, int]:
    """The between-run standard deviation of a run's mean return, pooled over variants.

    Args:
        seed_means: {variant: [mean return of each training seed over the same tracks]}.

    Returns:
        (sd, degrees of freedom = sum over variants of (seeds - 1)); (nan, 0) when no variant has
        two seeds.
    """
    ss, df = 0.0, 0
    for means in seed_means.values():
        m = np.asarray(means, dtype=np.float64)
        if m.size >= 2:
            ss += float(((m - m.mean()) ** 2).sum())
            df += m.size - 1
    return (float(np.sqrt(ss / df)), df) if df else (float("nan"), 0)


def minimum_detectable_effect(se: float, df: int, level: float = 0.95, power: float = 0.8) -> float:
    """The smallest true difference a two-sided t-test at ``level`` finds with probability ``power``:
    (t_{(1+level)/2, df} + t_{power, df}) * se (the normal approximation with t quantiles; Cohen
    1988, ch. 2). nan without degrees of freedom."""
    from scipy import stats

    if df < 1 or not np.isfinite(se):
        return float("nan")
    return float((stats.t.ppf((1 + level) / 2, df) + stats.t.ppf(power, df)) * se)


def seed_level_difference(a: list[float], b: list[float], sd: float, df: int, level: float = 0.95) -> dict | None:
    """Mean of ``a``'s runs minus ``b``'s, with a Student-t interval whose unit is the training run.

    Each entry is one training seed's mean return over the same tracks (so the tracks' difficulty
    cancels); ``sd`` and ``df`` are the pooled between-run standard deviation
    (:func:`pooled_seed_sd`). se = sd * sqrt(1/n_a + 1/n_b); the interval is the difference ± t * se
    with ``df`` degrees of freedom.

    Returns:
        {"mean", "ci95", "se", "df", "seeds": [n_a, n_b], "mde80" (:func:`minimum_detectable_effect`),
        "excludes_zero", "real"} (``real``: the interval excludes 0), or None when either side has
        no run or no variance is known.
    """
    from scipy import stats

    if not a or not b or df < 1 or not np.isfinite(sd):
        return None
    d = float(np.mean(a) - np.mean(b))
    se = float(sd * np.sqrt(1.0 / len(a) + 1.0 / len(b)))
    half = float(stats.t.ppf((1 + level) / 2, df) * se)
    lo, hi = d - half, d + half
    out = {"mean": d, "ci95": [lo, hi], "se": se, "df": int(df), "seeds": [len(a), len(b)],
           "mde80": minimum_detectable_effect(se, df, level), "excludes_zero": bool(lo > 0 or hi < 0)}
    out["real"] = out["excludes_zero"]
    return out


def _variant_order(names: list[str], plan: dict | None) -> list[str]:
    planned = []
    for c in (plan or {}).get("cells", []):
        v = c.rsplit("__s", 1)[0]
        if v not in planned:
            planned.append(v)
    return [v for v in planned if v in names] + sorted(v for v in names if v not in planned)


def summarize(out: str | Path) -> dict:
    """The report's contents as a dict (written as ``report.json``): rows per variant, the missing
    cells, the reference, and the protocol."""
    plan = load_plan(out)
    cells = load_cells(out)
    by_variant: dict[str, list[dict]] = {}
    for c in cells:
        by_variant.setdefault(c["variant"], []).append(c)
    eps_of = {name: _episodes(cs) for name, cs in by_variant.items()}  # {(seed, track): return} per variant
    ref_eps = eps_of.get(REFERENCE, {})
    # the training run is the unit: each run's mean over the tracks every cell drove
    tracks = [set(int(t) for t in c["closed_loop"]["seeds"]) for c in cells if c.get("closed_loop")]
    common = set.intersection(*tracks) if tracks else set()
    run_means = {name: [float(np.mean([eps_of[name][(int(c["seed"]), t)] for t in sorted(common)]))
                        for c in sorted(cs, key=lambda c: c["seed"]) if common]
                 for name, cs in by_variant.items()}
    sd, df = pooled_seed_sd(run_means)
    rows = []
    for name in _variant_order(list(by_variant), plan):
        cs = sorted(by_variant[name], key=lambda c: c["seed"])
        eps = eps_of[name]
        returns = np.array(list(eps.values()))
        bc_eps = _episodes(cs, "closed_loop_bc")
        bc_returns = np.array(list(bc_eps.values()))
        acc = np.array([c["heldout_accuracy"] for c in cs])
        acc_bc = np.array([c["heldout_accuracy_bc"] for c in cs])
        standstills = [s for c in cs for s in c["closed_loop"]["longest_standstill_steps"]]
        off_road = [s for c in cs for s in c["closed_loop"]["off_road_steps"]]
        row = {
            "variant": name, "core": cs[0]["core"], "options": cs[0]["options"], "seeds": [c["seed"] for c in cs],
            "window": cs[0]["window"], "width": cs[0]["width"], "core_parameters": cs[0]["core_parameters"],
            "core_parameter_ratio": cs[0]["core_parameter_ratio"], "topk_effective": cs[0].get("topk_effective"),
            "heldout_accuracy": float(acc.mean()), "heldout_accuracy_std": float(acc.std()),
            "heldout_accuracy_bc": float(acc_bc.mean()),
            "episodes": int(returns.size), "mean": float(returns.mean()), "std": float(returns.std()),
            "ci95": _run_interval(run_means[name], sd, df) or list(hierarchical_bootstrap_ci(eps)),
            "ci95_bootstrap": list(hierarchical_bootstrap_ci(eps)),
            "run_means": run_means[name], "median": float(np.median(returns)), "worst": float(returns.min()),
            "at_least_900": int((returns >= 900).sum()),
            "seed_means": [float(c["closed_loop"]["mean"]) for c in cs],
            "episodes_with_stall": int(sum(s > 50 for s in standstills)), "mean_off_road_steps": float(np.mean(off_road)),
            "latency_p50_ms": float(np.mean([c["latency_ms"]["p50"] for c in cs])),
            "latency_p99_ms": float(np.mean([c["latency_ms"]["p99"] for c in cs])),
            "train_minutes": float(np.mean([c["train_seconds"] for c in cs]) / 60.0),
            "returns": {f"{s}:{t}": r for (s, t), r in sorted(eps.items())},
            "bc_mean": float(bc_returns.mean()) if bc_returns.size else None,
            "bc_std": float(bc_returns.std()) if bc_returns.size else None,
            "bc_ci95": list(hierarchical_bootstrap_ci(bc_eps)) if bc_returns.size else None,
            "difference_from_reference": None if name == REFERENCE else  # one run each: the tracks' bootstrap
            seed_level_difference(run_means[name], run_means.get(REFERENCE, []), sd, df) or paired_difference(eps, ref_eps),
            "difference_from_reference_bootstrap": None if name == REFERENCE else paired_difference(eps, ref_eps),
        }
        rows.append(row)
    # an ablation or a sweep point (core@options) against its base core, when that ran
    for row in rows:
        base = row["core"] if row["options"] and row["core"] in by_variant else None
        row["base"] = base
        row["difference_from_base"] = None if base is None else \
            seed_level_difference(run_means[row["variant"]], run_means[base], sd, df) or \
            paired_difference(eps_of[row["variant"]], eps_of[base])
        row["core_parameter_ratio_to_base"] = None if base is None else \
            row["core_parameters"] / by_variant[base][0]["core_parameters"]
    sweeps = {name: sweep_points(pts) for name, pts in window_sweeps(rows).items()}
    finished = {c["cell"] for c in cells}
    missing = [c for c in (plan or {}).get("cells", []) if c not in finished]
    return {"reference": REFERENCE, "protocol": (plan or {}).get("protocol"), "rows": rows, "missing": missing,
            "window_sweeps": sweeps,
            "runs": {"tracks": len(common), "pooled_sd": sd, "df": df,
                     "unit": "the training run: its mean return over the tracks every cell drove; between-run "
                             "variance pooled over the variants; Student-t intervals with the pooled degrees of "
                             "freedom; mde80: the smallest difference found with 80 % power at the 5 % level"},
            "bootstrap": {"resamples": BOOTSTRAP, "seed": BOOTSTRAP_SEED, "level": 0.95,
                          "unit": "two levels: training seeds, then tracks within each seed; differences "
                                  "paired on shared (seed, track) episodes; a difference is called real only "
                                  "with >= 2 training seeds"}}


def _run_interval(means: list[float], sd: float, df: int, level: float = 0.95) -> list[float] | None:
    """mean of the runs' means ± t * sd / sqrt(runs): the interval of what another training run of
    this variant gives on these tracks; None without a pooled variance."""
    from scipy import stats

    if not means or df < 1 or not np.isfinite(sd):
        return None
    m, half = float(np.mean(means)), float(stats.t.ppf((1 + level) / 2, df) * sd / np.sqrt(len(means)))
    return [m - half, m + half]


def _mark(d: dict) -> str:
    if d.get("real"):
        return " *"
    return " (*)" if d.get("excludes_zero", d.get("real")) else ""


def _mde(d: dict | None) -> str:
    return "-" if d is None or not np.isfinite(d.get("mde80", float("nan"))) else f"{d['mde80']:.0f}"


def _runs_text(summary: dict) -> str:
    """How the intervals were made, and what they can tell apart."""
    runs = summary.get("runs") or {}
    df, sd = runs.get("df", 0), runs.get("pooled_sd", float("nan"))
    if not df:
        return ("Each variant has one training run: no interval can cover another training run, so none is "
                "called real. 95% CI: two-level bootstrap over tracks.")
    counts = sorted({len(r["seeds"]) for r in summary["rows"]})
    few = counts[-1] if counts else 0
    text = (f"The unit is the training run: each run's mean return over the {runs.get('tracks')} tracks every cell "
            f"drove. The between-run standard deviation, pooled over the variants, is {sd:.1f} ({df} degrees of "
            f"freedom); 95% intervals are Student-t on it. Δ: the mean of the variant's runs minus nac-steady's; * "
            f"its interval excludes 0. Smallest Δ detectable: the true difference this design finds with 80 % "
            f"power at the 5 % level; a smaller one can hide inside \"no difference detected\".")
    if few < 3:
        seeds = " or ".join(map(str, counts))
        text += (f" With {seeds} training seed(s) per variant (fewer than 3) the between-run variance rests on few "
                 "runs: read the intervals as rough, and no ranking inside them.")
    return text


def _pm(m, s, digits=1) -> str:
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def markdown(summary: dict) -> str:
    """The tables as markdown: the comparison, the offline-only view, and the missing cells."""
    p = summary.get("protocol") or {}
    lines = ["| variant | T | width | core params (x NAC-Steady) | held-out accuracy (BC / final) | return mean ± std "
             "| 95% CI (runs) | Δ vs nac-steady [95% CI] | smallest Δ detectable | median | worst | >= 900 | stalls "
             "| off-road steps | step p50 / p99 ms | train min | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        d = r["difference_from_reference"]
        diff = "reference" if r["variant"] == summary["reference"] else "n/a" if d is None else \
            f"{d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]{_mark(d)}"
        lines.append(
            f"| {r['variant']} | {r['window']} | {r['width']} | {r['core_parameters']:,} ({r['core_parameter_ratio']:.2f}) "
            f"| {r['heldout_accuracy_bc']:.3f} / {r['heldout_accuracy']:.3f} | {_pm(r['mean'], r['std'])} "
            f"| [{r['ci95'][0]:.1f}, {r['ci95'][1]:.1f}] | {diff} | {_mde(d)} | {r['median']:.1f} | {r['worst']:.1f} "
            f"| {r['at_least_900']}/{r['episodes']} | {r['episodes_with_stall']}/{r['episodes']} "
            f"| {r['mean_off_road_steps']:.0f} | {r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} "
            f"| {r['train_minutes']:.1f} | {','.join(map(str, r['seeds']))} |")
    out = ["## Closed-loop comparison", "",
           f"{p.get('episodes', '?')} tracks from seed {p.get('eval_seed', '?')} per training seed; BC "
           f"{p.get('epochs', '?')} epochs then {p.get('dagger_rounds', '?')} DAgger rounds of "
           f"{p.get('dagger_episodes', '?')} episodes ({p.get('dagger_epochs', '?')} epochs each), window T="
           f"{p.get('window', '?')}. {_runs_text(summary)}",
           "", *lines]
    bc_rows = [r for r in summary["rows"] if r["bc_mean"] is not None]
    if bc_rows:
        out += ["", "## Offline-only view: behaviour cloning alone", "",
                "| variant | held-out accuracy (the paper's metric) | closed-loop return mean ± std | 95% CI |",
                "|---|---|---|---|"]
        out += [f"| {r['variant']} | {r['heldout_accuracy_bc']:.3f} | {_pm(r['bc_mean'], r['bc_std'])} "
                f"| [{r['bc_ci95'][0]:.1f}, {r['bc_ci95'][1]:.1f}] |" for r in bc_rows]
    base_rows = [r for r in summary["rows"] if r.get("base")]
    if base_rows:
        out += ["", "## Variants against their base core (ablations, window sweep)", "",
                "Δ: the variant minus its base core (the same core with the default options), at the level of "
                "training runs as above.", "",
                "| variant | base | core params (x base) | held-out accuracy (BC / final) | return mean ± std "
                "| Δ vs base [95% CI] | smallest Δ detectable | runs (variant, base) |", "|---|---|---|---|---|---|---|---|"]
        for r in base_rows:
            d = r["difference_from_base"]
            diff = "n/a" if d is None else f"{d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]{_mark(d)}"
            out.append(f"| {r['variant']} | {r['base']} | {r['core_parameters']:,} ({r['core_parameter_ratio_to_base']:.2f}) "
                       f"| {r['heldout_accuracy_bc']:.3f} / {r['heldout_accuracy']:.3f} | {_pm(r['mean'], r['std'])} "
                       f"| {diff} | {_mde(d)} | {'-' if d is None else '{}, {}'.format(*d['seeds'])} |")
    sweeps = {k: v for k, v in (summary.get("window_sweeps") or {}).items() if v}
    if sweeps:
        windows = sorted({q["window"] for sp in sweeps.values() for q in sp})
        out += ["", "## Return against window T", "",
                "Each variant's sweep on the training seeds all its points share (a base core that ran more seeds is "
                "cut to those), mean return and 95% interval over those seeds' tracks.", "",
                "| variant | seeds | " + " | ".join(f"T={w}" for w in windows) + " |", "|---|---|" + "---|" * len(windows)]
        for name, sp in sweeps.items():
            at = {q["window"]: f"{q['mean']:.1f} [{q['ci95'][0]:.1f}, {q['ci95'][1]:.1f}]" for q in sp}
            out.append(f"| {name} | {','.join(map(str, sp[0]['seeds']))} | "
                       + " | ".join(at.get(w, "-") for w in windows) + " |")
    if summary["missing"]:
        out += ["", f"Missing cells ({len(summary['missing'])}): " + ", ".join(summary["missing"])]
    return "\n".join(out) + "\n"


def headline(summary: dict) -> str:
    """One paragraph: which variant drives best, by how much, and whether it is outside the noise."""
    rows = summary["rows"]
    if not rows:
        return "No finished cells yet."
    best = max(rows, key=lambda r: r["mean"])
    ref = next((r for r in rows if r["variant"] == summary["reference"]), None)
    text = f"Best mean return: {best['variant']} {best['mean']:.1f} (95% CI {best['ci95'][0]:.1f} to {best['ci95'][1]:.1f}, " \
           f"{best['episodes']} episodes)."
    if ref is not None and best is not ref:
        d = best["difference_from_reference"]
        if d is not None:
            verdict = "a real difference" if d["real"] else "no difference detected"
            text += (f" Against nac-steady ({ref['mean']:.1f} over its own seeds) the difference of the runs' means "
                     f"is {d['mean']:+.1f} (95% CI {d['ci95'][0]:+.1f} to {d['ci95'][1]:+.1f}"
                     + (f", {d['seeds'][0]} and {d['seeds'][1]} training runs): {verdict}; the design detects a "
                        f"difference of {d['mde80']:.0f} or more with 80 % power." if "mde80" in d else
                        f", one training run each, over the tracks only): {verdict}."))
    elif ref is not None:
        others = [r for r in rows if r is not ref and r["difference_from_reference"] is not None]
        real = [r["variant"] for r in others if r["difference_from_reference"]["real"]]
        text += (f" nac-steady has the best mean; it is ahead of {', '.join(real)} outside the noise" if real else
                 " nac-steady has the best mean, but no difference is detected") + "."
    return text


def window_sweeps(rows: list[dict]) -> dict[str, list[tuple[int, dict]]]:
    """Rows that differ only in their window T, grouped by the rest of the variant (its name
    without ``@T=``) and sorted by T; groups with a single T are left out."""
    sweeps: dict[str, list[tuple[int, dict]]] = {}
    for r in rows:
        order = list(r["options"])
        rest = tuple((k, r["options"][k]) for k in order if k != "T")
        sweeps.setdefault(Variant(r["core"], rest).name, []).append((int(r["window"]), r))
    return {k: sorted(v, key=lambda x: x[0]) for k, v in sweeps.items() if len({w for w, _ in v}) > 1}


def sweep_points(pts: list[tuple[int, dict]]) -> list[dict]:
    """One sweep's points on the training seeds that every point has, so that each T is scored on
    the same training runs' tracks (a base core that ran more seeds than its sweep points is cut
    to theirs).

    Args:
        pts: ``window_sweeps`` output for one variant: (T, row) sorted by T.

    Returns:
        [{"window": T, "seeds": [...], "episodes": n, "mean": ..., "ci95": [lo, hi]}] in T order
        (the interval as the table's: two-level bootstrap); empty when no seed is shared.
    """
    shared = set.intersection(*(set(r["seeds"]) for _, r in pts)) if pts else set()
    out = []
    for w, r in pts:
        keyed = {tuple(map(int, k.split(":"))): v for k, v in r["returns"].items()}  # "seed:track" -> (seed, track)
        eps = {st: v for st, v in keyed.items() if st[0] in shared}
        if not eps:
            return []
        vals = np.array(list(eps.values()))
        out.append({"window": int(w), "seeds": sorted(shared), "episodes": int(vals.size), "mean": float(vals.mean()),
                    "ci95": list(hierarchical_bootstrap_ci(eps))})
    return out


def figure(summary: dict, path: str | Path) -> Path:
    """Returns per track for each variant (box plot with every episode as a point, coloured by
    training seed); return against window T for variants that differ only in T; and held-out
    accuracy against closed-loop return (BC and final), written to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    sweeps = {k: v for k, v in (summary.get("window_sweeps") or {}).items() if v}  # summarize's sweep_points
    panels = 2 + bool(sweeps)
    fig, axes = plt.subplots(1, panels, figsize=(6 + 1.0 * max(len(rows), 4) + 5 * (panels - 1), 5),
                             gridspec_kw={"width_ratios": [max(len(rows), 4) / 2] + [2.5] * (panels - 1)})
    ax = axes[0]
    data = [[v for v in r["returns"].values()] for r in rows]
    ax.boxplot(data, showfliers=False, widths=0.6)
    rng = np.random.default_rng(0)
    seeds = sorted({s for r in rows for s in r["seeds"]})
    colors = plt.get_cmap("tab10")
    for i, r in enumerate(rows, start=1):
        for key, v in r["returns"].items():
            s = int(key.split(":")[0])
            ax.plot(i + rng.uniform(-0.18, 0.18), v, "o", ms=3, alpha=0.6, color=colors(seeds.index(s) % 10))
        ax.plot(i, r["mean"], "D", color="black", ms=5)
    ax.set_xticks(range(1, len(rows) + 1), [r["variant"] for r in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("episode return")
    ax.set_title("closed-loop return per track (points: episodes by training seed; diamond: mean)", fontsize=9)
    ax.axhline(900, color="grey", lw=0.8, ls="--")
    k = 1
    if sweeps:
        ax = axes[k]
        k += 1
        for name, sp in sweeps.items():
            ax.errorbar([q["window"] for q in sp], [q["mean"] for q in sp],
                        yerr=np.array([[q["mean"] - q["ci95"][0], q["ci95"][1] - q["mean"]] for q in sp]).T,
                        marker="o", capsize=3, label=f"{name} (seeds {','.join(map(str, sp[0]['seeds']))})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("window T (frames)")
        ax.set_ylabel("mean return (95% CI)")
        ax.set_title("return against window T (each line on the training seeds all its points share)", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[k]
    for r in rows:
        ax.plot(r["heldout_accuracy"], r["mean"], "o", color="C0")
        ax.annotate(r["variant"], (r["heldout_accuracy"], r["mean"]), fontsize=6)
        if r["bc_mean"] is not None:
            ax.plot(r["heldout_accuracy_bc"], r["bc_mean"], "s", color="C1")
    ax.plot([], [], "o", color="C0", label="BC + DAgger")
    ax.plot([], [], "s", color="C1", label="BC alone")
    ax.set_xlabel("held-out per-frame accuracy")
    ax.set_ylabel("mean closed-loop return")
    ax.set_title("the paper's metric against driving", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110, what="comparison figure")


def write_report(out: str | Path) -> dict:
    """Write ``report.md``, ``report.json`` and ``compare.png`` into the comparison folder.

    Returns:
        {"summary": ..., "paths": [...]}.

    Raises:
        FileNotFoundError: ``out`` is not a folder.
    """
    out = Path(out)
    if not out.is_dir():
        raise FileNotFoundError(f"{out} is not a comparison folder (run agent compare --out {out} first)")
    summary = summarize(out)
    summary["headline"] = headline(summary)
    md = markdown(summary) + "\n" + summary["headline"] + "\n"
    (out / "report.md").write_text(md)
    (out / "report.json").write_text(json.dumps(summary, indent=2) + "\n")
    paths = [out / "report.md", out / "report.json"]
    if summary["rows"]:
        paths.append(figure(summary, out / "compare.png"))
    return {"summary": summary, "paths": paths, "markdown": md}


__all__ = ["bootstrap_ci", "figure", "headline", "load_cells", "markdown", "paired_difference", "summarize",
           "sweep_points", "window_sweeps", "write_report"]
