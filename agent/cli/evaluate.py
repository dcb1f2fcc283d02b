"""`agent evaluate`: closed-loop returns (CarRacing), offline steering error and the keyboard-noise floor (Udacity).

The options are :class:`EvaluateRun`, parsed by tyro: the CarRacing options at the top level, an
expert's rules in ``teacher`` (:class:`agent.train.config.TeacherSection`) and the Udacity-only
options in ``udacity`` (:class:`UdacityOptions`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agent.actors.loading import LOADERS, file_kind, load_policy, resolve_policy_path
from agent.actors.rollout import SLOW_SPEED
from agent.cli.common import (udacity_loader, CLIError, check_udacity_folders, driver_tracks, parse_config, teacher_rule_options,
                              write_json)
from agent.eval.card import identity
from agent.eval.closed_loop import evaluate
from agent.eval.label_floor import floor_markdown, floor_means, recording_floor
from agent.eval.offline import evaluate_udacity, summarize_by_track
from agent.eval.steering import CURVE_THRESHOLD, INTENT_HALF_WIDTH_S
from agent.experts.rules import RuleError
from agent.nn.policy import file_digest
from agent.train.config import ConfigError, TeacherSection, check_device, torch_device
from agent.train.lodo import ORACLE_COLUMN, driver_names
from envs.tracks import EVAL_SEED_BASE

DESCRIPTION = f"""Closed-loop returns (carracing) or offline steering error (udacity) of a policy.

CarRacing: run a policy (any core, or an expert .zip) for --episodes episodes on the tracks
from --track-seed on (tracks >= {EVAL_SEED_BASE} are never used for training) and print the mean ± std
episode return (a policy or expert with continuous actions drives CarRacing's continuous
configuration). An expert .zip can drive with the teacher's rules (--teacher.start-rule etc.).

With --env udacity: offline steering MSE and MAE of a Udacity steering policy on recordings (--data;
center camera, no augmentation, frames streamed in order with their timestamps, the window
restarting at session breaks), beside the predict-0 and predict-the-training-mean baselines, and
the keyboard-noise floor: the ratio of a smoothed oracle (the driver's own labels averaged over a
half-width of 0.5 s), about the lowest ratio a policy that sees frames can reach. Then the policy
against the driver's intent, those smoothed labels (agent.eval.steering): the ratio on them, the
Pearson r, the share of curve frames turned the right way (left / right) and the mean steering
amount on curves against the driver's, and the ratio and r on the frames driven forwards (5 mph or
more, not reversing: the brake held past a stop drives the car backwards); means per track with
--udacity.tracks; --udacity.plot draws
one recording's steering against time. With --env udacity and --udacity.floor: only the floor, for
any recordings, no policy (agent.eval.label_floor)."""

TEACHER_HELP = ("carracing, --policy an expert .zip: evaluate it with the teacher's rules, as agent collect and "
                "DAgger drive it as the teacher (all off by default, so the expert is scored as trained): the start "
                "rule (gas at a standstill, no brake below the brake floor, 10 units/s), the creep and grass rules "
                "(discrete experts). The expert itself is --policy: --teacher.expert is not used here")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class UdacityOptions:
    """Udacity (--env udacity): the recordings' loading, and the keyboard-noise floor (--udacity.floor)."""

    floor: bool = False
    """no --policy: print the keyboard-noise floor of the --data recordings (read from the CSVs, no image decoded)"""
    half_width: tuple[float, ...] = (0.5,)
    """--udacity.floor: half-widths of the smoothed oracle's window in seconds, one column each"""
    exclude_self: bool = False
    """--udacity.floor: leave each label out of its own window (leave-one-out; the default includes it)"""
    tracks: dict[str, str] = field(default_factory=dict)
    """the track of each recording (by its short name) for means per track, e.g. '*' lake driver1 jungle"""
    plot: str | None = None
    """with --policy: draw prediction, smoothed label and raw label against time for one recording (a .png)"""
    plot_recording: str | None = None
    """--udacity.plot: the recording to draw, by its short name in the table (None: the first)"""
    on_bad_row: Literal["skip", "error"] = "skip"
    """skip unusable CSV rows with a warning, or stop with an error listing them"""
    crop_cache: str = "auto"
    """where recordings are cached as 66x200 YUV crops: auto (a cache for several recordings), '' (memory) or a folder"""

    def __post_init__(self):
        bad = [w for w in self.half_width if not (math.isfinite(w) and w >= 0)]
        _need(bool(self.half_width) and not bad,
              f"--udacity.half-width takes seconds >= 0, got {bad[0] if bad else 'none'}")


