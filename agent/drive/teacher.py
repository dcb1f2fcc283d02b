"""The teacher's view of a ``drive`` run: what the PPO expert would do in every state the policy visits.

``drive --teacher.expert EXPERT.zip`` asks the expert (:class:`agent.experts.policy.ExpertPolicy`, the
DAgger teacher, with its start rule unless ``--teacher.no-start-rule``, and optionally its creep, brake-floor and
grass rules) for its action in the state the policy is about to act on, before the policy acts. The HUD shows it beside the policy's action,
each episode's line prints how often the two agree, and ``--dump-traces`` stores it per step
(``teacher_action``, ``teacher_class``). It is DAgger's relabelling (Ross, Gordon and Bagnell,
"A Reduction of Imitation Learning and Structured Prediction to No-Regret Online Learning",
AISTATS 2011) run as a diagnostic: the first steps where the two part before the car leaves the
road show where a failure starts, and whether the teacher itself would have done better there.

The env must run in this process: the expert reads the car's privileged state from the env object.
"""

from __future__ import annotations

from pathlib import Path

from agent.actors.loading import resolve_policy_path
from agent.actors.rollout import steering_class
from agent.drive.traces import action_number
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import TeacherRules


class Teacher:
    """An expert that labels the states of a run, and the per-episode agreement with the policy.

    Args:
        expert: a loaded :class:`agent.experts.policy.ExpertPolicy`.
        continuous_policy: the policy drives CarRacing's continuous configuration ((steering,
            throttle) actions); the expert must then be continuous too, and vice versa.
        rules: the teacher's rules (:class:`agent.experts.rules.TeacherRules`, applied strictly:
            the creep and grass rules are the discrete expert's); default: the start rule alone,
            the setting of a DAgger teacher.
        name: the expert's file name, for messages and the trace file.

    Agreement is counted on action classes: the discrete action index (0..4), or for continuous
    actions the steering class (0 straight, 1 left, 2 right; :func:`agent.actors.rollout.steering_class`).

    Raises:
        ValueError: the expert's action space does not match the policy's, or a creep rule for a
            continuous expert or below 0, a brake floor below 0, or a grass rule for a continuous expert.
    """

    def __init__(self, expert, continuous_policy: bool, rules: TeacherRules | None = None, name: str = "expert"):
        if bool(expert.continuous) != bool(continuous_policy):
            kind = ("continuous (steering, throttle)" if expert.continuous else "five discrete actions")
            want = "a continuous expert" if continuous_policy else "a discrete expert"
            raise ValueError(f"--teacher.expert {name} drives with {kind}, but the policy does not; give {want} "
                             f"(e.g. {'carracing-expert-margin.zip' if continuous_policy else 'carracing-expert-discrete-margin.zip'})")
        self.expert = (rules if rules is not None else TeacherRules(start_rule=True)).apply(expert, strict=True)
        self.continuous = bool(expert.continuous)
        self.name = name
        self.steps = 0
        self.agreed = 0

    @classmethod
    def load(cls, name: str | Path, continuous_policy: bool, rules: TeacherRules | None = None) -> "Teacher":
        """Load the expert ``name`` (a path, or a bare name looked up in ``policies/``) as a teacher
        with ``rules`` (see :class:`Teacher`).

        Raises:
            ValueError: no such file (the message lists the shipped policies), a file that is not
                a PPO expert, or the mismatches of :class:`Teacher`.
        """
        try:
            path = resolve_policy_path(name)
            expert = ExpertPolicy.load(path)
        except (FileNotFoundError, ValueError) as exc:
            raise ValueError(f"--teacher.expert: {exc}") from exc
        return cls(expert, continuous_policy, rules, name=path.name)

    def reset(self) -> None:
        """Start a new episode's count."""
        self.steps = self.agreed = 0

    def label(self, env):
        """The expert's action for the env's current state: an int (0..4) or a (2,) float32 array
        (normalised steering, +1 = full right; throttle in -1..1)."""
        return self.expert.act(env)

    def action_class(self, action) -> int:
        """The class of a teacher action, as :attr:`agent.actors.rollout.Decision.action_class` counts it."""
        if not self.continuous:
            return int(action)
        return steering_class(action_number(action))

    def count(self, teacher_class: int, policy_class: int) -> bool:
        """Count one step; returns whether the policy chose the teacher's class."""
        same = int(teacher_class) == int(policy_class)
        self.steps += 1
        self.agreed += same
        return same

    @property
    def agreement(self) -> float:
        """The share of this episode's steps on which the policy chose the teacher's class, 0..1
        (NaN before the first step)."""
        return self.agreed / self.steps if self.steps else float("nan")

    def text(self) -> str:
        """The end-of-episode figure as ``drive`` prints it."""
        what = "steering class" if self.continuous else "action"
        return f"  teacher's {what} on {100 * self.agreement:5.1f} % of steps"


__all__ = ["Teacher"]
