"""The teacher's label rules: what the PPO expert's labels become in states its network handles badly.

The rules act on discrete labels at known speeds (:func:`creep_rule`, :func:`brake_floor_rule`),
on recorded demonstrations (the ``relabel_*`` functions: the labels the teacher would give now,
from the recorded speeds and frames), and on a live expert (:class:`TeacherRules`, which sets
them on an :class:`agent.experts.policy.ExpertPolicy` in one place for every command that drives
a teacher: ``agent collect``, DAgger in ``agent train``, ``agent expert check-recovery`` and
``drive --teacher.expert``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from agent.data.frame_cache import take_frames
from envs.carracing import ACTION_NAMES, car_on_grass

#: the discrete "gas" action (:data:`envs.carracing.ACTION_NAMES`)
GAS = ACTION_NAMES.index("gas")
#: the discrete "brake" action
BRAKE = ACTION_NAMES.index("brake")
#: below this speed (simulator units per second) the start rule turns the expert's brake into gas
#: (:meth:`agent.experts.policy.ExpertPolicy.act`); the car cruises at 30-90 units/s and reaches 43 after 2 s of gas
CRAWL_SPEED = 10.0
#: the brake floor a DAgger teacher can be given instead of :data:`CRAWL_SPEED` (``--teacher.brake-floor``):
#: the expert's brake labels at 10-15 units/s in its students' states (431 of the 2,575 brake labels of 19
#: clean DAgger rounds, half of them on the grass) teach a slow student to brake each time it reaches
#: 10 units/s (README, "The brake floor"); the expert's own laps and recoveries never brake below 20 on the road
BRAKE_FLOOR_SPEED = 20.0
#: the continuous expert's throttle under the start rule (full gas, as on the first steps of its laps)
START_THROTTLE = 1.0


def _below(actions, speeds, speed: float, rule: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(N,) int64 actions and (N,) bool "speed below ``speed``" (NaN: False) for a speed rule.

    Raises:
        ValueError: actions and speeds of different lengths, or a negative ``speed``.
    """
    actions = np.asarray(actions, dtype=np.int64).reshape(-1)
    speeds = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if len(speeds) != len(actions):
        raise ValueError(f"{rule} needs one speed per action: {len(speeds)} speeds for {len(actions)} actions")
    if not speed >= 0:
        raise ValueError(f"{name} must be >= 0 units/s, got {speed}")
    with np.errstate(invalid="ignore"):
        return actions, speeds < speed


def _relabel(demos, rule, what: str):
    """``demos`` with ``rule(actions, speeds, frames)`` applied to each discrete episode's labels;
    (new demos, labels changed). Raises ValueError for continuous demonstrations, naming ``what``."""
    if demos.continuous:
        raise ValueError(f"{what} is for discrete recordings (the continuous configuration steers and accelerates "
                         "at once, and keeps its throttle)")
    actions = [rule(a, v, f) for a, v, f in zip(demos.actions, demos.frame_speeds(), demos.frames)]
    changed = int(sum(np.count_nonzero(a != b) for a, b in zip(actions, demos.actions)))
    return dataclasses.replace(demos, actions=actions), changed


def creep_rule(actions: np.ndarray, speeds, creep_speed: float) -> np.ndarray:
    """The teacher's creep rule on discrete labels: below ``creep_speed`` every label becomes gas.

    Discrete CarRacing has no gas while steering, so a slow car that is told to steer coasts.
    Off the road, the discrete margin expert labels "left" on 64 % of the frames its DAgger
    students visited between 1 and 2.5 units/s; a student that copies it circles slowly on the
    grass, steering one way at 2-4 units/s, for 350-450 steps (README, "The creep rule").
    The start rule (:meth:`agent.experts.policy.ExpertPolicy.act`) only acts below 1 unit/s, so it never fires there.
    Below ``creep_speed`` the label is gas; above it the expert's steering is kept, so a slow
    car gets going, then turns.

    Args:
        actions: (N,) int64 discrete actions (0..4, :data:`envs.carracing.ACTION_NAMES`).
        speeds: (N,) car speeds in simulator units per second at those frames; NaN never triggers.
        creep_speed: units/s; 0 turns the rule off.

    Returns:
        (N,) int64: a new array.

    Raises:
        ValueError: ``actions`` and ``speeds`` of different lengths, or a negative ``creep_speed``.
    """
    actions, slow = _below(actions, speeds, creep_speed, "creep_rule", "creep_speed")
    return np.where(slow, GAS, actions)