@dataclass(frozen=True)
class EvaluateRun:
    """``agent evaluate``: closed-loop returns (CarRacing) or offline steering error (Udacity).

    Raises:
        ConfigError: a value out of range (when built), or from :meth:`check`, options that do not
            go together or a --json that exists; one line naming the option.
    """

    env: Literal["carracing", "udacity"] = "carracing"
    """simulator"""
    policy: str | None = None
    """policy file (.pt, or an expert .zip; a bare name is looked up in policies/); required unless --udacity.floor"""
    data: tuple[str, ...] = ()
    """udacity: the recording folder(s) (driving_log.csv + IMG/); with several, one row per recording and the means"""
    episodes: int = 50
    """carracing: episodes (one track each)"""
    track_seed: int = EVAL_SEED_BASE
    """carracing: the first track (CarRacing seed): episode i drives track track_seed+i"""
    max_steps: int | None = None
    """carracing: cap on episode length (None: the env's 1000)"""
    workers: int | None = None
    """carracing: processes, one episode at a time each (None: 2; 1 with --envs > 1); give them one core each"""
    envs: int = 1
    """carracing: envs stepped at once in subprocesses, the policy acting on their batch; use with --workers 1"""
    sample: bool = False
    """carracing: sample each action from the policy's softmax instead of the argmax (seeded by the track)"""
    slow_speed: float | None = None
    """carracing: the slow-steps threshold, units/s (None: 10, the start rule's floor; 25 sees a saw-tooth above 20)"""
    json: str | None = None
    """write the results as JSON here (carracing: per-episode returns, steps, stall figures and their aggregates)"""
    overwrite: bool = False
    """replace an existing --json file"""
    device: str = "auto"
    """torch device of the policy: auto (cuda when there is one), cpu, cuda, cuda:N"""
    threads: int = 0
    """torch threads of this process (0: torch's default); each of several --workers uses 1; beside a training run,
    --threads 1 --workers 1 keeps the evaluation to one core"""
    teacher: Annotated[TeacherSection, tyro.conf.arg(help=TEACHER_HELP)] = TeacherSection()
    udacity: UdacityOptions = UdacityOptions()

    def __post_init__(self):
        check_device(self.device)
        _need(self.threads >= 0, f"--threads must be >= 0 (0: torch's default), got {self.threads}")
        _need(self.episodes >= 1, f"--episodes must be >= 1, got {self.episodes}")
        _need(self.envs >= 1, f"--envs must be >= 1, got {self.envs}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}")
        _need(self.workers is None or self.workers >= 1, f"--workers must be >= 1, got {self.workers}")
        _need(self.slow_speed is None or (math.isfinite(self.slow_speed) and self.slow_speed > 0),
              f"--slow-speed must be a positive number of units/s, got {self.slow_speed}")

    def check(self) -> "EvaluateRun":
        """The rules between options that need no file read, and the --json the run would replace;
        returns self (the policy file's kind is checked by the run).

        Raises:
            ConfigError: --teacher.expert; options of the other simulator or mode; no --policy
                (or one with --udacity.floor); --envs > 1 with --workers > 1; a brake floor
                without the start rule; an existing --json without --overwrite.
        """
        u, default_u = self.udacity, UdacityOptions()
        _need(self.teacher.expert is None, f"--teacher.expert: agent evaluate drives --policy; evaluate the expert "
              f"with --policy {self.teacher.expert} (its rules: --teacher.start-rule etc.)")
        if self.env == "carracing":
            wrong = [f"--udacity.{f.name.replace('_', '-')}" for f in fields(u)
                     if getattr(u, f.name) != getattr(default_u, f.name) and f.name != "floor"]
            _need(not u.floor, "--udacity.floor is for --env udacity (the keyboard-noise floor of recorded steering "
                               "labels)")
            _need(not wrong, f"{', '.join(wrong)} only apply to --env udacity, and --env is carracing")
            _need(not self.data, "--data is for --env udacity; CarRacing policies are evaluated in closed loop on "
                                 "tracks")
        if u.floor:
            _need(not self.policy, "--udacity.floor scores the recordings' own labels and needs no policy: drop "
                                   "--policy (or drop --udacity.floor to score the policy; its table has the floor "
                                   "at +-0.5 s too)")
            _need(bool(self.data), "--udacity.floor needs --data: the recording folder(s) holding driving_log.csv "
                                   "and IMG/")
            _need(u.plot is None and u.plot_recording is None,
                  "--udacity.plot draws a policy's steering; --udacity.floor scores no policy: drop --udacity.plot")
        else:
            floor_only = [f"--udacity.{name.replace('_', '-')}" for name in ("half_width", "exclude_self")
                          if getattr(u, name) != getattr(default_u, name)]
            _need(not floor_only, f"{', '.join(floor_only)} only apply with --udacity.floor")
            _need(bool(self.policy), "--policy is required (or, with --env udacity --data D1 D2 ..., "
                                     "--udacity.floor for the label floor alone)")
        if self.env == "udacity":
            _need(not self.sample, "--sample is for --env carracing (closed loop); Udacity recordings are scored "
                                   "offline")
            rules = teacher_rule_options(self.teacher)
            _need(not rules, f"{', '.join(rules)}: the teacher's rules drive a CarRacing expert; --env is udacity")
        workers = self.workers if self.workers is not None else (2 if self.envs == 1 else 1)
        _need(self.envs == 1 or workers == 1,
              f"--envs {self.envs} steps its envs from one process: drop --workers {workers} (or pass 1)")
        _need(self.teacher.brake_floor is None or self.teacher.start_rule,
              "--teacher.brake-floor is the start rule's floor: add --teacher.start-rule")
        _need(self.json is None or self.overwrite or not Path(self.json).exists(),
              f"{self.json} already exists; choose another --json or pass --overwrite")
        _need(u.plot_recording is None or u.plot is not None,
              "--udacity.plot-recording names the recording --udacity.plot draws: add --udacity.plot PATH.png")
        _need(u.plot is None or self.overwrite or not Path(u.plot).exists(),
              f"{u.plot} already exists; choose another --udacity.plot or pass --overwrite")
        return self


