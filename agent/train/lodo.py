"""Leave-one-driver-out (LODO) evaluation of Udacity steering: does the policy work for a driver it never saw?

Every recording is one driver. For each recording (a *fold*) a policy is trained from scratch on
all the others, with the same settings, and scored on the held-out recording exactly as
``agent evaluate --env udacity`` scores one (center camera, every frame, streaming in order, the
window restarting at session breaks, raw labels) beside the trivial predict-0 baseline on the
same frames. The ratio MSE / predict-0 MSE says whether the policy beats always driving straight
(< 1) and by how much.

Choices are made on held-out drivers only, never on the test driver: inside a fold the test
recording is neither trained on nor used to choose a checkpoint (with ``val_fraction`` > 0 the
last block of each TRAINING recording chooses it; with 0 the last epoch is kept). Settings
(smoothing, sampling, cameras) are compared by their LODO means.

Output folder ``OUT``:

- ``folds/<driver>.json``: one per finished fold (the settings, the training report, the scores);
  written atomically, so a rerun skips finished folds (resumable) and refuses a folder made with
  other settings;
- ``folds/<driver>.npz``: the fold policy's steering on every held-out frame beside the labels, for
  a look afterwards without retraining: ``t`` (N,) capture times in seconds, ``pred``, ``label``
  (raw) and ``smoothed`` (+-0.5 s, :func:`agent.eval.steering.smooth_in_time`) (N,) float32
  normalised steering (+ = right), ``segments`` (S, 2) [start, stop) session segments;
- ``folds/<driver>.run/checkpoint.pt``: while a fold trains, its checkpoint after every epoch
  (:class:`agent.train.checkpoint.Checkpointer`, the fold's settings as its config): a rerun after a
  kill continues the fold from its last epoch, to the weights an uninterrupted fold gives, and
  deletes the folder once the fold is written; a checkpoint of other settings is not continued;
- ``folds/<driver>.pt``: the fold's policy (:meth:`agent.nn.policy.DrivingPolicy.save`; metadata: the
  held-out driver, the training drivers, the seed, the measured camera offset), to score a
  post-processing on the held-out driver without retraining; git ignores it;
- ``reference/<driver>.json``: a fixed reference policy (e.g. the shipped ``udacity-nac.pt``)
  scored on the same held-out recording, when one is given;
- ``lodo.md`` and ``lodo.json``: the table per driver and its means per track (rewritten after
  every fold, so a partial run has a partial table; :func:`write_table` rebuilds them from the
  finished folds without training), each ratio beside the held-out driver's keyboard-noise floor
  (:mod:`agent.eval.label_floor`).

Training budget: ``subsample`` keeps that share of each training recording, as randomly chosen
blocks of ``block`` consecutive frames (so windows of T <= block frames stay intact), drawn once
per fold; the time limit of :class:`agent.train.bc.TrainConfig` caps each fold's training.

:func:`run_consensus_lodo` writes the same folder for a reference that trains nothing: the other
drivers' steering at the most alike views (:mod:`agent.eval.consensus`), so ``agent lodo-compare``
sets a trained setting beside what the other drivers' own steering implies.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from agent.atomic import save_figure, write_atomic, write_json_atomic
from agent.data.udacity import camera_offset, camera_shifts, parse_log
from agent.data.windows import UdacitySource, smooth_steering
from agent.eval.label_floor import FLOOR_HALF_WIDTH_S, recording_floor, width_key
from agent.eval.consensus import FEATURE_SHAPE, ConsensusConfig, consensus_predict, leave_one_out_votes, vote_inputs
from agent.eval.offline import INTENT_MEANS, driving_scores, evaluate_udacity, score_recording, summarize_recordings
from agent.log import get_logger
from agent.train.checkpoint import CHECKPOINT_NAME, CheckpointError, Checkpointer, load_checkpoint
from agent.train.run import train

log = get_logger(__name__)

TRACK_UNKNOWN = "-"
ORACLE_COLUMN = "smoothed-oracle ratio (±0.5 s)"  # the floor column of lodo.md


def driver_names(paths: list[str | Path]) -> list[str]:
    """A short unique name per recording: its first path component after the common prefix.

    ``/data/udacity/0xR4Y+Track`` and ``/data/udacity/b-sh+CarND/track2`` give ``0xR4Y+Track`` and
    ``b-sh+CarND``; duplicates get ``-2``, ``-3`` appended.
    """
    parts = [Path(os.path.abspath(p)).parts for p in paths]
    if not parts:
        return []
    common = 0
    while len(parts) > 1 and all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
        common += 1
    if len(parts) == 1:
        common = len(parts[0]) - 1
    names, seen = [], {}
    for p in parts:
        name = p[common] if len(p) > common else p[-1]
        if name == "driving_log.csv":
            name = p[common - 1]
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return names


def subsample_blocks(rec, fraction: float, block: int, rng: np.random.Generator) -> list:
    """``rec`` cut to a random ``fraction`` of its frames in blocks of ``block`` consecutive frames.

    Returns a list of ``rec.slice`` views (adjacent chosen blocks merged); all of ``rec`` for
    ``fraction`` >= 1.

    Raises:
        ValueError: ``fraction`` not in (0, 1] or ``block`` < 1.
    """
    if not 0.0 < fraction <= 1.0 or block < 1:
        raise ValueError(f"subsample must be in (0, 1] and block >= 1, got {fraction} and {block}")
    if fraction >= 1.0:
        return [rec]
    n_blocks = -(-len(rec) // block)
    k = max(1, int(round(fraction * n_blocks)))
    chosen = np.sort(rng.choice(n_blocks, size=k, replace=False))
    runs, start, prev = [], int(chosen[0]), int(chosen[0])
    for b in chosen[1:].tolist():
        if b != prev + 1:
            runs.append((start, prev + 1))
            start = b
        prev = b
    runs.append((start, prev + 1))
    return [rec.slice(a * block, min(b * block, len(rec))) for a, b in runs]


#: the scores against the driver's intent that a fold keeps (:func:`agent.eval.offline.evaluate_udacity`)
INTENT_KEYS = ("intent_half_width_s", "smoothed_mse", "smoothed_zero_mse", "smoothed_ratio", "smoothed_corr",
               "right_way", "right_way_left", "right_way_right", "n_curve", "n_left", "n_right",
               "curve_mean_abs_pred", "curve_mean_abs_label", "curve_abs_ratio", "straight_error_share",
               "straight_mean_abs_pred", "curve_signed_excess", "n_straight", "best_lag_s", "corr_at_best_lag",
               "smoothed_ratio_at_best_lag")


def _scores(res: dict) -> dict:
    keep = ("mse", "mae", "zero_mse", "zero_mae", "n_frames", "n_segments", "rmse_degrees", "n_moving", "moving_mse",
            "moving_mae", "moving_zero_mse", "moving_smoothed_ratio", "moving_smoothed_corr", "moving_smoothed_mse",
            "moving_smoothed_zero_mse", "n_reversing", "min_speed_mph", "n_bad_rows_skipped",
            "data", "oracle_half_width_s", "oracle_mse", "oracle_ratio", *INTENT_KEYS)
    out = {k: res[k] for k in keep if k in res}
    out["ratio"] = res["mse"] / res["zero_mse"] if res["zero_mse"] > 0 else None
    return out


def run_lodo(paths: list[str | Path], out: str | Path, policy_config, train_config, load, *, augment=None,
             smooth_labels: int = 1, smooth_mode: str = "centred", straight_keep: float = 1.0, min_speed: float = 0.0,
             skip_reversing: bool = False, subsample: float = 1.0, block: int = 32, tracks: dict[str, str] | None = None,
             reference=None, folds: list[str] | None = None, extra_settings: dict | None = None,
             measure_cameras: bool = False, consensus_k: int = 0) -> dict:
    """Train and score one fold per recording (see the module docstring); returns the table (:func:`lodo_table`).

    Args:
        paths: the recordings, one driver each (at least 2).
        out: the output folder.
        policy_config: :class:`agent.nn.policy.PolicyConfig` of every fold's policy.
        train_config: :class:`agent.train.bc.TrainConfig` (epochs, lr, seed, time limit per fold, ...).
        load: ``load(path)`` -> a recording (:func:`agent.data.udacity_cache.load_cached` or
            :func:`agent.data.udacity.load_recording`), called once per recording.
        augment: :class:`agent.data.udacity.AugmentConfig` of training (None: no augmentation).
        smooth_labels, smooth_mode: training-label smoothing (:func:`agent.data.windows.smooth_steering`),
            applied to whole recordings before subsampling; the test driver is scored on raw labels.
        straight_keep: share of straight-driving frames the loss counts (:class:`agent.data.windows.UdacitySource`).
        min_speed: mph; training frames recorded slower are left out of the loss (0: none;
            :class:`agent.data.windows.UdacitySource`). Recorded in the settings only when > 0, so
            folders made before it existed still resume.
        skip_reversing: the frames where the car drives backwards are left out of the loss too
            (:func:`agent.data.udacity.reversing_frames`); recorded in the settings only when set.
        subsample, block: share of each training recording kept, in blocks of ``block`` frames.
        tracks: driver name -> track ("lake", "jungle"); unnamed drivers get ``tracks.get("*", "-")``.
        reference: an optional fixed policy scored on each held-out recording too.
        folds: only these held-out drivers (names from :func:`driver_names`); None: all.
        extra_settings: recorded with the settings (and compared on resume).
        measure_cameras: each fold's side-camera correction is measured in its training drivers' frames
            (:func:`agent.data.udacity.measure_camera_offset`, never the held-out driver's; each recording
            measured once) instead of
            ``augment.camera_correction``; the fold records the measurement.
        consensus_k: > 0: each training driver's frames are labelled with the vote of the fold's OTHER
            training drivers (:func:`agent.eval.consensus.leave_one_out_votes`, this many neighbours;
            the held-out driver neither votes nor is voted on) instead of its own (smoothed) labels;
            recorded in the settings only when set.

    Raises:
        ValueError: fewer than 2 recordings, an unknown fold name, or an ``out`` folder whose
            finished folds were made with other settings.
    """
    if len(paths) < 2:
        raise ValueError(f"leave-one-driver-out needs at least 2 recordings (one driver each), got {len(paths)}")
    names = driver_names(paths)
    if folds:
        unknown = sorted(set(folds) - set(names))
        if unknown:
            raise ValueError(f"unknown fold(s) {', '.join(unknown)}; the drivers are {', '.join(names)}")
    tracks = dict(tracks or {})
    track_of = {n: tracks.get(n, tracks.get("*", TRACK_UNKNOWN)) for n in names}
    out = Path(out)
    settings = {"recordings": {n: str(p) for n, p in zip(names, paths)}, "policy": policy_config.to_dict(),
                "train": {k: v for k, v in asdict(train_config).items() if k not in ("device", "workers")},
                "augment": ({**asdict(augment), **({"camera_correction": "measured"} if measure_cameras else {})}
                            if augment is not None else None), "smooth_labels": smooth_labels,
                "smooth_mode": smooth_mode, "straight_keep": straight_keep, "subsample": subsample, "block": block,
                **({"min_speed": min_speed} if min_speed > 0 else {}),
                **({"skip_reversing": True} if skip_reversing else {}),
                **({"consensus_k": consensus_k} if consensus_k else {}), **(extra_settings or {})}
    settings = json.loads(json.dumps(settings, default=str))
    for f in sorted((out / "folds").glob("*.json")):
        old = json.loads(f.read_text()).get("settings")
        if old != settings:
            diff = sorted(k for k in set(old or {}) | set(settings) if (old or {}).get(k) != settings.get(k))
            raise ValueError(f"{out} holds folds made with other settings ({', '.join(diff)} differ, e.g. {f.name}); "
                             "choose another output folder or delete it")
    recs = {}
    for n, p in zip(names, paths):
        recs[n] = load(p)
    inputs = {n: vote_inputs(r) for n, r in recs.items()} if consensus_k else {}
    shifts = {}  # each recording's camera shifts, measured once for every fold that trains on it
    for i, test in enumerate(names):
        if folds and test not in folds:
            continue
        fold_path = out / "folds" / f"{test}.json"
        if reference is not None and not (out / "reference" / f"{test}.json").is_file():
            res = evaluate_udacity(reference, recs[test], progress=False)
            write_json_atomic(out / "reference" / f"{test}.json",
                               {"driver": test, "track": track_of[test], "policy": getattr(reference, "path", None),
                                **_scores(res), "seconds": res["seconds"]})
            log.info("reference on %s: MSE %.4f, predict 0 %.4f", test, res["mse"], res["zero_mse"])
        if fold_path.is_file():
            log.info("fold %s: done already (%s), skipped", test, fold_path)
            continue
        t0 = time.time()
        pieces = []
        train_names = [n for n in names if n != test]
        if consensus_k:
            voted = dict(zip(train_names, leave_one_out_votes([inputs[n] for n in train_names],
                                                              ConsensusConfig(k=consensus_k))))
            log.info("fold %s: training labels are the vote of the other training drivers (k = %d)", test, consensus_k)
        for j, n in enumerate(names):
            if n == test:
                continue
            rec = (replace(recs[n], steering=voted[n].astype(np.float32)) if consensus_k else
                   smooth_steering(recs[n], smooth_labels, smooth_mode))
            pieces += subsample_blocks(rec, subsample, block, np.random.default_rng([train_config.seed, i, j]))
        fold_augment, offset = augment, None
        if augment is not None and measure_cameras:
            for n in names:
                if n != test and n not in shifts:
                    shifts[n] = camera_shifts(recs[n])
            offset = camera_offset([shifts[n] for n in names if n != test])
            fold_augment = replace(augment, camera_correction=offset["correction"])
            log.info("fold %s: side cameras measured %.1f px from the center view: correction %.3f", test,
                     offset["px"], offset["correction"])
        source = UdacitySource(pieces, fold_augment, straight_keep=straight_keep, seed=train_config.seed,
                               min_speed=min_speed, skip_reversing=skip_reversing)
        log.info("fold %d/%d: held-out driver %s (%d frames); training on %d drivers, %d frames", i + 1, len(names),
                 test, len(recs[test]), len(names) - 1, sum(source.lengths))
        checkpoint, resume = _fold_checkpoint(out / "folds" / f"{test}.run", settings)
        policy, report = train(source, policy_config, train_config, checkpoint=checkpoint, resume=resume)
        t_train = time.time() - t0
        # the fold's policy beside its scores, so a post-processing (a gain, a flipped view) can be measured on
        # the held-out driver later without retraining; git ignores it (results/**/*.pt)
        policy.save(out / "folds" / f"{test}.pt",
                    metadata={"lodo_fold": test, "train_drivers": [n for n in names if n != test],
                              "seed": train_config.seed, "camera_offset": offset})
        res = evaluate_udacity(policy, recs[test], progress=False, series=True)
        series = res.pop("series")
        arrays = {"t": series["t"], "pred": series["pred"].astype(np.float32),
                  "label": series["label"].astype(np.float32), "smoothed": series["smoothed"].astype(np.float32),
                  "segments": series["segments"]}
        write_atomic(out / "folds" / f"{test}.npz", lambda fh: np.savez_compressed(fh, **arrays))
        fold = {"driver": test, "track": track_of[test], "train_drivers": [n for n in names if n != test],
                **_scores(res), "seconds": {"train": t_train, "evaluate": res["seconds"]},
                "best_epoch": report.best_epoch, "epochs": [asdict(e) for e in report.epochs],
                "n_train_frames": report.n_train_frames, "n_val_frames": report.n_val_frames,
                "train_mean_steering": report.baselines.get("train_mean_steering"), "camera_offset": offset,
                "settings": settings}
        write_json_atomic(fold_path, fold)
        _remove_fold_checkpoint(checkpoint.run_dir)
        nan = float("nan")
        log.info("fold %s: MSE %.4f, MAE %.4f, predict-0 MSE %.4f, ratio %.3f (label floor %.2f); smoothed ratio "
                 "%.2f, r %.2f, right way %.2f (left %.2f, right %.2f), |steer| in curves %.3f vs %.3f (%.0f s)", test,
                 res["mse"], res["mae"], res["zero_mse"], fold["ratio"] or nan, fold.get("oracle_ratio") or nan,
                 *(nan if fold.get(k) is None else fold[k] for k in (
                     "smoothed_ratio", "smoothed_corr", "right_way", "right_way_left", "right_way_right",
                     "curve_mean_abs_pred", "curve_mean_abs_label")), time.time() - t0)
        write_table(out)
    return write_table(out)


def run_consensus_lodo(paths: list[str | Path], out: str | Path, load, cfg: ConsensusConfig = ConsensusConfig(), *,
                       tracks: dict[str, str] | None = None, folds: list[str] | None = None) -> dict:
    """Score the other drivers' consensus on each held-out driver, as a leave-one-driver-out folder.

    Writes ``out/folds/<driver>.json`` (the scores :func:`agent.eval.offline.score_recording` gives a
    fold's policy, with ``settings`` = this method and ``cfg``) and ``<driver>.npz`` (``t``, ``pred``,
    ``label``, ``smoothed``, ``segments``), then ``lodo.md`` / ``lodo.json``
    (:func:`write_table`): the folder reads like a trained setting's, so
    ``agent lodo-table`` and ``agent lodo-compare`` take it. A fold already written is skipped.

    Args:
        paths: the recordings, one driver each (at least 2).
        out: the output folder.
        load: ``load(path)`` -> a loaded recording (:func:`agent.data.udacity_cache.load_cached`).
        cfg: :class:`agent.eval.consensus.ConsensusConfig`.
        tracks: driver name -> track ("*" for every driver not named), as ``agent train --lodo.tracks``.
        folds: only these held-out drivers (names from :func:`driver_names`); None: all.

    Returns:
        The table (:func:`lodo_table`).

    Raises:
        ValueError: fewer than 2 recordings, an unknown fold, or an ``out`` whose folds were written
            with other settings.
    """
    if len(paths) < 2:
        raise ValueError(f"a consensus of other drivers needs at least 2 recordings, got {len(paths)}")
    names = driver_names(paths)
    unknown = sorted(set(folds or []) - set(names))
    if unknown:
        raise ValueError(f"unknown fold(s) {', '.join(unknown)}; the drivers are {', '.join(names)}")
    tracks = dict(tracks or {})
    out = Path(out)
    settings = {"method": "consensus of the other drivers (agent.eval.consensus)", "k": cfg.k, "dims": cfg.dims,
                "min_speed": cfg.min_speed, "feature": f"luma {FEATURE_SHAPE[0]}x{FEATURE_SHAPE[1]}, standardised",
                "recordings": {n: str(p) for n, p in zip(names, paths)}}
    for f in sorted((out / "folds").glob("*.json")):
        if json.loads(f.read_text()).get("settings") != settings:
            raise ValueError(f"{out} holds folds made with other settings (e.g. {f.name}); choose another output "
                             "folder or delete it")
    recs, votes = {}, {}
    for n, p in zip(names, paths):
        recs[n] = load(p)
        votes[n] = vote_inputs(recs[n], cfg.min_speed)
    for test in names:
        if folds and test not in folds:
            continue
        path = out / "folds" / f"{test}.json"
        if path.is_file():
            log.info("consensus fold %s: done already (%s), skipped", test, path)
            continue
        t0 = time.time()
        others = [n for n in names if n != test]
        pred = consensus_predict(votes[test].features,
                                 np.concatenate([votes[n].features[votes[n].voters] for n in others]),
                                 np.concatenate([votes[n].smoothed[votes[n].voters] for n in others]), cfg)
        res, smoothed = score_recording(pred.astype(np.float32), recs[test])
        arrays = {"t": np.asarray(recs[test].timestamps, np.float64), "pred": pred.astype(np.float32),
                  "label": np.asarray(recs[test].steering, np.float32), "smoothed": smoothed.astype(np.float32),
                  "segments": np.asarray(recs[test].segments)}
        write_atomic(out / "folds" / f"{test}.npz", lambda fh: np.savez_compressed(fh, **arrays))
        fold = {"driver": test, "track": tracks.get(test, tracks.get("*", TRACK_UNKNOWN)), "train_drivers": others,
                **res, "seconds": {"train": 0.0, "evaluate": time.time() - t0},
                "n_train_frames": int(sum(votes[n].voters.sum() for n in others)), "settings": settings}
        write_json_atomic(path, fold)
        log.info("consensus fold %s: smoothed ratio %.2f, r %.2f (%.0f s)", test, res.get("smoothed_ratio") or
                 float("nan"), res.get("smoothed_corr") or float("nan"), time.time() - t0)
        write_table(out)
    return write_table(out)


#: the first line of a fold checkpoint's stored config (the fold's settings as JSON follow): it marks the
#: checkpoint as a fold's, which ``agent train --resume`` does not take (the LODO command continues it)
FOLD_CONFIG_MARK = "# a leave-one-driver-out fold's settings (agent.train.lodo)\n"


def _fold_checkpoint(run_dir: Path, settings: dict) -> tuple[Checkpointer, dict | None]:
    """The fold's :class:`agent.train.checkpoint.Checkpointer` in ``run_dir``, and the checkpoint to continue
    (None: none there, unreadable, finished, or of other settings: the fold starts anew and overwrites it)."""
    config = FOLD_CONFIG_MARK + json.dumps(settings, sort_keys=True)
    checkpoint = Checkpointer(run_dir, config)
    if not (run_dir / CHECKPOINT_NAME).is_file():
        return checkpoint, None
    try:
        state = load_checkpoint(run_dir)
    except CheckpointError as exc:
        log.warning("%s; the fold starts anew", exc)
        return checkpoint, None
    if state.get("config") != config or state.get("stage") != "bc":
        log.warning("%s holds a checkpoint of other settings; the fold starts anew", run_dir)
        return checkpoint, None
    log.info("%s holds a checkpoint of this fold (%s): continuing from it", run_dir, state.get("what"))
    return checkpoint, state


def _remove_fold_checkpoint(run_dir: Path) -> None:
    """Delete a finished fold's checkpoint folder (only the checkpoint a :class:`Checkpointer` writes)."""
    (run_dir / CHECKPOINT_NAME).unlink(missing_ok=True)
    try:
        run_dir.rmdir()
    except OSError:  # something else is in it: left alone
        pass


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _fold_floor(d: dict) -> tuple[float | None, float | None]:
    """(oracle MSE, oracle ratio) at ``FLOOR_HALF_WIDTH_S`` of a fold: stored in the fold, or for a
    fold written before the floor existed, computed from its recording's CSV when that is still
    there and reads the same number of frames; (None, None) otherwise."""
    if d.get("oracle_mse") is not None and d.get("oracle_half_width_s") == FLOOR_HALF_WIDTH_S:
        return d["oracle_mse"], d.get("oracle_ratio")
    data = d.get("data")
    if not data or not Path(data).is_file():
        return None, None
    try:
        fl = recording_floor(data, (FLOOR_HALF_WIDTH_S,))
    except (OSError, ValueError) as exc:
        log.warning("no label floor for fold %s: %s", d.get("driver"), exc)
        return None, None
    if fl["n_frames"] != d.get("n_frames"):
        log.warning("no label floor for fold %s: %s now reads %d frames, the fold scored %s", d.get("driver"),
                    data, fl["n_frames"], d.get("n_frames"))
        return None, None
    k = width_key(FLOOR_HALF_WIDTH_S)
    return fl["oracle_mse"][k], fl["oracle_ratio"][k]


