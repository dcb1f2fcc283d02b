"""`agent collect`: the expert (or a person, --keyboard) drives; the frames are recorded as a Minari dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from agent.actors.loading import is_continuous, load_policy, make_actor, make_carracing_for
from agent.actors.record import KeyboardActor, collect
from agent.actors.vector import BatchExpertActor, collect as collect_vector, envs_for
from agent.cli.common import argparse_main, ENVS_HELP, FMT, START_RULE_HELP, CLIError
from agent.data.recordings import dataset_layout
from agent.experts.rules import TeacherRules
from agent.log import get_logger
from envs.carracing import make_carracing
from envs.tracks import EVAL_SEED_BASE


def add_parser(sub) -> None:
    p = sub.add_parser("collect", help="record demonstrations (expert or keyboard) as a Minari dataset",
                       formatter_class=FMT,
                       description="Step the real, rendered env with the expert (or you, --keyboard) acting and "
                                   "record the 96x96 frames the student sees, the actions, rewards, terminations, "
                                   "truncations and each episode's track seed. A continuous expert (`agent expert "
                                   "train --continuous`) drives and records the continuous configuration: actions "
                                   "(steering, throttle) in [-1, 1]. Episodes run on tracks --seed, "
                                   "--seed+1, ... Every finished episode is on disk at once: Ctrl-C keeps them.")
    p.add_argument("--env", default="carracing", choices=["carracing"], help="simulator")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--expert", help="the PPO expert .zip (a bare name is looked up in policies/)")
    src.add_argument("--keyboard", action="store_true", help="drive yourself with the arrow keys (needs a display)")
    p.add_argument("--episodes", type=int, default=40, help="episodes to record")
    p.add_argument("--seed", type=int, default=0, help="track seed of the first episode")
    p.add_argument("--out", required=True,
                   help="dataset folder ROOT/NAMESPACE/NAME-vN, e.g. recordings/nac-drive/expert-0-19-v0 (Minari id "
                        "nac-drive/expert-0-19-v0; MINARI_DATASETS_PATH=recordings lets Minari's tools find it)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--max-steps", type=int, default=None, help="cap on episode length (default: the env's 1000)")
    p.add_argument("--start-rule", action=argparse.BooleanOptionalAction, default=False, help=START_RULE_HELP)
    p.add_argument("--envs", type=int, default=1, help="--expert: " + ENVS_HELP)


def run(args) -> int:
    if args.episodes < 1:
        raise CLIError(f"--episodes must be >= 1, got {args.episodes}")
    if args.envs < 1 or (args.keyboard and args.envs != 1):
        raise CLIError(f"--envs must be >= 1 (and 1 with --keyboard: one person drives one car), got {args.envs}")
    out = Path(args.out)
    _, dataset_id = dataset_layout(out)  # RecordingError (a ValueError, exit 2) suggests a valid path
    if out.exists() and not args.overwrite:
        raise CLIError(f"{out} already exists; choose another --out or pass --overwrite")
    if args.seed + args.episodes > EVAL_SEED_BASE:
        get_logger(__name__).warning("tracks >= %d are the evaluation tracks; recording on them leaks test data",
                                     EVAL_SEED_BASE)
    description = None
    if args.keyboard:
        actor, name, env = KeyboardActor(), "keyboard", make_carracing()
    else:
        expert = TeacherRules(start_rule=args.start_rule).apply(load_policy(args.expert))
        actor, name = make_actor(expert), "ppo-expert"
        env = make_carracing_for(expert)  # the continuous configuration for a continuous expert
        if is_continuous(expert):
            description = ("CarRacing demonstrations by ppo-expert, continuous configuration: actions (steering, "
                           "throttle) in [-1, 1] (envs.carracing.ThrottleAction)")
    if args.envs > 1:
        env.close()
        envs = envs_for(expert, args.envs, render_pixels=True)  # the student's frames are what is recorded
        writer = collect_vector(envs, BatchExpertActor(expert), args.episodes, args.seed, out, name,
                                overwrite=args.overwrite, max_steps=args.max_steps, description=description)
    else:
        writer = collect(env, actor, args.episodes, args.seed, out, name, overwrite=args.overwrite,
                         max_steps=args.max_steps, description=description)
    kind = "continuous (steering, throttle)" if description else "discrete"
    print(f"recorded {writer.episodes} episode(s), {writer.steps} steps, {kind} actions -> {out} "
          f"(Minari dataset {dataset_id})")
    return 0 if writer.episodes else 1


main = argparse_main("collect", add_parser, run)
