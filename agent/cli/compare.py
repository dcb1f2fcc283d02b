"""`agent compare`: every temporal core trained and driven alike, and its report."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.cli.common import argparse_main, FMT, START_RULE_HELP, CLIError
from agent.compare.cells import DEFAULT_CORES, Protocol, parse_variants, run_comparison
from agent.compare.report import write_report
from envs.tracks import EVAL_SEED_BASE


def add_parser(sub) -> None:
    d = Protocol(data=["-"])
    p = sub.add_parser("compare", help="closed-loop comparison of temporal cores (NAC, LSTM, GRU, CfC, ...)",
                       formatter_class=FMT,
                       description="Train every core alike and drive it on the same unseen tracks: the same CNN, "
                                   "the same expert recordings, the same behaviour cloning and DAgger protocol (each "
                                   "core on its own rollouts), the same window T. Each (core, seed) cell writes its "
                                   "own folder OUT/<core>__s<seed>/ (policy, cell.json), so a comparison resumes "
                                   "after an interruption, can be spread over sessions or machines, and runs cells "
                                   "in parallel (--jobs). Non-NAC cores get the width whose parameter count is "
                                   "closest to NAC-Steady's. `agent compare --report OUT` builds the table "
                                   "(report.md, report.json) and the figure (compare.png) from the cells that exist "
                                   "and names the missing ones; a run writes them at its end too.")
    p.add_argument("--env", default="carracing", choices=["carracing"], help="simulator (closed loop: CarRacing)")
    p.add_argument("--cores", default=",".join(DEFAULT_CORES),
                   help="comma-separated variants: a core, optionally with options core@key=value@...; keys T "
                        "(window), width (the core's d), sparsity, topk, wiring (ncp or fc: the paper's NAC-FC), "
                        "e.g. nac-steady,lstm,nac-exact@wiring=fc,nac-steady@sparsity=0.9,nac-steady@T=16@topk=2")
    p.add_argument("--windows", default=None,
                   help="comma-separated window sizes T: each core without its own @T= runs once per T (a sweep)")
    p.add_argument("--seeds", default="0,1", help="comma-separated training seeds")
    p.add_argument("--out", default="results/compare-carracing", help="the comparison folder")
    p.add_argument("--report", default=None, metavar="OUT",
                   help="only build the report of this comparison folder from its finished cells")
    p.add_argument("--data", nargs="+", default=["recordings/nac-drive/rule-0-19-v0",
                                                 "recordings/nac-drive/rule-20-39-v0"],
                   help="the expert recordings every cell learns from")
    p.add_argument("--expert", default=d.expert, help="the PPO expert that labels DAgger rollouts")
    p.add_argument("--start-rule", action=argparse.BooleanOptionalAction, default=d.start_rule,
                   help="DAgger: " + START_RULE_HELP)
    p.add_argument("--window", type=int, default=d.window, help="frames per window T (a variant's @T= overrides)")
    p.add_argument("--epochs", type=int, default=d.epochs, help="behaviour-cloning epochs")
    p.add_argument("--dagger-rounds", type=int, default=d.dagger_rounds, help="DAgger rounds (0: BC alone)")
    p.add_argument("--dagger-episodes", type=int, default=d.dagger_episodes, help="student episodes per round")
    p.add_argument("--dagger-epochs", type=int, default=d.dagger_epochs, help="epochs on the aggregate per round")
    p.add_argument("--dagger-beta", type=float, default=d.dagger_beta, help="expert share in round 1's rollouts")
    p.add_argument("--dagger-beta-decay", type=float, default=d.dagger_beta_decay, help="beta decay per round")
    p.add_argument("--dagger-disturb", type=float, default=d.dagger_disturb, help="disturbances per 1000 steps")
    p.add_argument("--dagger-seed", type=int, default=d.dagger_seed, help="first DAgger track")
    p.add_argument("--dagger-max-steps", type=int, default=None, help="cap on DAgger episode length")
    p.add_argument("--episodes", type=int, default=d.episodes, help="closed-loop tracks per cell")
    p.add_argument("--eval-seed", type=int, default=d.eval_seed, help="first closed-loop track (the same for every cell)")
    p.add_argument("--max-steps", type=int, default=None, help="cap on closed-loop episode length (default 1000)")
    p.add_argument("--no-eval-bc", action="store_true",
                   help="do not drive the BC policy too (it gives the offline-only view: accuracy against return)")
    p.add_argument("--latency-steps", type=int, default=d.latency_steps, help="streaming steps timed for the latency")
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel processes")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per cell (default: 1 with --jobs > 1, else torch's default)")


def _int_list(text: str, what: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CLIError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not out:
        raise CLIError(f"{what} is empty")
    return out


def run(args) -> int:
    if args.report:
        rep = write_report(args.report)
        print(rep["markdown"])
        print("wrote " + ", ".join(map(str, rep["paths"])))
        return 0
    for d in args.data:
        if not Path(d).exists():
            raise CLIError(f"recording {d} not found; record the demonstrations first, e.g. agent collect --env "
                           f"carracing --expert carracing-expert.zip --episodes 20 --seed 0 --out {d}")
    if args.eval_seed < EVAL_SEED_BASE:
        raise CLIError(f"--eval-seed {args.eval_seed} is a training track; closed-loop tracks start at {EVAL_SEED_BASE}")
    if args.jobs < 1 or (args.threads is not None and args.threads < 0):
        raise CLIError("--jobs must be >= 1 and --threads >= 0")
    threads = args.threads if args.threads is not None else (1 if args.jobs > 1 else 0)
    windows = _int_list(args.windows, "--windows") if args.windows else None
    variants = parse_variants(args.cores, windows)
    seeds = _int_list(args.seeds, "--seeds")
    protocol = Protocol(data=args.data, expert=args.expert, window=args.window, epochs=args.epochs,
                        dagger_rounds=args.dagger_rounds, dagger_episodes=args.dagger_episodes,
                        dagger_epochs=args.dagger_epochs, dagger_beta=args.dagger_beta,
                        dagger_beta_decay=args.dagger_beta_decay, dagger_disturb=args.dagger_disturb,
                        dagger_seed=args.dagger_seed, dagger_max_steps=args.dagger_max_steps,
                        start_rule=args.start_rule, episodes=args.episodes, eval_seed=args.eval_seed,
                        max_steps=args.max_steps, eval_bc=not args.no_eval_bc, latency_steps=args.latency_steps)
    results = run_comparison(variants, seeds, protocol, args.out, jobs=args.jobs, threads=threads)
    for r in results:
        if r.status == "failed":
            print(f"cell {r.name}: FAILED: {r.error}")
        else:
            c = r.cell["closed_loop"]
            print(f"cell {r.name} ({r.status}): return {c['mean']:.1f} ± {c['std']:.1f}, held-out accuracy "
                  f"{r.cell['heldout_accuracy']:.3f}")
    rep = write_report(args.out)
    print(rep["markdown"])
    print("wrote " + ", ".join(map(str, rep["paths"])))
    return 1 if any(r.status == "failed" for r in results) else 0


main = argparse_main("compare", add_parser, run)