DRIVING_KEYS = ("moving_smoothed_mse", "moving_smoothed_zero_mse", "moving_smoothed_ratio", "moving_smoothed_corr",
                "n_reversing")


def _fold_driving(d: dict, npz: Path) -> dict:
    """A fold's smoothed scores on the frames driven forwards (:data:`DRIVING_KEYS`, as
    :func:`agent.eval.offline.evaluate_udacity` stores them): from the fold, or for a fold written
    before they existed, from its saved steering (``npz``) and its recording's speed and pedals (the
    CSV alone, no image read) when both are there and hold the fold's frames; else all None."""
    if all(k in d for k in DRIVING_KEYS):
        return {k: d[k] for k in DRIVING_KEYS}
    none = dict.fromkeys(DRIVING_KEYS)
    data = d.get("data")
    if not (data and Path(data).is_file() and npz.is_file()):
        return none
    try:
        _, good, _ = parse_log(data)
        with np.load(npz, allow_pickle=False) as z:
            pred, smoothed, segments = z["pred"].astype(np.float64), z["smoothed"].astype(np.float64), z["segments"]
    except (OSError, ValueError, KeyError) as exc:
        log.warning("no driving-forwards scores for fold %s: %s", d.get("driver"), exc)
        return none
    if len(good) != len(pred) or len(pred) != d.get("n_frames"):
        return none
    _, throttle, brake, speed = np.array([g[2] for g in good], np.float64).T
    return driving_scores(pred, smoothed, speed, throttle, brake, segments, d.get("min_speed_mph") or 5.0)[1]


