"""agent: record demonstrations, train and evaluate NAC driving policies, and watch them drive.

The workflow, one direction (DESIGN.md section 2):

  agent expert train   PPO expert on CarRacing's privileged state     -> policies/carracing-expert.zip
  agent collect        the expert (or you, --keyboard) drives; frames -> recordings/nac-drive/NAME-v0 (Minari)
  agent train          behaviour cloning (+ DAgger) of CNN + NAC       -> policies/nac.pt
  agent evaluate       closed-loop returns on unseen tracks            -> JSON
                       (--env udacity: offline steering error; --floor: the recordings' keyboard-noise floor)
  agent compare        every temporal core trained and driven alike     -> table, figure (results/)
  drive                watch a policy drive, with Grad-CAM and NAC neuron traces live
  agent plot-traces    Figure-4-style plots of the traces from drive --dump-traces
  agent wiring         a picture of the policy's NCP wiring
  agent bench nac      NAC layer speed and memory against the authors' torch-nac
  agent bench drive    runner FPS and latency with and without the overlays
  agent bench bridge   Udacity bridge round trip, with and without the policy and overlays
  agent bench rollouts env steps/s with 1, 2, 4 envs at once (--envs) for the expert and the student
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from envs.tracks import EVAL_SEED_BASE

FMT = argparse.ArgumentDefaultsHelpFormatter

#: help text of --start-rule (collect, train, evaluate)
_START_RULE_HELP = ("the teacher's start rule: gas at a standstill (speed < 1 unit/s) whatever its network chose, and "
                    "gas instead of brake below 10 units/s (a continuous expert: full throttle, its steering kept); "
                    "either expert can otherwise brake a slow car to a halt and brake or steer at rest until the time "
                    "limit (README, \"The expert's stalls\", \"The continuous start rule\")")


#: help text of --envs (collect, train, evaluate)
_ENVS_HELP = ("step this many CarRacing envs at once, each in its own process (gymnasium AsyncVectorEnv), the policy "
              "acting on the batch of their observations; each episode keeps its track and is measured alike. 1: one "
              "env in this process, episodes one after another (README, \"Vectorised rollouts\")")


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def _write_json(path: str | Path, obj) -> None:
    """``obj`` as indented JSON at ``path`` (its folder is created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")


# ----------------------------------------------------------------------------------- expert
def _add_expert(sub) -> None:
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
                   help="the expert drives with its start rule, as it does as DAgger's teacher: " + _START_RULE_HELP)
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


def _cmd_expert_recovery(args) -> int:
    from agent.eval.recovery import recovery_check, summarize
    from agent.actors.loading import load_policy, make_actor
    from envs.carracing import make_carracing

    if args.episodes < 1:
        raise CLIError("--episodes must be >= 1")
    from agent.experts.policy import ExpertPolicy
    from agent.experts.rules import RuleError, TeacherRules
    from agent.actors.loading import make_carracing_for

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
            raise CLIError(f"{_RULE_OPTIONS[exc.rule]}: {exc}") from exc
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
        _write_json(args.json, {"expert" if args.policy is None else "policy": str(args.policy or args.expert),
                                "seed": args.seed, "start_rule": args.start_rule, "creep_speed": args.creep_speed,
                                "brake_floor": getattr(driver, "brake_floor", None) if args.start_rule else None,
                                "grass_rule": args.grass_rule,
                                **out})
    return 0


def _cmd_expert(args) -> int:
    import torch

    if args.expert_command == "check-recovery":
        return _cmd_expert_recovery(args)

    from agent.actors.loading import resolve_policy_path
    from agent.train.ppo import ExpertConfig, train_expert

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


# ----------------------------------------------------------------------------------- collect
def _add_collect(sub) -> None:
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
    p.add_argument("--start-rule", action=argparse.BooleanOptionalAction, default=False, help=_START_RULE_HELP)
    p.add_argument("--envs", type=int, default=1, help="--expert: " + _ENVS_HELP)


def _cmd_collect(args) -> int:
    from agent.actors.record import KeyboardActor, collect
    from agent.data.recordings import dataset_layout
    from agent.log import get_logger
    from envs.carracing import make_carracing

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
        from agent.experts.rules import TeacherRules
        from agent.actors.loading import is_continuous, load_policy, make_actor, make_carracing_for

        expert = TeacherRules(start_rule=args.start_rule).apply(load_policy(args.expert))
        actor, name = make_actor(expert), "ppo-expert"
        env = make_carracing_for(expert)  # the continuous configuration for a continuous expert
        if is_continuous(expert):
            description = ("CarRacing demonstrations by ppo-expert, continuous configuration: actions (steering, "
                           "throttle) in [-1, 1] (envs.carracing.ThrottleAction)")
    if args.envs > 1:
        from agent.actors.vector import BatchExpertActor, collect as collect_vector, envs_for

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


