"""`agent collect`: the expert (or a person, --keyboard) drives; the frames are recorded as a Minari dataset.

The options are :class:`CollectRun`, parsed by tyro; the demonstrator is ``--teacher.expert`` with
the teacher's rules (:class:`agent.train.config.TeacherSection`, the same names as in every command
that drives a teacher).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agent.actors.loading import is_continuous, load_policy, make_actor, make_carracing_for
from agent.actors.record import KeyboardActor, collect
from agent.actors.vector import BatchExpertActor, collect as collect_vector, envs_for
from agent.cli.common import CLIError, parse_config, teacher_rule_options
from agent.data.recordings import dataset_layout
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import RuleError
from agent.log import get_logger
from agent.train.config import ConfigError, TeacherSection, check_device, torch_device
from envs.carracing import make_carracing
from envs.tracks import EVAL_SEED_BASE

DESCRIPTION = """Record demonstrations (the expert or you, --keyboard) as a Minari dataset.

Step the real, rendered env with the expert (--teacher.expert) or you (--keyboard) acting and
record the 96x96 frames the student sees, the actions, rewards, terminations, truncations and each
episode's track seed. A continuous expert (`agent expert train --ppo.continuous`) drives and
records the continuous configuration: actions (steering, throttle) in [-1, 1]. Episodes run on
tracks --track-seed, --track-seed+1, ... Every finished episode is on disk at once: Ctrl-C, SIGTERM,
a kill or a full disk keeps them (exit 130 after Ctrl-C)."""

TEACHER_HELP = ("the demonstrator: the PPO expert .zip that drives (--teacher.expert; a bare name is looked up in "
                "policies/) and the rules it drives with. The start rule (off by default, as everywhere): gas at a "
                "standstill (speed < 1 unit/s) whatever its network chose, and gas instead of brake below the brake "
                "floor (10 units/s; a continuous expert: full throttle, its steering kept); either expert can "
                "otherwise brake a slow car to a halt and brake or steer at rest until the time limit (README, \"The "
                "expert's stalls\"). The creep and grass rules are the discrete expert's")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class CollectRun:
    """``agent collect``: record demonstrations as a Minari dataset.

    Raises:
        ConfigError: a value out of range (when built), or from :meth:`check`, options that do not
            go together or an --out that exists; one line naming the option.
    """

    out: str
    """dataset folder ROOT/NAMESPACE/NAME-vN, e.g. recordings/nac-drive/expert-0-19-v0 (Minari id nac-drive/expert-0-19-v0)"""
    env: Literal["carracing"] = "carracing"
    """simulator"""
    keyboard: bool = False
    """drive yourself with the arrow keys (needs a display) instead of --teacher.expert"""
    episodes: int = 40
    """episodes to record"""
    track_seed: int = 0
    """the first track (CarRacing seed): episode i drives track track_seed+i"""
    max_steps: int | None = None
    """cap on episode length (None: the env's 1000)"""
    envs: int = 1
    """CarRacing envs stepped at once, each in its own process, the expert acting on their batch (1: in this process)"""
    overwrite: bool = False
    """replace --out if it exists"""
    device: str = "auto"
    """torch device of the expert: auto (cuda when there is one), cpu, cuda, cuda:N"""
    teacher: Annotated[TeacherSection, tyro.conf.arg(help=TEACHER_HELP)] = TeacherSection()

    def __post_init__(self):
        check_device(self.device)
        _need(self.episodes >= 1, f"--episodes must be >= 1, got {self.episodes}")
        _need(self.envs >= 1, f"--envs must be >= 1, got {self.envs}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}")
        _need(self.track_seed >= 0, f"--track-seed must be >= 0, got {self.track_seed}")

    def check(self) -> "CollectRun":
        """The rules between options, and the dataset the run would replace; returns self.

        Raises:
            ConfigError: neither or both of --teacher.expert and --keyboard; --keyboard with --envs
                or teacher rules; a brake floor without the start rule; an --out that exists
                without --overwrite.
        """
        t = self.teacher
        _need(bool(t.expert) != self.keyboard, "give the demonstrator: --teacher.expert EXPERT.zip (the PPO expert "
              "drives) or --keyboard (you drive)" + (", not both" if self.keyboard else ""))
        if self.keyboard:
            _need(self.envs == 1, f"--envs must be 1 with --keyboard (one person drives one car), got {self.envs}")
            rules = teacher_rule_options(t)
            _need(not rules, f"{', '.join(rules)}: the teacher's rules are the PPO expert's; --keyboard drives "
                             "without them")
        _need(t.brake_floor is None or t.start_rule,
              "--teacher.brake-floor is the start rule's floor: add --teacher.start-rule")
        _need(self.overwrite or not Path(self.out).exists(),
              f"{self.out} already exists; choose another --out or pass --overwrite")
        return self


def main(argv: list[str]) -> int:
    """Run ``agent collect ARGV``; the exit code: 0 when the recording ended (every episode, or
    Escape with --keyboard), 130 after Ctrl-C or SIGTERM (the finished episodes kept and counted),
    1 when no episode was recorded.

    Raises:
        OSError: a write failed (a full disk: "disk full ..."); the message names the file and the
            episodes kept. The dispatcher prints it as one line and exits with 1.
    """
    run = parse_config(CollectRun, argv, prog="agent collect", description=DESCRIPTION)
    out = Path(run.out)
    _, dataset_id = dataset_layout(out)  # RecordingError (a ValueError, exit 2) suggests a valid path
    if run.track_seed + run.episodes > EVAL_SEED_BASE:
        get_logger(__name__).warning("tracks >= %d are the evaluation tracks; recording on them leaks test data",
                                     EVAL_SEED_BASE)
    description = expert = None
    if run.keyboard:
        actor, name, env = KeyboardActor(), "keyboard", make_carracing()
    else:
        expert = load_policy(run.teacher.expert, device=torch_device(run.device))
        if not isinstance(expert, ExpertPolicy):
            raise CLIError(f"--teacher.expert takes the PPO expert's .zip (`agent expert train`); {run.teacher.expert} "
                           "is a student policy")
        try:  # strict: a continuous expert refuses the creep and grass rules (they are the discrete one's)
            run.teacher.rules.apply(expert, strict=True)
        except RuleError as exc:
            raise CLIError(f"--teacher.{exc.rule.replace('_', '-')}: {exc}") from exc
        actor, name = make_actor(expert), "ppo-expert"
        env = make_carracing_for(expert)  # the continuous configuration for a continuous expert
        if is_continuous(expert):
            description = ("CarRacing demonstrations by ppo-expert, continuous configuration: actions (steering, "
                           "throttle) in [-1, 1] (envs.carracing.ThrottleAction)")
    if run.envs > 1:
        env.close()
        envs = envs_for(expert, run.envs, render_pixels=True)  # the student's frames are what is recorded
        writer = collect_vector(envs, BatchExpertActor(expert), run.episodes, run.track_seed, out, name,
                                overwrite=run.overwrite, max_steps=run.max_steps, description=description)
    else:
        writer = collect(env, actor, run.episodes, run.track_seed, out, name, overwrite=run.overwrite,
                         max_steps=run.max_steps, description=description)
    kind = "continuous (steering, throttle)" if description else "discrete"
    stopped = "interrupted: " if writer.interrupted else ""
    if writer.episodes:
        print(f"{stopped}recorded {writer.episodes} episode(s), {writer.steps} steps, {kind} actions -> {out} "
              f"(Minari dataset {dataset_id})")
    else:
        print(f"{stopped}no episode finished; nothing was recorded ({out} was not made)")
    if writer.interrupted:
        return 130  # the dispatcher's code for Ctrl-C; the finished episodes are kept
    return 0 if writer.episodes else 1


__all__ = ["CollectRun", "DESCRIPTION", "main"]
