"""`agent expert train` (the PPO expert) and `agent expert check-recovery`.

``expert train``'s options are :class:`agent.train.config.ExpertRun` (``--config FILE.toml`` loads a
recipe first, with stages, as ``agent train``'s); ``expert check-recovery``'s are
:class:`CheckRecoveryRun`, whose expert is ``--teacher.expert`` with the teacher's rules
(:class:`agent.train.config.TeacherSection`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
import tyro

from agent.actors.loading import load_policy, make_actor, make_carracing_for, resolve_policy_path
from agent.cli.common import CLIError, parse_config, teacher_rule_options, write_json
from agent.cli.recipe import parse_stages, run_stages, stage_done, write_resolved
from agent.eval.recovery import recovery_check, summarize
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import RuleError
from agent.log import get_logger
from agent.train.config import ConfigError, ExpertRun, TeacherSection, torch_device
from agent.train.ppo import ExpertConfig, train_expert
from envs.carracing import make_carracing

log = get_logger("agent.expert")

DESCRIPTION = """The PPO expert that records demonstrations and labels DAgger's states: stable-baselines3 PPO on
CarRacing's privileged-state view (speed, yaw rate, wheels, next waypoints), with the pixel rendering
skipped while training.

  agent expert train           train the expert with PPO (`agent expert train --help`)
  agent expert check-recovery  does the expert (or a student, --policy) recover from off-road and standstill?"""

TRAIN_DESCRIPTION = """Train a PPO expert on privileged CarRacing state.

The checkpoint with the best mean return on held-out tracks (--ppo.keep last: the last one) is
written to --out; TensorBoard logs go to --tensorboard. About 30 minutes on a 2-core CPU for 3M
steps. --out must not exist unless --overwrite is given.

Configuration: `agent expert train --config recipes/carracing-expert-margin.toml [--SECTION.FIELD VALUE ...]`
loads a TOML recipe (its stages run in order, each from the previous stage's expert, and a rerun
skips the finished ones) and overrides any field from the command line. The resolved config is
written to RUN_DIR/config.toml."""

CHECK_DESCRIPTION = """Before the expert labels recoveries in DAgger, check that it recovers itself.