def lodo_table(out: str | Path) -> dict:
    """The table of a LODO folder from its finished folds: ``{"drivers": [...], "tracks": {...}}``.

    Per driver: track, frames, MSE, MAE, predict-0 MSE, ratio, the keyboard-noise floor beside it
    (``oracle_mse``, ``oracle_ratio``: the driver's own labels smoothed over +-0.5 s,
    :mod:`agent.eval.label_floor`; for folds written before it, computed from the recording's CSV
    when present, else None) and the reference policy's MSE and ratio where scored. Per track (and
    "all"): the number of folds, mean MSE, mean predict-0 MSE, their ratio (the target's measure),
    the mean of the per-driver ratios, the floor's ``oracle_ratio_of_means`` and
    ``oracle_mean_ratio`` (None unless every fold of the group has a floor), the reference's, and the
    scores against the driver's intent (:func:`_intent_means`: ``smoothed_ratio_of_means``,
    ``smoothed_corr``, ``right_way_left``, ``right_way_right``, ``curve_mean_abs_pred`` ...; issue
    "Udacity steering that turns", item 1).
    """
    out = Path(out)
    rows = []
    for f in sorted((out / "folds").glob("*.json"), key=lambda p: p.stem.lower()):
        d = json.loads(f.read_text())
        row = {k: d.get(k) for k in ("driver", "track", "n_frames", "mse", "mae", "zero_mse", "ratio",
                                     "n_train_frames", *INTENT_KEYS[1:])}
        row["oracle_mse"], row["oracle_ratio"] = _fold_floor(d)
        row.update(_fold_driving(d, f.with_suffix(".npz")))
        row["train_seconds"] = (d.get("seconds") or {}).get("train")
        ref = out / "reference" / f"{d['driver']}.json"
        if ref.is_file():
            r = json.loads(ref.read_text())
            row.update(reference_mse=r["mse"], reference_mae=r["mae"], reference_ratio=r["ratio"])
        rows.append(row)
    groups = {}
    for name in sorted({r["track"] for r in rows}) + (["all"] if rows else []):
        g = [r for r in rows if name == "all" or r["track"] == name]
        mse, zero = _mean([r["mse"] for r in g]), _mean([r["zero_mse"] for r in g])
        ref = _mean([r.get("reference_mse") for r in g])
        whole = all(r.get("oracle_mse") is not None for r in g)
        oracle = _mean([r["oracle_mse"] for r in g]) if whole else None
        groups[name] = {"folds": len(g), "mse": mse, "mae": _mean([r["mae"] for r in g]), "zero_mse": zero,
                        "ratio_of_means": mse / zero if zero else None, "mean_ratio": _mean([r["ratio"] for r in g]),
                        "oracle_ratio_of_means": oracle / zero if (oracle is not None and zero) else None,
                        "oracle_mean_ratio": _mean([r["oracle_ratio"] for r in g]) if whole else None,
                        "reference_mse": ref,
                        "reference_ratio_of_means": ref / zero if (ref is not None and zero) else None,
                        **_intent_means(g)}
    return {"drivers": rows, "tracks": groups}


