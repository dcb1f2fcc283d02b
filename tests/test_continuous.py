"""CarRacing's continuous configuration end to end, through the real entry points with tiny budgets:
a continuous PPO expert -> agent collect ((N, 2) float32 actions) -> agent train (Box head, MSE,
DAgger with the continuous expert) -> agent evaluate / drive on the continuous env; and the
discrete default left as it was."""

import json

import gymnasium as gym
import numpy as np
import pytest

from agent.cli import main
from agent.actors.record import collect
from agent.data.recordings import RecordingError, load_demonstrations
from agent.actors.rollout import Decision
from envs.carracing import ThrottleAction, make_carracing

BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


@pytest.fixture(scope="module")
def continuous_expert(tmp_path_factory):
    """A continuous PPO expert trained for one rollout through the real CLI (it drives badly, but it is a real file)."""
    out = tmp_path_factory.mktemp("cexpert") / "expert.zip"
    rc = main(["expert", "train", "--ppo.continuous", "--ppo.timesteps", "256", "--envs", "1", "--out", str(out),
               "--tensorboard", "", "--device", "cpu", "--run-dir", str(out.parent / "run")])
    assert rc == 0 and out.is_file()
    return out


@pytest.fixture(scope="module")
def continuous_recording(continuous_expert, tmp_path_factory):
    out = tmp_path_factory.mktemp("crec") / "nac-drive" / "cont-v0"
    rc = main(["collect", "--teacher.expert", str(continuous_expert), "--episodes", "2", "--track-seed", "3",
               "--max-steps", "30", "--out", str(out)])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def discrete_recording(tiny_expert, tmp_path_factory):
    out = tmp_path_factory.mktemp("drec") / "nac-drive" / "disc-v0"
    rc = main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--track-seed", "3", "--max-steps",
               "6", "--out", str(out)])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def continuous_student(continuous_recording, continuous_expert, tmp_path_factory):
    """BC for 1 epoch with T=2, then one short DAgger round relabelled by the continuous expert."""
    d = tmp_path_factory.mktemp("cstudent")
    out, report = d / "student.pt", d / "report.json"
    rc = main(["train", "--data", str(continuous_recording), "--out", str(out), "--run-dir", str(d / "run"),
               "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "16", "--teacher.expert",
               str(continuous_expert), "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1",
               "--dagger.max-steps", "8", "--train.tensorboard", "", "--json", str(report)])
    assert rc == 0 and out.is_file()
    return out, json.loads(report.read_text())


@pytest.fixture
def executed_actions(monkeypatch):
    """Every action the continuous env is given (ThrottleAction.action's argument), in this process."""
    seen = []
    original = ThrottleAction.action

    def spy(self, action):
        seen.append(np.array(action, copy=True))
        return original(self, action)

    monkeypatch.setattr(ThrottleAction, "action", spy)
    return seen


def _assert_in_box(actions, n):
    assert len(actions) == n
    a = np.stack(actions)
    assert a.shape == (n, 2) and a.dtype == np.float32
    assert np.all(np.isfinite(a)) and np.all(a >= -1.0) and np.all(a <= 1.0)


# ----------------------------------------------------------------------------- recordings
def test_collect_records_continuous_actions(continuous_recording):
    import minari

    ds = minari.MinariDataset(continuous_recording / "data")
    assert ds.action_space == BOX2 and ds.total_episodes == 2 and ds.total_steps == 60
    demos = load_demonstrations(continuous_recording)
    assert demos.continuous and demos.action_space == BOX2
    assert [a.shape for a in demos.actions] == [(30, 2), (30, 2)]
    assert all(a.dtype == np.float32 and np.all(np.abs(a) <= 1.0) for a in demos.actions)
    assert demos.frames[0].shape == (30, 96, 96, 3) and demos.seeds == [3, 4]
    # the frames are the continuous env's own, recorded losslessly
    obs, _ = make_carracing(continuous=True).reset(seed=3)
    np.testing.assert_array_equal(demos.frames[0][0], obs)


def test_load_demonstrations_rejects_mixing(continuous_recording, discrete_recording, tmp_path, capsys):
    assert not load_demonstrations(discrete_recording).continuous  # (N,) int64 as before
    assert load_demonstrations(discrete_recording).actions[0].dtype == np.int64
    with pytest.raises(RecordingError, match="discrete.*continuous|continuous.*discrete"):
        load_demonstrations([continuous_recording, discrete_recording])
    with pytest.raises(RecordingError, match="discrete and continuous"):
        load_demonstrations(discrete_recording).extend(load_demonstrations(continuous_recording))
    rc = main(["train", "--data", str(discrete_recording), str(continuous_recording), "--out", str(tmp_path / "x.pt"),
               "--run-dir", str(tmp_path / "x"), "--train.epochs", "1", "--train.tensorboard", ""])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot train on" in err and "continuous" in err
    assert not (tmp_path / "x.pt").exists()


class _Fixed:
    """An actor that always gives one continuous action (recorded as given, clipped only by the env)."""

    label, has_probs, traces_reason = "fixed", False, None

    def __init__(self, action):
        self.action = np.asarray(action, np.float32)

    def reset(self):
        pass

    def act(self, obs, env, info=None):
        return Decision(self.action, 0)


@pytest.mark.parametrize("action, message", [([1.5, 0.0], "outside the action space"),
                                             ([np.nan, 0.0], "non-finite")])
def test_load_demonstrations_checks_continuous_actions(action, message, tmp_path):
    out = tmp_path / "nac-drive" / "bad-v0"
    collect(make_carracing(continuous=True), _Fixed(action), 1, 0, out, "test", max_steps=3, progress=False)
    with pytest.raises(RecordingError, match=message):
        load_demonstrations(out)


