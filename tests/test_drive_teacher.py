"""``drive --teacher.expert``: the expert's label of every state a policy visits (HUD, printed agreement,
``--dump-traces``), checked against a replay of the same episode with the expert asked directly."""

from __future__ import annotations

import os

os.environ["SDL_VIDEODRIVER"] = "dummy"
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.drive.config import DRIVE_TEACHER, DriveConfig, parse_drive_args
from agent.drive.session import run_drive
from agent.train.config import ConfigError, TeacherSection

POLICIES = Path(__file__).resolve().parents[1] / "policies"
TEACHER = POLICIES / "carracing-expert-discrete-margin.zip"
SEED = 700_010  # a validation track; within 100 steps the expert both drives on and turns


def _parse(*argv: str) -> DriveConfig:
    return parse_drive_args(list(argv))


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory):
    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    return DrivingPolicy(default_config("carracing", window=4)).save(tmp_path_factory.mktemp("policy") / "tiny.pt")


def _agreement(printed: str) -> list[float]:
    return [float(x) for x in re.findall(r"teacher's action on\s+([\d.]+) % of steps", printed)]


def test_teacher_labels_are_the_experts_actions_in_the_visited_states(tmp_path, capsys):
    from agent.drive.traces import load_traces
    from agent.actors.rollout import all_wheels_off_road
    from agent.experts.policy import ExpertPolicy
    from envs.carracing import make_carracing

    out = tmp_path / "t.npz"
    # the shipped student drives (a random policy stands still, and at a standstill the start rule
    # makes every label gas)
    assert run_drive(_parse("--policy", "nac.pt", "--headless", "--no-saliency", "--track-seed", str(SEED),
                            "--max-steps", "100", "--teacher.expert", str(TEACHER), "--dump-traces", str(out))) == 0
    printed = capsys.readouterr().out
    assert f"teacher {TEACHER.name}" in printed
    d = load_traces(out)
    assert str(d["teacher"]) == TEACHER.name
    assert d["teacher_action"].shape == (100,) and d["teacher_class"].dtype == np.int64
    assert len(np.unique(d["teacher_class"])) >= 2  # gas and a turn: a constant label would prove little
    # the same episode replayed with the policy's actions; the expert (start rule on, as DAgger's
    # teacher) asked directly in each state gives the recorded labels
    expert = ExpertPolicy.load(TEACHER).use_start_rule(True)
    env = make_carracing()
    env.reset(seed=SEED)
    labels, off = [], []
    for a in d["action"].astype(int):
        labels.append(expert.act(env))
        env.step(a)
        off.append(all_wheels_off_road(env))
    env.close()
    np.testing.assert_array_equal(d["teacher_action"].astype(int), labels)
    np.testing.assert_array_equal(d["teacher_class"], labels)
    np.testing.assert_array_equal(d["off_road"], off)  # the replay did follow the run
    # the printed agreement is the share of steps where the policy chose the teacher's action
    assert _agreement(printed) == [pytest.approx(100 * np.mean(d["teacher_class"] == d["action_class"]), abs=0.05)]


def test_creep_rule_makes_every_slow_label_gas(policy_file, tmp_path, capsys):
    from agent.drive.traces import load_traces
    from envs.carracing import ACTION_NAMES

    out = tmp_path / "t.npz"
    # 40 steps from the start never reach 1000 units/s: with the creep rule at 1000 every label is gas
    assert run_drive(_parse("--policy", str(policy_file), "--headless", "--no-saliency", "--track-seed", str(SEED),
                            "--max-steps", "40", "--teacher.expert", TEACHER.name, "--teacher.creep-speed", "1000",
                            "--dump-traces", str(out))) == 0
    d = load_traces(out)
    gas = ACTION_NAMES.index("gas")
    np.testing.assert_array_equal(d["teacher_class"], np.full(40, gas))
    assert _agreement(capsys.readouterr().out) == [pytest.approx(100 * np.mean(d["action_class"] == gas), abs=0.05)]


@pytest.mark.parametrize("argv, words", [
    (["--env", "udacity", "--teacher.expert", "x.zip"], "Udacity simulator has no expert"),
    (["--teacher.expert", "nac.pt"], "expert's .zip"),
    (["--teacher.creep-speed", "10"], "--teacher.creep-speed sets the teacher's rules; give the teacher with "
                                      "--teacher.expert"),
    (["--teacher.expert", "x.zip", "--env-worker", "on"], "--env-worker auto or off"),
    (["--teacher.brake-floor", "20", "--teacher.grass-rule"], "--teacher.brake-floor, --teacher.grass-rule set the "
                                                               "teacher's rules; give the teacher with --teacher.expert"),
    (["--teacher.no-start-rule"], "--teacher.no-start-rule sets the teacher's rules"),
    (["--teacher.expert", "x.zip", "--teacher.no-start-rule", "--teacher.brake-floor", "20"],
     "--teacher.brake-floor is the start rule's floor"),
])
def test_bad_teacher_options_are_refused_with_a_reason(argv, words, capsys):
    from agent.cli import main

    with pytest.raises(ConfigError, match=re.escape(words)) as e:
        _parse(*argv)
    assert main(["drive", *argv]) == 2  # one line, before anything loads
    assert capsys.readouterr().err.strip() == f"agent drive: error: {e.value}"