def _timing(row: dict) -> str:
    """The markdown cell of a row's timing (``best_lag_s``, ``smoothed_ratio_at_best_lag``); blank when absent."""
    lag = row.get("best_lag_s")
    return "" if lag is None else f"{lag:+.2f}, {_f(row.get('smoothed_ratio_at_best_lag'), '.2f')}"


def _intent_means(rows: list[dict]) -> dict:
    """The means against the driver's intent of a group of folds (:func:`agent.eval.offline.summarize_recordings`):
    ``smoothed_ratio_of_means``, ``smoothed_mean_ratio`` and :data:`agent.eval.offline.INTENT_MEANS`; all None
    unless every fold of the group has intent scores (folds written before they existed have none)."""
    keys = ("smoothed_ratio_of_means", "smoothed_mean_ratio", *INTENT_MEANS, "moving_smoothed_ratio_of_means",
            "moving_smoothed_corr")
    if not rows or any(r.get("smoothed_mse") is None for r in rows):
        return dict.fromkeys(keys)
    summary = summarize_recordings(rows)
    return {k: summary.get(k) for k in keys}


def _f(x, fmt=".4f", missing="-"):
    return missing if x is None else format(x, fmt)


def write_table(out: str | Path) -> dict:
    """Write ``lodo.json`` and ``lodo.md`` in ``out`` from its finished folds; returns the table."""
    out = Path(out)
    table = lodo_table(out)
    ref = any("reference_mse" in r for r in table["drivers"])
    head = (f"| held-out driver | track | frames | MSE | MAE | predict-0 MSE | ratio | {ORACLE_COLUMN} |" +
            (" reference MSE | reference ratio |" if ref else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in table["drivers"]:
        lines.append(f"| {r['driver']} | {r['track']} | {r['n_frames']} | {_f(r['mse'])} | {_f(r['mae'])} | "
                     f"{_f(r['zero_mse'])} | {_f(r['ratio'], '.2f')} | {_f(r.get('oracle_ratio'), '.2f', '')} |" +
                     (f" {_f(r.get('reference_mse'))} | {_f(r.get('reference_ratio'), '.2f')} |" if ref else ""))
    for name, g in table["tracks"].items():
        floor = g.get("oracle_ratio_of_means")
        lines.append(f"| **mean, {name}** ({g['folds']} folds) | {name} | | {_f(g['mse'])} | {_f(g['mae'])} | "
                     f"{_f(g['zero_mse'])} | {_f(g['ratio_of_means'], '.2f')} (mean of ratios "
                     f"{_f(g['mean_ratio'], '.2f')}) | " +
                     ("" if floor is None else f"{floor:.2f} (mean of ratios {_f(g.get('oracle_mean_ratio'), '.2f', '')})") +
                     " |" +
                     (f" {_f(g['reference_mse'])} | {_f(g['reference_ratio_of_means'], '.2f')} |" if ref else ""))
    lines += ["", "Against the driver's intent: the held-out labels smoothed over ±0.5 s (centred, the label included). "
              "Smoothed ratio = MSE / predict-0 MSE on them; r = Pearson correlation with them; right way = share of "
              "curve frames (|smoothed| > 0.05) steered the smoothed label's way, left and right apart; |pred| vs "
              "|label| = mean magnitudes on curve frames; timing = the shift of the predictions (within ±1 s; + = the "
              "policy late) that correlates best with the smoothed labels, and the smoothed ratio at it "
              "(agent.eval.steering.timing; blank for folds written before it). Driving forwards: the same smoothed ratio "
              "and r on the frames at 5 mph or more where the car is not reversing (agent.data.udacity.reversing_frames:"
              " the multi-point turns after leaving the road). Means per track: mean smoothed MSE / "
              "mean predict-0, and the other columns' means over the folds.", "",
              "| held-out driver | track | smoothed ratio | r | right way | left | right | \\|pred\\| vs \\|label\\| in curves "
              "| timing (s), smoothed ratio there | driving forwards: smoothed ratio, r |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in table["drivers"]:
        lines.append(f"| {r['driver']} | {r['track']} | {_f(r.get('smoothed_ratio'), '.2f')} | "
                     f"{_f(r.get('smoothed_corr'), '.2f')} | {_f(r.get('right_way'), '.2f')} | "
                     f"{_f(r.get('right_way_left'), '.2f')} | {_f(r.get('right_way_right'), '.2f')} | "
                     f"{_f(r.get('curve_mean_abs_pred'), '.3f')} vs {_f(r.get('curve_mean_abs_label'), '.3f')} | "
                     f"{_timing(r)} | {_f(r.get('moving_smoothed_ratio'), '.2f', '')}, "
                     f"{_f(r.get('moving_smoothed_corr'), '.2f', '')} |")
    for name, g in table["tracks"].items():
        lines.append(f"| **mean, {name}** ({g['folds']} folds) | {name} | "
                     f"**{_f(g.get('smoothed_ratio_of_means'), '.2f')}** | {_f(g.get('smoothed_corr'), '.2f')} | "
                     f"{_f(g.get('right_way'), '.2f')} | {_f(g.get('right_way_left'), '.2f')} | "
                     f"{_f(g.get('right_way_right'), '.2f')} | {_f(g.get('curve_mean_abs_pred'), '.3f')} vs "
                     f"{_f(g.get('curve_mean_abs_label'), '.3f')} | {_timing(g)} | "
                     f"{_f(g.get('moving_smoothed_ratio_of_means'), '.2f', '')}, "
                     f"{_f(g.get('moving_smoothed_corr'), '.2f', '')} |")
    md = ("Leave-one-driver-out: each row is a policy trained on the other drivers and scored on this one "
          "(center camera, every frame, streaming; raw labels). ratio = MSE / predict-0 MSE (< 1 beats driving "
          "straight); the means' ratio is mean MSE / mean predict-0 MSE. The smoothed-oracle ratio is the "
          "keyboard-noise floor beside it: the held-out driver's own labels averaged over ±0.5 s (within a session "
          "segment) as the prediction, scored the same way (agent.eval.label_floor); a frame-only policy is not "
          "expected to go below it. Blank: not known for this fold.\n\n" + "\n".join(lines) + "\n")
    if table["drivers"]:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "lodo.json", table)
        write_atomic(out / "lodo.md", md)
    table["markdown"] = md
    return table


#: issue "Udacity steering that turns", item 2: the means per track every seed's leave-one-driver-out
#: run must reach: (key of the track means, "max" or "min", {track: bound}, "*" for any track)
TARGETS = (("smoothed_ratio_of_means", "max", {"lake": 0.5, "jungle": 0.6}),
           ("smoothed_corr", "min", {"*": 0.7}),
           ("right_way_left", "min", {"*": 0.9}),
           ("right_way_right", "min", {"*": 0.9}),
           ("ratio_of_means", "max", {"*": 0.7}))
#: the columns of the table over seeds: (key, heading, format)
SEED_COLUMNS = (("smoothed_ratio_of_means", "smoothed ratio", ".2f"), ("smoothed_corr", "r", ".2f"),
                ("right_way_left", "right way, left", ".2f"), ("right_way_right", "right way, right", ".2f"),
                ("ratio_of_means", "raw ratio", ".2f"),
                ("moving_smoothed_ratio_of_means", "smoothed ratio, driving forwards (not a target)", ".2f"),
                ("curve_abs_ratio", "\\|pred\\| / \\|label\\| in curves",
                                                          ".2f"))


def _bound(key: str, track: str):
    for k, how, bounds in TARGETS:
        if k == key:
            b = bounds.get(track, bounds.get("*"))
            return (how, b) if b is not None else None
    return None


def seed_folders(out: str | Path) -> dict[int, Path]:
    """The per-seed LODO folders under ``out`` (``s<seed>/``, as ``--lodo.seeds`` writes them) that
    hold at least one finished fold: seed -> folder, in seed order ({} when there are none).

    ``agent train --lodo.seeds 1`` run after seed 0 finished tabulates both seeds with it, so a
    rerun of one seed (or of some folds) never rewrites ``seeds.md`` from part of the evidence.
    """
    out = Path(out)
    found = {}
    for d in out.glob("s*") if out.is_dir() else ():
        if d.is_dir() and d.name[1:].isdigit() and any((d / "folds").glob("*.json")):
            found[int(d.name[1:])] = d
    return dict(sorted(found.items()))


#: the per-fold scores compared across seeds (key, heading)
PAIRED_KEYS = (("smoothed_ratio", "smoothed ratio"), ("smoothed_corr", "r"))


def _paired_folds(drivers: dict[int, list[dict]]) -> dict:
    """Each held-out driver finished by every seed, with its scores per seed, and the seed-to-seed
    spread of a fold: the pooled within-fold standard deviation sqrt(mean over folds of the sample
    variance across seeds), and the median and largest range (max - min over the seeds).

    This is the noise a one-seed screen of a setting works against: a change of one fold smaller
    than its seed-to-seed range cannot be told from the seed's doing.
    """
    seeds = sorted(drivers)
    by = {s: {r["driver"]: r for r in drivers[s]} for s in seeds}
    common = sorted(set.intersection(*(set(b) for b in by.values())), key=str.lower)
    every = set().union(*by.values())
    missing = {s: sorted(every - set(by[s])) for s in seeds}
    rows = {}
    for d in common:
        row = {"track": by[seeds[0]][d]["track"]}
        for key, _ in PAIRED_KEYS:
            row[key] = [by[s][d].get(key) for s in seeds]
        rows[d] = row
    spread = {}
    for key, _ in PAIRED_KEYS:
        vals = [r[key] for r in rows.values() if None not in r[key]]
        if len(seeds) < 2 or not vals:
            spread[key] = None
            continue
        ranges = sorted(max(v) - min(v) for v in vals)
        var = [float(np.var(v, ddof=1)) for v in vals]
        spread[key] = {"folds": len(vals), "pooled_sd": float(np.sqrt(np.mean(var))),
                       "median_range": float(np.median(ranges)), "max_range": ranges[-1]}
    return {"drivers": rows, "spread": spread, "missing": {s: m for s, m in missing.items() if m}}


def _paired_markdown(seeds: list[int], paired: dict) -> str:
    if len(seeds) < 2:
        return ""
    lines = []
    if paired["missing"]:
        lines.append("**The seeds finished different folds**, so the means per track above are over different "
                     "drivers; the rows below compare the folds every seed finished. Not yet finished: " +
                     "; ".join(f"seed {s}: {', '.join(m)}" for s, m in paired["missing"].items()) + ".\n")
    sp = paired["spread"].get("smoothed_ratio")
    if sp:
        lines.append(f"Seed-to-seed spread of one fold's smoothed ratio over {sp['folds']} folds: pooled standard "
                     f"deviation {sp['pooled_sd']:.3f}, range median {sp['median_range']:.3f}, largest "
                     f"{sp['max_range']:.3f}. A one-seed screen that moves a fold by less than the median range has not shown "
                     "an effect.\n")
    head = "| held-out driver | track | " + " | ".join(f"{h}, seeds {', '.join(map(str, seeds))}"
                                                     for _, h in PAIRED_KEYS) + " |"
    lines += [head, "|" + "---|" * (len(PAIRED_KEYS) + 2)]
    for d, row in paired["drivers"].items():
        cells = [" / ".join(_f(v, ".3f") for v in row[k]) for k, _ in PAIRED_KEYS]
        lines.append(f"| {d} | {row['track']} | " + " | ".join(cells) + " |")
    return "\n" + "\n".join(lines) + "\n"


def seeds_table(runs: dict[int, str | Path], out: str | Path | None = None) -> dict:
    """The leave-one-driver-out means per track over several training seeds, against the targets.

    Each seed's run is a LODO folder (:func:`run_lodo`); its means per track (:func:`lodo_table`) are
    taken as they are, and per track and measure this gives each seed's value, their mean, and
    whether every seed meets :data:`TARGETS` (the seed, not the fold, is the unit of a retraining;
    Colas, Sigaud and Oudeyer 2018, "How Many Random Seeds?"). With fewer than 3 seeds no interval
    is given: the table says so.

    Args:
        runs: seed -> its LODO folder.
        out: where to write ``seeds.json`` and ``seeds.md`` (None: write nothing).

    Returns:
        {"seeds": [...], "folds": {seed: {track: folds}}, "tracks": {track: {key: {"per_seed",
        "mean", "target", "met"}}}, "paired": {"drivers": {driver: {"track", "smoothed_ratio":
        [per seed], "smoothed_corr": [...]}}, "spread": {key: {"folds", "pooled_sd", "median_range",
        "max_range"} or None}, "missing": {seed: [drivers not finished]}} (:func:`_paired_folds`),
        "markdown": str}.

    Raises:
        ValueError: no runs, or a folder without finished folds.
    """
    if not runs:
        raise ValueError("seeds_table needs at least one seed's leave-one-driver-out folder")
    tables = {}
    for seed, folder in runs.items():
        t = lodo_table(folder)
        if not t["drivers"]:
            raise ValueError(f"{folder} holds no finished fold (seed {seed}): run the leave-one-driver-out first")
        tables[int(seed)] = t
    seeds = sorted(tables)
    tracks = [name for name in tables[seeds[0]]["tracks"] if all(name in tables[s]["tracks"] for s in seeds)]
    result = {"seeds": seeds, "folds": {s: {n: tables[s]["tracks"][n]["folds"] for n in tracks} for s in seeds},
              "tracks": {}}
    for name in tracks:
        row = {}
        for key, _, _ in SEED_COLUMNS:
            vals = [tables[s]["tracks"][name].get(key) for s in seeds]
            mean = _mean(vals) if all(v is not None for v in vals) else None
            bound = _bound(key, name) if name != "all" else None
            met = None
            if bound is not None and mean is not None:
                how, b = bound
                met = all((v <= b) if how == "max" else (v >= b) for v in vals)
            row[key] = {"per_seed": vals, "mean": mean,
                        "target": None if bound is None else f"{'<=' if bound[0] == 'max' else '>='} {bound[1]}",
                        "met": met}
        result["tracks"][name] = row
    head = "| track | folds a seed | " + " | ".join(h for _, h, _ in SEED_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(SEED_COLUMNS) + 2)]
    for name, row in result["tracks"].items():
        folds = "/".join(str(result["folds"][s][name]) for s in seeds)
        cells = []
        for key, _, fmt in SEED_COLUMNS:
            c = row[key]
            each = ", ".join(_f(v, fmt) for v in c["per_seed"])
            mark = "" if c["met"] is None else (" ✓" if c["met"] else " ✗")
            tgt = f" ({c['target']})" if c["target"] else ""
            cells.append(f"**{_f(c['mean'], fmt)}**{tgt}{mark}<br>seeds {each}")
        lines.append(f"| {name} | {folds} | " + " | ".join(cells) + " |")
    n = len(seeds)
    md = (f"Leave-one-driver-out over {n} training seed{'s' if n != 1 else ''} ({', '.join(map(str, seeds))}): "
          "each cell is the mean over the seeds of the seed's mean per track, then each seed's value. ✓: every "
          "seed meets the target of issue \"Udacity steering that turns\" (smoothed ratio <= 0.5 on the lake track "
          "and <= 0.6 on the jungle track, r >= 0.7, right-way turns >= 0.9 left and right, raw-label ratio <= 0.7); "
          "✗: at least one does not. " +
          ("With fewer than 3 seeds no interval is given: the seeds' values show the spread. " if n < 3 else "") +
          "Folds: the finished folds of each seed per track.\n\n" + "\n".join(lines) + "\n")
    paired = _paired_folds({s: tables[s]["drivers"] for s in seeds})
    result["paired"] = paired
    md += _paired_markdown(seeds, paired)
    result["markdown"] = md
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "seeds.json", {k: v for k, v in result.items() if k != "markdown"})
        write_atomic(out / "seeds.md", md)
    return result


