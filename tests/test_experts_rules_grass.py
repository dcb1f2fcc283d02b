"""The teacher's grass rule: with the car on the grass a brake label becomes gas, in DAgger's
relabelling (the wheels' grass flags of the privileged state) and in recorded labels (the grass
read from the pixels around the car)."""

import numpy as np
import pytest
from expert_fixture import ConstantNet

from agent.cli import main
from agent.data.recordings import Demonstrations
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import BRAKE, GAS, relabel_grass
from envs.carracing import ACTION_NAMES, PRIVILEGED_DIM, WHEEL_GRASS, car_on_grass, make_carracing

LEFT = ACTION_NAMES.index("left")
GRASS, ROAD = (100, 228, 100), (105, 105, 105)


_Constant = ConstantNet


def _frame(ground, grass_cols=0):
    """A 96x96 frame of one ground colour with a red car where gymnasium draws it; the first
    ``grass_cols`` columns around the car painted grass on a road frame (the car at the edge)."""
    f = np.zeros((96, 96, 3), np.uint8)
    f[:] = ground
    if grass_cols:
        f[:, :41 + grass_cols] = GRASS
    f[66:77, 46:50] = (204, 0, 0)
    f[84:] = 0  # the dashboard strip
    return f


def test_car_on_grass_reads_the_ring_around_the_car():
    frames = np.stack([_frame(GRASS), _frame(ROAD), _frame(ROAD, grass_cols=7)])
    assert car_on_grass(frames).tolist() == [True, False, False]
    assert car_on_grass(frames[0]) is True and car_on_grass(frames[1]) is False
    assert car_on_grass(frames[2], share=0.3) is True  # half the ring is grass
    with pytest.raises(ValueError, match="96, 96, 3"):
        car_on_grass(np.zeros((2, 64, 64, 3), np.uint8))
    with pytest.raises(ValueError, match="share"):
        car_on_grass(frames, share=1.5)


def test_on_real_frames_the_start_is_road_and_the_flags_agree():
    env = make_carracing()
    try:
        obs, _ = env.reset(seed=3)
        for _ in range(60):  # gymnasium zooms in over the first steps; drive a little straight
            obs, *_ = env.step(3)
        state = env.unwrapped.privileged_observation()
        assert state[WHEEL_GRASS].tolist() == [0.0, 0.0, 0.0, 0.0]  # the car starts on the road
        assert car_on_grass(obs) is False
        wheels = env.unwrapped.car.wheels
        assert state[WHEEL_GRASS].tolist() == [0.0 if w.tiles else 1.0 for w in wheels]
    finally:
        env.close()


def test_the_expert_turns_brake_into_gas_only_on_the_grass():
    states = np.zeros((4, PRIVILEGED_DIM), np.float32)
    states[0, WHEEL_GRASS] = 1.0  # all four wheels on the grass
    states[1, WHEEL_GRASS] = (1.0, 1.0, 1.0, 0.0)  # one wheel still on the road
    speeds = np.full(4, 40.0)
    braking = ExpertPolicy(_Constant(BRAKE))
    assert braking.grass_rule is False
    assert braking.act_batch(states, speeds).tolist() == [BRAKE] * 4
    assert braking.use_grass_rule() is braking
    assert braking.act_batch(states, speeds).tolist() == [GAS, BRAKE, BRAKE, BRAKE]
    assert ExpertPolicy(_Constant(LEFT)).use_grass_rule().act_batch(states, speeds).tolist() == [LEFT] * 4
    assert braking.use_grass_rule(False).act_batch(states, speeds).tolist() == [BRAKE] * 4
    with pytest.raises(ValueError, match="discrete experts"):
        ExpertPolicy(_Constant((0.0, -1.0))).use_grass_rule()


def test_relabel_grass_reads_the_frames():
    frames = [np.stack([_frame(GRASS), _frame(ROAD), _frame(GRASS), _frame(GRASS)]), np.stack([_frame(ROAD)])]
    actions = [np.array([BRAKE, BRAKE, LEFT, GAS]), np.array([BRAKE])]
    demos = Demonstrations(frames, actions, [0, 1], [0.0, 0.0])
    new, changed = relabel_grass(demos)
    assert [a.tolist() for a in new.actions] == [[GAS, BRAKE, LEFT, GAS], [BRAKE]]
    assert changed == 1 and demos.actions[0][0] == BRAKE
    cont = Demonstrations(frames, [np.zeros((4, 2), np.float32), np.zeros((1, 2), np.float32)], [0, 1], [0.0, 0.0])
    with pytest.raises(ValueError, match="discrete recordings"):
        relabel_grass(cont)


def test_grass_rule_trains_through_the_cli(tmp_path, capsys):
    from agent.data.recordings import RecordingWriter, load_demonstrations
    from agent.actors.rollout import Episode

    rec = tmp_path / "recordings" / "nac-drive" / "grass-v0"
    obs = np.stack([_frame(GRASS), _frame(ROAD), _frame(GRASS), _frame(ROAD), _frame(GRASS), _frame(GRASS)])
    actions = np.array([BRAKE, BRAKE, BRAKE, GAS, LEFT], np.int64)
    n = len(actions)
    ep = Episode(0, obs, actions, None, np.zeros(n, np.float32), np.zeros(n, bool), np.r_[np.zeros(n - 1, bool), True],
                 np.full(n + 1, 30.0, np.float32))
    env = make_carracing()
    try:
        RecordingWriter(rec, env, "test").add(ep)
    finally:
        env.close()
    assert load_demonstrations(rec).actions[0].tolist() == actions.tolist()
    rc = main(["train", "--data", str(rec), "--out", str(tmp_path / "nac.pt"), "--run-dir", str(tmp_path / "run"),
               "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "4", "--teacher.grass-rule",
               "--train.val-fraction", "0", "--train.tensorboard", ""])
    assert rc == 0
    log = " ".join(capsys.readouterr().err.split())
    assert f"teacher.grass_rule: 2 of {n} recorded brake labels on the grass" in log


def test_check_recovery_and_drive_take_the_grass_rule(tiny_expert, tmp_path):
    import json

    from agent.drive.config import parse_drive_args
    from agent.drive.teacher import Teacher
    from agent.experts.policy import ExpertPolicy as Expert
    from agent.experts.rules import TeacherRules
    from agent.train.config import ConfigError

    js = tmp_path / "rec.json"
    assert main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--start", "5",
                 "--limit", "10", "--max-steps", "40", "--teacher.start-rule", "--teacher.grass-rule", "--json",
                 str(js)]) == 0
    assert json.loads(js.read_text())["grass_rule"] is True
    assert Teacher(Expert.load(tiny_expert), False, TeacherRules(start_rule=True, grass_rule=True)).expert.grass_rule is True
    with pytest.raises(ConfigError, match="give the teacher"):
        parse_drive_args(["--teacher.grass-rule"])
    assert parse_drive_args(["--teacher.expert", str(tiny_expert), "--teacher.grass-rule"]).teacher.rules.grass_rule