On each track the expert (--teacher.expert, with the teacher's rules as DAgger uses them) drives;
at --start one disturbance steers it off the road (40 steps of hard steering) or brakes it to a
standstill (100 steps); then it drives on its own. Recovered: back on the road and moving within the
next --limit steps. Also runs each track undisturbed for the return it loses. With --policy the same
check runs on a student policy (.pt): does it start again after a stop on a track it never saw?"""

TEACHER_HELP = ("the expert checked (unless --policy): the PPO expert .zip (--teacher.expert; a bare name is looked up "
                "in policies/) and the rules it drives with, as `agent train`'s DAgger teacher labels (all off by "
                "default): the start rule (gas at a standstill, no brake below the brake floor, 10 units/s), the creep "
                "and grass rules (discrete experts). The rules also apply to an expert .zip given as --policy")

#: check-recovery's expert when --teacher.expert is not given
DEFAULT_EXPERT = "carracing-expert-discrete-margin.zip"
#: the first track of check-recovery: outside the training, DAgger and evaluation tracks
RECOVERY_SEED = 600_000


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class CheckRecoveryRun:
    """``agent expert check-recovery``: does the expert (or a student) recover from off-road and standstill?

    Raises:
        ConfigError: a value out of range (when built), or from :meth:`check`, a brake floor
            without the start rule or a --json that exists; one line naming the option.
    """

    policy: str | None = None
    """check this CarRacing policy instead of the expert: a student .pt (its own actions and view) or another .zip"""
    episodes: int = 20
    """tracks"""
    track_seed: int = RECOVERY_SEED
    """the first track (CarRacing seed): episode i drives track track_seed+i (outside training and evaluation)"""
    start: int = 250
    """step at which the disturbance begins"""
    limit: int = 250
    """steps after the disturbance within which it must recover"""
    max_steps: int | None = None
    """cap on episode length (None: the env's 1000)"""
    json: str | None = None
    """write every episode and the summary here"""
    overwrite: bool = False
    """replace an existing --json file"""
    teacher: Annotated[TeacherSection, tyro.conf.arg(help=TEACHER_HELP)] = TeacherSection(expert=DEFAULT_EXPERT)

    def __post_init__(self):
        _need(self.episodes >= 1, f"--episodes must be >= 1, got {self.episodes}")
        _need(self.track_seed >= 0, f"--track-seed must be >= 0, got {self.track_seed}")
        _need(self.start >= 0 and self.limit >= 1, f"--start must be >= 0 and --limit >= 1 steps, got {self.start} and "
                                                   f"{self.limit}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}")

    def check(self) -> "CheckRecoveryRun":
        """The rules between options, and the --json the run would replace; returns self."""
        _need(self.policy is not None or bool(self.teacher.expert),
              "give the expert to check (--teacher.expert EXPERT.zip) or a policy (--policy P)")
        _need(self.teacher.brake_floor is None or self.teacher.start_rule,
              "--teacher.brake-floor is the start rule's floor: add --teacher.start-rule")
        _need(self.json is None or self.overwrite or not Path(self.json).exists(),
              f"{self.json} already exists; choose another --json or pass --overwrite")
        return self


def main(argv: list[str]) -> int:
    """Run ``agent expert SUBCOMMAND ARGV``; the exit code."""
    commands = {"train": train_main, "check-recovery": check_recovery_main}
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: agent expert {{{','.join(commands)}}} [OPTIONS]\n\n{DESCRIPTION}")
        return 0 if argv else 2
    if argv[0] not in commands:
        close = difflib.get_close_matches(argv[0], commands, n=1)
        raise CLIError(f"unknown subcommand {argv[0]!r}: choose {' or '.join(close or commands)}")
    return commands[argv[0]](argv[1:])


def train_main(argv: list[str]) -> int:
    """Run ``agent expert train ARGV``: every stage of the recipe; the exit code."""
    stages = parse_stages(ExpertRun, argv, prog="agent expert train", description=TRAIN_DESCRIPTION)
    for name, run in stages:  # every stage's --out before the first one runs (a recipe's stages take hours)
        if run.out_path.exists() and not run.overwrite and not (name and stage_done(run, run.run_path / "config.toml")):
            raise CLIError(f"{run.out_path} already exists{f' (stage {name})' if name else ''}; choose another --out "
                           "or pass --overwrite")
    return run_stages(stages, train_one, lambda run: run.run_path / "config.toml")


def train_one(run: ExpertRun) -> int:
    """One PPO run (one stage of a recipe), validated already; the exit code."""
    out = run.out_path
    if out.exists() and not run.overwrite:
        raise CLIError(f"{out} already exists; choose another --out or pass --overwrite")
    init = str(resolve_policy_path(run.init)) if run.init else None  # FileNotFoundError: one line, before any work
    resolved = run.resolved()
    write_resolved(run, run.run_path / "config.toml")
    log.info("resolved config -> %s", run.run_path / "config.toml")
    if resolved.threads:
        torch.set_num_threads(resolved.threads)
    p = resolved.ppo
    cfg = ExpertConfig(timesteps=p.timesteps, seed=resolved.seed, n_envs=resolved.envs, action_repeat=p.action_repeat,
                       learning_rate=p.lr, ent_coef=p.ent_coef, device=torch_device(resolved.device),
                       continuous=p.continuous, disturbed_starts=p.disturbed_starts,
                       offtrack_patience=p.offtrack_patience, init=init, wheel_off_penalty=p.wheel_off_penalty,
                       keep=p.keep)
    train_expert(cfg, out, tensorboard_dir=resolved.tensorboard or None)
    print(f"expert -> {out}")
    return 0


def check_recovery_main(argv: list[str]) -> int:
    """Run ``agent expert check-recovery ARGV``; the exit code."""
    run = parse_config(CheckRecoveryRun, argv, prog="agent expert check-recovery", description=CHECK_DESCRIPTION)
    t = run.teacher
    driver = load_policy(run.policy or t.expert)
    rules = teacher_rule_options(t)
    if rules and not isinstance(driver, ExpertPolicy):
        raise CLIError(f"{', '.join(rules)}: the teacher's rules are the PPO expert's; the policy checked "
                       f"({run.policy}) is not one")
    if isinstance(driver, ExpertPolicy):
        try:  # strict: a continuous expert refuses the creep and grass rules (they are the discrete one's)
            t.rules.apply(driver, strict=True)
        except RuleError as exc:
            raise CLIError(f"--teacher.{exc.rule.replace('_', '-')}: {exc}") from exc
        env = make_carracing(privileged=True, continuous=driver.continuous)
    elif run.policy is None:
        raise CLIError(f"{t.expert} is not a PPO expert .zip (to check a student policy, pass it as --policy)")
    else:
        policy_env = getattr(getattr(driver, "config", None), "env", "carracing")
        if policy_env != "carracing":
            raise CLIError(f"{run.policy} is a {policy_env} policy; the recovery check drives CarRacing")
        env = make_carracing_for(driver)
    seeds = range(run.track_seed, run.track_seed + run.episodes)
    results = recovery_check(env, make_actor(driver), seeds, start=run.start, limit=run.limit,
                             max_steps=run.max_steps)
    out = summarize(results)
    for kind, s in out["summary"].items():
        med = "-" if s["median_steps_to_recover"] is None else f"{s['median_steps_to_recover']:.0f}"
        print(f"{kind:9s} recovered {s['recovered']}/{s['episodes']}  median steps to recover {med}  "
              f"return {s['mean_disturbed_return']:.1f} disturbed vs {s['mean_undisturbed_return']:.1f} undisturbed")
    if run.json:
        write_json(run.json, {"expert" if run.policy is None else "policy": str(run.policy or t.expert),
                              "seed": run.track_seed, "start_rule": t.start_rule, "creep_speed": t.creep_speed,
                              "brake_floor": getattr(driver, "brake_floor", None) if t.start_rule else None,
                              "grass_rule": t.grass_rule, **out})
    return 0


__all__ = ["CHECK_DESCRIPTION", "CheckRecoveryRun", "DESCRIPTION", "TRAIN_DESCRIPTION", "check_recovery_main", "main",
           "train_main", "train_one"]
