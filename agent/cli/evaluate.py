"""`agent evaluate`: closed-loop returns (CarRacing), offline steering error and the keyboard-noise floor (Udacity)."""

from __future__ import annotations

from agent.actors.loading import LOADERS, file_kind, resolve_policy_path
from agent.actors.rollout import SLOW_SPEED
from agent.cli.common import (argparse_main, CROP_CACHE_HELP, ENVS_HELP, FMT, CLIError, check_udacity_folders, parse_tracks,
                              udacity_loader, write_json)
from agent.eval.closed_loop import evaluate
from agent.eval.label_floor import floor_markdown, floor_means, recording_floor
from agent.eval.offline import evaluate_udacity, summarize_recordings
from agent.nn.policy import file_digest
from agent.train.lodo import ORACLE_COLUMN, driver_names
from envs.tracks import EVAL_SEED_BASE


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="closed-loop returns (carracing) or offline steering error (udacity)",
                       formatter_class=FMT,
                       description="Run a policy (any core, or the expert .zip) for --episodes episodes on tracks "
                                   f"--seed, --seed+1, ... (tracks >= {EVAL_SEED_BASE} are never used for "
                                   "training) and print the mean ± std episode return (a policy or expert with "
                                   "continuous actions drives CarRacing's continuous configuration). "
                                   "With --env udacity: "
                                   "offline steering MSE and MAE of a Udacity steering policy on a recording "
                                   "(--data; center camera, no augmentation, frames streamed in order with their "
                                   "timestamps, the window restarting at session breaks), beside the predict-0 "
                                   "and predict-the-training-mean baselines, and the keyboard-noise floor: the "
                                   "ratio of a smoothed oracle (the driver's own labels averaged over +-0.5 s), "
                                   "about the lowest ratio a policy that sees frames can reach. "
                                   "With --env udacity --floor: only that floor, for any recordings, no policy "
                                   "(agent.eval.label_floor).")
    p.add_argument("--env", default="carracing", choices=["carracing", "udacity"], help="simulator")
    p.add_argument("--policy", default=None,
                   help="policy file (a bare name is looked up in policies/); required unless --floor")
    p.add_argument("--data", default=None, nargs="+",
                   help="udacity: the recording folder(s) (driving_log.csv + IMG/) to score the policy on; with "
                        "several, one row per recording (MSE, MAE, predict-0 MSE, ratio, smoothed-oracle ratio) "
                        "and their means")
    p.add_argument("--floor", action="store_true",
                   help="udacity, no --policy: print the keyboard-noise floor of the --data recordings (read from "
                        "the CSVs, no image decoded): per recording, frames, session segments, share of labels "
                        "exactly 0, predict-0 MSE and the smoothed-oracle ratio (oracle MSE / predict-0 MSE) per "
                        "--half-width, where the oracle predicts each label by the mean of the driver's own labels "
                        "within +-h seconds in the same segment; then the means per --track")
    p.add_argument("--half-width", type=float, nargs="+", default=[0.5], metavar="S",
                   help="--floor: half-widths of the oracle's window in seconds, one column each")
    p.add_argument("--exclude-self", action="store_true",
                   help="--floor: leave each label out of its own window (leave-one-out); the default includes it, "
                        "which lowers the oracle's error; the two give a range for the floor")
    p.add_argument("--track", action="append", default=[], metavar="DRIVER=TRACK",
                   help="--floor: the track of a recording (named as in the tables; '*=lake' for all not named), "
                        "for means per track")
    p.add_argument("--on-bad-row", default="skip", choices=["skip", "error"],
                   help="udacity: skip unusable CSV rows with a warning, or stop with an error listing them")
    p.add_argument("--crop-cache", default="auto", help="udacity: " + CROP_CACHE_HELP)
    p.add_argument("--episodes", type=int, default=50, help="carracing: episodes (one track each)")
    p.add_argument("--seed", type=int, default=EVAL_SEED_BASE, help="carracing: track seed of the first episode")
    p.add_argument("--max-steps", type=int, default=None, help="carracing: cap on episode length (default: 1000)")
    p.add_argument("--workers", type=int, default=None,
                   help="carracing: parallel processes, one episode at a time each (default 2; 1 with --envs > 1). "
                        "Give them one core each: on a 2-core machine, two evaluations at once with --workers 1 "
                        "each ran several times slower than the two one after the other with --workers 2")
    p.add_argument("--envs", type=int, default=1, help="carracing: " + ENVS_HELP + "; use with --workers 1")
    p.add_argument("--sample", action="store_true",
                   help="carracing: sample each action from the policy's softmax instead of taking the most "
                        "probable one (seeded by the track, so runs repeat); a stalled car's identical frames "
                        "then no longer fix its decision")
    p.add_argument("--start-rule", action="store_true",
                   help="carracing, an expert .zip: evaluate it with the start rule that agent collect and DAgger "
                        "use as the teacher (gas at a standstill, no brake below 10 units/s); off by default, so the "
                        "expert is scored as trained")
    p.add_argument("--slow-speed", type=float, default=None, metavar="UNITS_PER_S",
                   help="carracing: the slow-steps figure counts the steps below this speed after the car first "
                        "reached it (default 10, the start rule's floor; 25 also counts a brake/gas saw-tooth above "
                        "a brake floor of 20: README, 'The brake floor')")
    p.add_argument("--json", default=None,
                   help="write the results as JSON here (carracing: per-episode returns, steps, "
                        "longest_standstill_steps and off_road_steps, and their aggregates)")