def brake_floor_rule(actions: np.ndarray, speeds, floor: float) -> np.ndarray:
    """The start rule's brake floor on discrete labels: below ``floor`` a brake label becomes gas.

    The start rule (:meth:`agent.experts.policy.ExpertPolicy.act`) does this below :data:`CRAWL_SPEED`; a DAgger teacher
    can be given a higher floor (:data:`BRAKE_FLOOR_SPEED`, ``--teacher.brake-floor``), and
    recordings labelled under the old floor get the new one from their recorded speeds
    (:func:`relabel_brake_floor`). Other labels are kept.

    Args:
        actions: (N,) int64 discrete actions (0..4, :data:`envs.carracing.ACTION_NAMES`).
        speeds: (N,) car speeds in simulator units per second at those frames; NaN never triggers.
        floor: units/s; 0 turns the rule off.

    Returns:
        (N,) int64: a new array.

    Raises:
        ValueError: ``actions`` and ``speeds`` of different lengths, or a negative ``floor``.
    """
    actions, slow = _below(actions, speeds, floor, "brake_floor_rule", "the brake floor")
    return np.where(slow & (actions == BRAKE), GAS, actions)


def relabel_brake_floor(demos, floor: float):
    """Recorded discrete demonstrations with :func:`brake_floor_rule` applied to their labels.

    Like :func:`relabel_creep`, it needs only the label and the recorded speed
    (:attr:`agent.data.recordings.Demonstrations.speeds`); frames without a known speed keep
    their label.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions.
        floor: units/s (see :func:`brake_floor_rule`).

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations, or a negative ``floor``.
    """
    return _relabel(demos, lambda a, v, _: brake_floor_rule(a, v, floor), "relabelling with a brake floor")


def relabel_grass(demos):
    """Recorded discrete demonstrations with the grass rule (:meth:`agent.experts.policy.ExpertPolicy.use_grass_rule`)
    applied to their labels: a brake label on a frame where the car is on the grass becomes gas.

    Recordings keep no wheel flags, so the grass is read from the frame's pixels
    (:func:`envs.carracing.car_on_grass`), which misses about 4 % of the grass frames and marked
    no road frame as grass when it was measured.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions and CarRacing's
            (96, 96, 3) frames.

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations, or frames that are not CarRacing's.
    """
    def rule(actions, speeds, frames):
        new = np.asarray(actions, dtype=np.int64).copy()
        brake = np.flatnonzero(new == BRAKE)
        if brake.size:  # the pixel test only where it can change a label
            # read past a frame file's map (take_frames): the map's pages would count in the resident set
            new[brake[car_on_grass(take_frames(frames, brake))]] = GAS
        return new

    return _relabel(demos, rule, "the grass rule")


def relabel_creep(demos, creep_speed: float):
    """Recorded discrete demonstrations with :func:`creep_rule` applied to their labels.

    The rule needs only the label and the car's speed, which recordings keep
    (:attr:`agent.data.recordings.Demonstrations.speeds`), so recordings made before it (expert
    laps and DAgger rounds) get the labels the teacher would give now. Frames without a known
    speed keep their label.

    Args:
        demos: :class:`agent.data.recordings.Demonstrations` with discrete actions.
        creep_speed: units/s (see :func:`creep_rule`).

    Returns:
        (new Demonstrations, the number of labels changed).

    Raises:
        ValueError: continuous demonstrations (the continuous configuration can steer and
            accelerate at once; the rule is for the discrete one), or a negative ``creep_speed``.
    """
    return _relabel(demos, lambda a, v, _: creep_rule(a, v, creep_speed), "the creep rule")


