"""`agent bench nac|drive|bridge|rollouts`: benchmarks that print figures."""

from __future__ import annotations

from agent.bench import nac as bench
from agent.bench.bridge import bench_bridge, bench_bridge_policy, print_bridge_table
from agent.bench.drive import DisplayUnavailable, bench_drive, print_drive_table
from agent.bench.rollouts import bench_rollouts, print_rollouts_table
from agent.cli.common import argparse_main, FMT, CLIError, write_json
from envs.tracks import EVAL_SEED_BASE


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print figures")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    n = bsub.add_parser("nac", help="NAC layer: time and memory against torch MHA, LSTM and torch-nac",
                        formatter_class=FMT,
                        description="Our NAC layer side by side with torch.nn.MultiheadAttention (causal, same width "
                                    "and heads), torch.nn.LSTM and torch-nac 0.0.2 (the authors' PyTorch port, "
                                    "installed on demand into a private folder): forward time and peak memory (B=1, "
                                    "input and d_model 64, 4 heads, top-k 8, exact mode), forward+backward (B=8), "
                                    "streaming step p50/p99, with ratios and issue 12's layer targets.")
    n.add_argument("--sizes", type=int, nargs="+", default=[16, 256, 1024], help="T for both layers")
    n.add_argument("--block-sizes", type=int, nargs="+", default=[4096, 16384], help="extra T for our blocks selector")
    n.add_argument("--repeats", type=int, default=3, help="timed forwards per size (median)")
    n.add_argument("--no-peer", action="store_true", help="skip torch-nac")
    n.add_argument("--no-baselines", action="store_true", help="skip torch's MultiheadAttention and LSTM")
    n.add_argument("--train-T", type=int, default=256, help="T of the forward+backward rows (B=8); 0 skips them")
    n.add_argument("--step-window", type=int, default=16, help="cached frames of the streaming-step rows; 0 skips")
    n.add_argument("--threads", type=int, default=1, help="torch CPU threads per measurement (0: torch's default)")
    n.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall time, or the measuring thread's CPU time (with --threads 1; steadier on a busy CPU)")
    n.add_argument("--json", default=None, help="also write the rows as JSON here")
    d = bsub.add_parser("drive", help="runner FPS and step latency with and without the overlays",
                        formatter_class=FMT,
                        description="Runner speed in four configurations (policy only, + NAC traces, "
                                    "+ Grad-CAM, all on), every frame composed as the window shows it: FPS, "
                                    "p50/p99 of the loop step and of the observation-to-action latency, and CPU ms "
                                    "per step. Headless by default; --window shows every frame in a real window "
                                    "(DISPLAY, or a private Xvfb started for the run when DISPLAY is unset: "
                                    "apt-get install -y xvfb). The target is CarRacing's own 50 FPS with "
                                    "everything on.")
    d.add_argument("--policy", default="nac.pt", help="policy file (a bare name is looked up in policies/)")
    d.add_argument("--steps", type=int, default=600, help="timed steps per configuration and round")
    d.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of all configurations (pooled)")
    d.add_argument("--window", action="store_true",
                   help="show every frame in a real pygame window (the path `drive` takes with a display)")
    d.add_argument("--record", action="store_true",
                   help="add a configuration: all on while writing the mp4 (drive --record), with ffmpeg's CPU")
    d.add_argument("--fps-limit", type=float, default=0.0,
                   help="the window's frame-rate cap, FPS; 0 = none, to see what the loop can do (default: 0)")
    d.add_argument("--json", default=None, help="also write the rows as JSON here")
    b = bsub.add_parser("bridge", help="Udacity bridge round trip (telemetry in -> steer out), with and without "
                                       "the policy and overlays", formatter_class=FMT,
                        description="A wire-level fake simulator sends telemetry over loopback and times the steer "
                                    "reply: the bridge alone, with the Udacity policy's step, and with the policy "
                                    "plus Grad-CAM, NAC traces and the composed view. p50/p90/p99/max in ms.")
    b.add_argument("--policy", default="udacity-nac.pt", help="Udacity policy ('' to time the bridge only)")
    b.add_argument("--n", type=int, default=1000, help="timed round trips per row")
    b.add_argument("--warmup", type=int, default=50, help="untimed round trips first")
    r = bsub.add_parser("rollouts", help="env steps/s with N envs at once (--envs), expert and student",
                        formatter_class=FMT,
                        description="The same episodes with 1, 2, 4, ... CarRacing envs stepped at once: N = 1 "
                                    "through the one-env path, N > 1 through AsyncVectorEnv subprocesses with the "
                                    "policy acting on the batch (agent collect/evaluate/train --envs N). The expert "
                                    "runs without pixels (its privileged state comes through info), the student "
                                    "on rendered frames. Prints env steps/s, the ratio against N = 1 and whether "
                                    "the returns equal N = 1's, with the load average (figures, not a test).")
    r.add_argument("--policies", nargs="+", default=["carracing-expert.zip", "nac.pt"],
                   help="policy files (a bare name is looked up in policies/)")
    r.add_argument("--envs", type=int, nargs="+", default=[1, 2, 4], help="the N to time (ratios against the first)")
    r.add_argument("--episodes", type=int, default=4, help="tracks per configuration")
    r.add_argument("--max-steps", type=int, default=250, help="steps per episode")
    r.add_argument("--seed", type=int, default=EVAL_SEED_BASE, help="first track")
    r.add_argument("--json", default=None, help="also write the rows as JSON here")


def run(args) -> int:
    if args.bench_command == "bridge":
        if args.n < 10 or args.warmup < 0:
            raise CLIError("--n must be >= 10 and --warmup >= 0")
        rows = bench_bridge_policy(args.policy, args.n, args.warmup) if args.policy else \
            [bench_bridge(args.n, None, args.warmup)]
        print_bridge_table(rows)
        return 0
    if args.bench_command == "drive":
        if args.steps < 10 or args.rounds < 1 or args.fps_limit < 0:
            raise CLIError("--steps must be >= 10, --rounds >= 1 and --fps-limit >= 0")
        try:
            rows = bench_drive(args.policy, args.steps, rounds=args.rounds, window=args.window, record=args.record,
                               fps_limit=args.fps_limit)
        except DisplayUnavailable as exc:
            raise CLIError(f"--window: {exc}") from exc
        print_drive_table(rows)
        if args.json:
            write_json(args.json, rows)
        return 0
    if args.bench_command == "rollouts":
        if args.episodes < 1 or args.max_steps < 1 or min(args.envs) < 1:
            raise CLIError("--episodes, --max-steps and every --envs must be >= 1")
        rows = bench_rollouts(args.policies, args.envs, args.episodes, args.max_steps, args.seed)
        print_rollouts_table(rows)
        if args.json:
            write_json(args.json, rows)
        return 0

    if args.clock == "cpu" and args.threads != 1:
        raise CLIError("--clock cpu measures one thread's CPU time: add --threads 1")
    rows = bench.bench_nac(sizes=tuple(args.sizes), block_sizes=tuple(args.block_sizes), repeats=args.repeats,
                           peer=not args.no_peer, threads=args.threads, clock=args.clock,
                           baselines=() if args.no_baselines else ("mha", "lstm"),
                           train_T=args.train_T or None, step_window=args.step_window or None)
    bench.print_table(rows)
    if args.json:
        write_json(args.json, rows)
    return 0


main = argparse_main("bench", add_parser, run)
