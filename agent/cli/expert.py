"""`agent expert train` (the PPO expert) and `agent expert check-recovery`."""

from __future__ import annotations

import argparse

from agent.actors.loading import load_policy, make_actor, make_carracing_for, resolve_policy_path
from agent.cli.common import argparse_main, FMT, RULE_OPTIONS, START_RULE_HELP, CLIError, write_json
from agent.eval.recovery import recovery_check, summarize
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import RuleError, TeacherRules
from agent.train.ppo import ExpertConfig, train_expert
from envs.carracing import make_carracing


def add_parser(sub) -> None:
    p = sub.add_parser("expert", help="train the PPO expert (privileged state)",
                       description="The PPO expert that records demonstrations: stable-baselines3 PPO on "
                                   "CarRacing's privileged-state view (speed, yaw rate, wheels, next waypoints), "
                                   "with the pixel rendering skipped while training.")
    esub = p.add_subparsers(dest="expert_command", required=True)
    t = esub.add_parser("train", help="train the expert with PPO", formatter_class=FMT,
                        description="Train a PPO expert on privileged CarRacing state. The checkpoint with the "
                                    "best mean return on held-out tracks is written to --out; TensorBoard logs go "
                                    "to --tensorboard. About 30 minutes on a 2-core CPU for 3M steps.")
    t.add_argument("--env", default="carracing", choices=["carracing"], help="simulator")
    t.add_argument("--timesteps", type=int, default=3_000_000, help="PPO agent steps")
    t.add_argument("--seed", type=int, default=0, help="seed of PPO and of the training tracks")
    t.add_argument("--out", default="policies/carracing-expert.zip", help="where to write the expert")
    t.add_argument("--n-envs", type=int, default=8, help="parallel envs in the PPO rollout")
    t.add_argument("--action-repeat", type=int, default=1, help="repeat each expert action this many frames")
    t.add_argument("--device", default="auto", help="torch device for PPO updates (auto: cuda if available)")
    t.add_argument("--tensorboard", default="runs/expert", help="TensorBoard log folder ('' for none)")
    t.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    t.add_argument("--continuous", action="store_true",
                   help="the continuous configuration: (steering, throttle) actions in [-1, 1] and a Gaussian PPO "
                        "policy, instead of the paper's five discrete actions (gas 0.2, no gas while steering)")
    t.add_argument("--ent-coef", type=float, default=None, help="PPO entropy bonus (default 0.003, continuous 0.0)")
    t.add_argument("--disturbed-starts", type=float, default=0.0,
                   help="share of training episodes that start off the road or at a standstill (a centre-line "
                        "follower drives a random stretch, then a disturbance), so the expert learns to recover")
    t.add_argument("--offtrack-patience", type=int, default=50,
                   help="steps with all wheels off the road before a training episode is cut")
    t.add_argument("--init", default=None, help="fine-tune: start from this expert .zip's weights")
    t.add_argument("--wheel-off-penalty", type=float, default=0.0,
                   help="training reward shaping: subtract this per wheel off the road per step, so the expert keeps "
                        "its wheels on the road in bends instead of hugging the edge (a line a student can imitate "
                        "without skipping tiles); evaluation always scores the env's own reward")
    t.add_argument("--keep", choices=["best", "last"], default="best",
                   help="the checkpoint written to --out: the best mean return on the held-out tracks, or the last "
                        "(the best one is then left in <out>_best/)")
    t.add_argument("--lr", type=float, default=3e-4, help="PPO learning rate (lower it when fine-tuning with --init)")
    r = esub.add_parser("check-recovery", formatter_class=FMT,
                        help="does the expert (or a student, --policy) recover from off-road and standstill?",
                        description="Before the expert labels recoveries in DAgger, check that it recovers itself. "
                                    "On each track the expert drives; at --start one disturbance steers it off the "
                                    "road (40 steps of hard steering) or brakes it to a standstill (100 steps); then "
                                    "it drives on its own. Recovered = back on the road and moving within --limit "
                                    "steps. Also runs each track undisturbed for the return it loses. With --policy "
                                    "the same check runs on a student policy (.pt): does it start again after a "
                                    "stop on a track it never saw?")
    r.add_argument("--expert", default="carracing-expert.zip", help="the PPO expert .zip (a bare name is looked up in policies/)")
    r.add_argument("--policy", default=None,
                   help="check this CarRacing policy instead of the expert: a student .pt (its own action "
                        "configuration, discrete or continuous, and its own view) or another expert .zip")
    r.add_argument("--episodes", type=int, default=20, help="tracks")
    r.add_argument("--seed", type=int, default=600_000, help="first track (default: outside training and evaluation)")
    r.add_argument("--start", type=int, default=250, help="step at which the disturbance begins")
    r.add_argument("--limit", type=int, default=250, help="steps after the disturbance within which it must recover")
    r.add_argument("--max-steps", type=int, default=None, help="cap on episode length")
    r.add_argument("--start-rule", action=argparse.BooleanOptionalAction, default=False,
                   help="the expert drives with its start rule, as it does as DAgger's teacher: " + START_RULE_HELP)
    r.add_argument("--creep-speed", type=float, default=0.0, metavar="V",
                   help="the discrete expert drives with the creep rule (every action below V units/s is gas), as "
                        "`agent train --creep-speed` teaches it; 0: off")
    r.add_argument("--brake-floor", type=float, default=None, metavar="V",
                   help="with --start-rule: the rule turns brake into gas below V units/s (default 10), as "
                        "`agent train --brake-floor` teaches it")
    r.add_argument("--grass-rule", action="store_true",
                   help="the discrete expert drives with the grass rule (brake becomes gas with all four wheels on "
                        "the grass), as `agent train --grass-rule` teaches it")
    r.add_argument("--json", default=None, help="write every episode and the summary here")


