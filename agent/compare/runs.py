"""Whole recipe runs compared: does the temporal core matter at the top?

``agent compare --runs CORE:SEED=EVAL.json[,EVAL.json ...]`` reads the ``agent evaluate --json``
files of finished recipe runs (e.g. ``agent train --config recipes/nac.toml --policy.core gru``,
one run per training seed, each driven on the unseen sets) and writes ``OUT/runs.md`` and
``OUT/runs.json``:

- per run and per evaluation file (one set of tracks): the mean return with its Student-t
  interval over the tracks, the worst track, the tracks at 600 or more, and the episodes that
  stood still over 50 steps; and whether the run passes :data:`QUALITY` (the issue "nac.pt from
  one command": a mean of 905 or more on each set, every track at 600 or more, no standstill);
- per core: the mean of its runs' means over the tracks every run drove, with an interval whose
  unit is the training run, and its difference from the reference core with the smallest
  difference the design detects (:func:`agent.compare.report.seed_level_difference`,
  :func:`agent.compare.report.minimum_detectable_effect`: the between-run variance pooled over the
  cores, Student-t). With fewer than 3 runs a core the report says the intervals are rough;
- per core: its tail over every episode of its runs (:func:`tail_summary`): the tracks below 600
  with their rate's Clopper-Pearson interval, the episodes more than 50 steps off the road, and
  how many of those excursions cost the track 600; against the reference, Fisher's exact test on
  the tracks below 600. Two cores with equal means can differ here: one that rarely leaves the
  road but loses the lap when it does, one that leaves it more often at a smaller cost.

The run, not the episode, is the unit: a retraining draws a new run (Colas, Sigaud and Oudeyer,
"How Many Random Seeds?", 2018; Agarwal et al., NeurIPS 2021).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from agent.atomic import write_atomic
from agent.compare.report import pooled_seed_sd, seed_level_difference

#: what each core of a recipe run is, in the words the comparison page uses (the recipe's features extractor, a
#: CNN with the motion channel, feeds each of them)
CORE_MEANING = {
    "nac-steady": "NAC (Neuronal Attention Circuit), steady-state logits, over the last T frames: memory by attention",
    "nac-exact": "NAC with the exact ODE logits over the last T frames: memory by attention",
    "nac-euler": "NAC with Euler-integrated logits over the last T frames: memory by attention",
    "nac": "NAC over the last T frames: memory by attention",
    "gru": "a GRU over the last T frames: recurrent memory",
    "lstm": "an LSTM over the last T frames: recurrent memory",
    "mha": "multi-head self-attention over the last T frames",
    "none": "no temporal core and T = 1: the newest frame and its motion channel (its difference to the frame "
            "before), that is frame stacking of two frames; no memory beyond that",
}

#: the quality a recipe run must reach on each unseen set
QUALITY = {"mean_at_least": 905.0, "every_track_at_least": 600.0, "standstill_steps_at_most": 50}

#: an episode that spends more steps than this off the road (all four wheels on the grass) is an excursion
EXCURSION_STEPS = 50


def parse_run_spec(text: str) -> tuple[str, int, list[Path]]:
    """``"CORE:SEED=A.json,B.json"`` -> (core, seed, [paths]).

    Raises:
        ValueError: another shape (the message shows the expected one).
    """
    try:
        head, files = text.split("=", 1)
        core, seed = head.rsplit(":", 1)
        paths = [Path(f) for f in files.split(",") if f.strip()]
        if not core or not paths:
            raise ValueError
        return core.strip(), int(seed), paths
    except ValueError:
        raise ValueError(f"--runs takes CORE:SEED=EVAL.json[,EVAL.json ...] (agent evaluate --json files of one "
                         f"training run), e.g. nac-steady:0=runs/nac/eval-1000000.json,runs/nac/eval-2000000.json; "
                         f"got {text!r}") from None


def _read_eval(path: Path) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read as an `agent evaluate --json` file ({exc})") from exc
    if not isinstance(d, dict) or not {"seeds", "returns"} <= set(d) or len(d["seeds"]) != len(d["returns"]):
        raise ValueError(f"{path} is not an `agent evaluate --json` file of CarRacing (it needs seeds and returns of "
                         "equal length)")
    return d


def _t_interval(values: np.ndarray, level: float = 0.95) -> list[float]:
    from scipy import stats

    if values.size < 2:
        return [float("nan"), float("nan")]
    half = stats.t.ppf((1 + level) / 2, values.size - 1) * values.std(ddof=1) / math.sqrt(values.size)
    return [float(values.mean() - half), float(values.mean() + half)]


def set_summary(d: dict, path: Path) -> dict:
    """One evaluation file (one run on one set of tracks): the figures of the quality bar."""
    r = np.asarray(d["returns"], dtype=np.float64)
    stand = np.asarray(d.get("longest_standstill_steps") or [0] * r.size)
    tracks = [int(s) for s in d["seeds"]]
    out = {"file": str(path), "tracks": [min(tracks), max(tracks)], "episodes": int(r.size), "mean": float(r.mean()),
           "ci95": _t_interval(r), "worst": float(r.min()), "worst_track": tracks[int(r.argmin())],
           "at_least_600": int((r >= QUALITY["every_track_at_least"]).sum()),
           "standstills": int((stand > QUALITY["standstill_steps_at_most"]).sum()),
           "laps": d.get("laps_finished")}
    off = d.get("off_road_steps")
    out["excursions"] = None if off is None else int((np.asarray(off) > EXCURSION_STEPS).sum())
    out["passes"] = bool(out["mean"] >= QUALITY["mean_at_least"] and out["at_least_600"] == r.size
                         and out["standstills"] == 0)
    return out


def tail_summary(evals: Sequence[dict]) -> dict:
    """The tail of one core over every episode of its runs (one dict per evaluation file).

    Returns ``episodes``; ``below_600`` (tracks under the bar) with ``rate_ci95``, the exact
    Clopper-Pearson 95 % interval of the per-track rate (Clopper and Pearson, Biometrika 1934);
    ``excursions``, the episodes more than :data:`EXCURSION_STEPS` steps off the road, and
    ``excursions_below_600``, those of them that ended under 600 (both None when the files carry no
    ``off_road_steps``). Episodes of different runs count as independent draws, which ignores the
    run-to-run spread: read the counts as a description, the test on them as a first look.
    """
    from scipy import stats

    r = np.concatenate([np.asarray(d["returns"], dtype=np.float64) for d in evals])
    low = r < QUALITY["every_track_at_least"]
    k, n = int(low.sum()), int(r.size)
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="exact") if n else None
    out = {"episodes": n, "below_600": k, "rate_ci95": [float(ci.low), float(ci.high)] if ci else [float("nan")] * 2,
           "excursions": None, "excursions_below_600": None}
    if all(d.get("off_road_steps") is not None for d in evals):
        off = np.concatenate([np.asarray(d["off_road_steps"]) for d in evals]) > EXCURSION_STEPS
        out["excursions"], out["excursions_below_600"] = int(off.sum()), int((off & low).sum())
    return out


def tail_difference(tail: dict, reference: dict) -> float:
    """Two-sided p-value of Fisher's exact test: tracks below 600 of a core against the reference's."""
    from scipy import stats

    table = [[tail["below_600"], tail["episodes"] - tail["below_600"]],
             [reference["below_600"], reference["episodes"] - reference["below_600"]]]
    return float(stats.fisher_exact(table).pvalue)


def runs_summary(specs: Sequence[str], reference: str | None = None) -> dict:
    """Read the runs and compare the cores; the dict ``runs.json`` holds.

    Args:
        specs: ``CORE:SEED=EVAL.json[,...]`` per run (:func:`parse_run_spec`).
        reference: the core the others are compared with (default: the first one named).

    Raises:
        ValueError: a bad spec, an unreadable file, a run named twice, or runs of one core that
            drove different tracks (their means would not compare).
    """
    runs: dict[str, dict[int, list[tuple[Path, dict]]]] = {}
    for text in specs:
        core, seed, paths = parse_run_spec(text)
        if seed in runs.get(core, {}):
            raise ValueError(f"--runs names {core}:{seed} twice")
        runs.setdefault(core, {})[seed] = [(p, _read_eval(p)) for p in paths]
    if not runs:
        raise ValueError("--runs: give at least one run")
    reference = reference or next(iter(runs))
    all_tracks = [set(int(t) for _, d in evs for t in d["seeds"]) for seeds in runs.values() for evs in seeds.values()]
    common = sorted(set.intersection(*all_tracks))
    rows, run_means = [], {}
    for core, seeds in runs.items():
        run_means[core] = []
        for seed, evs in sorted(seeds.items()):
            by_track = {int(t): float(r) for _, d in evs for t, r in zip(d["seeds"], d["returns"])}
            m = float(np.mean([by_track[t] for t in common])) if common else float("nan")
            run_means[core].append(m)
            sets = [set_summary(d, p) for p, d in evs]
            rows.append({"core": core, "seed": seed, "mean_common": m, "sets": sets,
                         "passes": all(s["passes"] for s in sets)})
    sd, df = pooled_seed_sd(run_means)
    tails = {core: tail_summary([d for evs in seeds.values() for _, d in evs]) for core, seeds in runs.items()}
    cores = []
    for core, means in run_means.items():
        from scipy import stats

        n = len(means)
        half = float(stats.t.ppf(0.975, df) * sd / math.sqrt(n)) if df else float("nan")
        diff = None if core == reference else seed_level_difference(means, run_means[reference], sd, df)
        cores.append({"core": core, "runs": n, "run_means": means, "mean": float(np.mean(means)),
                      "ci95": [float(np.mean(means)) - half, float(np.mean(means)) + half],
                      "difference_from_reference": diff,
                      "tail": {**tails[core], "fisher_p_vs_reference":
                               None if core == reference else tail_difference(tails[core], tails[reference])}})
    return {"reference": reference, "tracks": len(common), "pooled_sd": sd, "df": df, "quality": QUALITY,
            "runs": rows, "cores": cores}


def _ci(ci) -> str:
    return "-" if not all(np.isfinite(ci)) else f"[{ci[0]:.1f}, {ci[1]:.1f}]"


def runs_markdown(summary: dict) -> str:
    """The two tables (runs against the quality bar; cores against the reference) and the verdict."""
    q = summary["quality"]
    lines = ["## Each run against the quality bar", "",
             f"A run passes when, on every set, the mean return is {q['mean_at_least']:g} or more, every track scores "
             f"{q['every_track_at_least']:g} or more and no episode stands still over {q['standstill_steps_at_most']} "
             "steps. 95% CI: Student-t over the set's tracks (one episode each).", "",
             "| core | seed | tracks | mean | 95% CI | worst (track) | >= 600 | standstills | laps | passes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["runs"]:
        for s in r["sets"]:
            lines.append(f"| {r['core']} | {r['seed']} | {s['tracks'][0]:,}-{s['tracks'][1]:,} | {s['mean']:.1f} "
                         f"| {_ci(s['ci95'])} | {s['worst']:.1f} ({s['worst_track']:,}) "
                         f"| {s['at_least_600']}/{s['episodes']} | {s['standstills']} | {s['laps'] if s['laps'] is not None else '-'} "
                         f"| {'yes' if s['passes'] else 'no'} |")
    ref = summary["reference"]
    lines += ["", "## What the cores are", ""]
    lines += [f"- **{c['core']}**: {CORE_MEANING.get(c['core'], CORE_MEANING.get(c['core'].split('-')[0], 'as named'))}."
              for c in summary["cores"]]
    lines += ["", "## The cores", "",
              f"The unit is the training run: each run's mean return over the {summary['tracks']} tracks every run "
              f"drove. Between-run standard deviation, pooled over the cores: "
              + (f"{summary['pooled_sd']:.1f} ({summary['df']} degrees of freedom); 95% intervals are Student-t on it."
                 if summary["df"] else "unknown (no core has two runs): no interval covers another training run."),
              "", f"| core | runs | runs' means | mean | 95% CI (runs) | Δ vs {ref} [95% CI] | smallest Δ detectable |",
              "|---|---|---|---|---|---|---|"]
    for c in summary["cores"]:
        d = c["difference_from_reference"]
        diff = "reference" if c["core"] == ref else "-" if d is None else \
            f"{d['mean']:+.1f} [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}]{' *' if d['real'] else ''}"
        mde = "-" if d is None else f"{d['mde80']:.0f}"
        lines.append(f"| {c['core']} | {c['runs']} | {', '.join(f'{m:.1f}' for m in c['run_means'])} | {c['mean']:.1f} "
                     f"| {_ci(c['ci95'])} | {diff} | {mde} |")
    lines += ["", "## The tails", "",
              f"Every episode of a core's runs: the tracks below {q['every_track_at_least']:g} (the rate's 95% interval: "
              f"Clopper-Pearson), the episodes more than {EXCURSION_STEPS} steps off the road (excursions) and how many of "
              f"those ended below {q['every_track_at_least']:g}; Fisher's exact test against {ref} on the tracks below "
              f"{q['every_track_at_least']:g}. Episodes of different runs count as independent here, which the run-to-run "
              "spread does not bear out: a first look, not a verdict.", "",
              f"| core | episodes | below {q['every_track_at_least']:g} | rate [95% CI] | excursions "
              f"| of them below {q['every_track_at_least']:g} | Fisher p vs {ref} |", "|---|---|---|---|---|---|---|"]
    for c in summary["cores"]:
        t = c.get("tail")
        if t is None:
            continue
        p = t.get("fisher_p_vs_reference")
        exc = "-" if t["excursions"] is None else str(t["excursions"])
        exc_low = "-" if t["excursions_below_600"] is None else str(t["excursions_below_600"])
        lines.append(f"| {c['core']} | {t['episodes']} | {t['below_600']} | {100 * t['below_600'] / max(t['episodes'], 1):.1f} % "
                     f"[{100 * t['rate_ci95'][0]:.1f}, {100 * t['rate_ci95'][1]:.1f}] | {exc} | {exc_low} "
                     f"| {'reference' if p is None else f'{p:.2f}'} |")
    lines += ["", verdict(summary)]
    return "\n".join(lines) + "\n"


def verdict(summary: dict) -> str:
    """One paragraph in plain words: which core wins, or that none is shown to, and what is ruled out."""
    ref = summary["reference"]
    diffs = [(c["core"], c["difference_from_reference"]) for c in summary["cores"] if c["core"] != ref]
    diffs = [(k, d) for k, d in diffs if d is not None]
    if not diffs:
        return "No difference can be stated: every core needs runs, and one core two, to estimate the spread between runs."
    few = min(c["runs"] for c in summary["cores"])
    parts = []
    for core, d in diffs:
        lo, hi = d["ci95"]
        if d["real"]:
            parts.append(f"{core} scores {abs(d['mean']):.1f} points {'above' if d['mean'] > 0 else 'below'} {ref} "
                         f"([{lo:+.1f}, {hi:+.1f}]): a difference is detected.")
        else:
            parts.append(f"{core} against {ref}: no difference detected ({d['mean']:+.1f}, [{lo:+.1f}, {hi:+.1f}]); a "
                         f"difference beyond {max(abs(lo), abs(hi)):.0f} points is ruled out at 95 %, and the design "
                         f"finds one of {d['mde80']:.0f} points 4 times in 5.")
    ref_tail = next((c.get("tail") for c in summary["cores"] if c["core"] == ref), None)
    for c in summary["cores"]:
        t = c.get("tail")
        if c["core"] == ref or t is None or ref_tail is None:
            continue
        p = t["fisher_p_vs_reference"]
        parts.append(f"Tracks below {summary['quality']['every_track_at_least']:g}: {c['core']} {t['below_600']} of "
                     f"{t['episodes']}, {ref} {ref_tail['below_600']} of {ref_tail['episodes']} (Fisher p = {p:.2f}: "
                     f"{'a difference in the tail' if p < 0.05 else 'not shown to differ'}).")
    if few < 3:
        parts.append(f"With {few} run(s) for some core the between-run spread rests on few runs: the intervals are rough.")
    return " ".join(parts)


def write_runs_report(specs: Sequence[str], out: str | Path, reference: str | None = None) -> dict:
    """:func:`runs_summary`, written to ``OUT/runs.json`` and ``OUT/runs.md``; the summary with ``markdown``
    and ``paths`` added."""
    summary = runs_summary(specs, reference)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    md = runs_markdown(summary)
    write_atomic(out / "runs.json", json.dumps(summary, indent=1) + "\n", what="runs report")
    write_atomic(out / "runs.md", md, what="runs report")
    return {**summary, "markdown": md, "paths": [str(out / "runs.md"), str(out / "runs.json")]}


__all__ = ["CORE_MEANING", "EXCURSION_STEPS", "QUALITY", "tail_difference", "tail_summary", "parse_run_spec", "runs_markdown", "runs_summary", "set_summary", "verdict", "write_runs_report"]