# ----------------------------------------------------------------------------------- train
def _add_train(sub) -> None:
    from agent.nn.cores import CORES

    p = sub.add_parser("train", help="behaviour cloning (+ DAgger) of a driving policy, either simulator",
                       formatter_class=FMT,
                       description="One trainer for both simulators and every temporal core: a features extractor "
                                   "(the paper's CNN for CarRacing, PilotNet for Udacity), a temporal core (--core) "
                                   "and an action head derived from the env's action space (five action logits with "
                                   "cross-entropy for CarRacing; steering and throttle with MSE for recordings of "
                                   "CarRacing's continuous configuration, read from the data; one steering output "
                                   "with MSE for Udacity), trained "
                                   "on windows of --window consecutive frames. Validation data is held out by "
                                   "episode (Udacity: the last --val-fraction of each recording's rows) and scored "
                                   "streaming, frame by frame, as the policy drives; the best checkpoint by the "
                                   "head's metric (higher accuracy, lower MSE) is kept. With --dagger-rounds R and "
                                   "--expert (CarRacing), the student then drives, the expert relabels the frames "
                                   "it visits, the data is aggregated and the student retrained, R times. "
                                   "Defaults marked 'per env' are listed in `agent.train.bc.TRAIN_DEFAULTS` and "
                                   "`agent.nn.policy.default_config`.")
    p.add_argument("--env", default="carracing", choices=["carracing", "udacity"], help="simulator")
    p.add_argument("--data", required=True, nargs="+",
                   help="recording(s): Minari datasets made by `agent collect` (carracing: a folder such as "
                        "recordings/nac-drive/expert-v0, or a dataset id), or the Udacity simulator's training-mode "
                        "folders holding driving_log.csv and IMG/ (udacity)")
    p.add_argument("--core", default=argparse.SUPPRESS, choices=list(CORES),
                   help="temporal core (per env: nac-steady for carracing, nac-exact for udacity); torch-nac needs "
                        "pip install -e \".[peers]\"")
    p.add_argument("--core-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a core option over the env's defaults (repeatable; numbers, true/false or text), e.g. "
                        "--core-option input_norm=true (NAC: a LayerNorm on the features first), --core-option "
                        "sparsity=0.9, --core-option topk=4; see agent.nn.cores for each core's options")
    p.add_argument("--out", default=argparse.SUPPRESS,
                   help="policy file to write (per env: policies/nac.pt, policies/udacity-nac.pt)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--window", type=int, default=argparse.SUPPRESS, help="T: frames the core sees (per env: 4; 8)")
    p.add_argument("--dashboard", choices=["visible", "speed", "hidden", "speedometer", "speed-input"],
                   default=argparse.SUPPRESS,
                   help="carracing: what the CNN sees of the dashboard strip (bottom 12 rows, which shows the car's "
                        "own controls): visible (the paper's input), speed (blanked except the speed bar; the default), "
                        "hidden (cropped), speedometer (as speed, plus a legible speed bar drawn into the strip, 6.4 pixels per "
                        "unit/s, about 50 times gymnasium's; recorded frames are redrawn from their speeds) or "
                        "speed-input (the whole strip blanked; the speed, read off that drawn bar, enters as a number "
                        "beside the CNN's features, as conditional imitation learning's measured speed). "
                        "With --init: switch a visible/speed/speedometer/speed-input policy's mode, its weights kept")
    p.add_argument("--motion", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                   help="carracing: the CNN also reads each frame's difference from the previous one (motion "
                        "channels: speed and turning, and an unmistakable standstill); on by default, "
                        "--no-motion for the paper's single-frame input")
    p.add_argument("--skip-stalls", action="store_true",
                   help="carracing: leave the expert's stalls out of the loss (frames where the road scene has not "
                        "moved since the previous frame and the label is not gas: the discrete expert sometimes "
                        "brakes or steers at rest for hundreds of steps, and a student that copies it stays put); "
                        "the frames stay in the windows as context")
    p.add_argument("--standstills", type=float, default=0.0, metavar="SHARE",
                   help="carracing: replace this share of the training windows (e.g. 0.05) by a synthetic "
                        "standstill: one of the window's frames repeated, so the motion channels are zero, with the "
                        "speed bar blanked, labelled go (discrete: gas; continuous: full throttle, the recorded "
                        "steering kept), as the teacher's start rule labels a standing car. It shows the student a "
                        "standstill in every scene of the data, not only where its rollouts stopped. Needs "
                        "--dashboard speed or hidden (default: 0, none)")
    p.add_argument("--d-model", type=int, default=argparse.SUPPRESS, help="core width d (per env: 64; 100)")
    p.add_argument("--epochs", type=int, default=argparse.SUPPRESS, help="behaviour-cloning epochs (per env: 8; 40)")
    p.add_argument("--batch-frames", type=int, default=argparse.SUPPRESS,
                   help="frames per batch; windows per batch = this // window (per env: 256; 64)")
    p.add_argument("--lr", type=float, default=argparse.SUPPRESS, help="peak learning rate, AdamW (per env: 1e-3; 3e-4)")
    p.add_argument("--weight-decay", type=float, default=argparse.SUPPRESS, help="AdamW weight decay (per env: 1e-4; 0)")
    p.add_argument("--schedule", choices=["onecycle", "cosine"], default=argparse.SUPPRESS,
                   help="learning-rate schedule (per env: onecycle; cosine to lr/20)")
    p.add_argument("--val-fraction", type=float, default=argparse.SUPPRESS,
                   help="share held out for validation: episodes (carracing, 0.1), or the last rows of each "
                        "recording as one block (udacity, 0.15)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, split, batches and augmentation")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (augmentation runs there)")
    p.add_argument("--expert", default=None,
                   help="carracing: PPO expert .zip for DAgger relabelling (of the same action kind as --data: a "
                        "continuous expert for continuous recordings)")
    p.add_argument("--start-rule", action=argparse.BooleanOptionalAction, default=False,
                   help="carracing DAgger: " + _START_RULE_HELP)
    p.add_argument("--creep-speed", type=float, default=0.0, metavar="V",
                   help="carracing, discrete: the teacher's creep rule: below V units/s every label is gas, in the "
                        "recordings (relabelled from their recorded speeds) and in DAgger's relabelling. Discrete "
                        "CarRacing cannot steer and accelerate at once, and off the road the expert steers a car at "
                        "1-4 units/s, which then circles on the grass for hundreds of steps; the start rule acts "
                        "only below 1 unit/s (README, 'The creep rule'). 0: off")
    p.add_argument("--brake-floor", type=float, default=None, metavar="V",
                   help="carracing, discrete: the start rule's brake floor: below V units/s a brake label becomes "
                        "gas, in the recordings (relabelled from their recorded speeds) and in DAgger's relabelling "
                        "(which needs --start-rule). Without it the start rule's floor is 10 units/s and recordings "
                        "keep their labels; the expert's brake labels just above 10 in its students' states teach a "
                        "slow student to brake each time it reaches 10 (README, 'The brake floor'). 20 is the "
                        "setting that removes them")
    p.add_argument("--grass-rule", action="store_true",
                   help="carracing, discrete: the teacher's grass rule: with the car on the grass a brake label "
                        "becomes gas, in DAgger's relabelling (all four wheels on the grass) and in the recordings "
                        "(the grass read from the pixels around the car). The expert brakes slow cars on the grass, "
                        "which teaches its students to brake at that speed on the road too (README, 'The brake "
                        "floor')")
    p.add_argument("--dagger-rounds", type=int, default=0, help="carracing: DAgger rounds after BC")
    p.add_argument("--dagger-episodes", type=int, default=8, help="carracing: student episodes per DAgger round")
    p.add_argument("--dagger-epochs", type=int, default=3, help="carracing: epochs on the aggregate after each round")
    p.add_argument("--dagger-beta", type=float, default=0.5,
                   help="carracing: probability that the expert's action is executed in round 1's rollouts "
                        "(Ross et al.'s mixture; the demonstrations themselves are round 0, beta 1)")
    p.add_argument("--dagger-beta-decay", type=float, default=0.5,
                   help="carracing: beta of round r = dagger-beta * decay^(r-1) (0.5: 0.5, 0.25, 0.125, ...)")
    p.add_argument("--dagger-disturb", type=float, default=0.0,
                   help="carracing: disturbances per 1000 steps in DAgger rollouts (hard steering off the road, or "
                        "braking to a standstill), so the expert labels the recoveries (DART-like; 0: none)")
    p.add_argument("--dagger-disturb-kinds", default="off-road,stop",
                   help="carracing: comma-separated disturbances drawn by --dagger-disturb: off-road, stop, and ditch "
                        "(off the road, then braked to a standstill there, so the expert labels starting again "
                        "from rest on the grass)")
    p.add_argument("--dagger-out", default=None,
                   help="carracing: also write each round's relabelled episodes as Minari datasets "
                        "DAGGER_OUT-r<round>-v0, e.g. recordings/nac-drive/nac-dagger")
    p.add_argument("--dagger-max-steps", type=int, default=None, help="carracing: cap on DAgger episode length")
    p.add_argument("--dagger-edge-weight", type=float, default=1.0,
                   help="carracing: loss weight of the relabelled frames on or near the road's edge (one to three "
                        "wheels off the road now, or a wheel off within --dagger-edge-horizon steps), where the "
                        "student skips a bend's tiles; frames with all four wheels off the road, and the rest, weigh "
                        "1 (default 1: no weighting; README, 'Edge weights, tried')")
    p.add_argument("--class-weights", type=float, nargs="+", default=None, metavar="W",
                   help="discrete actions: loss weight of the frames by their target action, one weight per action "
                        "in the head's order (carracing: nothing right left gas brake), e.g. 1 1 1 1 4 to weigh "
                        "the teacher's rare brakes 4 times (class-weighted cross-entropy, a weighted mean); applies "
                        "to behaviour cloning and the DAgger rounds, and multiplies --dagger-edge-weight "
                        "(default: none, every frame 1)")
    p.add_argument("--dagger-edge-horizon", type=int, default=10,
                   help="carracing: steps ahead that make a frame 'near the edge' for --dagger-edge-weight (10 = 0.2 s)")
    p.add_argument("--envs", type=int, default=1, help="carracing, DAgger rollouts: " + _ENVS_HELP)
    p.add_argument("--dagger-seed", type=int, default=None,
                   help="carracing: first track of DAgger round 1 (default 500,000; round r drives "
                        "seed + (r-1) * episodes onwards); give another to continue DAgger on new tracks")
    p.add_argument("--save-bc", default=None, help="also save the policy after BC, before DAgger, here")
    p.add_argument("--init", default=None,
                   help="start from this policy file (its core, window and features are kept); with --epochs 0 "
                        "behaviour cloning is skipped, e.g. DAgger rounds on top of a saved BC policy")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0: torch's default; under torchrun: cores / processes per machine)")
    p.add_argument("--device", default="cpu",
                   help="torch device (under torchrun: cpu trains with gloo, cuda with NCCL on cuda:LOCAL_RANK)")
    p.add_argument("--tensorboard", default="runs/train", help="TensorBoard root folder ('' for none)")
    p.add_argument("--report", default=None, help="also write the training report as JSON here")
    p.add_argument("--time-limit", type=float, default=None, help="stop after the epoch that crosses this many minutes")
    p.add_argument("--on-bad-row", default="skip", choices=["skip", "error"],
                   help="udacity: skip unusable CSV rows with a warning, or stop with an error listing them")
    p.add_argument("--augment-prob", type=float, default=0.6,
                   help="udacity: probability that a training window is augmented (0: no augmentation)")
    p.add_argument("--smooth-labels", type=int, default=1,
                   help="udacity: train on a moving average of the steering over this many frames (odd for "
                        "centred; 1: the raw labels). Validation always uses the raw labels")
    p.add_argument("--smooth-mode", default="centred", choices=["centred", "causal"],
                   help="udacity: --smooth-labels averages frames i-k..i+k (centred) or the last N frames (causal)")
    p.add_argument("--straight-keep", type=float, default=1.0,
                   help="udacity: share of the straight-driving frames (|training label| < 0.001) that the loss "
                        "counts, drawn once per frame (keyboard recordings are 70-80%% zeros); 1: all")
    p.add_argument("--crop-cache", default="auto", help="udacity: " + _CROP_CACHE_HELP)
    lodo = p.add_argument_group(
        "leave-one-driver-out (udacity)",
        "With --leave-one-driver-out OUT, `agent train` does not write a policy: each --data recording is one "
        "driver, and for each one a policy is trained from scratch on the others with the options above and scored "
        "on it (offline steering MSE, MAE, predict-0 MSE and their ratio, as `agent evaluate --env udacity`). "
        "OUT/folds/<driver>.json holds each finished fold (a rerun skips it), OUT/lodo.md and OUT/lodo.json the "
        "table per driver and its means per track. Choose settings by these held-out-driver means, never by one "
        "test driver. --val-fraction > 0 chooses each fold's checkpoint on its training drivers' last rows; 0 "
        "keeps the last epoch.")
    lodo.add_argument("--leave-one-driver-out", metavar="OUT", default=None,
                      help="run the leave-one-driver-out evaluation into this folder")
    lodo.add_argument("--subsample", type=float, default=1.0,
                      help="share of each training recording used (per fold with --leave-one-driver-out; also for "
                           "plain udacity training, so a shipped policy can follow the recipe a LODO run measured), "
                           "as random blocks of --block frames")
    lodo.add_argument("--block", type=int, default=32, help="frames per block of --subsample (>= --window)")
    lodo.add_argument("--track", action="append", default=[], metavar="DRIVER=TRACK",
                      help="the track of a driver (a --data folder's name as the table shows it), for the means "
                           "per track; DRIVER '*' sets the default, e.g. --track '*=lake' --track b-sh+CarND=jungle")
    lodo.add_argument("--reference", default=None,
                      help="also score this fixed Udacity policy (e.g. udacity-nac.pt) on each held-out driver")
    lodo.add_argument("--folds", nargs="+", default=None, metavar="DRIVER", help="run only these folds")


