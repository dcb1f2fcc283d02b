"""`agent train`: behaviour cloning (+ DAgger) of a driving policy, and the leave-one-driver-out evaluation (Udacity)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agent.actors.loading import is_continuous, load_policy, make_carracing_for, reads_speedometer, resolve_policy_path
from agent.actors.perturb import KINDS
from agent.actors.vector import envs_for
from agent.cli.common import (CROP_CACHE_HELP, ENVS_HELP, FMT, RULE_OPTIONS, START_RULE_HELP, CLIError,
                              check_udacity_folders, parse_tracks, udacity_loader, write_json)
from agent.data.recordings import load_demonstrations
from agent.data.udacity import AugmentConfig
from agent.data.windows import DemonstrationSource, UdacitySource
from agent.experts.rules import RuleError, TeacherRules
from agent.log import get_logger
from agent.nn.cores import CORES, make_core
from agent.nn.policy import DrivingPolicy, default_config, default_core_kwargs
from agent.train import distributed as ddp
from agent.train.bc import TRAIN_DEFAULTS, TrainConfig, report_metadata
from agent.train.lodo import run_lodo, subsample_blocks
from agent.train.run import train
from envs.tracks import EVAL_SEED_BASE


def add_parser(sub) -> None:
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
                   help="carracing DAgger: " + START_RULE_HELP)
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
    p.add_argument("--envs", type=int, default=1, help="carracing, DAgger rollouts: " + ENVS_HELP)
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
    p.add_argument("--crop-cache", default="auto", help="udacity: " + CROP_CACHE_HELP)
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


#: `agent train` options that only one simulator uses, with the value that means "not given"
_ENV_ONLY = {"udacity": {"augment_prob": 0.6, "smooth_labels": 1, "on_bad_row": "skip", "smooth_mode": "centred",
                         "straight_keep": 1.0, "crop_cache": "auto", "leave_one_driver_out": None},
             "carracing": {"expert": None, "dagger_rounds": 0, "dagger_beta": 0.5, "dagger_beta_decay": 0.5,
                           "dagger_disturb": 0.0, "dagger_disturb_kinds": "off-road,stop", "dagger_out": None,
                           "dagger_max_steps": None, "dagger_seed": None, "dagger_edge_weight": 1.0,
                           "dagger_edge_horizon": 10,
                           "save_bc": None, "start_rule": False, "creep_speed": 0.0, "brake_floor": None,
                           "grass_rule": False, "envs": 1}}


def _load_source(env: str, data: list[str], args):
    """The training source of --data for a simulator (CarRacing: Minari recordings; Udacity: CSV folders)."""
    if env == "carracing":
        demos = load_demonstrations(data)  # RecordingError if they mix action kinds
        demos = _relabel_recorded(demos, _teacher_rules(args))
        return DemonstrationSource(demos, skip_stalls=getattr(args, "skip_stalls", False),
                                   standstills=getattr(args, "standstills", 0.0))

    if getattr(args, "standstills", 0.0):
        raise CLIError("--standstills is CarRacing's (synthetic standstills of its frames); leave it out for udacity")
    check_udacity_folders(data)
    load = udacity_loader(args, len(data))
    recs = [load(d) for d in data]
    fraction, block = getattr(args, "subsample", 1.0), getattr(args, "block", 32)
    if fraction < 1.0:  # the same cut as a leave-one-driver-out fold's (agent.train.lodo), one rng per recording
        import numpy as np

        recs = [piece for j, r in enumerate(recs)
                for piece in subsample_blocks(r, fraction, block, np.random.default_rng([args.seed, j]))]

        get_logger("agent.train").info("--subsample %.2f: %d frames in %d pieces of the %d recordings", fraction,
                 sum(len(r) for r in recs), len(recs), len(data))
    return UdacitySource(recs, AugmentConfig(p_augment=args.augment_prob), smooth_labels=args.smooth_labels,
                         smooth_mode=args.smooth_mode, straight_keep=args.straight_keep, seed=args.seed)


def _teacher_rules(args):
    """The teacher's rules of `agent train`'s --start-rule, --creep-speed, --brake-floor and --grass-rule
    (absent options: off; the values were checked by :func:`run`)."""
    try:
        return TeacherRules(start_rule=getattr(args, "start_rule", False),
                            creep_speed=getattr(args, "creep_speed", 0.0),
                            brake_floor=getattr(args, "brake_floor", None),
                            grass_rule=getattr(args, "grass_rule", False))
    except RuleError as exc:
        raise CLIError(f"{RULE_OPTIONS[exc.rule]}: {exc}") from exc


#: how `agent train` names a recording rule that ran (:meth:`agent.experts.rules.TeacherRules.relabel`)
_RULE_FLAGS = {"creep_speed": lambda r: f"--creep-speed {r.creep_speed:.1f}",
               "brake_floor": lambda r: f"--brake-floor {r.brake_floor:.1f}",
               "grass_rule": lambda r: "--grass-rule"}


def _relabel_recorded(demos, rules):
    """``rules.relabel(demos)`` (the teacher's rules applied to recorded labels), logging
    "<flag>: N of M recorded <what>" per rule. Raises CLIError, naming the flag, where a rule does
    not apply (continuous recordings, frames that are not CarRacing's)."""
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
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise CLIError(f"--dagger-disturb-kinds {text!r}: choose a comma-separated subset of {', '.join(KINDS)}")
    return kinds


def run(args) -> int:
    import numpy as np

    other = "udacity" if args.env == "carracing" else "carracing"
    wrong = [k for k, unset in _ENV_ONLY[other].items() if getattr(args, k) != unset]
    if wrong:
        raise CLIError(f"{', '.join('--' + k.replace('_', '-') for k in wrong)} only apply to --env {other}")
    if args.dagger_seed is not None:
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
        write_json(args.report, report.as_dict())
    ddp.close(dist)
    return 0


def _train_lodo(args, cfg, given: dict) -> int:
    """`agent train --env udacity --data D1 D2 ... --leave-one-driver-out OUT` (agent.train.lodo)."""
    import torch

    if args.init or hasattr(args, "out") or args.save_bc:
        raise CLIError("--leave-one-driver-out trains one policy per fold from scratch and writes no policy file; "
                       "drop --init, --out and --save-bc")
    check_udacity_folders(args.data)
    tracks = parse_tracks(args.track, args.data)
    reference = None
    if args.reference:
        reference = load_policy(args.reference)
        if getattr(reference, "output_kind", None) != "steering":
            raise CLIError(f"--reference {args.reference} is not a Udacity steering policy")
        reference.path = str(resolve_policy_path(args.reference))
    if args.threads:
        torch.set_num_threads(args.threads)
    pcfg = default_config("udacity", getattr(args, "core", None), seed=22222 + args.seed, **given)
    table = run_lodo(args.data, args.leave_one_driver_out, pcfg, cfg, udacity_loader(args, len(args.data)),
                     augment=AugmentConfig(p_augment=args.augment_prob) if args.augment_prob > 0 else None,
                     smooth_labels=args.smooth_labels, smooth_mode=args.smooth_mode, straight_keep=args.straight_keep,
                     subsample=args.subsample, block=args.block, tracks=tracks, reference=reference,
                     folds=args.folds)
    print(table["markdown"])
    print(f"wrote {Path(args.leave_one_driver_out) / 'lodo.md'} and lodo.json")
    return 0