def main(argv: list[str]) -> int:
    """Run ``agent evaluate ARGV``; the exit code."""
    run = parse_config(EvaluateRun, argv, prog="agent evaluate", description=DESCRIPTION)
    if run.threads:
        import torch

        torch.set_num_threads(run.threads)
    if run.udacity.floor:
        return _udacity_floor(run)
    path = resolve_policy_path(run.policy)
    kind, payload = file_kind(path)  # read once; the Udacity evaluation builds the policy from it
    env = _policy_env(kind, payload)
    if env is not None and env != run.env:
        hint = " --data RECORDING" if env == "udacity" else ""
        raise CLIError(f"{path} is a policy for --env {env}; evaluate it with --env {env}{hint}")
    if run.env == "udacity":
        return _evaluate_udacity(run, path, kind, payload)

    rules = teacher_rule_options(run.teacher)
    if rules:
        if kind != "sb3-ppo-expert":
            raise CLIError(f"{', '.join(rules)}: the teacher's rules are the PPO expert's; pass an expert .zip as "
                           f"--policy ({path} is not one)")
        try:  # here, not in the workers: a continuous expert refuses the creep and grass rules
            run.teacher.rules.apply(load_policy(path), strict=True)
        except RuleError as exc:
            raise CLIError(f"--teacher.{exc.rule.replace('_', '-')}: {exc}") from exc
    slow_speed = SLOW_SPEED if run.slow_speed is None else run.slow_speed
    workers = run.workers if run.workers is not None else (2 if run.envs == 1 else 1)
    res = evaluate(path, run.episodes, run.track_seed, env=run.env, max_steps=run.max_steps, workers=workers,
                   deterministic=not run.sample, rules=run.teacher.rules, envs=run.envs, slow_speed=slow_speed,
                   device=torch_device(run.device))
    print("\n".join(res.summary_lines()))
    if run.json:
        res.to_json(run.json)
        print(f"wrote {run.json}")
    return 0


