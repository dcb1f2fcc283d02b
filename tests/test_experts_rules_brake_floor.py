"""The start rule's brake floor: below a speed a brake label becomes gas, in DAgger's relabelling
(the teacher's start rule) and in recorded labels (relabelled from the speeds recordings keep)."""

import numpy as np
import pytest
from cli_run import run_cli
from expert_fixture import ConstantNet, small_demos

from agent.cli import main
from agent.data.recordings import RecordingWriter, load_demonstrations
from agent.actors.rollout import Episode
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import BRAKE, BRAKE_FLOOR_SPEED, CRAWL_SPEED, GAS, START_THROTTLE, brake_floor_rule, relabel_brake_floor
from envs.carracing import ACTION_NAMES, PRIVILEGED_DIM

LEFT, NOTHING = ACTION_NAMES.index("left"), ACTION_NAMES.index("nothing")


_Constant = ConstantNet


def test_the_rule_turns_only_slow_brakes_into_gas():
    actions = np.array([BRAKE, BRAKE, LEFT, BRAKE, BRAKE, NOTHING])
    speeds = np.array([5.0, 19.9, 12.0, 20.0, np.nan, 3.0])
    out = brake_floor_rule(actions, speeds, 20.0)
    assert out.tolist() == [GAS, GAS, LEFT, BRAKE, BRAKE, NOTHING]  # 20 is not below 20; NaN never triggers
    assert actions[0] == BRAKE  # a new array
    assert brake_floor_rule(actions, speeds, 0.0).tolist() == actions.tolist()
    with pytest.raises(ValueError, match="one speed per action"):
        brake_floor_rule(actions, speeds[:2], 20.0)
    with pytest.raises(ValueError, match=">= 0"):
        brake_floor_rule(actions, speeds, -1.0)


def test_the_expert_uses_its_floor_only_under_the_start_rule():
    speeds = np.array([0.0, 8.0, 15.0, 25.0])
    states = np.zeros((len(speeds), PRIVILEGED_DIM), np.float32)
    braking = ExpertPolicy(_Constant(BRAKE), start_rule=True)
    assert braking.brake_floor == CRAWL_SPEED == 10.0
    assert braking.act_batch(states, speeds).tolist() == [GAS, GAS, BRAKE, BRAKE]
    assert braking.use_brake_floor(BRAKE_FLOOR_SPEED) is braking
    assert braking.act_batch(states, speeds).tolist() == [GAS, GAS, GAS, BRAKE]
    assert ExpertPolicy(_Constant(BRAKE)).use_brake_floor(20.0).act_batch(states, speeds).tolist() == [BRAKE] * 4
    # steering is never changed by the floor (only the standstill part of the start rule makes it gas)
    assert ExpertPolicy(_Constant(LEFT), start_rule=True).use_brake_floor(20.0).act_batch(states, speeds).tolist() \
        == [GAS, LEFT, LEFT, LEFT]
    # the continuous expert: a negative throttle below the floor becomes full gas, its steering kept
    cont = ExpertPolicy(_Constant((0.3, -1.0)), start_rule=True).use_brake_floor(20.0)
    out = cont.act_batch(states, speeds)
    assert out[:, 1].tolist() == [START_THROTTLE] * 3 + [-1.0] and np.allclose(out[:, 0], 0.3)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="brake floor"):
            braking.use_brake_floor(bad)


def _demos(speeds=None, continuous=False):
    return small_demos(([BRAKE, BRAKE, LEFT, BRAKE], [BRAKE, NOTHING, BRAKE]), speeds, continuous)


