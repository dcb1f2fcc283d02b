"""The dashboard masks, disturbances, DAgger's mixing schedule and the expert's recovery check."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from agent.cli import main
from agent.nn.features import CarRacingCNN, dashboard_rows, speed_bar_columns
from agent.actors.rollout import Decision
from agent.train.dagger import beta_schedule
from agent.actors.perturb import DisturbanceConfig, PerturbedActor, disturbance_action, disturbance_phases, speed_action


# ------------------------------------------------------------------------------------------- dashboard
def test_dashboard_geometry_matches_gymnasium_frames():
    """The strip and the speed bar sit where gymnasium draws them in a real 96x96 frame."""
    from envs.carracing import make_carracing

    env = make_carracing()
    obs, _ = env.reset(seed=3)
    for _ in range(40):
        obs, *_ = env.step(3)  # gas: the speed bar grows
    rows = dashboard_rows(96)
    assert rows == 12
    c0, c1 = speed_bar_columns(96)
    assert (c0, c1) == (12, 15)
    strip = obs[-rows:].astype(int).sum(-1)
    assert strip[:, c0:c1].max() > 0, "the speed bar is lit after 40 steps of gas"
    above = obs[: 96 - rows].astype(int).sum(-1)
    assert (above[-1] > 0).any(), "the rows above the strip are the road scene"


def _frames(n=2, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 96, 96, 3), dtype=np.uint8)


def test_dashboard_speed_mode_keeps_only_the_speed_bar():
    cnn = CarRacingCNN(dashboard="speed").eval()
    x = cnn.preprocess(_frames())
    assert x.shape == (2, 3, 96, 96)
    ref = CarRacingCNN(dashboard="visible").preprocess(_frames())
    assert torch.equal(x[:, :, :84], ref[:, :, :84])
    assert x[:, :, 84:, :12].abs().sum() == 0 and x[:, :, 84:, 15:].abs().sum() == 0
    assert torch.equal(x[:, :, 84:, 12:15], ref[:, :, 84:, 12:15])


def test_dashboard_speed_mode_output_ignores_the_indicators():
    """Changing only the steering/ABS/gyro pixels cannot change what the network computes."""
    torch.manual_seed(0)
    for mode, same in (("speed", True), ("hidden", True), ("visible", False)):
        cnn = CarRacingCNN(dashboard=mode).eval()
        a = _frames(1)
        b = a.copy()
        b[0, 84:, 40:80] = 255 - b[0, 84:, 40:80]  # steering indicator and gyroscope region
        with torch.no_grad():
            fa, fb = cnn(a), cnn(b)
        assert torch.allclose(fa, fb) == same, mode


def test_dashboard_hidden_mode_crops_and_reports_its_region():
    cnn = CarRacingCNN(dashboard="hidden")
    assert cnn.preprocess(_frames()).shape == (2, 3, 84, 96)
    assert cnn.region((96, 96)) == (0, 84, 0, 96)
    assert CarRacingCNN().region((96, 96)) == (0, 96, 0, 96)
    assert cnn.features_dim < CarRacingCNN().features_dim


def test_dashboard_rejects_unknown_mode():
    with pytest.raises(ValueError, match="dashboard must be one of"):
        CarRacingCNN(dashboard="masked")


# ------------------------------------------------------------------------------------------- disturbances
class _Constant:
    label, has_probs, traces_reason = "const", False, None

    def __init__(self):
        self.calls = 0

    def reset(self):
        self.calls = 0

    def act(self, obs, env, info=None):
        self.calls += 1
        return Decision(0, 0)


class _Env:
    action_space = gym.spaces.Discrete(5)


def test_disturbance_actions():
    d5 = gym.spaces.Discrete(5)
    assert disturbance_action("stop", 1, d5) == 4
    assert {disturbance_action("off-road", s, d5) for s in (-1, 1)} == {1, 2}
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    assert np.allclose(disturbance_action("stop", 1, box), [0, -1])
    assert disturbance_action("off-road", -1, box)[0] == -1.0
    with pytest.raises(ValueError):
        disturbance_action("spin", 1, d5)
    with pytest.raises(ValueError):
        disturbance_action("stop", 1, gym.spaces.Discrete(3))


def test_perturbed_actor_fixed_schedule_overrides_then_returns_control():
    inner = _Constant()
    actor = PerturbedActor(inner, DisturbanceConfig(per_episode=0), np.random.default_rng(0),
                           schedule=[(3, "stop", 4, 1)])
    actor.reset()
    actions = [actor.act(None, _Env()).action for _ in range(10)]
    assert actions == [0, 0, 0, 4, 4, 4, 4, 0, 0, 0]
    assert inner.calls == 10, "the wrapped actor is asked on every step (its window advances)"
    assert actor.events == [(3, "stop", 4)]


def test_perturbed_actor_random_rate():
    cfg = DisturbanceConfig(per_episode=20.0, warmup=0, kinds=("stop",), stop_steps=(1, 1))
    actor = PerturbedActor(_Constant(), cfg, np.random.default_rng(1))
    actor.reset()
    for _ in range(5000):
        actor.act(None, _Env())
    assert 60 <= len(actor.events) <= 140  # about 20 per 1000 steps
    with pytest.raises(ValueError):
        DisturbanceConfig(per_episode=-1)


def test_ditch_steers_off_then_brakes_and_is_not_in_the_default_mix():
    inner = _Constant()
    actor = PerturbedActor(inner, DisturbanceConfig(per_episode=0), np.random.default_rng(0),
                           schedule=[(2, "ditch", (3, 2), -1)])
    actor.reset()
    actions = [actor.act(None, _Env()).action for _ in range(9)]
    assert actions == [0, 0, 2, 2, 2, 4, 4, 0, 0], "3 steps steering left, then 2 braking, then control returns"
    assert actor.events == [(2, "ditch", 5)] and inner.calls == 9
    assert "ditch" not in DisturbanceConfig().kinds
    with pytest.raises(ValueError, match="phase length"):
        disturbance_phases("ditch", (3,), 1, _Env.action_space)
    # random draws: each ditch lasts one length from each range, and no new disturbance starts between its phases
    cfg = DisturbanceConfig(per_episode=50.0, warmup=0, kinds=("ditch",), off_road_steps=(2, 2), stop_steps=(3, 3))
    actor = PerturbedActor(_Constant(), cfg, np.random.default_rng(4))
    actor.reset()
    actions = [actor.act(None, _Env()).action for _ in range(2000)]
    assert actor.events and all(kind == "ditch" and n == 5 for _, kind, n in actor.events)
    for start, _, _ in actor.events:
        assert actions[start:start + 5] in ([1, 1, 4, 4, 4], [2, 2, 4, 4, 4])


class _Cycle(_Constant):
    """Chooses 0, 1, 2, 3, 4, 0, 1, ... (nothing, right, left, gas, brake)."""

    def act(self, obs, env, info=None):
        self.calls += 1
        return Decision((self.calls - 1) % 5, (self.calls - 1) % 5)


def test_speed_disturbance_keeps_the_steering_and_never_coasts_or_brakes():
    inner = _Cycle()
    actor = PerturbedActor(inner, DisturbanceConfig(per_episode=0), np.random.default_rng(0),
                           schedule=[(5, "speed", 7, 1)])
    actor.reset()
    actions = [actor.act(None, _Env()).action for _ in range(15)]
    # steps 5-11 are disturbed: nothing (0) and brake (4) become gas (3); steering and gas stay
    assert actions == [0, 1, 2, 3, 4] + [3, 1, 2, 3, 3, 3, 1] + [2, 3, 4]
    assert actor.events == [(5, "speed", 7)] and inner.calls == 15
    assert "speed" not in DisturbanceConfig().kinds
    box = gym.spaces.Box(-1, 1, (2,), np.float32)
    assert np.allclose(speed_action(np.array([-0.4, -1.0], np.float32), box), [-0.4, 1.0])
    with pytest.raises(ValueError, match="Discrete"):
        speed_action(0, gym.spaces.Discrete(3))
    with pytest.raises(ValueError, match="speed_steps"):
        DisturbanceConfig(speed_steps=(0, 5))
    # random draws last a length from speed_steps
    cfg = DisturbanceConfig(per_episode=30.0, warmup=0, kinds=("speed",), speed_steps=(4, 4))
    actor = PerturbedActor(_Constant(), cfg, np.random.default_rng(2))
    actor.reset()
    actions = [actor.act(None, _Env()).action for _ in range(2000)]
    assert actor.events and all(kind == "speed" and n == 4 for _, kind, n in actor.events)
    for start, _, _ in actor.events:
        assert actions[start:start + 4] == [3, 3, 3, 3]


def test_train_config_takes_the_speed_disturbance():
    from agent.train.config import DaggerSection

    assert DaggerSection(disturb_kinds=("off-road", "stop", "speed")).disturb_kinds[-1] == "speed"


def test_train_cli_refuses_an_unknown_disturbance_kind(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # tyro's parser refuses a kind outside the choices
        main(["train", "--env", "carracing", "--data", str(tmp_path), "--dagger.disturb-kinds", "off-road", "spin",
              "--out", str(tmp_path / "p.pt"), "--run-dir", str(tmp_path / "run")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--dagger.disturb-kinds" in err and "spin" in err


def test_beta_schedule_decays_from_the_given_beta():
    assert beta_schedule(0.5, 0.5, 3) == [0.5, 0.25, 0.125]
    assert beta_schedule(0.0, 0.5, 2) == [0.0, 0.0]


def test_disturbed_start_puts_the_car_off_the_road_or_at_rest():
    from agent.train.ppo import make_expert_train_env

    env = make_expert_train_env(disturbed_starts=1.0, seed=3)
    kinds = []
    for i in range(4):
        _, info = env.reset(seed=700_000 + i)
        car = env.unwrapped.car
        kinds.append(info.get("disturbed_start"))
        if info.get("disturbed_start") == "stop":
            assert env.unwrapped.speed < 1.0
        assert env.unwrapped.t > 0.3, "hidden steps were driven before the episode starts"
    assert any(k is not None for k in kinds)
    assert car is not None


def test_check_recovery_cli(tiny_expert, tmp_path, capsys):
    out = tmp_path / "rec.json"
    rc = main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--start", "5",
               "--limit", "10", "--max-steps", "40", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "off-road" in text and "stop" in text
    res = json.loads(out.read_text())
    assert set(res["summary"]) == {"off-road", "stop"}
    for ep in res["episodes"]:
        assert ep["recovered"] == (ep["steps_to_recover"] is not None)


def test_check_recovery_of_a_student_policy(tmp_path, capsys):
    """--policy runs the same check on a student .pt in its own env; a student given as --expert, or a
    Udacity policy, is refused with the fix."""
    import torch

    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    student = DrivingPolicy(default_config("carracing", window=2)).save(tmp_path / "student.pt")
    out = tmp_path / "rec.json"
    rc = main(["expert", "check-recovery", "--policy", str(student), "--episodes", "1", "--start", "5",
               "--limit", "10", "--max-steps", "30", "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["policy"] == str(student) and "expert" not in res
    assert {ep["kind"] for ep in res["episodes"]} == {"off-road", "stop"}
    for ep in res["episodes"]:
        assert ep["recovered"] == (ep["steps_to_recover"] is not None)
    capsys.readouterr()
    assert main(["expert", "check-recovery", "--teacher.expert", str(student), "--episodes", "1"]) == 2
    assert "pass it as --policy" in capsys.readouterr().err
    udacity = DrivingPolicy(default_config("udacity", window=2)).save(tmp_path / "udacity.pt")
    assert main(["expert", "check-recovery", "--policy", str(udacity), "--episodes", "1"]) == 2
    assert "udacity policy" in capsys.readouterr().err


def test_dagger_with_disturbances_writes_each_round(tiny_expert, tmp_path, capsys):
    from agent.data.recordings import load_demonstrations

    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "2", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    out = tmp_path / "nac.pt"
    dag = tmp_path / "recordings" / "nac-drive" / "nac-dagger"
    rc = main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "run"), "--policy.window",
               "2", "--train.epochs", "1", "--train.batch-frames", "8", "--teacher.expert", str(tiny_expert),
               "--dagger.rounds", "2", "--dagger.episodes", "1", "--dagger.epochs", "1", "--dagger.max-steps", "30",
               "--dagger.disturb", "200", "--dagger.save-rounds", str(dag), "--policy.dashboard", "speed",
               "--train.tensorboard", ""])
    assert rc == 0
    for r in (1, 2):
        demos = load_demonstrations(f"{dag}-r{r}-v0")
        assert demos.n_frames == 30 and len(demos.frames) == 1
    from agent.actors.loading import load_policy

    assert load_policy(out).features.dashboard == "speed"


def test_dagger_continues_a_saved_bc_policy(recording_and_policy, tiny_expert, tmp_path):
    """--init with --train.epochs 0 skips behaviour cloning and runs DAgger on the saved policy's weights."""
    from agent.actors.loading import load_policy

    rec, bc = recording_and_policy
    out = tmp_path / "dagger.pt"
    rc = main(["train", "--data", str(rec), "--init", str(bc), "--train.epochs", "0", "--out", str(out),
               "--run-dir", str(tmp_path / "run"), "--train.batch-frames", "8", "--teacher.expert", str(tiny_expert),
               "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1", "--dagger.max-steps", "20",
               "--train.tensorboard", ""])
    assert rc == 0
    before, after = load_policy(bc), load_policy(out)
    assert after.config == before.config
    changed = any(not torch.equal(a, b) for a, b in zip(before.state_dict().values(), after.state_dict().values()))
    assert changed, "DAgger trained the loaded weights further"
    assert main(["train", "--data", str(rec), "--init", str(bc), "--train.epochs", "0", "--policy.window", "2",
                 "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x")]) == 2
    assert main(["train", "--data", str(rec), "--train.epochs", "0", "--out", str(tmp_path / "y.pt"),
                 "--run-dir", str(tmp_path / "y")]) == 2