def _policy_env(kind: str, payload) -> str | None:
    """The simulator a policy file (its kind and contents, :func:`agent.actors.loading.file_kind`) is for."""
    if kind == "sb3-ppo-expert":
        return "carracing"
    if kind == "nac-udacity-policy":
        return "udacity"
    return (payload.get("config") or {}).get("env") if isinstance(payload, dict) else None


def run(args) -> int:
    if args.floor:
        return _udacity_floor(args)
    if args.track or args.half_width != [0.5] or args.exclude_self:
        raise CLIError("--track, --half-width and --exclude-self are for --floor")
    if not args.policy:
        raise CLIError("--policy is required (or, with --env udacity --data D1 D2 ..., --floor for the label "
                       "floor alone)")
    path = resolve_policy_path(args.policy)
    kind, payload = file_kind(path)  # read once; the Udacity evaluation builds the policy from it
    env = _policy_env(kind, payload)
    if env is not None and env != args.env:
        hint = " --data RECORDING" if env == "udacity" else ""
        raise CLIError(f"{path} is a policy for --env {env}; evaluate it with --env {env}{hint}")
    if args.env == "udacity":
        if args.sample:
            raise CLIError("--sample is for --env carracing (closed loop); Udacity recordings are scored offline")
        return _evaluate_udacity(args, path, kind, payload)
    if args.data:
        raise CLIError("--data is for --env udacity; CarRacing policies are evaluated in closed loop on tracks")

    if args.start_rule and kind != "sb3-ppo-expert":
        raise CLIError("--start-rule is the PPO expert's start rule; pass an expert .zip as --policy")
    if args.envs < 1:
        raise CLIError(f"--envs must be >= 1, got {args.envs}")
    slow_speed = SLOW_SPEED if args.slow_speed is None else args.slow_speed  # evaluate() checks it
    workers = args.workers if args.workers is not None else (2 if args.envs == 1 else 1)
    if args.envs > 1 and workers > 1:
        raise CLIError(f"--envs {args.envs} steps its envs from one process: drop --workers {workers} (or pass 1)")
    res = evaluate(path, args.episodes, args.seed, env=args.env, max_steps=args.max_steps, workers=workers,
                   deterministic=not args.sample, start_rule=args.start_rule, envs=args.envs, slow_speed=slow_speed)
    print("\n".join(res.summary_lines()))
    if args.json:
        res.to_json(args.json)
        print(f"wrote {args.json}")
    return 0


def _udacity_floor(args) -> int:
    """`agent evaluate --env udacity --data D1 D2 ... --floor`: the smoothed-oracle floor table, no policy."""
    if args.env != "udacity":
        raise CLIError("--floor is for --env udacity (the keyboard-noise floor of recorded steering labels)")
    if args.policy:
        raise CLIError("--floor scores the recordings' own labels and needs no policy: drop --policy (or drop "
                       "--floor to score the policy; its table has the floor at +-0.5 s too)")
    if not args.data:
        raise CLIError("--floor needs --data: the recording folder(s) holding driving_log.csv and IMG/")
    bad = [w for w in args.half_width if not (w >= 0 and w != float("inf"))]
    if bad:
        raise CLIError(f"--half-width takes seconds >= 0, got {bad[0]}")
    check_udacity_folders(args.data)
    tracks = parse_tracks(args.track, args.data)
    rows = []
    for name, d in zip(driver_names(args.data), args.data):
        rows.append({"recording": name, "track": tracks.get(name, tracks.get("*", "-")),
                     **recording_floor(d, args.half_width, on_bad_row=args.on_bad_row,
                                         exclude_self=args.exclude_self)})
    print(floor_markdown(rows, args.half_width))
    if args.json:
        write_json(args.json, {"half_widths_s": args.half_width, "exclude_self": args.exclude_self, "recordings": rows,
                                "means": floor_means(rows, args.half_width)})
        print(f"wrote {args.json}")
    return 0