def test_relabel_brake_floor_uses_the_recorded_speeds():
    demos = _demos([np.array([12.0, 30.0, 5.0, 19.0], np.float32), np.array([np.nan, 4.0, 15.0], np.float32)])
    new, changed = relabel_brake_floor(demos, 20.0)
    assert [a.tolist() for a in new.actions] == [[GAS, BRAKE, LEFT, GAS], [BRAKE, NOTHING, GAS]]
    assert changed == 3
    assert demos.actions[0].tolist() == [BRAKE, BRAKE, LEFT, BRAKE]  # the input is left as it was
    assert relabel_brake_floor(_demos(), 20.0)[1] == 0  # no recorded speeds: labels kept
    with pytest.raises(ValueError, match="discrete recordings"):
        relabel_brake_floor(_demos(continuous=True), 20.0)


def _write_recording(path, speeds, actions):
    """A one-episode recording of plain frames whose labels and recorded speeds are given."""
    from envs.carracing import make_carracing

    n = len(actions)
    ep = Episode(0, np.zeros((n + 1, 96, 96, 3), np.uint8), np.asarray(actions, np.int64), None,
                 np.zeros(n, np.float32), np.zeros(n, bool), np.r_[np.zeros(n - 1, bool), True],
                 np.asarray(speeds, np.float32))
    env = make_carracing()
    try:
        writer = RecordingWriter(path, env, "test")
        writer.add(ep)
    finally:
        env.close()


def test_brake_floor_trains_through_the_cli_from_recorded_speeds(tmp_path, capsys):
    rec = tmp_path / "recordings" / "nac-drive" / "brakes-v0"
    actions = [GAS, BRAKE, BRAKE, BRAKE, LEFT, BRAKE, GAS, BRAKE]
    speeds = [0.0, 12.0, 18.0, 25.0, 5.0, 9.0, 40.0, 60.0, 50.0]  # the reset's speed, then after each step
    _write_recording(rec, speeds, actions)
    demos = load_demonstrations(rec)
    assert demos.actions[0].tolist() == actions
    expected = int(np.count_nonzero((np.array(speeds[:-1]) < 20.0) & (np.array(actions) == BRAKE)))
    assert expected == 3
    rc = main(["train", "--data", str(rec), "--out", str(tmp_path / "nac.pt"), "--run-dir", str(tmp_path / "run"),
               "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "4", "--teacher.brake-floor",
               "20", "--train.val-fraction", "0", "--train.tensorboard", ""])
    assert rc == 0 and (tmp_path / "nac.pt").is_file()
    log = " ".join(capsys.readouterr().err.split())
    assert f"{expected} of {len(actions)} recorded brake labels below 20.0 units/s relabelled gas" in log


def test_brake_floor_errors_are_clear(tiny_expert, tmp_path, capsys):
    rec = tmp_path / "none-v0"
    common = ["train", "--data", str(rec), "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x")]
    rc, err = run_cli([*common, "--teacher.brake-floor", "-1"], capsys)  # refused by tyro's parser
    assert rc == 2 and "teacher.brake_floor must be a finite speed >= 0" in err
    rc, err = run_cli([*common, "--teacher.brake-floor", "20", "--dagger.rounds", "1", "--teacher.expert",
                       str(tiny_expert)], capsys)
    assert rc == 2 and "DAgger's teacher uses it only with teacher.start_rule" in err
    rc, err = run_cli(["train", "--env", "udacity", "--data", str(tmp_path), "--out", str(tmp_path / "u.pt"),
                       "--run-dir", str(tmp_path / "u"), "--teacher.brake-floor", "20"], capsys)
    assert rc == 2 and "teacher.brake_floor only apply to env 'carracing'" in err


def test_check_recovery_takes_the_brake_floor(tiny_expert, tmp_path, capsys):
    import json

    js = tmp_path / "rec.json"
    assert main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--start", "5",
                 "--limit", "10", "--max-steps", "40", "--teacher.start-rule", "--teacher.brake-floor", "20",
                 "--json", str(js)]) == 0
    assert json.loads(js.read_text())["brake_floor"] == 20.0
    assert main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1",
                 "--teacher.brake-floor", "20"]) == 2
    assert "add --teacher.start-rule" in capsys.readouterr().err