#: the per-fold scores :func:`compare_settings` compares (key, heading, format)
COMPARE_KEYS = (("smoothed_ratio", "smoothed ratio", ".3f"), ("smoothed_corr", "r", ".3f"), ("ratio", "raw ratio", ".3f"),
                ("curve_abs_ratio", "\\|pred\\| / \\|label\\| in curves", ".2f"))


def runs_of(folder: str | Path) -> dict[int, Path]:
    """The seeds of a leave-one-driver-out setting: seed -> LODO folder.

    ``folder`` is either a folder of seed folders (``s<seed>/``, as ``--lodo.seeds`` writes them;
    :func:`seed_folders`) or one LODO folder with ``folds/`` (its seed read from a fold's settings).

    Raises:
        ValueError: neither is there (no finished fold).
    """
    folder = Path(folder)
    runs = seed_folders(folder)
    if runs:
        return runs
    folds = sorted((folder / "folds").glob("*.json"))
    if not folds:
        raise ValueError(f"{folder} holds no finished fold and no s<seed>/ folder with one: give a folder that "
                         "`agent train --lodo.out` wrote")
    seed = ((json.loads(folds[0].read_text()).get("settings") or {}).get("train") or {}).get("seed", 0)
    return {int(seed): folder}


def compare_settings(base: dict[int, str | Path], new: dict[int, str | Path], out: str | Path | None = None) -> dict:
    """Two leave-one-driver-out settings, fold by fold, with intervals that know the seed-to-seed noise.

    For every held-out driver that every seed of both settings finished, and each of
    :data:`COMPARE_KEYS`: the mean over each setting's seeds, and their difference (new - base). The
    noise is one fold's seed-to-seed standard deviation ``sd``, pooled over every (setting, driver)
    with two or more seeds, in both folders (all their folds, not only the shared ones). Seeds of the
    two settings are taken as independent draws (another setting's same seed trains other weights), so
    one fold's difference has standard error ``sd * sqrt(1/n_base + 1/n_new)``; per track (and "all")
    the mean over its k folds has that over sqrt(k), and the 95 % interval uses Student's t with the
    pooled degrees of freedom (folds taken as independent given the seeds; Colas, Sigaud and Oudeyer
    2018, "How Many Random Seeds?", for seeds as the unit of a training run). Each track also gets
    each setting's ratio of means (the target's measure: mean smoothed MSE / mean predict-0 over the
    shared folds, averaged over the seeds).

    Args:
        base, new: seed -> LODO folder (:func:`runs_of`).
        out: where to write ``compare.json`` and ``compare.md`` (None: write nothing).

    Returns:
        {"base_seeds", "new_seeds", "drivers": {driver: {"track", key: {"base", "new", "diff", "se"}}},
        "noise": {key: {"sd", "df"} or None}, "tracks": {track: {"folds", key: {"diff", "ci95", "base", "new"},
        "smoothed_ratio_of_means": {"base", "new"}}}, "missing": [drivers finished by some seeds only],
        "markdown"}; each driver's cell also lists the seeds' values (``base_seeds``, ``new_seeds``).

    Raises:
        ValueError: a setting without seeds, or no driver that every seed of both settings finished.
    """
    from scipy import stats

    if not base or not new:
        raise ValueError("compare_settings needs at least one seed of each setting")
    rows = {}
    for side, runs in (("base", base), ("new", new)):
        for seed, folder in runs.items():
            t = lodo_table(folder)
            if not t["drivers"]:
                raise ValueError(f"{folder} holds no finished fold (seed {seed})")
            rows[(side, int(seed))] = {r["driver"]: r for r in t["drivers"]}
    every = set().union(*(set(r) for r in rows.values()))
    shared = sorted(set.intersection(*(set(r) for r in rows.values())), key=str.lower)
    if not shared:
        raise ValueError("no held-out driver was finished by every seed of both settings: nothing to compare")
    seeds = {side: sorted(s for sd, s in rows if sd == side) for side in ("base", "new")}
    nb, nn = len(seeds["base"]), len(seeds["new"])

    def values(side, driver, key):
        vals = [rows[(side, s)][driver].get(key) for s in seeds[side] if driver in rows[(side, s)]]
        return [float(v) for v in vals if v is not None]

    noise = {}
    for key, *_ in COMPARE_KEYS:
        ss, df = 0.0, 0
        for side in ("base", "new"):
            for d in every:
                v = values(side, d, key)
                if len(v) >= 2:
                    ss += float(np.sum((np.asarray(v) - np.mean(v)) ** 2))
                    df += len(v) - 1
        noise[key] = {"sd": float(np.sqrt(ss / df)), "df": df} if df else None
    drivers = {}
    for d in shared:
        row = {"track": rows[("base", seeds["base"][0])][d]["track"]}
        for key, *_ in COMPARE_KEYS:
            b, n = values("base", d, key), values("new", d, key)
            if len(b) < nb or len(n) < nn:
                row[key] = None
                continue
            se = noise[key]["sd"] * np.sqrt(1 / nb + 1 / nn) if noise[key] else None
            row[key] = {"base": float(np.mean(b)), "new": float(np.mean(n)), "diff": float(np.mean(n) - np.mean(b)),
                        "se": None if se is None else float(se), "base_seeds": b, "new_seeds": n}
        drivers[d] = row
    tracks = {}
    for name in sorted({r["track"] for r in drivers.values()}) + ["all"]:
        group = [d for d, r in drivers.items() if name == "all" or r["track"] == name]
        entry = {"folds": len(group)}
        for key, *_ in COMPARE_KEYS:
            cells = [drivers[d][key] for d in group if drivers[d][key] is not None]
            if not cells:
                entry[key] = None
                continue
            diff = float(np.mean([c["diff"] for c in cells]))
            ci = None
            if noise[key]:
                half = float(stats.t.ppf(0.975, noise[key]["df"]) * noise[key]["sd"] * np.sqrt(1 / nb + 1 / nn)
                             / np.sqrt(len(cells)))
                ci = [diff - half, diff + half]
            entry[key] = {"diff": diff, "ci95": ci, "base": float(np.mean([c["base"] for c in cells])),
                          "new": float(np.mean([c["new"] for c in cells]))}
        rom = {}
        for side in ("base", "new"):  # each seed's track mean as lodo.md has it (_intent_means), then their mean
            per = [_intent_means([rows[(side, s)][d] for d in group])["smoothed_ratio_of_means"] for s in seeds[side]]
            rom[side] = None if None in per else float(np.mean(per))
        entry["smoothed_ratio_of_means"] = rom
        tracks[name] = entry
    result = {"base_seeds": seeds["base"], "new_seeds": seeds["new"], "drivers": drivers, "noise": noise,
              "tracks": tracks, "missing": sorted(every - set(shared), key=str.lower)}
    result["markdown"] = _compare_markdown(result)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "compare.json", {k: v for k, v in result.items() if k != "markdown"})
        write_atomic(out / "compare.md", result["markdown"])
        plot_compare(result, out / "compare.png")
    return result


