"""What the NAC traces encode: phi, omega and the attention logits per head against the action taken.

The NAC paper (Razzaq et al., "Neuronal Attention Circuits", arXiv 2512.10282, Figure 4) reads its
traces against the steering: "phi stays between 0.8 and 1.6, below 1.1 when turning left or
left-straight and above 1.3 when turning right. The attention logits are below 0.6 for left and
above 0.65 for right." This module measures what the traces of a trained policy carry, on
closed-loop drives, in three ways:

- **Distributions** (:func:`action_distributions`): per action class and per head, the median,
  quartiles, 5th and 95th percentiles and the mean (with its 95 % interval) of phi, omega and the
  logits, each the mean over the head's kept keys of the newest query (:meth:`StepTraces.mean`).
- **Linear probes** (:func:`probe_scores`; Alain and Bengio, "Understanding intermediate layers
  using linear classifier probes", arXiv 1610.01644, 2016): a logistic regression
  (scikit-learn, standardised inputs, class-balanced weights) predicts the steering class, the
  throttle class, the full action and the speed tercile from each head's traces (3 numbers: the
  means of phi, omega and the logit; or 3 per key age), from all heads together, from the CNN
  features the core received, and from the car's speed alone, against a chance baseline
  (``DummyClassifier``, most frequent class: balanced accuracy 1 / classes). Folds are whole
  tracks (``GroupKFold``): no track has steps in both the training and the test part. The score is
  the balanced accuracy (mean recall over the classes), on each fold and pooled over the
  held-out predictions of all folds. A head *carries* a target when its fold-paired balanced
  accuracy minus chance has a 95 % interval above 0 (the project's rule).
- **The Figure 4 claim, literally** (:func:`figure4_claim`): the share of steps with phi in
  [0.8, 1.6], the median phi on left and on right turns against 1.1 and 1.3, the median logit on
  left and right turns against 0.6 and 0.65; per head and for the mean over heads, with a
  scale-free check of the direction (left below right) beside it.

This project's NAC gates phi with a sigmoid (:mod:`agent.nn.nac`), so phi lies in (0, 1) and
can never exceed 1.1 or reach 1.3: the phi claims can hold only in their "below" parts. The five
discrete CarRacing actions have no "left-straight": the left class is the action "left" alone.

Entry point: :func:`encoding_report` (and ``python -m agent.drive.encoding --help``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from agent.atomic import save_figure
from agent.actors.rollout import STEERING_CLASSES
from agent.drive.stats import format_interval, json_default, mean_interval
from agent.drive.traces import step_traces

log = logging.getLogger(__name__)

#: The trace quantities studied, per head (each the mean over the head's kept keys).
QUANTITIES = ("phi", "omega", "logits")
#: Throttle classes of a discrete action: no pedal (nothing, left, right), gas, brake.
THROTTLE_CLASSES = ("coast", "gas", "brake")
#: Speed classes: the terciles of the car's speed over the samples.
SPEED_CLASSES = ("slow", "medium", "fast")
#: What the probes predict, in table order.
TARGETS = ("steering", "throttle", "action", "speed")
#: The paper's Figure 4 numbers (arXiv 2512.10282): phi range, phi bounds left/right, logit bounds left/right.
FIG4_PHI_RANGE = (0.8, 1.6)
FIG4_PHI_LEFT_BELOW = 1.1
FIG4_PHI_RIGHT_ABOVE = 1.3
FIG4_LOGIT_LEFT_BELOW = 0.6
FIG4_LOGIT_RIGHT_ABOVE = 0.65
#: "phi stays between 0.8 and 1.6" is taken to hold when at least this share of steps is in the range.
FIG4_RANGE_SHARE = 0.95


# ----------------------------------------------------------------------------- samples

@dataclass
class EncodingSamples:
    """Per-step traces, CNN features, action and speed of closed-loop drives. N steps, H heads.

    Attributes:
        phi, omega, logits: (N, H) float64, each head's mean over its kept keys of the newest
            query (:meth:`agent.drive.traces.StepTraces.mean`); phi in (0, 1), omega > 0, the
            logit a = the ODE solution (NAC-Steady: phi / omega).
        by_age: {quantity: (N, H, A) float64}: the same per key age (0 = the newest frame, up to
            A - 1 = window - 1 frames back); NaN where the head kept no key of that age.
        features: (N, F) float32, the features extractor's output the core received on the step.
        action: (N,) int64, the action taken (argmax of the logits).
        speed: (N,) float64, the car's speed when the frame was rendered (the speed the policy
            saw), simulator units per second; NaN where unknown.
        track: (N,) int64, the track seed (one episode per track). step: (N,) int64, the step index
            in its episode (0-based).
        action_names: the names of the action indices (``PolicyConfig.action_names``).
    """

    phi: np.ndarray
    omega: np.ndarray
    logits: np.ndarray
    by_age: dict
    features: np.ndarray
    action: np.ndarray
    speed: np.ndarray
    track: np.ndarray
    step: np.ndarray
    action_names: tuple

    def __post_init__(self):
        n = len(self.action)
        for name in ("phi", "omega", "logits", "features", "speed", "track", "step"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} steps, action has {n}")
        for q in QUANTITIES:
            if getattr(self, q).shape != self.phi.shape:
                raise ValueError(f"{q} is {getattr(self, q).shape}, phi is {self.phi.shape}")
            if q in self.by_age and self.by_age[q].shape[:2] != self.phi.shape:
                raise ValueError(f"by_age[{q!r}] is {self.by_age[q].shape}, phi is {self.phi.shape}")

    def __len__(self) -> int:
        return len(self.action)

    @property
    def num_heads(self) -> int:
        return int(self.phi.shape[1])

    def steering(self) -> np.ndarray:
        """(N,) int64 steering class, :data:`agent.actors.rollout.STEERING_CLASSES` order: 0 straight
        (any action not named left or right), 1 left, 2 right."""
        code = np.array([1 if n == "left" else 2 if n == "right" else 0 for n in self.action_names], np.int64)
        return code[self.action]

    def throttle(self) -> np.ndarray:
        """(N,) int64 throttle class, :data:`THROTTLE_CLASSES` order: 0 coast, 1 gas, 2 brake."""
        code = np.array([1 if n == "gas" else 2 if n == "brake" else 0 for n in self.action_names], np.int64)
        return code[self.action]

    def speed_edges(self) -> tuple[float, float]:
        """The speed terciles (units/s) over the steps with a known speed (NaN, NaN if none)."""
        v = self.speed[np.isfinite(self.speed)]
        if not len(v):
            return float("nan"), float("nan")
        lo, hi = np.quantile(v, [1 / 3, 2 / 3])
        return float(lo), float(hi)

    def speed_class(self) -> np.ndarray:
        """(N,) int64 speed tercile, :data:`SPEED_CLASSES` order (0 below the first tercile, 2 above
        the second); -1 where the speed is unknown."""
        lo, hi = self.speed_edges()
        out = np.where(self.speed < lo, 0, np.where(self.speed < hi, 1, 2)).astype(np.int64)
        return np.where(np.isfinite(self.speed), out, -1)

    def labels(self, target: str) -> tuple[np.ndarray, tuple]:
        """((N,) int64 class per step, class names) for a target of :data:`TARGETS`.

        Raises:
            ValueError: an unknown target.
        """
        if target == "steering":
            return self.steering(), STEERING_CLASSES
        if target == "throttle":
            return self.throttle(), THROTTLE_CLASSES
        if target == "action":
            return self.action.astype(np.int64), tuple(self.action_names)
        if target == "speed":
            return self.speed_class(), SPEED_CLASSES
        raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")

    def subset(self, keep) -> "EncodingSamples":
        """The steps where ``keep`` ((N,) bool, or indices) selects."""
        return EncodingSamples(self.phi[keep], self.omega[keep], self.logits[keep],
                               {q: a[keep] for q, a in self.by_age.items()}, self.features[keep],
                               self.action[keep], self.speed[keep], self.track[keep], self.step[keep],
                               tuple(self.action_names))


class _TracingActor:
    """Wraps a :class:`agent.actors.rollout.PolicyActor` with traces on; keeps each step's traces and features."""

    def __init__(self, policy, window: int):
        from agent.actors.loading import make_actor

        self.policy, self.window = policy, int(window)
        self.inner = make_actor(policy, deterministic=True)
        self.inner.want_intermediates = True
        self.label, self.has_probs, self.traces_reason = self.inner.label, self.inner.has_probs, self.inner.traces_reason
        self.topk = int(policy.nac.topk)
        self.rows: list = []

    def reset(self) -> None:
        self.inner.reset()
        self.rows = []

    def act(self, obs, env=None, info=None):
        d = self.inner.act(obs, env, info)
        tr = step_traces(d.intermediates, 0, None, self.topk)
        with torch.no_grad():  # what step gave the core: the same preprocessing and features, in eval mode
            feats = self.policy.features.from_preprocessed(self.policy.saliency_input(obs, d.state_before))
        ages = np.where(tr.valid, tr.ages, -1)
        by_age = {}
        for q in QUANTITIES:
            a = np.full((tr.num_heads, self.window), np.nan)
            h, k = np.nonzero((ages >= 0) & (ages < self.window))
            a[h, ages[h, k]] = getattr(tr, q)[h, k]
            by_age[q] = a
        self.rows.append(({q: tr.mean(q) for q in QUANTITIES}, by_age,
                          feats[0].float().cpu().numpy(), int(d.action)))
        return d