@dataclass(frozen=True)
class TeacherRules:
    """The rules a teacher (the PPO expert) labels and drives with, set in one place.

    Attributes:
        start_rule: gas at a standstill and no brake below the brake floor
            (:meth:`agent.experts.policy.ExpertPolicy.use_start_rule`; discrete and continuous experts).
        creep_speed: the creep rule's speed, units/s (:func:`creep_rule`; discrete experts); 0: off.
        brake_floor: the start rule's brake floor, units/s (:func:`brake_floor_rule`); None: the
            expert's own, :data:`CRAWL_SPEED`.
        grass_rule: with all four wheels on the grass a brake becomes gas
            (:meth:`agent.experts.policy.ExpertPolicy.use_grass_rule`; discrete experts).

    Raises:
        RuleError: (a ValueError naming the field in ``rule``) a creep speed that is not a finite
            number >= 0, or a brake floor that is neither None nor a finite number >= 0.
    """

    start_rule: bool = False
    creep_speed: float = 0.0
    brake_floor: float | None = None
    grass_rule: bool = False

    def __post_init__(self):
        if not _finite_speed(self.creep_speed):
            raise RuleError("creep_speed",
                            f"creep_speed must be a finite speed >= 0 units/s (0: off), got {self.creep_speed!r}")
        if self.brake_floor is not None and not _finite_speed(self.brake_floor):
            raise RuleError("brake_floor", f"brake_floor must be a finite speed >= 0 units/s or None (the start "
                                           f"rule's own {CRAWL_SPEED:g}), got {self.brake_floor!r}")

    def apply(self, expert, *, strict: bool = False):
        """Set these rules on ``expert`` (an :class:`agent.experts.policy.ExpertPolicy`); returns it.

        The start rule is set as given (on or off), the brake floor when it is not None (else the
        expert keeps its own). The creep and grass rules are the discrete expert's and are set on
        it as given (0 and False turn them off); with ``strict`` False (DAgger's teacher in ``agent
        train``) a continuous expert drives without them; with ``strict`` True (``agent expert
        check-recovery``, ``drive --teacher.expert``) they are set on any expert, so a continuous one
        refuses a creep speed above 0 or the grass rule.

        Raises:
            RuleError: with ``strict``, a creep speed above 0 or the grass rule for a continuous
                expert (the expert's ValueError, with the field in ``rule``).
        """
        expert.use_start_rule(self.start_rule)
        discrete = not expert.continuous
        for rule, on, use in (("creep_speed", strict or discrete, lambda: expert.use_creep_rule(self.creep_speed)),
                              ("brake_floor", self.brake_floor is not None,
                               lambda: expert.use_brake_floor(self.brake_floor)),
                              ("grass_rule", strict or discrete, lambda: expert.use_grass_rule(self.grass_rule))):
            if on:
                try:
                    use()
                except ValueError as exc:
                    raise RuleError(rule, str(exc)) from exc
        return expert

    def relabel(self, demos, log=None):
        """Recorded discrete demonstrations with the recording rules applied to their labels, in
        the order ``agent train`` applies them: the creep rule (:func:`relabel_creep`, if
        ``creep_speed``), the brake floor (:func:`relabel_brake_floor`, if ``brake_floor`` is not
        None), the grass rule (:func:`relabel_grass`, if ``grass_rule``). The start rule changes no
        recorded label.

        Args:
            demos: :class:`agent.data.recordings.Demonstrations`.
            log: called as ``log(rule, changed, what)`` after each rule that ran: ``rule`` its
                field ("creep_speed", "brake_floor", "grass_rule"), ``changed`` the labels it changed
                and ``what`` the labels it acts on, e.g. "labels below 10.0 units/s relabelled gas".

        Returns:
            (new demos, {rule: labels changed} for the rules that ran).

        Raises:
            RuleError: (a ValueError naming the field in ``rule``) a rule that ran does not apply to
                these recordings (continuous actions, frames that are not CarRacing's).
        """
        steps = []
        if self.creep_speed:
            creep = self.creep_speed
            steps.append(("creep_speed", lambda d: relabel_creep(d, creep),
                          f"labels below {creep:.1f} units/s relabelled gas"))
        if self.brake_floor is not None:
            floor = self.brake_floor
            steps.append(("brake_floor", lambda d: relabel_brake_floor(d, floor),
                          f"brake labels below {floor:.1f} units/s relabelled gas"))
        if self.grass_rule:
            steps.append(("grass_rule", relabel_grass,
                          "brake labels on the grass (read from the pixels) relabelled gas"))
        counts = {}
        for rule, relabel, what in steps:
            try:
                demos, counts[rule] = relabel(demos)
            except ValueError as exc:
                raise RuleError(rule, str(exc)) from exc
            if log is not None:
                log(rule, counts[rule], what)
        return demos, counts


class RuleError(ValueError):
    """A teacher's rule that is out of range, or does not apply to the expert or the recordings;
    :attr:`rule` names the :class:`TeacherRules` field ("creep_speed", "brake_floor" or "grass_rule")."""

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


def _finite_speed(value) -> bool:
    """Whether ``value`` is a finite number >= 0 (a speed in units/s)."""
    try:
        return math.isfinite(value) and value >= 0
    except TypeError:
        return False


__all__ = ["BRAKE", "BRAKE_FLOOR_SPEED", "CRAWL_SPEED", "GAS", "START_THROTTLE", "RuleError", "TeacherRules",
           "brake_floor_rule", "creep_rule", "relabel_brake_floor", "relabel_creep", "relabel_grass"]