@pytest.fixture(scope="module")
def recording_and_policy(tiny_expert, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("init")
    rec = tmp / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "2", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    bc = tmp / "bc.pt"
    assert main(["train", "--data", str(rec), "--out", str(bc), "--run-dir", str(tmp / "run"), "--policy.window", "2",
                 "--train.epochs", "1", "--train.batch-frames", "8", "--policy.dashboard", "hidden",
                 "--train.tensorboard", ""]) == 0
    return rec, bc


def test_grad_cam_puts_no_heat_on_blanked_dashboard_pixels():
    """With dashboard="speed", the strip except the speed bar is constant input: the map is 0 there."""
    from cam_fixture import newest_frame_cam

    from agent.drive.saliency import bottom_share
    from agent.nn.policy import DrivingPolicy, default_config

    torch.manual_seed(0)
    policy = DrivingPolicy(default_config("carracing", window=2,
                                          features_kwargs={"dropout": 0.0, "dashboard": "speed"})).eval()
    cam = newest_frame_cam(policy, _frames(3, seed=4))
    assert cam.shape == (96, 96)
    assert cam[84:, :12].max() == 0 and cam[84:, 15:].max() == 0
    assert cam[:84].max() > 0
    assert bottom_share(cam) == pytest.approx(cam[84:, 12:15].sum() / cam.sum())


def test_evaluate_sample_is_seeded_by_the_track(recording_and_policy, tmp_path):
    """--sample draws actions from the softmax; the same tracks give the same returns again."""
    _, bc = recording_and_policy
    runs = []
    for i in range(2):
        out = tmp_path / f"s{i}.json"
        assert main(["evaluate", "--policy", str(bc), "--episodes", "2", "--track-seed", "700000", "--max-steps", "25",
                     "--workers", "1", "--sample", "--json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert runs[0]["returns"] == runs[1]["returns"] and runs[0]["deterministic"] is False
    out = tmp_path / "argmax.json"
    assert main(["evaluate", "--policy", str(bc), "--episodes", "1", "--track-seed", "700000", "--max-steps", "5",
                 "--workers", "1", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["deterministic"] is True