def collect_encoding_samples(policy, tracks: Sequence[int], max_steps: int = 1000, skip_first: int | None = None,
                             progress: Callable[[str], None] | None = None) -> EncodingSamples:
    """Drive ``policy`` (deterministic, argmax) one episode on each track and keep every step's traces.

    Uses the project's rollout (:func:`agent.actors.rollout.rollout`, the actor of
    :func:`agent.actors.loading.make_actor` with ``want_intermediates``), so the NAC runs its
    torch path, as ``drive --dump-traces`` does. Per step: :func:`agent.drive.traces.step_traces`
    of ``state.last["intermediates"]`` (the newest query), the features the core received
    (``policy.features.from_preprocessed(policy.saliency_input(frame, state_before))``, the
    step's own preprocessing with the previous frame for motion channels), the action, and the
    car's speed when the frame was rendered (:attr:`agent.actors.rollout.Episode.speeds`).

    Args:
        policy: a discrete CarRacing :class:`agent.nn.policy.DrivingPolicy` with a NAC core.
        tracks: track seeds (validation 700,000 upward; unseen tracks are >= 1,000,000).
        max_steps: the episode cap per track (an episode also ends at the lap's end).
        skip_first: steps dropped at each episode's start (default: window - 1, so every kept
            step has a full window of keys).
        progress: called with a line after each track.

    Returns:
        :class:`EncodingSamples`.

    Raises:
        ValueError: a policy that is not discrete or has no NAC core.
    """
    from agent.actors.loading import make_carracing_for
    from agent.actors.rollout import rollout

    if getattr(policy, "output_kind", None) != "discrete":
        raise ValueError("trace encoding is measured for discrete policies (the classes are action indices)")
    if policy.nac is None:
        raise ValueError(f"the {policy.config.core} core has no NAC traces (a nac-* core is needed)")
    say = progress or (lambda s: log.info("%s", s))
    window = int(policy.config.window)
    skip = window - 1 if skip_first is None else int(skip_first)
    policy.eval()
    parts = []
    for seed in tracks:
        t0 = time.perf_counter()
        env = make_carracing_for(policy)
        actor = _TracingActor(policy, window)
        try:
            ep = rollout(env, actor, int(seed), max_steps=int(max_steps), keep_frames=False)
        finally:
            env.close()
        n = len(actor.rows)
        idx = np.arange(skip, n)
        speeds = np.asarray(ep.speeds, np.float64)[:n]  # speeds[i]: at the frame step i acted on
        parts.append((seed, idx, actor.rows, speeds))
        say(f"track {seed}: {n} steps driven, {len(idx)} kept, return {ep.episode_return:.0f}, "
            f"{time.perf_counter() - t0:.0f} s")
    rows = [(seed, i, rs[i], sp[i]) for seed, idx, rs, sp in parts for i in idx]
    H = policy.nac.num_heads if hasattr(policy.nac, "num_heads") else None
    if not rows:
        H = H or 1
        empty = np.zeros((0, H))
        return EncodingSamples(empty, empty.copy(), empty.copy(), {q: np.zeros((0, H, window)) for q in QUANTITIES},
                               np.zeros((0, 0), np.float32), np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64),
                               np.zeros(0, np.int64), tuple(policy.config.action_names))
    return EncodingSamples(
        phi=np.stack([r[2][0]["phi"] for r in rows]), omega=np.stack([r[2][0]["omega"] for r in rows]),
        logits=np.stack([r[2][0]["logits"] for r in rows]),
        by_age={q: np.stack([r[2][1][q] for r in rows]) for q in QUANTITIES},
        features=np.stack([r[2][2] for r in rows]).astype(np.float32),
        action=np.array([r[2][3] for r in rows], np.int64), speed=np.array([r[3] for r in rows], np.float64),
        track=np.array([r[0] for r in rows], np.int64), step=np.array([r[1] for r in rows], np.int64),
        action_names=tuple(policy.config.action_names))


