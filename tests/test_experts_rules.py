"""agent.experts.rules.TeacherRules: the teacher's rules checked once and set on an expert in one place."""

import math

import numpy as np
import pytest
from expert_fixture import ConstantNet, small_demos

from agent.experts.policy import ExpertPolicy
from agent.experts.rules import BRAKE, CRAWL_SPEED, GAS, RuleError, TeacherRules


@pytest.mark.parametrize("kwargs, field", [
    ({"creep_speed": -1.0}, "creep_speed"), ({"creep_speed": math.nan}, "creep_speed"),
    ({"creep_speed": math.inf}, "creep_speed"), ({"brake_floor": -0.5}, "brake_floor"),
    ({"brake_floor": math.inf}, "brake_floor"), ({"brake_floor": math.nan}, "brake_floor"),
])
def test_bad_values_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as info:
        TeacherRules(**kwargs)
    assert isinstance(info.value, RuleError) and info.value.rule == field


def test_rules_are_frozen_and_default_to_off():
    rules = TeacherRules()
    assert (rules.start_rule, rules.creep_speed, rules.brake_floor, rules.grass_rule) == (False, 0.0, None, False)
    with pytest.raises(AttributeError):
        rules.creep_speed = 5.0  # type: ignore[misc]


def test_apply_sets_every_rule_on_a_discrete_expert():
    expert = TeacherRules(start_rule=True, creep_speed=5.0, brake_floor=20.0, grass_rule=True).apply(
        ExpertPolicy(ConstantNet(BRAKE)))
    assert (expert.start_rule, expert.creep_speed, expert.brake_floor, expert.grass_rule) == (True, 5.0, 20.0, True)
    # off again, the brake floor left as it was where none is given
    TeacherRules().apply(expert)
    assert (expert.start_rule, expert.creep_speed, expert.brake_floor, expert.grass_rule) == (False, 0.0, 20.0, False)
    assert TeacherRules().apply(ExpertPolicy(ConstantNet(GAS))).brake_floor == CRAWL_SPEED


def test_a_continuous_expert_drives_without_the_discrete_rules_unless_strict():
    rules = TeacherRules(start_rule=True, creep_speed=5.0, brake_floor=20.0, grass_rule=True)
    expert = rules.apply(ExpertPolicy(ConstantNet((0.0, -1.0))))  # DAgger's teacher: leaves them out
    assert (expert.start_rule, expert.creep_speed, expert.brake_floor, expert.grass_rule) == (True, 0.0, 20.0, False)
    with pytest.raises(RuleError, match="discrete") as info:
        rules.apply(ExpertPolicy(ConstantNet((0.0, -1.0))), strict=True)
    assert info.value.rule == "creep_speed"
    with pytest.raises(RuleError) as info:
        TeacherRules(grass_rule=True).apply(ExpertPolicy(ConstantNet((0.0, -1.0))), strict=True)
    assert info.value.rule == "grass_rule"


def test_relabel_applies_the_recording_rules_in_order_and_reports_each():
    demos = small_demos([[BRAKE, BRAKE, 1, 0], [BRAKE, 2, 0]], speeds=[np.array([1.0, 15.0, 3.0, 30.0]),
                                                                      np.array([25.0, 2.0, np.nan])])
    logged = []
    new, counts = TeacherRules(creep_speed=5.0, brake_floor=20.0).relabel(
        demos, log=lambda rule, changed, what: logged.append((rule, changed)))
    # creep: speeds 1 and 3 and 2 become gas (3 labels); floor: the brake at 15 becomes gas (1 label)
    np.testing.assert_array_equal(new.actions[0], [GAS, GAS, GAS, 0])
    np.testing.assert_array_equal(new.actions[1], [BRAKE, GAS, 0])
    assert counts == {"creep_speed": 3, "brake_floor": 1} and logged == [("creep_speed", 3), ("brake_floor", 1)]
    assert TeacherRules(start_rule=True).relabel(demos) == (demos, {})


def test_relabel_refuses_continuous_recordings_naming_the_rule():
    with pytest.raises(RuleError, match="discrete recordings") as info:
        TeacherRules(brake_floor=20.0).relabel(small_demos(None, continuous=True))
    assert info.value.rule == "brake_floor"