@pytest.mark.parametrize("rules, words", [
    (dict(creep_speed=-1), "teacher.creep_speed must be a finite speed >= 0 units/s"),
    (dict(brake_floor=-1), "teacher.brake_floor must be a finite speed >= 0 units/s"),
])
def test_bad_teacher_values_are_refused_where_the_section_is_built(rules, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        TeacherSection(expert="x.zip", start_rule=True, **rules)


def test_drives_teacher_has_the_start_rule_unless_turned_off():
    assert DriveConfig().teacher == DRIVE_TEACHER and DRIVE_TEACHER.rules.start_rule is True
    cfg = _parse("--teacher.expert", "x.zip", "--teacher.creep-speed", "10", "--teacher.brake-floor", "20",
                 "--teacher.grass-rule")
    assert (cfg.teacher.expert, cfg.teacher.rules.start_rule, cfg.teacher.creep_speed, cfg.teacher.brake_floor,
            cfg.teacher.grass_rule) == ("x.zip", True, 10.0, 20.0, True)
    assert _parse("--teacher.expert", "x.zip", "--teacher.no-start-rule").teacher.rules.start_rule is False


def test_teacher_of_the_other_action_space_is_refused(policy_file, capsys):
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "3",
                            "--teacher.expert", "carracing-expert-margin.zip"))
    err = capsys.readouterr().err
    assert code == 2 and "continuous" in err and "carracing-expert-discrete-margin.zip" in err


def test_missing_teacher_file_is_a_clear_error(policy_file, capsys):
    code = run_drive(_parse("--policy", str(policy_file), "--headless", "--max-steps", "3",
                            "--teacher.expert", "no-such-expert.zip"))
    err = capsys.readouterr().err
    assert code == 2 and "--teacher.expert" in err and "no-such-expert.zip" in err


def test_hud_shows_the_teacher_in_another_colour_where_it_disagrees():
    from agent.drive.hud import Renderer, StepView

    r = Renderer((96, 96), scale=2, panel_width=0)
    frame = np.zeros((96, 96, 3), np.uint8)
    probs = np.full(5, 0.2)

    def hud(teacher):
        r.compose(StepView(frame=frame, step=1, action=3, probs=probs, teacher_class=teacher))
        return r.to_rgb()[r.hud_rect.top:r.hud_rect.bottom].copy()

    none, same, other = hud(None), hud(3), hud(4)
    assert (same != none).any()  # the teacher's label is drawn
    assert (other != same).any()  # another label, another colour


def test_the_teachers_brake_floor_reaches_its_start_rule():
    from agent.drive.teacher import Teacher
    from agent.experts.rules import CRAWL_SPEED, TeacherRules

    assert Teacher.load(TEACHER.name, False).expert.brake_floor == CRAWL_SPEED
    t = Teacher.load(TEACHER.name, False, TeacherRules(start_rule=True, creep_speed=10.0, brake_floor=20.0))
    assert t.expert.brake_floor == 20.0 and t.expert.start_rule and t.expert.creep_speed == 10.0


def test_a_gru_policy_dumps_its_steps_and_labels_without_nac_traces(tmp_path, capsys):
    """--dump-traces with another core: every step, the teacher's labels and the Grad-CAM map, no NAC arrays."""
    from agent.drive.traces import has_nac_traces, load_traces, plot_traces
    from agent.nn.policy import DrivingPolicy, default_config
    from envs.carracing import ACTION_NAMES

    torch.manual_seed(0)
    gru = DrivingPolicy(default_config("carracing", core="gru", window=4)).save(tmp_path / "gru.pt")
    out = tmp_path / "g.npz"
    assert run_drive(_parse("--policy", str(gru), "--headless", "--track-seed", str(SEED), "--max-steps", "30",
                            "--teacher.expert", TEACHER.name, "--teacher.creep-speed", "1000",
                            "--dump-traces", str(out))) == 0
    printed = capsys.readouterr().out
    assert "30 steps: actions, rewards, speeds and labels; no NAC traces" in printed
    d = load_traces(out)
    assert not has_nac_traces(d) and "omega" not in d and "neuron_motor" not in d
    assert d["action"].shape == (30,) and d["speed"].shape == (30,) and d["off_road"].shape == (30,)
    np.testing.assert_array_equal(d["teacher_class"], np.full(30, ACTION_NAMES.index("gas")))  # the creep rule
    assert d["cam"].shape == (30, 96, 96) and np.isfinite(d["cam"]).all()  # Grad-CAM works for any CNN policy
    with pytest.raises(ValueError, match="no NAC traces"):
        plot_traces(out, tmp_path / "p.png")