def plot_compare(result: dict, path: str | Path) -> Path:
    """A figure of :func:`compare_settings`: one panel per score (smoothed ratio, r), one row per
    held-out driver; each seed's value as a small dot (grey: base, blue: new), the seed means as
    large markers joined by an arrow base -> new; each track's mean difference and 95 % interval in
    the panel's title. Saved with matplotlib's Agg backend.

    Returns:
        ``path`` as a Path (its folder is created).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(k, h) for k, h, _ in COMPARE_KEYS if k in ("smoothed_ratio", "smoothed_corr")]
    drivers = list(result["drivers"])
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 1.8 + 0.45 * len(drivers)), squeeze=False)
    for ax, (key, head) in zip(axes[0], keys):
        for y, d in enumerate(drivers):
            c = result["drivers"][d][key]
            if c is None:
                continue
            ax.scatter(c["base_seeds"], [y + 0.12] * len(c["base_seeds"]), s=14, color="0.6", zorder=2)
            ax.scatter(c["new_seeds"], [y - 0.12] * len(c["new_seeds"]), s=14, color="tab:blue", zorder=2)
            ax.annotate("", xy=(c["new"], y), xytext=(c["base"], y),
                        arrowprops=dict(arrowstyle="->", color="tab:blue" if c["diff"] else "0.6"))
            ax.scatter([c["base"]], [y], s=60, facecolors="none", edgecolors="0.4", zorder=3)
            ax.scatter([c["new"]], [y], s=60, color="tab:blue", zorder=3)
        ax.set_yticks(range(len(drivers)), [f"{d} ({result['drivers'][d]['track']})" for d in drivers], fontsize=8)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlabel(f"{head} (grey: base seeds {result['base_seeds']}, blue: new seeds {result['new_seeds']})",
                      fontsize=8)
        parts = []
        for name, t in result["tracks"].items():
            c = t.get(key)
            if c is None or name == "all":
                continue
            ci = "" if c["ci95"] is None else f" [{c['ci95'][0]:+.3f}, {c['ci95'][1]:+.3f}]"
            parts.append(f"{name} ({t['folds']}): {c['diff']:+.3f}{ci}")
        ax.set_title(f"{head}, new - base (mean over folds, 95 % interval)\n" + "\n".join(parts), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110, what="comparison figure")


def _compare_markdown(r: dict) -> str:
    sb, sn = ", ".join(map(str, r["base_seeds"])), ", ".join(map(str, r["new_seeds"]))
    lines = [f"New setting (seeds {sn}) against base (seeds {sb}), on the held-out drivers every seed of both "
             "finished: each cell is base -> new (means over the seeds) and the difference new - base. Per track "
             "the mean difference over its folds, with a 95 % interval from one fold's seed-to-seed standard "
             "deviation pooled over both settings' folds (Student's t): an interval that holds 0 shows no "
             "difference.", ""]
    sp = [f"{h}: sd {r['noise'][k]['sd']:.3f} ({r['noise'][k]['df']} df)" for k, h, *_ in COMPARE_KEYS if r["noise"][k]]
    lines.append("Seed-to-seed noise of one fold: " + ("; ".join(sp) if sp else "not known (one seed a setting)") + ".")
    if r["missing"]:
        lines.append("Left out (not finished by every seed of both settings): " + ", ".join(r["missing"]) + ".")
    lines += ["", "| held-out driver | track | " + " | ".join(h for _, h, *_ in COMPARE_KEYS) + " |",
              "|" + "---|" * (len(COMPARE_KEYS) + 2)]
    for d, row in r["drivers"].items():
        cells = [("-" if row[k] is None else f"{row[k]['base']:{f}} -> {row[k]['new']:{f}} ({row[k]['diff']:+{f}})")
                 for k, _, f in COMPARE_KEYS]
        lines.append(f"| {d} | {row['track']} | " + " | ".join(cells) + " |")
    for name, t in r["tracks"].items():
        cells = []
        for k, _, f in COMPARE_KEYS:
            c = t[k]
            if c is None:
                cells.append("-")
                continue
            ci = "" if c["ci95"] is None else f" [{c['ci95'][0]:+{f}}, {c['ci95'][1]:+{f}}]"
            cells.append(f"{c['base']:{f}} -> {c['new']:{f}} (**{c['diff']:+{f}}**{ci})")
        lines.append(f"| **mean, {name}** ({t['folds']} folds) | {name} | " + " | ".join(cells) + " |")
    lines += ["", "Smoothed ratio of means per track (the target's measure, over the shared folds, mean over the seeds): " +
              "; ".join(f"{name} {_f(t['smoothed_ratio_of_means']['base'], '.3f')} -> "
                        f"{_f(t['smoothed_ratio_of_means']['new'], '.3f')}" for name, t in r["tracks"].items()) + "."]
    return "\n".join(lines) + "\n"


__all__ = ["COMPARE_KEYS", "SEED_COLUMNS", "TARGETS", "compare_settings", "driver_names", "lodo_table", "plot_compare",
           "run_consensus_lodo", "run_lodo", "runs_of", "seed_folders", "seeds_table", "subsample_blocks",
           "write_table"]
