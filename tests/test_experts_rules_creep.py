"""The teacher's creep rule: below a speed every discrete label is gas, in DAgger's relabelling and
in recorded labels (relabelled from the speeds the recordings keep)."""

import numpy as np
import pytest
from cli_run import run_cli
from expert_fixture import ConstantNet, small_demos

from agent.cli import main
from agent.data.recordings import load_demonstrations
from agent.experts.policy import ExpertPolicy
from agent.experts.rules import GAS, creep_rule, relabel_creep
from envs.carracing import ACTION_NAMES, PRIVILEGED_DIM

LEFT, RIGHT, NOTHING, BRAKE = (ACTION_NAMES.index(n) for n in ("left", "right", "nothing", "brake"))


_Constant = ConstantNet


def test_creep_rule_turns_every_slow_label_into_gas_and_keeps_the_rest():
    actions = np.array([LEFT, RIGHT, NOTHING, BRAKE, LEFT, RIGHT, LEFT])
    speeds = np.array([0.5, 2.0, 4.9, 3.0, 5.0, 40.0, np.nan])
    out = creep_rule(actions, speeds, 5.0)
    assert out.tolist() == [GAS, GAS, GAS, GAS, LEFT, RIGHT, LEFT]  # 5.0 is not below 5; NaN never triggers
    assert actions.tolist()[0] == LEFT  # a new array
    assert creep_rule(actions, speeds, 0.0).tolist() == actions.tolist()  # 0: off
    with pytest.raises(ValueError, match="one speed per action"):
        creep_rule(actions, speeds[:3], 5.0)
    with pytest.raises(ValueError, match=">= 0"):
        creep_rule(actions, speeds, -1.0)


def test_the_expert_applies_it_after_the_start_rule_and_only_when_asked():
    speeds = np.array([0.0, 2.0, 4.0, 8.0, 40.0])
    states = np.zeros((len(speeds), PRIVILEGED_DIM), np.float32)
    plain = ExpertPolicy(_Constant(LEFT), start_rule=True)
    assert plain.creep_speed == 0.0
    assert plain.act_batch(states, speeds).tolist() == [GAS, LEFT, LEFT, LEFT, LEFT]  # the start rule alone
    crept = ExpertPolicy(_Constant(LEFT), start_rule=True).use_creep_rule(5.0)
    assert crept.act_batch(states, speeds).tolist() == [GAS, GAS, GAS, LEFT, LEFT]
    # without the start rule too: the two rules are separate
    assert ExpertPolicy(_Constant(BRAKE)).use_creep_rule(5.0).act_batch(states, speeds).tolist() == \
        [GAS, GAS, GAS, BRAKE, BRAKE]
    with pytest.raises(ValueError, match="discrete experts"):
        ExpertPolicy(_Constant((0.3, -1.0))).use_creep_rule(5.0)
    with pytest.raises(ValueError, match=">= 0"):
        plain.use_creep_rule(-2.0)


def _demos(speeds=None, continuous=False):
    return small_demos(([LEFT, RIGHT, LEFT, GAS], [NOTHING, BRAKE, LEFT]), speeds, continuous)


def test_relabel_creep_uses_the_recorded_speeds():
    demos = _demos([np.array([1.0, 3.0, 9.0, 2.0], np.float32), np.array([np.nan, 4.0, 6.0], np.float32)])
    new, changed = relabel_creep(demos, 5.0)
    assert [a.tolist() for a in new.actions] == [[GAS, GAS, LEFT, GAS], [NOTHING, GAS, LEFT]]
    assert changed == 3  # the gas already there is not counted
    assert demos.actions[0].tolist() == [LEFT, RIGHT, LEFT, GAS]  # the input is left as it was
    # episodes without speeds keep their labels; speeds travel through subset and extend
    both = _demos().extend(demos)
    assert both.subset([2]).speeds[0].tolist() == [1.0, 3.0, 9.0, 2.0]
    assert relabel_creep(both, 5.0)[1] == 3
    with pytest.raises(ValueError, match="discrete recordings"):
        relabel_creep(_demos(continuous=True), 5.0)
    with pytest.raises(ValueError, match="speeds must be"):
        _demos([np.zeros(3, np.float32), np.zeros(3, np.float32)])


def test_creep_speed_trains_through_the_cli_from_recorded_speeds(tiny_expert, tmp_path, capsys):
    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    demos = load_demonstrations(rec)
    speeds = demos.speeds[0]
    # the recording keeps the speed at every labelled frame: at rest at the reset, then moving or not
    assert speeds.shape == (20,) and np.isfinite(speeds).all() and speeds[0] < 1.0
    slow_not_gas = int(np.count_nonzero((speeds < 1e6) & (demos.actions[0] != GAS)))
    out = tmp_path / "nac.pt"
    rc = main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "run"), "--policy.window",
               "2", "--train.epochs", "1", "--train.batch-frames", "8", "--teacher.creep-speed", "1e6",
               "--train.tensorboard", ""])
    assert rc == 0 and out.is_file()
    log = " ".join(capsys.readouterr().err.split())
    assert f"{slow_not_gas} of 20 recorded labels" in log
    rc, err = run_cli(["train", "--data", str(rec), "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x"),
                       "--teacher.creep-speed", "-1"], capsys)  # refused by tyro's parser
    assert rc == 2 and "teacher.creep_speed must be a finite speed >= 0" in err
    rc, err = run_cli(["train", "--env", "udacity", "--data", str(tmp_path), "--out", str(tmp_path / "u.pt"),
                       "--run-dir", str(tmp_path / "u"), "--teacher.creep-speed", "5"], capsys)
    assert rc == 2 and "teacher.creep_speed only apply to env 'carracing'" in err