def _evaluate_udacity(args, path, kind, payload) -> int:
    """`agent evaluate --env udacity`: offline steering MSE / MAE on a recording, printed and as JSON."""
    if not args.data:
        raise CLIError("--env udacity needs --data: a recording folder holding driving_log.csv and IMG/")
    check_udacity_folders(args.data)
    if kind not in LOADERS:
        raise CLIError(f"{path} holds a policy of kind {kind!r}, which this version cannot load")
    policy = LOADERS[kind](path, payload, "cpu")
    if getattr(policy, "output_kind", None) != "steering" or getattr(policy.config, "env", None) != "udacity":
        raise CLIError(f"{path} is not a Udacity steering policy (make one with `agent train --env udacity`)")
    head = {"policy": str(path), "policy_sha256": file_digest(path), "env": "udacity", "core": policy.config.core}
    if len(args.data) > 1:
        return _evaluate_udacity_many(args, policy, head)
    res = {**head, **evaluate_udacity(policy, udacity_loader(args, 1)(args.data[0]))}
    print(f"{path.name} on {args.data[0]}: steering MSE {res['mse']:.4f}, MAE {res['mae']:.4f} over "
          f"{res['n_frames']} frames ({res['rmse_degrees']:.1f} degrees RMS); predict-0 baseline MSE "
          f"{res['zero_mse']:.4f}" + (f" (ratio {res['ratio']:.2f})" if res["ratio"] is not None else "") + (f", predict-train-mean MSE {res['train_mean_mse']:.4f}"
                                      if "train_mean_mse" in res else ""))
    if res.get("oracle_ratio") is not None:
        print(f"  keyboard-noise floor: smoothed-oracle ratio (±{res['oracle_half_width_s']:g} s) "
              f"{res['oracle_ratio']:.2f} (the driver's own labels averaged over ±{res['oracle_half_width_s']:g} s "
              f"score MSE {res['oracle_mse']:.4f})")
    if res["n_moving"]:
        print(f"  while moving (>= {res['min_speed_mph']:g} mph, {res['n_moving']} frames): MSE {res['moving_mse']:.4f}, "
              f"MAE {res['moving_mae']:.4f}; predict-0 MSE {res['moving_zero_mse']:.4f}")
    if args.json:
        write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _evaluate_udacity_many(args, policy, head: dict) -> int:
    """`agent evaluate --env udacity --data D1 D2 ...`: one row per recording and the means, printed and as JSON."""
    load = udacity_loader(args, len(args.data))
    rows = []
    for name, d in zip(driver_names(args.data), args.data):
        rows.append({"recording": name, **evaluate_udacity(policy, load(d), progress=False)})
    summary = summarize_recordings(rows)
    fmt = lambda x, f=".4f": "-" if x is None else format(x, f)  # noqa: E731
    print(f"| recording | frames | MSE | MAE | predict-0 MSE | ratio | {ORACLE_COLUMN} |\n" + "|---" * 7 + "|")
    for r in rows:
        print(f"| {r['recording']} | {r['n_frames']} | {r['mse']:.4f} | {r['mae']:.4f} | {r['zero_mse']:.4f} | "
              f"{fmt(r['ratio'], '.2f')} | {fmt(r.get('oracle_ratio'), '.2f')} |")
    print(f"| **mean** ({summary['n_recordings']} recordings) | {summary['n_frames']} | {summary['mse']:.4f} | "
          f"{summary['mae']:.4f} | {summary['zero_mse']:.4f} | {fmt(summary['ratio_of_means'], '.2f')} (mean of "
          f"ratios {fmt(summary['mean_ratio'], '.2f')}) | {fmt(summary['oracle_ratio_of_means'], '.2f')} (mean of "
          f"ratios {fmt(summary['oracle_mean_ratio'], '.2f')}) |")
    if args.json:
        write_json(args.json, {**head, "recordings": rows, "summary": summary})
        print(f"wrote {args.json}")
    return 0


main = argparse_main("evaluate", add_parser, run)