def _policy_env(kind: str, payload) -> str | None:
    """The simulator a policy file (its kind and contents, :func:`agent.actors.loading.file_kind`) is for."""
    if kind == "sb3-ppo-expert":
        return "carracing"
    if kind == "nac-udacity-policy":
        return "udacity"
    return (payload.get("config") or {}).get("env") if isinstance(payload, dict) else None



def _udacity_floor(run: EvaluateRun) -> int:
    """`agent evaluate --env udacity --data D1 D2 ... --udacity.floor`: the smoothed-oracle floor table, no policy."""
    u, data = run.udacity, list(run.data)
    check_udacity_folders(data)
    tracks = driver_tracks(u.tracks, data, option="--udacity.tracks")
    half_widths = list(u.half_width)
    rows = []
    for name, d in zip(driver_names(data), data):
        rows.append({"recording": name, "track": tracks.get(name, tracks.get("*", "-")),
                     **recording_floor(d, half_widths, on_bad_row=u.on_bad_row, exclude_self=u.exclude_self)})
    print(floor_markdown(rows, half_widths))
    if run.json:
        write_json(run.json, {"half_widths_s": half_widths, "exclude_self": u.exclude_self, "recordings": rows,
                              "means": floor_means(rows, half_widths)})
        print(f"wrote {run.json}")
    return 0


def _evaluate_udacity(run: EvaluateRun, path: Path, kind: str, payload) -> int:
    """`agent evaluate --env udacity`: offline steering MSE / MAE and the scores against the driver's
    intent on recordings, printed and as JSON, and the --udacity.plot figure."""
    data, u = list(run.data), run.udacity
    if not data:
        raise CLIError("--env udacity needs --data: a recording folder holding driving_log.csv and IMG/")
    check_udacity_folders(data)
    tracks = driver_tracks(u.tracks, data, option="--udacity.tracks")
    names = driver_names(data)
    if u.plot_recording is not None and u.plot_recording not in names:
        raise CLIError(f"--udacity.plot-recording {u.plot_recording}: not one of the recordings "
                       f"({', '.join(names)})")
    if kind not in LOADERS:
        raise CLIError(f"{path} holds a policy of kind {kind!r}, which this version cannot load")
    policy = LOADERS[kind](path, payload, torch_device(run.device))
    if getattr(policy, "output_kind", None) != "steering" or getattr(policy.config, "env", None) != "udacity":
        raise CLIError(f"{path} is not a Udacity steering policy (make one with `agent train --env udacity`)")
    ident = identity(path)  # the digests of exactly the file scored, as the CarRacing JSON records them
    head = {"policy": str(path), "policy_sha256": file_digest(path), "file_sha256": ident["file_sha256"],
            "weights_sha256": ident["weights_sha256"], "env": "udacity", "core": policy.config.core}
    plot_name = u.plot_recording if u.plot_recording is not None else names[0]
    load = udacity_loader(u.crop_cache, u.on_bad_row, len(data))
    rows, series = [], None
    for name, d in zip(names, data):
        keep = u.plot is not None and name == plot_name
        res = evaluate_udacity(policy, load(d), progress=len(data) == 1, series=keep)
        series = res.pop("series", series)
        rows.append({"recording": name, "track": tracks.get(name, tracks.get("*", "-")), **res})
    if len(data) > 1:
        _print_many(rows, summarize_by_track(rows), bool(tracks))
    else:
        _print_one(path, data[0], rows[0])
    if u.plot is not None:
        from agent.eval.steering_plot import plot_steering

        r = next(r for r in rows if r["recording"] == plot_name)
        title = (f"{path.name} on {plot_name}: smoothed ratio {_fmt(r['smoothed_ratio'], '.2f')}, "
                 f"r {_fmt(r['smoothed_corr'], '.2f')}, right way {_fmt(r['right_way'], '.2f')}")
        plot_steering(u.plot, series["t"], series["pred"], series["label"], series["smoothed"],
                      segments=series["segments"], title=title, half_width_s=r["intent_half_width_s"],
                      threshold=r["curve_threshold"])
        print(f"wrote {u.plot}")
    if run.json:
        if len(data) > 1:
            groups = summarize_by_track(rows)
            write_json(run.json, {**head, "recordings": rows, "summary": groups["all"], "tracks": groups})
        else:
            write_json(run.json, {**head, **{k: v for k, v in rows[0].items() if k != "recording"}})
        print(f"wrote {run.json}")
    return 0