# ----------------------------------------------------------------------------- distributions

def summary(values) -> dict:
    """Distribution of the finite ``values``: n, median, q25, q75, p5, p95 and ``mean`` (a
    :func:`agent.drive.stats.mean_interval`: mean with its Student-t 95 % interval); NaN when empty."""
    v = np.asarray(values, np.float64).ravel()
    v = v[np.isfinite(v)]
    if not len(v):
        nan = float("nan")
        return {"n": 0, "median": nan, "q25": nan, "q75": nan, "p5": nan, "p95": nan, "mean": mean_interval(v)}
    p5, q25, med, q75, p95 = np.percentile(v, [5, 25, 50, 75, 95])
    return {"n": int(len(v)), "median": float(med), "q25": float(q25), "q75": float(q75), "p5": float(p5),
            "p95": float(p95), "mean": mean_interval(v)}


def action_distributions(samples: EncodingSamples, by: str = "action") -> dict:
    """Per class and per head, the distribution of phi, omega and the logits.

    Args:
        samples: N steps of H heads.
        by: the classes: "action" (the action taken), "steering", "throttle" or "speed" (terciles).

    Returns:
        ``{"by": by, "classes": names, "counts": {class: n}, quantity: {head: {class: summary}}}``,
        head "0" .. "H-1" and "mean" (the mean over heads of each step's value); each summary as
        :func:`summary` gives it (phi and omega dimensionless, logits in logit units). A class
        with no step is left out of each quantity's dict.

    Raises:
        ValueError: an unknown ``by``.
    """
    y, names = samples.labels(by)
    out: dict = {"by": by, "classes": list(names),
                 "counts": {str(n): int(np.count_nonzero(y == c)) for c, n in enumerate(names)}}
    for q in QUANTITIES:
        x = getattr(samples, q)
        cols = {str(h): x[:, h] for h in range(x.shape[1])}
        cols["mean"] = np.nanmean(x, axis=1) if x.shape[1] else np.zeros(len(x))
        out[q] = {h: {str(n): summary(col[y == c]) for c, n in enumerate(names) if np.any(y == c)}
                  for h, col in cols.items()}
    return out


# ----------------------------------------------------------------------------- probes

def feature_sets(samples: EncodingSamples, per_head: bool = True, by_age: bool = True) -> dict:
    """The probes' inputs by name: {name: (N, D) float64}.

    - ``"CNN features"``: (N, F) the features the core received;
    - ``"speed"``: (N, 1) the car's speed (the policy reads it: context for the speed targets);
    - ``"all heads"``: (N, 3 H) phi, omega and logit means of every head;
    - ``"all heads by age"``: (N, 3 H A) the same per key age (NaN where absent; imputed in the probe);
    - ``"head h"``: (N, 3) head h's phi, omega and logit means (``per_head``);
    - ``"head h by age"``: (N, 3 A) head h's per key age (``per_head`` and ``by_age``).
    """
    sets = {"CNN features": np.asarray(samples.features, np.float64), "speed": samples.speed[:, None].astype(np.float64),
            "all heads": np.concatenate([getattr(samples, q) for q in QUANTITIES], 1)}
    have_age = by_age and all(q in samples.by_age for q in QUANTITIES)
    if have_age:
        sets["all heads by age"] = np.concatenate([samples.by_age[q].reshape(len(samples), -1) for q in QUANTITIES], 1)
    if per_head:
        for h in range(samples.num_heads):
            sets[f"head {h}"] = np.stack([getattr(samples, q)[:, h] for q in QUANTITIES], 1)
        if have_age:
            for h in range(samples.num_heads):
                sets[f"head {h} by age"] = np.concatenate([samples.by_age[q][:, h] for q in QUANTITIES], 1)
    return sets