def test_the_longest_crawl_counts_slow_steps_that_the_standstill_figure_misses():
    from agent.actors.rollout import CRAWL_METRIC_SPEED, Episode

    # at rest for 2 steps, then 60 steps circling at 3 units/s, then driving
    after = np.r_[np.zeros(2), np.full(60, 3.0), np.full(10, 40.0)].astype(np.float32)
    n = len(after)
    ep = Episode(0, None, np.zeros(n, np.int64), None, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool),
                 np.r_[np.float32(0.0), after])
    assert CRAWL_METRIC_SPEED == 5.0
    assert ep.longest_standstill == 2 and ep.longest_crawl == 62
    unknown = Episode(0, None, np.zeros(2, np.int64), None, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool),
                      np.full(3, np.nan))
    assert unknown.longest_crawl is None


def test_evaluate_reports_crawls(tmp_path):
    import json

    import torch

    from agent.nn.policy import DrivingPolicy, default_config
    from agent.actors.rollout import STALL_STEPS

    torch.manual_seed(0)
    p = DrivingPolicy(default_config("carracing", window=2)).eval()
    with torch.no_grad():  # a head that always picks "left"
        p.head.net[-1].weight.zero_()
        p.head.net[-1].bias.zero_()
        p.head.net[-1].bias[LEFT] = 10.0
    pol = p.save(tmp_path / "left.pt")  # steers from rest: never moves, so it crawls throughout
    js = tmp_path / "e.json"
    assert main(["evaluate", "--policy", str(pol), "--episodes", "1", "--track-seed", "1000000", "--max-steps", "60",
                 "--workers", "1", "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["longest_crawl_steps"] == [60] and res["episodes_with_crawl"] == int(60 > STALL_STEPS) == 1
    assert res["crawl_speed"] == 5.0


def test_evaluate_drives_an_expert_with_the_teachers_rules(tiny_expert, tmp_path, capsys):
    """--teacher.* rules: an expert .zip as --policy only, applied strictly, recorded in the JSON."""
    import json

    js = tmp_path / "e.json"
    argv = ["evaluate", "--policy", str(tiny_expert), "--episodes", "1", "--max-steps", "10", "--workers", "1",
            "--device", "cpu", "--teacher.start-rule", "--teacher.creep-speed", "5", "--teacher.grass-rule", "--json",
            str(js)]
    assert main(argv) == 0
    res = json.loads(js.read_text())
    assert (res["start_rule"], res["creep_speed"], res["grass_rule"], res["brake_floor"]) == (True, 5.0, True, None)
    assert res["steps"] == [10] and res["device"] == "cpu"
    assert main(argv) == 2 and "--overwrite" in capsys.readouterr().err  # the JSON is there
    for args, message in [
        (["--policy", str(tiny_expert), "--teacher.brake-floor", "20"], "add --teacher.start-rule"),
        (["--policy", "nac.pt", "--teacher.creep-speed", "5"], "the teacher's rules are the PPO expert's"),
        (["--policy", "carracing-expert-margin.zip", "--teacher.grass-rule"], "--teacher.grass-rule: "),
        (["--teacher.expert", str(tiny_expert)], "evaluate the expert with --policy"),
    ]:
        assert main(["evaluate", *args, "--episodes", "1", "--device", "cpu"]) == 2, args
        assert message in capsys.readouterr().err, args


def test_drive_prints_the_longest_crawl():
    from agent.drive.session import stall_text
    from agent.actors.rollout import StallMeter

    meter = StallMeter()
    for speed in [0.0, 3.0, 3.0, 3.0, 40.0, 2.0]:
        meter.update(speed, False, 10)
    assert meter.longest_standstill == 1 and meter.longest_crawl == 4
    assert "longest crawl    4 steps" in stall_text(meter)
    meter.reset()
    assert meter.longest_crawl is None and "crawl" not in stall_text(meter)


def test_check_recovery_takes_the_teachers_rules(tiny_expert, tmp_path, capsys):
    import json

    js = tmp_path / "rec.json"
    assert main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--start", "5",
                 "--limit", "10", "--max-steps", "40", "--teacher.start-rule", "--teacher.creep-speed", "5", "--json",
                 str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["start_rule"] is True and res["creep_speed"] == 5.0 and set(res["summary"]) == {"off-road", "stop"}
    with pytest.raises(SystemExit) as exc:  # a value the field refuses: tyro's parser reports it
        main(["expert", "check-recovery", "--teacher.expert", str(tiny_expert), "--episodes", "1",
              "--teacher.creep-speed", "-1"])
    assert exc.value.code == 2 and "creep_speed" in capsys.readouterr().err
    js.unlink()
    assert main(["expert", "check-recovery", "--teacher.expert", "carracing-expert-margin.zip", "--episodes", "1",
                 "--teacher.creep-speed", "5", "--json", str(js)]) == 2  # strict: a continuous expert has no creep rule
    assert "--teacher.creep-speed: " in capsys.readouterr().err and not js.exists()