# ----------------------------------------------------------------------------- training
def test_train_gives_a_box_head_student(continuous_student):
    from agent.actors.loading import is_continuous, load_policy
    from agent.nn.policy import DrivingPolicy

    path, report = continuous_student
    policy = load_policy(path)
    assert isinstance(policy, DrivingPolicy) and is_continuous(policy)
    assert policy.output_kind == "continuous" and policy.action_space == BOX2
    assert policy.config.action_names == ("steering", "throttle") and policy.config.window == 2
    assert report["metric"] == "mse" and not report["higher_is_better"]
    assert np.isfinite(report["best_metric"])
    assert report["n_train_sequences"] == 2  # 1 recorded + 1 DAgger episode (1 held out)
    assert len(report["dagger_returns"]) == 1
    assert len(policy.metadata["train_mean_action"]) == 2 and "train_mean_steering" not in policy.metadata
    action, _ = policy.predict(np.zeros((3, 96, 96, 3), np.uint8))
    assert action.shape == (3, 2) and action.dtype == np.float32 and np.all(np.abs(action) <= 1.0)


def test_continuous_windows_and_loss(continuous_recording):
    import torch

    from agent.data.windows import DemonstrationSource, WindowDataset
    from agent.nn.policy import DrivingPolicy, default_config

    item = WindowDataset(DemonstrationSource(load_demonstrations(continuous_recording)), 4, shuffle_borders=False)[0]
    assert item["target"].shape == (4, 2) and item["target"].dtype == torch.float32
    policy = DrivingPolicy(default_config("carracing", core="gru", continuous=True, window=4))
    out = policy(item["obs"][None], item["t"][None], item["mask"][None])  # (1, 4, 2)
    mask = item["mask"][None].clone()
    mask[0, -1] = False
    loss = policy.head.loss(out, item["target"][None], mask)
    expected = ((out - item["target"][None]) ** 2)[0, :3].mean()
    assert out.shape == (1, 4, 2) and torch.allclose(loss, expected)
    s, c = policy.head.metric_sums(torch.full((1, 1, 2), 3.0), torch.zeros(1, 1, 2), torch.ones(1, 1, dtype=torch.bool))
    assert (s, c) == (2.0, 2)  # outputs clipped to the box (1.0 each) before the squared error


def test_dagger_refuses_an_expert_of_the_other_kind(continuous_recording, discrete_recording, continuous_expert,
                                                   tiny_expert, tmp_path, capsys):
    for data, expert in ((continuous_recording, tiny_expert), (discrete_recording, continuous_expert)):
        rc = main(["train", "--data", str(data), "--out", str(tmp_path / "x.pt"), "--run-dir",
                   str(tmp_path / data.name), "--train.epochs", "1", "--teacher.expert", str(expert),
                   "--dagger.rounds", "1", "--train.tensorboard", ""])
        err = capsys.readouterr().err
        assert rc == 2 and "same kind" in err, err
    assert not (tmp_path / "x.pt").exists()


# ----------------------------------------------------------------------------- evaluate and drive
def test_evaluate_the_student_on_the_continuous_env(continuous_student, executed_actions, tmp_path):
    js = tmp_path / "eval.json"
    rc = main(["evaluate", "--policy", str(continuous_student[0]), "--episodes", "1", "--max-steps", "20",
               "--workers", "1", "--json", str(js)])
    assert rc == 0 and json.loads(js.read_text())["steps"] == [20]
    _assert_in_box(executed_actions, 20)


def test_evaluate_the_continuous_expert(continuous_expert, executed_actions, capsys):
    rc = main(["evaluate", "--policy", str(continuous_expert), "--episodes", "1", "--max-steps", "10", "--workers", "1"])
    assert rc == 0 and "mean return" in capsys.readouterr().out
    _assert_in_box(executed_actions, 10)


def test_drive_shows_the_two_controls(continuous_student, executed_actions):
    from agent.drive.config import parse_drive_args
    from agent.drive.session import DriveSession
    from agent.actors.loading import load_policy

    args = parse_drive_args(["--headless", "--max-steps", "5", "--env-worker", "off"])  # the spy sees this process
    s = DriveSession(args, load_policy(continuous_student[0]), "student.pt", headless=True, force_draw=True)
    views = []
    compose = s.renderer.compose
    s.renderer.compose = lambda view: (views.append(view), compose(view))[1]
    try:
        how, _, steps = s.play_episode(1_000_000, 1)
    finally:
        s.close()
    assert how == "done" and steps == 5
    assert s.renderer.steering and not s.renderer.show_probs and s.renderer.steering_degrees is None
    _assert_in_box(executed_actions, 5)
    for view, action in zip(views, executed_actions):
        assert view.probs is None and view.action is None
        assert view.steering == pytest.approx(float(action[0])) and view.throttle == pytest.approx(float(action[1]))


# ----------------------------------------------------------------------------- the discrete default
def test_the_discrete_default_is_unchanged():
    from agent.actors.loading import is_continuous
    from agent.nn.policy import CARRACING_ACTIONS, DrivingPolicy, default_config

    cfg = default_config("carracing")
    assert cfg.action_space == {"type": "discrete", "n": 5} and cfg.action_names == CARRACING_ACTIONS
    policy = DrivingPolicy(cfg)
    assert policy.output_kind == "discrete" and not is_continuous(policy)
    assert isinstance(make_carracing().action_space, gym.spaces.Discrete)
    cont = default_config("carracing", continuous=True)
    assert cont.action_space == {"type": "box", "low": [-1.0, -1.0], "high": [1.0, 1.0]}
    assert cont.action_names == ("steering", "throttle")
    with pytest.raises(ValueError, match="continuous"):
        default_config("udacity", continuous=True)