#: help text of --crop-cache (train, evaluate)
_CROP_CACHE_HELP = ("where recordings are cached as preprocessed 66x200 YUV crops of the three cameras (one uint8 .npy "
                    "memory map per recording, 119 KB a row, keyed by the CSV, its images and the preprocessing; "
                    "agent.data.udacity_cache), so many recordings fit: 'auto' caches in "
                    "~/.cache/nac-drive/udacity-crops when several --data folders are given and reads one into "
                    "memory (raw frames, 460 KB a row); '' always reads into memory; a folder always caches there")


#: `agent train` options that only one simulator uses, with the value that means "not given"
_ENV_ONLY = {"udacity": {"augment_prob": 0.6, "smooth_labels": 1, "on_bad_row": "skip", "smooth_mode": "centred",
                         "straight_keep": 1.0, "crop_cache": "auto", "leave_one_driver_out": None},
             "carracing": {"expert": None, "dagger_rounds": 0, "dagger_beta": 0.5, "dagger_beta_decay": 0.5,
                           "dagger_disturb": 0.0, "dagger_disturb_kinds": "off-road,stop", "dagger_out": None,
                           "dagger_max_steps": None, "dagger_seed": None, "dagger_edge_weight": 1.0,
                           "dagger_edge_horizon": 10,
                           "save_bc": None, "start_rule": False, "creep_speed": 0.0, "brake_floor": None,
                           "grass_rule": False, "envs": 1}}