def _fmt(x, f=".4f") -> str:
    return "-" if x is None else format(x, f)


INTENT_NOTE = (f"Against the driver's intent: the labels averaged over ±{INTENT_HALF_WIDTH_S:g} s of capture time "
               f"(label included, one session segment); curve frames have |smoothed| > {CURVE_THRESHOLD:g} "
               "(left is negative steering).")


def _print_one(path: Path, data: str, res: dict) -> None:
    """The lines of a single recording's scores."""
    print(f"{path.name} on {data}: steering MSE {res['mse']:.4f}, MAE {res['mae']:.4f} over "
          f"{res['n_frames']} frames ({res['rmse_degrees']:.1f} degrees RMS); predict-0 baseline MSE "
          f"{res['zero_mse']:.4f}" + (f" (ratio {res['ratio']:.2f})" if res["ratio"] is not None else "")
          + (f", predict-train-mean MSE {res['train_mean_mse']:.4f}" if "train_mean_mse" in res else ""))
    if res.get("oracle_ratio") is not None:
        print(f"  keyboard-noise floor: smoothed-oracle ratio (±{res['oracle_half_width_s']:g} s) "
              f"{res['oracle_ratio']:.2f} (the driver's own labels averaged over ±{res['oracle_half_width_s']:g} s "
              f"score MSE {res['oracle_mse']:.4f})")
    if res["n_moving"]:
        rev = res.get("n_reversing") or 0
        print(f"  while driving forwards (>= {res['min_speed_mph']:g} mph, {res['n_moving']} frames"
              + (f"; {rev} reversing frames left out" if rev else "") + "): "
              f"MSE {res['moving_mse']:.4f}, "
              f"MAE {res['moving_mae']:.4f}; predict-0 MSE {res['moving_zero_mse']:.4f}; against the driver's intent "
              f"smoothed ratio {_fmt(res.get('moving_smoothed_ratio'), '.2f')}, Pearson r "
              f"{_fmt(res.get('moving_smoothed_corr'), '.2f')}")
    print(f"  against the driver's intent (labels averaged over ±{res['intent_half_width_s']:g} s): MSE "
          f"{res['smoothed_mse']:.4f}, smoothed ratio {_fmt(res['smoothed_ratio'], '.2f')} (predict-0 MSE "
          f"{res['smoothed_zero_mse']:.4f}), Pearson r {_fmt(res['smoothed_corr'], '.2f')}")
    print(f"  curve frames (|smoothed| > {res['curve_threshold']:g}: {res['n_curve']}, {res['n_left']} left, "
          f"{res['n_right']} right): turned the right way {_fmt(res['right_way'], '.2f')} (left "
          f"{_fmt(res['right_way_left'], '.2f')}, right {_fmt(res['right_way_right'], '.2f')}); mean |steering| "
          f"{_fmt(res['curve_mean_abs_pred'], '.3f')} against the driver's {_fmt(res['curve_mean_abs_label'], '.3f')}")
    if res.get("straight_error_share") is not None:
        print(f"  where the error lies: {_fmt(res['straight_error_share'], '.0%')} of it on straight frames "
              f"(|smoothed| <= {res['curve_threshold']:g}, mean |steering| there "
              f"{_fmt(res['straight_mean_abs_pred'], '.3f')}); in curves the steering exceeds the driver's by "
              f"{_fmt(res['curve_signed_excess'], '+.3f')} on average (- = less, or the wrong way)")
    if res.get("best_lag_s") is not None:
        print(f"  timing: shifted {res['best_lag_s']:+.2f} s (+ = the policy late) the predictions correlate best, "
              f"r {_fmt(res['corr_at_best_lag'], '.2f')}, smoothed ratio {_fmt(res['smoothed_ratio_at_best_lag'], '.2f')}")