def _probe(C: float, max_iter: int):
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    return Pipeline([("impute", SimpleImputer(strategy="mean", keep_empty_features=True)),
                     ("scale", StandardScaler()),
                     ("probe", LogisticRegression(C=C, class_weight="balanced", max_iter=max_iter))])


def _balanced_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Mean recall over the classes present in ``y_true`` (scikit-learn's ``balanced_accuracy_score``)."""
    from sklearn.metrics import balanced_accuracy_score

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "y_pred contains classes not in y_true"
        return float(balanced_accuracy_score(y_true, y_pred))


def probe_scores(samples: EncodingSamples, targets: Sequence[str] = TARGETS, sets: dict | None = None,
                 max_folds: int = 10, C: float = 1.0, max_iter: int = 2000, threads: int | None = 1,
                 progress: Callable[[str], None] | None = None) -> dict:
    """Cross-validated linear probes of each target from each feature set (Alain and Bengio 2016).

    A probe is ``Pipeline(SimpleImputer(mean), StandardScaler(), LogisticRegression(C,
    class_weight="balanced"))``; chance is ``DummyClassifier("most_frequent")`` (balanced accuracy
    1 / classes). Folds: ``GroupKFold`` over the tracks (``min(max_folds, tracks)`` folds, so with
    few tracks each fold holds out one track); the same folds for every set, so differences are
    paired by fold. Steps with an unknown label (speed NaN) are left out of that target.

    Args:
        samples: N steps from at least 2 tracks.
        targets: of :data:`TARGETS`.
        sets: {name: (N, D) array, or ((N, D) array, C) to fit that set with its own C}
            (default: :func:`feature_sets`).
        max_folds: the most folds.
        C: the logistic regression's inverse L2 strength (on standardised inputs).
        max_iter: lbfgs iterations.
        threads: BLAS and OpenMP threads during the fits (``threadpoolctl``; None: as they are).
            One is the fastest for these small problems: with two, each fit of a few hundred
            steps took about 8 times as long on the 2-core development machine.
        progress: called with a line after each target.

    Returns:
        ``{"folds": k, "tracks": [...], "C": C, "targets": {target: {"classes": names, "counts":
        {class: n}, "chance": 1 / classes present, "rows": {set: row}}}}``; a row holds
        ``"balanced_accuracy"`` (pooled over the held-out predictions of all folds; for the
        chance row this can fall below 1 / classes when the majority class differs between
        folds), ``"recall"`` ({class: pooled recall}), ``"C"``, ``"folds"``
        (each fold's), ``"fold_interval"`` (:func:`mean_interval` over folds), ``"minus_chance"`` and
        ``"minus_cnn"`` (fold-paired differences, as intervals), ``"above_chance"`` (the lower end
        of ``minus_chance`` is above 0), ``"inputs"`` (D) and ``"not_converged"`` (fits that hit
        ``max_iter``). The chance row is named ``"chance"``. A target with fewer than 2 classes is
        ``{"skipped": why}``.

    Raises:
        ValueError: fewer than 2 tracks, an unknown target, or a set of another length than N.
    """
    say = progress or (lambda s: log.info("%s", s))
    groups = np.asarray(samples.track)
    n_tracks = len(np.unique(groups))
    if n_tracks < 2:
        raise ValueError(f"probes need steps of at least 2 tracks (folds are whole tracks), got {n_tracks}")
    sets = feature_sets(samples) if sets is None else dict(sets)
    for name, X in sets.items():
        if len(X[0] if isinstance(X, tuple) else X) != len(samples):
            raise ValueError(f"feature set {name!r} has {len(X)} rows, the samples have {len(samples)}")
    from threadpoolctl import threadpool_limits

    _probe(C, max_iter).fit(np.arange(4.0)[:, None], np.array([0, 0, 1, 1]))  # loads every library the fits use:
    with threadpool_limits(limits=threads):  # the limits reach only libraries loaded before this
        return _probe_scores(samples, targets, sets, groups, int(min(max_folds, n_tracks)), C, max_iter, say)


def _probe_scores(samples, targets, sets, groups, k, C, max_iter, say) -> dict:
    from sklearn.dummy import DummyClassifier
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import GroupKFold

    result = {"folds": k, "tracks": sorted(int(t) for t in np.unique(groups)), "C": float(C), "targets": {}}
    for target in targets:
        t0 = time.perf_counter()
        y_all, names = samples.labels(target)
        known = y_all >= 0
        y, g = y_all[known], groups[known]
        present = np.unique(y)
        entry = {"classes": list(names), "counts": {str(n): int(np.count_nonzero(y == c)) for c, n in enumerate(names)}}
        if len(present) < 2:
            entry["skipped"] = f"only {len(present)} class(es) among the steps"
            result["targets"][target] = entry
            continue
        if len(np.unique(g)) < 2:
            entry["skipped"] = "the steps with a known label come from one track"
            result["targets"][target] = entry
            continue
        folds = list(GroupKFold(n_splits=int(min(k, len(np.unique(g))))).split(np.zeros(len(y)), y, g))
        entry["chance"] = 1.0 / len(present)
        rows: dict = {}
        runs = [("chance", None)] + list(sets.items())
        for name, X in runs:
            X, c_set = X if isinstance(X, tuple) else (X, C)
            Xk = np.zeros((len(y), 1)) if X is None else np.asarray(X, np.float64)[known]
            pred = np.full(len(y), -1, np.int64)
            per_fold, not_conv = [], 0
            for train, test in folds:
                if X is None or len(np.unique(y[train])) < 2:
                    model = DummyClassifier(strategy="most_frequent")
                else:
                    model = _probe(c_set, max_iter)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", ConvergenceWarning)
                    model.fit(Xk[train], y[train])
                not_conv += sum(issubclass(w.category, ConvergenceWarning) for w in caught)
                pred[test] = model.predict(Xk[test])
                per_fold.append(_balanced_accuracy(y[test], pred[test]))
            rows[name] = {"balanced_accuracy": _balanced_accuracy(y, pred), "folds": per_fold,
                          "recall": {str(names[c]): float(np.mean(pred[y == c] == c)) for c in present},
                          "C": None if X is None else float(c_set),
                          "fold_interval": mean_interval(per_fold), "inputs": int(Xk.shape[1]),
                          "not_converged": int(not_conv)}
        chance_f = np.asarray(rows["chance"]["folds"])
        cnn_f = np.asarray(rows["CNN features"]["folds"]) if "CNN features" in rows else None
        for name, r in rows.items():
            f = np.asarray(r["folds"])
            r["minus_chance"] = mean_interval(f - chance_f)
            r["minus_cnn"] = mean_interval(f - cnn_f) if cnn_f is not None else None
            lo = r["minus_chance"]["lo"]
            r["above_chance"] = bool(np.isfinite(lo) and lo > 0) if name != "chance" else False
        entry["rows"] = rows
        result["targets"][target] = entry
        say(f"probes of {target}: {len(runs)} sets, {len(folds)} folds, {time.perf_counter() - t0:.0f} s")
    return result


def carriers(probes: dict, target: str) -> list[dict]:
    """The heads ranked by their probe's pooled balanced accuracy for ``target`` (best first).

    Returns:
        [{"head": h, "balanced_accuracy", "minus_chance" (interval), "above_chance"}, ...] from the
        ``"head h"`` rows of :func:`probe_scores`' result; [] for a skipped or absent target.
    """
    entry = probes.get("targets", {}).get(target, {})
    rows = entry.get("rows", {})
    out = []
    for name, r in rows.items():
        parts = name.split(" ")
        if len(parts) == 2 and parts[0] == "head" and parts[1].isdigit():
            out.append({"head": int(parts[1]), "balanced_accuracy": r["balanced_accuracy"],
                        "minus_chance": r["minus_chance"], "above_chance": r["above_chance"]})
    return sorted(out, key=lambda d: -d["balanced_accuracy"])


# ----------------------------------------------------------------------------- the paper's Figure 4 claim

def _check(values: np.ndarray, below: float | None = None, above: float | None = None) -> dict:
    """{"n", "median", "share" (of steps on the claimed side), "holds" (the median is; None if no step)}."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"n": 0, "median": float("nan"), "share": float("nan"), "holds": None}
    med = float(np.median(v))
    if below is not None:
        share, holds = float(np.mean(v < below)), med < below
    else:
        share, holds = float(np.mean(v > above)), med > above
    return {"n": int(len(v)), "median": med, "share": share, "holds": bool(holds)}


def figure4_claim(samples: EncodingSamples) -> dict:
    """The NAC paper's Figure 4 claim (arXiv 2512.10282), tested literally, per head and on the head mean.

    Sub-claims, each on the per-step mean over a head's kept keys (or the mean over heads):

    - ``phi_range``: phi in [0.8, 1.6] on at least :data:`FIG4_RANGE_SHARE` of the steps;
    - ``phi_left``: the median phi on left steps (action "left"; the paper's "left-straight" has no
      counterpart among the five actions) is below 1.1;
    - ``phi_right``: the median phi on right steps is above 1.3;
    - ``logit_left``: the median attention logit on left steps is below 0.6;
    - ``logit_right``: the median attention logit on right steps is above 0.65.

    Beside them, scale-free: ``phi_direction`` and ``logit_direction`` hold when the median on left
    steps is below the median on right steps (the ordering the paper's numbers imply).

    Returns:
        ``{"claims": {name: text}, "heads": {head: {sub-claim: check}}, "holds_on_mean": bool,
        "heads_holding": [heads where all five literal sub-claims hold], "counts": {sub-claim: heads
        holding}, "verdict": text}``, head "0" .. "H-1" and "mean"; a check is ``{"n", "median",
        "share" (steps on the claimed side; for phi_range the share in range), "holds"}`` (holds
        None when no step is of that class), a direction ``{"left", "right", "holds"}``.
    """
    steer = samples.steering()
    left, right = steer == STEERING_CLASSES.index("left"), steer == STEERING_CLASSES.index("right")
    lo, hi = FIG4_PHI_RANGE
    claims = {
        "phi_range": f"phi stays between {lo} and {hi} (on >= {FIG4_RANGE_SHARE:.0%} of steps)",
        "phi_left": f"phi below {FIG4_PHI_LEFT_BELOW} when turning left (median)",
        "phi_right": f"phi above {FIG4_PHI_RIGHT_ABOVE} when turning right (median)",
        "logit_left": f"attention logit below {FIG4_LOGIT_LEFT_BELOW} for left (median)",
        "logit_right": f"attention logit above {FIG4_LOGIT_RIGHT_ABOVE} for right (median)",
        "phi_direction": "median phi on left steps below that on right steps (scale-free)",
        "logit_direction": "median logit on left steps below that on right steps (scale-free)",
    }
    literal = ("phi_range", "phi_left", "phi_right", "logit_left", "logit_right")
    H = samples.num_heads
    cols = {str(h): (samples.phi[:, h], samples.logits[:, h]) for h in range(H)}
    cols["mean"] = (np.nanmean(samples.phi, 1), np.nanmean(samples.logits, 1)) if H else (np.zeros(0), np.zeros(0))
    heads = {}
    for h, (phi, lg) in cols.items():
        fin = phi[np.isfinite(phi)]
        share = float(np.mean((fin >= lo) & (fin <= hi))) if len(fin) else float("nan")
        r = {"phi_range": {"n": int(len(fin)), "median": float(np.median(fin)) if len(fin) else float("nan"),
                           "share": share, "holds": None if not len(fin) else bool(share >= FIG4_RANGE_SHARE)},
             "phi_left": _check(phi[left], below=FIG4_PHI_LEFT_BELOW),
             "phi_right": _check(phi[right], above=FIG4_PHI_RIGHT_ABOVE),
             "logit_left": _check(lg[left], below=FIG4_LOGIT_LEFT_BELOW),
             "logit_right": _check(lg[right], above=FIG4_LOGIT_RIGHT_ABOVE)}
        for name, x in (("phi_direction", phi), ("logit_direction", lg)):
            a, b = r[name.split("_")[0] + "_left"]["median"], r[name.split("_")[0] + "_right"]["median"]
            r[name] = {"left": a, "right": b, "holds": None if not (np.isfinite(a) and np.isfinite(b)) else bool(a < b)}
        heads[h] = r
    all_hold = [h for h in heads if h != "mean" and all(heads[h][c]["holds"] for c in literal)]
    counts = {c: sum(bool(heads[str(h)][c]["holds"]) for h in range(H)) for c in claims}
    on_mean = all(heads["mean"][c]["holds"] for c in literal)
    if on_mean:
        verdict = "holds on the mean over heads"
    elif all_hold:
        verdict = f"does not hold on the mean over heads; holds for head(s) {', '.join(all_hold)}"
    else:
        failed = [c for c in literal if heads["mean"][c]["holds"] is False]
        untested = [c for c in literal if heads["mean"][c]["holds"] is None]
        verdict = (f"does not hold: on the mean over heads {', '.join(failed) or 'none'} fail(s)"
                   + (f", {', '.join(untested)} cannot be tested (no step of that class)" if untested else "")
                   + ", and no head meets all five")
    return {"claims": claims, "heads": heads, "holds_on_mean": bool(on_mean), "heads_holding": all_hold,
            "counts": counts, "num_heads": H, "verdict": verdict}


# ----------------------------------------------------------------------------- the report

def _yes(x) -> str:
    return "n/a" if x is None else "holds" if x else "does not hold"


def probes_markdown(probes: dict, heads: bool = True) -> str:
    """The probe table (markdown): one row per feature set, one column per target: the pooled balanced
    accuracy, then the mean over folds with its 95 % interval; * marks above chance."""
    targets = [t for t in probes["targets"] if "rows" in probes["targets"][t]]
    if not targets:
        return "No target had two classes.\n"
    names = list(probes["targets"][targets[0]]["rows"])
    if not heads:
        names = [n for n in names if not n.startswith("head ")]
    head = "| input | " + " | ".join(f"{t} (pooled; folds [95 % CI])" for t in targets) + " |"
    lines = [head, "|---|" + "---|" * len(targets)]
    for n in names:
        cells = []
        for t in targets:
            r = probes["targets"][t]["rows"].get(n)
            if r is None:
                cells.append("-")
                continue
            star = " *" if r["above_chance"] else ""
            cells.append(f"{r['balanced_accuracy']:.3f}{star}; {format_interval(r['fold_interval'], 2)}")
        lines.append(f"| {n} (D={probes['targets'][targets[0]]['rows'][n]['inputs']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def figure4_markdown(fig4: dict) -> str:
    """The Figure 4 table (markdown): each literal sub-claim on the head mean, with the heads where it holds."""
    m = fig4["heads"]["mean"]
    lines = ["| claim | mean over heads: median (share of steps) | verdict | heads holding |", "|---|---|---|---|"]
    for c, text in fig4["claims"].items():
        r = m[c]
        if c.endswith("direction"):
            val = f"left {r['left']:.3f}, right {r['right']:.3f}"
        else:
            val = f"{r['median']:.3f} ({100 * r['share']:.1f} %)" if r["n"] else "no steps"
        lines.append(f"| {text} | {val} | {_yes(r['holds'])} | {fig4['counts'][c]} of {fig4['num_heads']} |")
    return "\n".join(lines) + f"\n\nVerdict: {fig4['verdict']}.\n"


def distributions_markdown(dist: dict, quantity: str) -> str:
    """Median [q25, q75] of ``quantity`` per head (rows) and class (columns), markdown."""
    classes = [c for c in dist["classes"] if dist["counts"].get(c, 0)]
    lines = ["| head | " + " | ".join(f"{c} (n={dist['counts'][c]})" for c in classes) + " |",
             "|---|" + "---|" * len(classes)]
    for h, per in dist[quantity].items():
        cells = [f"{per[c]['median']:.3g} [{per[c]['q25']:.3g}, {per[c]['q75']:.3g}]" if c in per else "-" for c in classes]
        lines.append(f"| {h} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_encoding(samples: EncodingSamples, out: str | Path, probes: dict | None = None, dpi: int = 80) -> Path:
    """PNG: per head (rows; the first row the mean over heads) box plots of phi, omega and the logits
    (columns) per action class, whiskers at the 5th and 95th percentiles, no fliers. The Figure 4
    bounds are drawn as dashed lines on the head-mean row. With ``probes``, each row's title gives
    the head's steering and throttle probe scores."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent.drive.traces import CLASS_COLORS

    names = list(samples.action_names)
    present = [c for c in range(len(names)) if np.any(samples.action == c)]
    H = samples.num_heads
    fig, axes = plt.subplots(H + 1, 3, figsize=(12, 1.9 * (H + 1)), dpi=dpi, squeeze=False)
    bounds = {"phi": (FIG4_PHI_RANGE[0], FIG4_PHI_LEFT_BELOW, FIG4_PHI_RIGHT_ABOVE, FIG4_PHI_RANGE[1]),
              "logits": (FIG4_LOGIT_LEFT_BELOW, FIG4_LOGIT_RIGHT_ABOVE)}
    for row in range(H + 1):
        h = None if row == 0 else row - 1
        for col, q in enumerate(QUANTITIES):
            x = getattr(samples, q)
            y = np.nanmean(x, 1) if h is None else x[:, h]
            ax = axes[row, col]
            groups = [y[(samples.action == c) & np.isfinite(y)] for c in present]
            if not any(len(g) for g in groups):
                ax.text(0.5, 0.5, "no steps", ha="center", va="center", transform=ax.transAxes)
                ax.set_title(f"{'mean over heads' if h is None else f'head {h}'}: {q}", fontsize=8)
                continue
            bp = ax.boxplot(groups, whis=(5, 95), showfliers=False, patch_artist=True)
            for patch, c in zip(bp["boxes"], present):
                patch.set_facecolor(np.array(CLASS_COLORS[c % len(CLASS_COLORS)]) / 255)
            ax.set_xticks(range(1, len(present) + 1), [names[c] for c in present], fontsize=7)
            ax.tick_params(axis="y", labelsize=7)
            ax.grid(alpha=0.3)
            if h is None and q in bounds:
                for b in bounds[q]:
                    ax.axhline(b, color="k", lw=0.7, ls="--")
            title = f"{'mean over heads' if h is None else f'head {h}'}: {q}"
            if probes is not None and col == 0 and h is not None:
                bits = []
                for t in ("steering", "throttle"):
                    r = probes.get("targets", {}).get(t, {}).get("rows", {}).get(f"head {h}")
                    if r is not None:
                        bits.append(f"{t} {r['balanced_accuracy']:.2f}")
                title += (" (" + ", ".join(bits) + ")") if bits else ""
            ax.set_title(title, fontsize=8)
    fig.suptitle(f"NAC traces per action, {len(samples)} steps of {len(np.unique(samples.track))} tracks "
                 f"(mean over kept keys; probe: balanced accuracy; first row, dashed: the paper's Figure 4 bounds)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.99))
    return save_figure(fig, out, dpi=dpi, what="encoding figure")


def encoding_markdown(report: dict) -> str:
    """The whole report as a markdown page: setup, probe tables, carriers, Figure 4, medians per action."""
    p = report["probes"]
    setup = (f"{report['steps']} steps of tracks {', '.join(map(str, report['tracks']))} "
             f"({', '.join(f'{t}: {n}' for t, n in report['steps_per_track'].items())})")
    if "skipped" in p:
        setup += f"; probes skipped: {p['skipped']}."
        table = ""
    else:
        setup += (f"; {p['folds']} folds by track; logistic regression, C = {p['C']}, class-balanced; "
                  f"balanced accuracy pooled over the held-out steps, then mean over folds with its 95 % interval; "
                  f"* = above chance (fold-paired 95 % interval of the difference above 0). Pooled chance "
                  f"falls below 1 / classes when the majority class differs between folds.")
        table = probes_markdown(p)
    lines = [f"# What the NAC traces encode: `{Path(report['policy']).name}` (weights {report['weights_sha256'][:8]})", "",
             setup, "", "## Probes", "", table, ""]
    for t in ("steering", "throttle", "speed"):
        c = report["carriers"].get(t, [])
        if c:
            top = ", ".join(f"head {d['head']} {d['balanced_accuracy']:.3f}{' *' if d['above_chance'] else ''}"
                            for d in c[:5])
            n_above = sum(d["above_chance"] for d in c)
            lines.append(f"- **{t}:** best heads {top}; {n_above} of {len(c)} heads above chance.")
    lines += ["", "## The paper's Figure 4 claim", "", figure4_markdown(report["figure4"]), ""]
    for q in QUANTITIES:
        lines += [f"## {q} per action: median [q25, q75]", "", distributions_markdown(report["distributions"]["action"], q), ""]
    lines += [f"Figure: [{report['figure']}]({report['figure']})", ""]
    return "\n".join(lines)


def encoding_report(policy_path, tracks: Sequence[int], steps: int, out_dir: str | Path | None = None,
                    max_folds: int = 10, C: float = 1.0, sensitivity_C: Sequence[float] = (0.01, 0.1),
                    progress: Callable[[str], None] | None = None,
                    samples: EncodingSamples | None = None) -> dict:
    """Drive the tracks, measure what the traces encode, and write ``encoding.json``, ``encoding.md``, ``encoding.png``.

    Args:
        policy_path: a policy file or shipped name (``nac.pt``), a discrete CarRacing policy with a NAC core.
        tracks: track seeds, one episode each (validation 700,000 upward; unseen >= 1,000,000).
        steps: the steps wanted in all: each episode is capped at ``ceil(steps / len(tracks))``
            steps (an episode that ends its lap sooner gives fewer).
        out_dir: where the three files go (None: nothing written).
        max_folds, C: :func:`probe_scores`.
        sensitivity_C: further rows "CNN features, C=c" and "all heads, C=c" for each c: how much
            the comparison of the 2430-wide CNN features with the 48 trace numbers depends on
            the regularisation (no C is chosen by the report; read them as a sensitivity check).
        progress: called with a line of text per track and per target (e.g. ``print``).
        samples: steps already collected (:func:`collect_encoding_samples` with this policy and
            tracks), to reuse them; None: drive here.

    Returns:
        the report dict (what ``encoding.json`` holds): policy, weights_sha256, tracks, steps,
        steps_per_track, speed_terciles (units/s), distributions (by action and by steering:
        :func:`action_distributions`), probes (:func:`probe_scores`), carriers (per target:
        :func:`carriers`), figure4 (:func:`figure4_claim`), seconds, figure (the PNG's name).

    Raises:
        FileNotFoundError: no such policy. ValueError: a policy that is not discrete or has no NAC
        core. With steps of fewer than 2 tracks the probes are ``{"skipped": why, "targets": {}}``
        and the rest is measured.
    """
    from agent.actors.loading import load_policy, resolve_policy_path
    from agent.eval.card import weights_sha256

    say = progress or (lambda s: log.info("%s", s))
    path = resolve_policy_path(policy_path)
    policy = load_policy(path)
    policy.eval()
    t_start = time.perf_counter()
    if samples is None:
        samples = collect_encoding_samples(policy, tracks, max_steps=int(math.ceil(steps / len(tracks))), progress=say)
    t_drive = time.perf_counter() - t_start
    say(f"{len(samples)} steps from {len(tracks)} tracks in {t_drive:.0f} s")
    n_tracks = len(np.unique(samples.track))
    if n_tracks >= 2:
        sets = feature_sets(samples)
        base = list(sets.items())
        extra = {f"{n}, C={c:g}": (sets[n], float(c)) for c in sensitivity_C for n in ("CNN features", "all heads")}
        sets = dict(base[:3] + list(extra.items()) + base[3:])  # after "all heads", before the heads
        probes = probe_scores(samples, sets=sets, max_folds=max_folds, C=C, progress=say)
    else:
        probes = {"skipped": f"the probes' folds are whole tracks: they need steps of 2 tracks or more, got {n_tracks}",
                  "targets": {}}
    report = {
        "policy": str(path), "weights_sha256": weights_sha256(path), "tracks": [int(t) for t in tracks],
        "steps": len(samples), "steps_per_track": {str(int(t)): int(np.count_nonzero(samples.track == t)) for t in tracks},
        "action_names": list(samples.action_names), "num_heads": samples.num_heads,
        "speed_terciles": list(samples.speed_edges()),
        "distributions": {"action": action_distributions(samples, "action"),
                          "steering": action_distributions(samples, "steering")},
        "probes": probes, "carriers": {t: carriers(probes, t) for t in TARGETS},
        "figure4": figure4_claim(samples), "figure": "encoding.png",
        "torch_threads": torch.get_num_threads(), "drive_seconds": t_drive,
    }
    report["seconds"] = time.perf_counter() - t_start
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        plot_encoding(samples, out / "encoding.png", probes)
        (out / "encoding.json").write_text(json.dumps(report, indent=1, default=json_default) + "\n")
        (out / "encoding.md").write_text(encoding_markdown(report))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agent.drive.encoding POLICY --tracks ... --steps N --out DIR``: run :func:`encoding_report`."""
    ap = argparse.ArgumentParser(prog="python -m agent.drive.encoding", description=__doc__.split("\n\n")[0])
    ap.add_argument("policy", help="policy file or shipped name (nac.pt)")
    ap.add_argument("--tracks", type=int, nargs="+", default=[700_000, 700_001, 700_002, 700_003, 700_004, 700_005])
    ap.add_argument("--steps", type=int, default=6000, help="steps wanted in all (each episode capped at steps / tracks)")
    ap.add_argument("--folds", type=int, default=10, help="the most folds (folds are whole tracks)")
    ap.add_argument("--C", type=float, default=1.0, help="the probes' inverse L2 strength")
    ap.add_argument("--sensitivity-C", type=float, nargs="*", default=[0.01, 0.1],
                    help="further CNN-features and all-heads rows at these C")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="directory for encoding.json, encoding.md and encoding.png")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    report = encoding_report(args.policy, args.tracks, args.steps, args.out, args.folds, args.C, args.sensitivity_C,
                             progress=lambda s: print(s, flush=True))
    if "skipped" not in report["probes"]:
        print(probes_markdown(report["probes"], heads=False))
    print(figure4_markdown(report["figure4"]))
    print(f"{report['seconds']:.0f} s")
    return 0


__all__ = ["EncodingSamples", "FIG4_LOGIT_LEFT_BELOW", "FIG4_LOGIT_RIGHT_ABOVE", "FIG4_PHI_LEFT_BELOW",
           "FIG4_PHI_RANGE", "FIG4_PHI_RIGHT_ABOVE", "FIG4_RANGE_SHARE", "QUANTITIES", "SPEED_CLASSES", "TARGETS",
           "THROTTLE_CLASSES", "action_distributions", "carriers", "collect_encoding_samples", "distributions_markdown",
           "encoding_markdown", "encoding_report", "feature_sets", "figure4_claim", "figure4_markdown", "main",
           "plot_encoding", "probe_scores", "probes_markdown", "summary"]

if __name__ == "__main__":
    raise SystemExit(main())