def _udacity_loader(args, n_recordings: int):
    """``load(path)`` for Udacity recordings under --crop-cache (see ``_CROP_CACHE_HELP``) and --on-bad-row."""
    from functools import partial

    from agent.data.udacity import load_recording
    from agent.data.udacity_cache import DEFAULT_CACHE_DIR, load_cached

    cache = getattr(args, "crop_cache", "")
    if cache == "auto":
        cache = str(DEFAULT_CACHE_DIR) if n_recordings > 1 else ""
    if cache:
        return partial(load_cached, cache_dir=cache, on_bad_row=args.on_bad_row)
    return partial(load_recording, on_bad_row=args.on_bad_row)


def _check_udacity_folders(data: list[str]) -> None:
    for d in data:
        if not (Path(d) / "driving_log.csv").is_file() and not (Path(d).is_file() and Path(d).suffix == ".csv"):
            raise CLIError(f"{d} is not a Udacity recording (no driving_log.csv in it)")


def _load_source(env: str, data: list[str], args):
    """The training source of --data for a simulator (CarRacing: Minari recordings; Udacity: CSV folders)."""
    from agent.data.windows import DemonstrationSource, UdacitySource

    if env == "carracing":
        from agent.data.recordings import load_demonstrations

        demos = load_demonstrations(data)  # RecordingError if they mix action kinds
        demos = _relabel_recorded(demos, _teacher_rules(args))
        return DemonstrationSource(demos, skip_stalls=getattr(args, "skip_stalls", False),
                                   standstills=getattr(args, "standstills", 0.0))
    from agent.data.udacity import AugmentConfig

    if getattr(args, "standstills", 0.0):
        raise CLIError("--standstills is CarRacing's (synthetic standstills of its frames); leave it out for udacity")
    _check_udacity_folders(data)
    load = _udacity_loader(args, len(data))
    recs = [load(d) for d in data]
    fraction, block = getattr(args, "subsample", 1.0), getattr(args, "block", 32)
    if fraction < 1.0:  # the same cut as a leave-one-driver-out fold's (agent.train.lodo), one rng per recording
        import numpy as np

        from agent.train.lodo import subsample_blocks

        recs = [piece for j, r in enumerate(recs)
                for piece in subsample_blocks(r, fraction, block, np.random.default_rng([args.seed, j]))]
        from agent.log import get_logger

        get_logger("agent.train").info("--subsample %.2f: %d frames in %d pieces of the %d recordings", fraction,
                 sum(len(r) for r in recs), len(recs), len(data))
    return UdacitySource(recs, AugmentConfig(p_augment=args.augment_prob), smooth_labels=args.smooth_labels,
                         smooth_mode=args.smooth_mode, straight_keep=args.straight_keep, seed=args.seed)


def _teacher_rules(args):
    """The teacher's rules of `agent train`'s --start-rule, --creep-speed, --brake-floor and --grass-rule
    (absent options: off; the values were checked by :func:`_cmd_train`)."""
    from agent.experts.rules import RuleError, TeacherRules

    try:
        return TeacherRules(start_rule=getattr(args, "start_rule", False),
                            creep_speed=getattr(args, "creep_speed", 0.0),
                            brake_floor=getattr(args, "brake_floor", None),
                            grass_rule=getattr(args, "grass_rule", False))
    except RuleError as exc:
        raise CLIError(f"{_RULE_OPTIONS[exc.rule]}: {exc}") from exc


#: the option of each teacher's rule (:class:`agent.experts.rules.TeacherRules`'s fields)
_RULE_OPTIONS = {"creep_speed": "--creep-speed", "brake_floor": "--brake-floor", "grass_rule": "--grass-rule"}

#: how `agent train` names a recording rule that ran (:meth:`agent.experts.rules.TeacherRules.relabel`)
_RULE_FLAGS = {"creep_speed": lambda r: f"--creep-speed {r.creep_speed:.1f}",
               "brake_floor": lambda r: f"--brake-floor {r.brake_floor:.1f}",
               "grass_rule": lambda r: "--grass-rule"}


def _relabel_recorded(demos, rules):
    """``rules.relabel(demos)`` (the teacher's rules applied to recorded labels), logging
    "<flag>: N of M recorded <what>" per rule. Raises CLIError, naming the flag, where a rule does
    not apply (continuous recordings, frames that are not CarRacing's)."""
    from agent.experts.rules import RuleError
    from agent.log import get_logger

    log = get_logger("agent.train")
    n_frames = demos.n_frames
    try:
        demos, _ = rules.relabel(demos, log=lambda rule, changed, what: log.info(
            "%s: %d of %d recorded %s", _RULE_FLAGS[rule](rules), changed, n_frames, what))
    except RuleError as exc:
        raise CLIError(f"{_RULE_FLAGS[exc.rule](rules)}: {exc}") from exc
    return demos