def _print_many(rows: list[dict], groups: dict, by_track: bool) -> None:
    """Two markdown tables (raw labels with the floor; against the driver's intent), one row per
    recording, then the means (per track, with a track column, when tracks were given; then all)."""
    means = [(name, g) for name, g in groups.items() if by_track or name == "all"]

    def label(name: str, g: dict) -> str:
        return ("**mean**" if name == "all" else f"**mean, {name}**") + f" ({g['n_recordings']} recordings)"

    def track(name: str) -> str:
        return f" {'' if name == 'all' else name} |" if by_track else ""

    t_head = " track |" if by_track else ""
    head = f"| recording |{t_head} frames | MSE | MAE | predict-0 MSE | ratio | {ORACLE_COLUMN} |"
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for r in rows:
        print(f"| {r['recording']} |{track(r['track'])} {r['n_frames']} | {r['mse']:.4f} | {r['mae']:.4f} | "
              f"{r['zero_mse']:.4f} | {_fmt(r['ratio'], '.2f')} | {_fmt(r.get('oracle_ratio'), '.2f')} |")
    for name, g in means:
        print(f"| {label(name, g)} |{track(name)} {g['n_frames']} | {g['mse']:.4f} | "
              f"{g['mae']:.4f} | {g['zero_mse']:.4f} | {_fmt(g['ratio_of_means'], '.2f')} (mean of ratios "
              f"{_fmt(g['mean_ratio'], '.2f')}) | {_fmt(g['oracle_ratio_of_means'], '.2f')} (mean of ratios "
              f"{_fmt(g['oracle_mean_ratio'], '.2f')}) |")
    print(f"\n{INTENT_NOTE}\n")
    head = (f"| recording |{t_head} curve frames | smoothed ratio | Pearson r | right way (left / right) | "
            "mean abs steering on curves, policy / driver | driving forwards: smoothed ratio, r |")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|")
    for r in rows:
        print(f"| {r['recording']} |{track(r['track'])} {r['n_curve']} | {_fmt(r['smoothed_ratio'], '.2f')} | "
              f"{_fmt(r['smoothed_corr'], '.2f')} | {_fmt(r['right_way'], '.2f')} "
              f"({_fmt(r['right_way_left'], '.2f')} / {_fmt(r['right_way_right'], '.2f')}) | "
              f"{_fmt(r['curve_mean_abs_pred'], '.3f')} / {_fmt(r['curve_mean_abs_label'], '.3f')} | "
              f"{_fmt(r.get('moving_smoothed_ratio'), '.2f')}, {_fmt(r.get('moving_smoothed_corr'), '.2f')} |")
    for name, g in means:
        print(f"| {label(name, g)} |{track(name)} {g['n_curve']} | "
              f"{_fmt(g['smoothed_ratio_of_means'], '.2f')} (mean of ratios {_fmt(g['smoothed_mean_ratio'], '.2f')}) "
              f"| {_fmt(g['smoothed_corr'], '.2f')} | {_fmt(g['right_way'], '.2f')} "
              f"({_fmt(g['right_way_left'], '.2f')} / {_fmt(g['right_way_right'], '.2f')}) | "
              f"{_fmt(g['curve_mean_abs_pred'], '.3f')} / {_fmt(g['curve_mean_abs_label'], '.3f')} | "
              f"{_fmt(g.get('moving_smoothed_ratio_of_means'), '.2f')}, {_fmt(g.get('moving_smoothed_corr'), '.2f')} |")
    print("\nDriving forwards: the frames at or above the minimum speed where the car is not reversing "
          "(agent.data.udacity.reversing_frames); the mean row's ratio is the ratio of means.")


__all__ = ["DESCRIPTION", "EvaluateRun", "UdacityOptions", "main"]