def _check_recovery(args) -> int:
    if args.episodes < 1:
        raise CLIError("--episodes must be >= 1")

    driver = load_policy(args.policy or args.expert)
    if (args.start_rule or args.creep_speed or args.brake_floor is not None or args.grass_rule) and \
            not isinstance(driver, ExpertPolicy):
        raise CLIError("--start-rule, --creep-speed, --brake-floor and --grass-rule are the PPO expert's rules; the "
                       "policy checked is not one")
    if args.brake_floor is not None and not args.start_rule:
        raise CLIError("--brake-floor is the start rule's floor: add --start-rule")
    if isinstance(driver, ExpertPolicy):
        try:  # strict: a continuous expert refuses the creep and grass rules (they are the discrete one's)
            TeacherRules(start_rule=args.start_rule, creep_speed=args.creep_speed, brake_floor=args.brake_floor,
                         grass_rule=args.grass_rule).apply(driver, strict=True)
        except RuleError as exc:
            raise CLIError(f"{RULE_OPTIONS[exc.rule]}: {exc}") from exc
        env = make_carracing(privileged=True, continuous=driver.continuous)
    elif args.policy is None:
        raise CLIError(f"{args.expert} is not a PPO expert .zip (to check a student policy, pass it as --policy)")
    else:
        policy_env = getattr(getattr(driver, "config", None), "env", "carracing")
        if policy_env != "carracing":
            raise CLIError(f"{args.policy} is a {policy_env} policy; the recovery check drives CarRacing")
        env = make_carracing_for(driver)
    results = recovery_check(env, make_actor(driver), range(args.seed, args.seed + args.episodes), start=args.start,
                             limit=args.limit, max_steps=args.max_steps)
    out = summarize(results)
    for kind, s in out["summary"].items():
        med = "-" if s["median_steps_to_recover"] is None else f"{s['median_steps_to_recover']:.0f}"
        print(f"{kind:9s} recovered {s['recovered']}/{s['episodes']}  median steps to recover {med}  "
              f"return {s['mean_disturbed_return']:.1f} disturbed vs {s['mean_undisturbed_return']:.1f} undisturbed")
    if args.json:
        write_json(args.json, {"expert" if args.policy is None else "policy": str(args.policy or args.expert),
                                "seed": args.seed, "start_rule": args.start_rule, "creep_speed": args.creep_speed,
                                "brake_floor": getattr(driver, "brake_floor", None) if args.start_rule else None,
                                "grass_rule": args.grass_rule,
                                **out})
    return 0


def run(args) -> int:
    import torch

    if args.expert_command == "check-recovery":
        return _check_recovery(args)

    if args.threads:
        torch.set_num_threads(args.threads)
    extra = {}
    if args.ent_coef is not None:
        extra["ent_coef"] = args.ent_coef
    elif args.continuous:
        extra["ent_coef"] = 0.0
    cfg = ExpertConfig(timesteps=args.timesteps, seed=args.seed, n_envs=args.n_envs,
                       action_repeat=args.action_repeat, device=args.device, continuous=args.continuous,
                       learning_rate=args.lr, disturbed_starts=args.disturbed_starts, offtrack_patience=args.offtrack_patience,
                       init=str(resolve_policy_path(args.init)) if args.init else None,
                       wheel_off_penalty=args.wheel_off_penalty, keep=args.keep, **extra)
    train_expert(cfg, args.out, tensorboard_dir=args.tensorboard or None)
    return 0


main = argparse_main("expert", add_parser, run)
