"""Class weights (`agent train --train.class-weights`): each frame's loss weight from its target action."""

import json
from pathlib import Path

import pytest
import torch
from cli_run import unbox

from agent.cli import main
from agent.nn.policy import DrivingPolicy
from agent.train.bc import TrainConfig, class_frame_weights

SAMPLE = str(Path(__file__).resolve().parents[1] / "recordings" / "nac-drive" / "sample-v0")


def test_frames_weigh_by_their_target_action_and_padding_weighs_nothing():
    table = torch.tensor([1.0, 2.0, 3.0, 0.5, 4.0])
    target = torch.tensor([[0, 4, 3], [1, 2, -100]])  # -100: a padded position
    assert class_frame_weights(target, table).tolist() == [[1.0, 4.0, 0.5], [2.0, 3.0, 0.0]]
    edge = torch.tensor([[2.0, 1.0, 1.0], [1.0, 3.0, 1.0]])  # DAgger's edge weights multiply
    assert class_frame_weights(target, table, edge).tolist() == [[2.0, 4.0, 0.5], [2.0, 9.0, 0.0]]


@pytest.mark.parametrize("bad", [(1.0, -1.0), (0.0, 0.0), (1.0, float("nan")), ()])
def test_train_config_refuses_bad_class_weights(bad):
    with pytest.raises(ValueError, match="class_weights"):
        TrainConfig(class_weights=bad)


def _train(tmp_path, name, *extra):
    out = tmp_path / f"{name}.pt"
    try:  # a value a config section refuses exits from tyro's parser (SystemExit 2)
        rc = main(["train", "--env", "carracing", "--data", SAMPLE, "--out", str(out), "--run-dir",
                   str(tmp_path / name), "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "16",
                   "--seed", "3", "--train.tensorboard", "", "--threads", "1", *extra])
    except SystemExit as exc:
        rc = exc.code
    return rc, out


def test_class_weights_change_what_is_learnt_and_are_recorded(tmp_path):
    rc, plain = _train(tmp_path, "plain")
    assert rc == 0
    rc, ones = _train(tmp_path, "ones", "--train.class-weights", "1", "1", "1", "1", "1")
    assert rc == 0
    report = tmp_path / "gas.json"
    rc, gas_only = _train(tmp_path, "gas", "--train.class-weights", "0", "0", "0", "1", "0", "--json", str(report))
    assert rc == 0
    p, o, g = (DrivingPolicy.load(f).state_dict() for f in (plain, ones, gas_only))
    # all ones is the plain (unweighted) mean; weighing only the gas frames trains other weights
    assert all(torch.allclose(p[k], o[k], atol=1e-5) for k in p)
    assert not all(torch.allclose(p[k], g[k], atol=1e-5) for k in p)
    assert json.loads(report.read_text())["config"]["class_weights"] == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_class_weights_errors_say_what_was_wrong(tmp_path, capsys):
    rc, _ = _train(tmp_path, "neg", "--train.class-weights", "1", "1", "1", "1", "-4")
    err = unbox(capsys.readouterr().err)
    assert rc == 2 and "train.class_weights must be finite weights >= 0" in err
    rc, _ = _train(tmp_path, "short", "--train.class-weights", "1", "4")
    err = capsys.readouterr().err
    assert rc == 2 and "5 actions" in err and "2 weights" in err