def _parse_option_value(text: str):
    """'true'/'false' -> bool, an int or float literal -> that number, anything else -> the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _core_options(args) -> dict:
    """The core's options: the env's defaults (``default_core_kwargs``) updated by --core-option
    KEY=VALUE; a bad option is found by building the core once, so it fails before any data loads.

    Raises:
        CLIError: a malformed KEY=VALUE, or an option the core refuses (with its message).
    """
    from agent.nn.cores import make_core
    from agent.nn.policy import default_config, default_core_kwargs

    core = getattr(args, "core", None) or default_config(args.env).core
    kwargs = dict(default_core_kwargs(args.env, core))
    for item in args.core_option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"--core-option must be KEY=VALUE, got {item!r}")
        kwargs[key.strip()] = _parse_option_value(value)
    try:
        make_core(core, 8, 8 * kwargs.get("num_heads", 1), 2, 0.02, **kwargs)
    except (TypeError, ValueError) as exc:
        raise CLIError(f"--core-option {' '.join(args.core_option)} does not suit the {core} core: {exc}") from exc
    return kwargs


def _carracing_continuous(source) -> bool:
    """Whether CarRacing recordings hold the continuous configuration's actions (inferred from the
    data, so `agent train` needs no flag); False for the five discrete actions.

    Raises:
        CLIError: continuous actions of another space than Box(-1, 1, (2,)) (steering, throttle).
    """
    import gymnasium as gym
    import numpy as np

    demos = source.demos
    if not demos.continuous:
        return False
    space = demos.action_space
    if space is None or not isinstance(space, gym.spaces.Box) or space.shape != (2,) or \
            not (np.allclose(space.low, -1.0) and np.allclose(space.high, 1.0)):
        raise CLIError(f"the recordings hold continuous actions in {space}, but CarRacing's continuous "
                       "configuration drives with (steering, throttle) in Box(-1, 1, (2,)); record them with "
                       "`agent collect --expert` and an expert trained with `agent expert train --continuous`")
    return True


def _disturb_kinds(text: str) -> tuple[str, ...]:
    """``--dagger-disturb-kinds`` as a tuple; raises CLIError on an unknown or empty kind."""
    from agent.actors.perturb import KINDS

    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise CLIError(f"--dagger-disturb-kinds {text!r}: choose a comma-separated subset of {', '.join(KINDS)}")
    return kinds


def _cmd_train(args) -> int:
    import numpy as np

    from agent.actors.loading import is_continuous, load_policy, make_carracing_for, reads_speedometer
    from agent.nn.policy import DrivingPolicy, default_config
    from agent.train.bc import TRAIN_DEFAULTS, TrainConfig, report_metadata
    from agent.train.run import train

    other = "udacity" if args.env == "carracing" else "carracing"
    wrong = [k for k, unset in _ENV_ONLY[other].items() if getattr(args, k) != unset]
    if wrong:
        raise CLIError(f"{', '.join('--' + k.replace('_', '-') for k in wrong)} only apply to --env {other}")
    if args.dagger_seed is not None:
        from envs.tracks import EVAL_SEED_BASE

        last = args.dagger_seed + max(args.dagger_rounds, 1) * args.dagger_episodes
        if args.dagger_seed < 0 or last > EVAL_SEED_BASE:
            raise CLIError(f"DAgger tracks {args.dagger_seed}..{last - 1} must lie in 0..{EVAL_SEED_BASE - 1}: tracks "
                           f"from {EVAL_SEED_BASE:,} on are the evaluation tracks")
    if not (args.dagger_edge_weight >= 0 and np.isfinite(args.dagger_edge_weight)) or args.dagger_edge_horizon < 0:
        raise CLIError(f"--dagger-edge-weight must be a finite weight >= 0 and --dagger-edge-horizon >= 0 steps, got "
                       f"{args.dagger_edge_weight} and {args.dagger_edge_horizon}")
    cw = args.class_weights
    if cw is not None and not (all(np.isfinite(w) and w >= 0 for w in cw) and any(w > 0 for w in cw)):
        raise CLIError(f"--class-weights must be finite weights >= 0, one per action, not all 0; got "
                       f"{' '.join(map(str, args.class_weights))}")
    if args.dagger_edge_weight != 1.0 and not args.dagger_rounds:
        raise CLIError("--dagger-edge-weight weighs DAgger's relabelled frames: it needs --dagger-rounds")
    if not args.creep_speed >= 0 or not np.isfinite(args.creep_speed):
        raise CLIError(f"--creep-speed must be a speed >= 0 units/s (0: off), got {args.creep_speed}")
    if args.brake_floor is not None:
        if not (args.brake_floor >= 0 and np.isfinite(args.brake_floor)):
            raise CLIError(f"--brake-floor must be a speed >= 0 units/s, got {args.brake_floor}")
        if args.dagger_rounds and not args.start_rule:
            raise CLIError("--brake-floor is the start rule's floor: DAgger's teacher uses it only with --start-rule")
    if args.dagger_rounds and not args.expert:
        raise CLIError("--dagger-rounds needs --expert (the PPO expert that relabels the student's states)")
    if args.envs < 1 or (args.envs != 1 and not args.dagger_rounds):
        raise CLIError(f"--envs steps the DAgger rollouts: it needs --dagger-rounds and must be >= 1, got {args.envs}")
    if not 0.0 <= args.augment_prob <= 1.0:
        raise CLIError(f"--augment-prob must be in [0, 1], got {args.augment_prob}")
    if args.smooth_labels < 1 or (args.smooth_labels % 2 == 0 and args.smooth_mode == "centred"):
        raise CLIError(f"--smooth-labels must be an odd number of frames >= 1 (any >= 1 with --smooth-mode causal), "
                       f"got {args.smooth_labels}")
    if not 0.0 < args.straight_keep <= 1.0:
        raise CLIError(f"--straight-keep must be in (0, 1], got {args.straight_keep}")
    lodo_only = [o for o, unset in (("track", []), ("reference", None), ("folds", None)) if getattr(args, o) != unset]
    if lodo_only and not args.leave_one_driver_out:
        raise CLIError(f"{', '.join('--' + o for o in lodo_only)} only apply with --leave-one-driver-out OUT")
    budget = [o for o, unset in (("subsample", 1.0), ("block", 32)) if getattr(args, o) != unset]
    if budget and args.env != "udacity":
        raise CLIError(f"{', '.join('--' + o for o in budget)} only apply to --env udacity")
    out = Path(getattr(args, "out", "policies/nac.pt" if args.env == "carracing" else "policies/udacity-nac.pt"))
    if out.exists() and not args.overwrite and not args.leave_one_driver_out:
        raise CLIError(f"{out} already exists; choose another --out or pass --overwrite")
    given = {k: getattr(args, k) for k in ("window", "d_model") if hasattr(args, k)}
    if any(v < 1 for v in given.values()):
        raise CLIError("--window and --d-model must be >= 1")
    tcfg = dict(TRAIN_DEFAULTS[args.env])
    tcfg.update({k: getattr(args, k) for k in ("epochs", "batch_frames", "lr", "weight_decay", "schedule",
                                                "val_fraction") if hasattr(args, k)})
    cfg = TrainConfig(**tcfg, seed=args.seed, device=args.device, workers=args.workers,
                      time_limit_s=args.time_limit * 60 if args.time_limit else None,
                      dagger_rounds=args.dagger_rounds, dagger_episodes=args.dagger_episodes,
                      dagger_epochs=args.dagger_epochs, dagger_beta=args.dagger_beta,
                      dagger_beta_decay=args.dagger_beta_decay, dagger_disturb=args.dagger_disturb,
                      dagger_disturb_kinds=_disturb_kinds(args.dagger_disturb_kinds),
                      dagger_out=args.dagger_out,
                      **({"dagger_seed": args.dagger_seed} if args.dagger_seed is not None else {}),
                      dagger_max_steps=args.dagger_max_steps, dagger_edge_weight=args.dagger_edge_weight,
                      dagger_edge_horizon=args.dagger_edge_horizon,
                      class_weights=tuple(args.class_weights) if args.class_weights else None)
    cnn_options = {k: getattr(args, k) for k in ("dashboard", "motion") if hasattr(args, k)}  # CarRacingCNN's
    if cnn_options:
        if args.env != "carracing":
            raise CLIError(f"--{next(iter(cnn_options))} only applies to --env carracing")
        given["features_kwargs"] = {**default_config("carracing").features_kwargs, **cnn_options}
    if args.core_option:
        given["core_kwargs"] = _core_options(args)
    if args.env == "udacity":  # the training budget of a fold, or of a plain run
        if args.subsample <= 0 or args.subsample > 1 or args.block < 1:
            raise CLIError(f"--subsample must be in (0, 1] and --block >= 1, got {args.subsample} and {args.block}")
        window = given.get("window", default_config("udacity").window)
        if args.subsample < 1 and args.block < window:
            raise CLIError(f"--block ({args.block}) must be at least --window ({window}) frames")
    if args.leave_one_driver_out:
        return _train_lodo(args, cfg, given)
    from agent.train import distributed as ddp

    dist = ddp.init_from_env(args.device, args.threads)  # under torchrun: join its process group; else --threads
    if args.dagger_rounds and dist.world_size > 1:
        raise CLIError(ddp.DAGGER_UNDER_TORCHRUN)
    source = _load_source(args.env, args.data, args)
    continuous = _carracing_continuous(source) if args.env == "carracing" else False
    pcfg = default_config(args.env, getattr(args, "core", None), continuous=continuous, seed=22222 + args.seed,
                          **given)
    expert = env = None
    if args.dagger_rounds:
        # DAgger's teacher: a continuous expert drives without the (discrete) creep and grass rules
        expert = _teacher_rules(args).apply(load_policy(args.expert))
        if is_continuous(expert) != continuous:
            kinds = {True: "continuous (steering, throttle)", False: "discrete"}
            raise CLIError(f"--expert {args.expert} drives with {kinds[is_continuous(expert)]} actions but the "
                           f"recordings hold {kinds[continuous]} actions; DAgger needs an expert of the same kind "
                           "as the data (record with that expert, or pass the matching one)")
    init = None
    if args.init:
        init = load_policy(args.init)
        if not isinstance(init, DrivingPolicy) or init.config.env != args.env:
            raise CLIError(f"--init {args.init} is not a {args.env} policy made by `agent train`")
        clash = [o for o in ("core", "window", "d_model", "motion") if hasattr(args, o)]
        if clash:
            raise CLIError(f"--init keeps the policy's own {', '.join('--' + c.replace('_', '-') for c in clash)}; "
                           "drop those options")
        if init.config.action_space != pcfg.action_space:
            raise CLIError(f"--init {args.init} has actions {init.config.action_space}, the data has {pcfg.action_space}")
        if hasattr(args, "dashboard") and args.dashboard != init.features.dashboard:
            try:
                init = init.with_dashboard(args.dashboard)
            except ValueError as exc:
                raise CLIError(f"--init {args.init} --dashboard {args.dashboard}: {exc}") from exc
    elif cfg.epochs == 0:
        raise CLIError("--epochs 0 (no behaviour cloning) needs --init POLICY")
    if args.dagger_rounds:  # the student's env: its frames carry the speedometer if the student reads one
        speedometer = reads_speedometer(init if init is not None else pcfg)
        env = make_carracing_for(expert, speedometer=speedometer)  # continuous for a continuous expert
        if args.envs > 1:  # the student's rollouts on --envs envs at once, the expert labelling from info
            from agent.actors.vector import envs_for

            env.close()
            env = envs_for(expert, args.envs, render_pixels=True, speedometer=speedometer)
    policy, report = train(source, pcfg, cfg, tensorboard_dir=args.tensorboard or None, expert=expert, env=env,
                           bc_checkpoint=args.save_bc, init=init, dist=dist)
    if not dist.is_main:  # torchrun: rank 0 alone writes the policy, the report and the results
        ddp.close(dist)
        return 0
    command = "agent train " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["train"] else "agent train"
    policy.save(out, metadata=json.loads(json.dumps(report_metadata(report, command=command,
                                                                    recordings=[str(d) for d in args.data]),
                                                    default=str)))
    baseline = ""
    if "val_zero_mse" in report.baselines:
        baseline = (f"; baselines: predict 0 {report.baselines['val_zero_mse']:.4f}, predict the training mean "
                    f"{report.baselines['val_mean_mse']:.4f}")
    for r, returns in enumerate(report.dagger_returns):
        print(f"DAgger round {r + 1}/{len(report.dagger_returns)}: student return {np.mean(returns):.1f} "
              f"± {np.std(returns):.1f} on {len(returns)} training tracks")
    print(f"held-out {report.metric} (streaming, every frame): {report.best_metric:.4f} at epoch "
          f"{report.best_epoch}{baseline}")
    print(f"training took {report.seconds['total']:.0f} s -> {out}")
    if args.report:
        _write_json(args.report, report.as_dict())
    ddp.close(dist)
    return 0


def _parse_tracks(specs: list[str], data: list[str]) -> dict[str, str]:
    """``--track DRIVER=TRACK`` options as {driver: track} ("*" for every driver not named)."""
    from agent.train.lodo import driver_names

    tracks = {}
    for spec in specs:
        name, sep, track = spec.partition("=")
        if not sep or not name or not track:
            raise CLIError(f"--track takes DRIVER=TRACK (e.g. b-sh+CarND-Behavioral-Cloning-P3=jungle), got {spec!r}")
        tracks[name] = track
    unknown = sorted(set(tracks) - set(driver_names(data)) - {"*"})
    if unknown:
        raise CLIError(f"--track names unknown driver(s) {', '.join(unknown)}; the drivers are "
                       f"{', '.join(driver_names(data))}")
    return tracks


def _train_lodo(args, cfg, given: dict) -> int:
    """`agent train --env udacity --data D1 D2 ... --leave-one-driver-out OUT` (agent.train.lodo)."""
    import torch

    from agent.data.udacity import AugmentConfig
    from agent.nn.policy import default_config
    from agent.train.lodo import run_lodo

    if args.init or hasattr(args, "out") or args.save_bc:
        raise CLIError("--leave-one-driver-out trains one policy per fold from scratch and writes no policy file; "
                       "drop --init, --out and --save-bc")
    _check_udacity_folders(args.data)
    tracks = _parse_tracks(args.track, args.data)
    reference = None
    if args.reference:
        from agent.actors.loading import load_policy, resolve_policy_path

        reference = load_policy(args.reference)
        if getattr(reference, "output_kind", None) != "steering":
            raise CLIError(f"--reference {args.reference} is not a Udacity steering policy")
        reference.path = str(resolve_policy_path(args.reference))
    if args.threads:
        torch.set_num_threads(args.threads)
    pcfg = default_config("udacity", getattr(args, "core", None), seed=22222 + args.seed, **given)
    table = run_lodo(args.data, args.leave_one_driver_out, pcfg, cfg, _udacity_loader(args, len(args.data)),
                     augment=AugmentConfig(p_augment=args.augment_prob) if args.augment_prob > 0 else None,
                     smooth_labels=args.smooth_labels, smooth_mode=args.smooth_mode, straight_keep=args.straight_keep,
                     subsample=args.subsample, block=args.block, tracks=tracks, reference=reference,
                     folds=args.folds)
    print(table["markdown"])
    print(f"wrote {Path(args.leave_one_driver_out) / 'lodo.md'} and lodo.json")
    return 0


# ----------------------------------------------------------------------------------- evaluate
def _add_evaluate(sub) -> None:
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
    p.add_argument("--crop-cache", default="auto", help="udacity: " + _CROP_CACHE_HELP)
    p.add_argument("--episodes", type=int, default=50, help="carracing: episodes (one track each)")
    p.add_argument("--seed", type=int, default=EVAL_SEED_BASE, help="carracing: track seed of the first episode")
    p.add_argument("--max-steps", type=int, default=None, help="carracing: cap on episode length (default: 1000)")
    p.add_argument("--workers", type=int, default=None,
                   help="carracing: parallel processes, one episode at a time each (default 2; 1 with --envs > 1). "
                        "Give them one core each: on a 2-core machine, two evaluations at once with --workers 1 "
                        "each ran several times slower than the two one after the other with --workers 2")
    p.add_argument("--envs", type=int, default=1, help="carracing: " + _ENVS_HELP + "; use with --workers 1")
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


def _cmd_evaluate(args) -> int:
    from agent.actors.loading import file_kind, resolve_policy_path

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
    from agent.eval.closed_loop import evaluate
    from agent.actors.rollout import SLOW_SPEED

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
    from agent.eval.label_floor import floor_markdown, floor_means, recording_floor
    from agent.train.lodo import driver_names

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
    _check_udacity_folders(args.data)
    tracks = _parse_tracks(args.track, args.data)
    rows = []
    for name, d in zip(driver_names(args.data), args.data):
        rows.append({"recording": name, "track": tracks.get(name, tracks.get("*", "-")),
                     **recording_floor(d, args.half_width, on_bad_row=args.on_bad_row,
                                         exclude_self=args.exclude_self)})
    print(floor_markdown(rows, args.half_width))
    if args.json:
        _write_json(args.json, {"half_widths_s": args.half_width, "exclude_self": args.exclude_self, "recordings": rows,
                                "means": floor_means(rows, args.half_width)})
        print(f"wrote {args.json}")
    return 0


def _evaluate_udacity(args, path, kind, payload) -> int:
    """`agent evaluate --env udacity`: offline steering MSE / MAE on a recording, printed and as JSON."""
    from agent.eval.offline import evaluate_udacity
    from agent.actors.loading import LOADERS
    from agent.nn.policy import file_digest

    if not args.data:
        raise CLIError("--env udacity needs --data: a recording folder holding driving_log.csv and IMG/")
    _check_udacity_folders(args.data)
    if kind not in LOADERS:
        raise CLIError(f"{path} holds a policy of kind {kind!r}, which this version cannot load")
    policy = LOADERS[kind](path, payload, "cpu")
    if getattr(policy, "output_kind", None) != "steering" or getattr(policy.config, "env", None) != "udacity":
        raise CLIError(f"{path} is not a Udacity steering policy (make one with `agent train --env udacity`)")
    head = {"policy": str(path), "policy_sha256": file_digest(path), "env": "udacity", "core": policy.config.core}
    if len(args.data) > 1:
        return _evaluate_udacity_many(args, policy, head)
    res = {**head, **evaluate_udacity(policy, _udacity_loader(args, 1)(args.data[0]))}
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
        _write_json(args.json, res)
        print(f"wrote {args.json}")
    return 0


def _evaluate_udacity_many(args, policy, head: dict) -> int:
    """`agent evaluate --env udacity --data D1 D2 ...`: one row per recording and the means, printed and as JSON."""
    from agent.eval.offline import evaluate_udacity, summarize_recordings
    from agent.train.lodo import ORACLE_COLUMN, driver_names

    load = _udacity_loader(args, len(args.data))
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
        _write_json(args.json, {**head, "recordings": rows, "summary": summary})
        print(f"wrote {args.json}")
    return 0


# ----------------------------------------------------------------------------------- compare
def _add_compare(sub) -> None:
    from agent.compare.cells import DEFAULT_CORES, Protocol

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
                   help="DAgger: " + _START_RULE_HELP)
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


def _cmd_compare(args) -> int:
    from agent.compare.cells import Protocol, parse_variants, run_comparison
    from agent.compare.report import write_report

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


# ----------------------------------------------------------------------------------- drive
def _add_drive(sub) -> None:
    from agent.drive.args import add_drive_arguments

    p = sub.add_parser("drive", help="watch a policy drive (also the `drive` command)", formatter_class=FMT,
                       description="Run a policy in the simulator with a live window (frame, action, speed, "
                                   "return, FPS). Without a display, or with --headless, it runs without a "
                                   "window; --record writes an mp4.")
    add_drive_arguments(p)


def _cmd_drive(args) -> int:
    from agent.drive.session import run_drive

    return run_drive(args)


# ----------------------------------------------------------------------------------- bench
def _add_bench(sub) -> None:
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


def _cmd_bench(args) -> int:
    if args.bench_command == "bridge":
        from agent.bench.bridge import bench_bridge, bench_bridge_policy, print_bridge_table

        if args.n < 10 or args.warmup < 0:
            raise CLIError("--n must be >= 10 and --warmup >= 0")
        rows = bench_bridge_policy(args.policy, args.n, args.warmup) if args.policy else \
            [bench_bridge(args.n, None, args.warmup)]
        print_bridge_table(rows)
        return 0
    if args.bench_command == "drive":
        from agent.bench.drive import DisplayUnavailable, bench_drive, print_drive_table

        if args.steps < 10 or args.rounds < 1 or args.fps_limit < 0:
            raise CLIError("--steps must be >= 10, --rounds >= 1 and --fps-limit >= 0")
        try:
            rows = bench_drive(args.policy, args.steps, rounds=args.rounds, window=args.window, record=args.record,
                               fps_limit=args.fps_limit)
        except DisplayUnavailable as exc:
            raise CLIError(f"--window: {exc}") from exc
        print_drive_table(rows)
        if args.json:
            _write_json(args.json, rows)
        return 0
    if args.bench_command == "rollouts":
        from agent.bench.rollouts import bench_rollouts, print_rollouts_table

        if args.episodes < 1 or args.max_steps < 1 or min(args.envs) < 1:
            raise CLIError("--episodes, --max-steps and every --envs must be >= 1")
        rows = bench_rollouts(args.policies, args.envs, args.episodes, args.max_steps, args.seed)
        print_rollouts_table(rows)
        if args.json:
            _write_json(args.json, rows)
        return 0
    from agent.bench import nac as bench

    if args.clock == "cpu" and args.threads != 1:
        raise CLIError("--clock cpu measures one thread's CPU time: add --threads 1")
    rows = bench.bench_nac(sizes=tuple(args.sizes), block_sizes=tuple(args.block_sizes), repeats=args.repeats,
                           peer=not args.no_peer, threads=args.threads, clock=args.clock,
                           baselines=() if args.no_baselines else ("mha", "lstm"),
                           train_T=args.train_T or None, step_window=args.step_window or None)
    bench.print_table(rows)
    if args.json:
        _write_json(args.json, rows)
    return 0


# ----------------------------------------------------------------------------------- plot-traces
def _add_plot_traces(sub) -> None:
    p = sub.add_parser("plot-traces", help="plot NAC traces dumped by drive --dump-traces (the paper's Figure 4)",
                       formatter_class=FMT,
                       description="Read a trace file written by `drive --dump-traces` and draw omega, the logits, "
                                   "phi and the attention weights (mean over the kept keys) over the run, each step "
                                   "coloured by the action taken, with their distribution per action beside them, "
                                   "as in the paper's Figure 4 (arXiv 2512.10282).")
    p.add_argument("traces", help="the .npz written by drive --dump-traces")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--head", type=int, default=None, help="plot this head (0-based) instead of the mean over heads")
    p.add_argument("--size", type=int, nargs=2, default=[1600, 1000], metavar=("W", "H"), help="PNG size in pixels")


def _cmd_plot_traces(args) -> int:
    from agent.drive.traces import plot_traces

    if min(args.size) < 200:
        raise CLIError(f"--size must be at least 200 x 200 pixels, got {args.size[0]} x {args.size[1]}")
    out = plot_traces(args.traces, args.out, head=args.head, size=tuple(args.size))
    print(f"wrote {out}")
    return 0


# ----------------------------------------------------------------------------------- wiring
def _add_wiring(sub) -> None:
    p = sub.add_parser("wiring", help="draw a policy's NCP wiring (the NAC backbone) as a PNG", formatter_class=FMT,
                       description="Draw the AutoNCP wiring of the policy's NAC backbone with ncps (networkx + "
                                   "matplotlib): the pair-input sensory neurons, inter, command and motor neurons, "
                                   "excitatory (green) and inhibitory (red) synapses.")
    p.add_argument("--policy", default="nac.pt", help="policy file (a bare name is looked up in policies/)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--layout", default="shell", choices=["shell", "circular", "kamada", "spring", "spectral", "spiral"],
                   help="networkx layout")


def _cmd_wiring(args) -> int:
    from agent.actors.loading import load_policy
    from agent.drive.wiring import draw_wiring, wiring_summary

    policy = load_policy(args.policy)
    if getattr(policy, "nac", None) is None:
        raise CLIError(f"{args.policy} has no NAC core (its core: {getattr(policy.config, 'core', 'none')}); "
                       "only nac-* cores have an NCP wiring to draw")
    out = draw_wiring(policy, args.out, layout=args.layout)
    counts = wiring_summary(policy.nac.wiring)
    print(f"wrote {out}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


# ----------------------------------------------------------------------------------- convert-policy
def _add_convert(sub) -> None:
    p = sub.add_parser("convert-policy", help="convert a format-1 policy file to the current format",
                       formatter_class=FMT,
                       description="Policy files written before the policy classes were unified (format 1: kinds "
                                   "'nac-drive-policy' and 'nac-udacity-policy') are rewritten as the one "
                                   "DrivingPolicy format (2). The weights are unchanged, so the converted policy "
                                   "acts identically. (load_policy also converts format-1 files in memory.)")
    p.add_argument("src", help="the format-1 policy file")
    p.add_argument("dst", help="where to write the converted file (may equal src)")


def _cmd_convert(args) -> int:
    from agent.nn.legacy import convert_policy_file

    policy = convert_policy_file(args.src, args.dst)
    print(f"converted {args.src} -> {args.dst}: {policy.config.env}, {policy.config.features} + {policy.config.core} "
          f"(window {policy.config.window}) + {policy.head.kind} head")
    return 0


# ----------------------------------------------------------------------------------- average-policies
def _add_average(sub) -> None:
    p = sub.add_parser("average-policies", help="average the weights of policies trained from one start (a model soup)",
                       formatter_class=FMT,
                       description="Writes one policy whose weights are the (weighted) mean of the given policy "
                                   "files' (a uniform 'model soup', Wortsman et al. 2022). Meant for DAgger runs "
                                   "that started from the same behaviour-cloning checkpoint with different seeds: "
                                   "the result is one network of the same size and speed. Every file must have the "
                                   "same configuration. Evaluate the result closed loop (agent evaluate) before "
                                   "trusting it: runs that drifted apart average into a worse policy.")
    p.add_argument("policies", nargs="+", help="two or more .pt policy files (names in policies/ work too)")
    p.add_argument("--weights", type=float, nargs="+", default=None,
                   help="one non-negative weight per policy (normalised to sum 1; default uniform)")
    p.add_argument("--out", required=True, help="the averaged policy file to write")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")


def _cmd_average(args) -> int:
    from agent.train.soup import average_policies

    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise CLIError(f"{out} already exists; choose another --out or pass --overwrite")
    soup = average_policies(args.policies, args.weights)
    soup.save(out, metadata={"stage": "weight average (model soup)", "averaged": [str(p) for p in args.policies],
                             "weights": args.weights})
    print(f"averaged {len(args.policies)} policies -> {out} ({soup.config.core}, window {soup.config.window}, "
          f"{sum(p.numel() for p in soup.parameters())} parameters)")
    return 0


# ----------------------------------------------------------------------------------- main
COMMANDS = {
    "expert": (_add_expert, _cmd_expert),
    "collect": (_add_collect, _cmd_collect),
    "train": (_add_train, _cmd_train),
    "evaluate": (_add_evaluate, _cmd_evaluate),
    "compare": (_add_compare, _cmd_compare),
    "drive": (_add_drive, _cmd_drive),
    "bench": (_add_bench, _cmd_bench),
    "plot-traces": (_add_plot_traces, _cmd_plot_traces),
    "wiring": (_add_wiring, _cmd_wiring),
    "convert-policy": (_add_convert, _cmd_convert),
    "average-policies": (_add_average, _cmd_average),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add, _ in COMMANDS.values():
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agent``. Returns the exit code (2 for a user error, printed as one line)."""
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command][1](args)
    except (CLIError, FileNotFoundError, FileExistsError, ValueError) as exc:
        print(f"agent {args.command}: error: {exc}", file=sys.stderr)
        return 2


def drive_main(argv: list[str] | None = None) -> int:
    """Entry point of ``drive`` (the same as ``agent drive``)."""
    return main(["drive", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
