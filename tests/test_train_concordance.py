"""The concordance loss term (`agent train --train.concordance W`): 1 - Lin's CCC, a loss that does not
reward steering shrunk toward 0."""

import json

import numpy as np
import pytest
import torch
from cli_run import unbox
from udacity_fixture import write_recording

from agent.cli import main
from agent.nn.heads import RegressionHead
from agent.nn.policy import DrivingPolicy
from agent.train.bc import TrainConfig


def _head():
    return RegressionHead(4, 1, 8, "relu", [-1], [1])


def _ccc(y, t):  # Lin (1989), population moments, written out in NumPy
    my, mt = y.mean(), t.mean()
    return 2 * ((y - my) * (t - mt)).mean() / (y.var() + t.var() + (my - mt) ** 2)


def test_concordance_loss_is_one_minus_lins_ccc_over_the_counted_positions():
    rng = np.random.default_rng(0)
    t = rng.normal(0, 0.3, (3, 5)).astype(np.float64)
    y = 0.4 * t + rng.normal(0, 0.05, (3, 5))
    mask = np.ones((3, 5), bool)
    mask[2, 3:] = False  # padding: its values must not count
    t_pad = t.copy()
    t_pad[~mask] = np.nan
    loss = _head().double().concordance_loss(torch.tensor(y)[..., None], torch.tensor(t_pad), torch.tensor(mask))
    assert loss.item() == pytest.approx(1 - _ccc(y[mask], t[mask]), rel=1e-9)


def test_shrunk_outputs_pay_and_exact_ones_do_not():
    t = torch.linspace(-0.5, 0.5, 20).reshape(2, 10, 1)
    mask = torch.ones(2, 10, dtype=torch.bool)
    head = _head()
    assert head.concordance_loss(t.clone(), t, mask).item() == pytest.approx(0.0, abs=1e-6)
    # outputs with the right sign and a third of the size: correlation 1, yet 1 - CCC = 1 - 2s/(s^2 + 1) = 0.4
    assert head.concordance_loss(t / 3, t, mask).item() == pytest.approx(1 - (2 / 3) / (1 / 9 + 1), rel=1e-5)
    # a constant output (the shrink to 0 in the limit) pays the most a non-anticorrelated output can: 1
    assert head.concordance_loss(torch.zeros_like(t), t, mask).item() == pytest.approx(1.0, abs=1e-6)


def test_weights_count_as_repeated_positions_and_degenerate_batches_give_zero():
    rng = np.random.default_rng(1)
    y, t = rng.normal(size=(1, 4, 1)), rng.normal(size=(1, 4))
    head = _head().double()
    w = torch.tensor([[2.0, 1.0, 1.0, 3.0]], dtype=torch.float64)
    rep = [0, 0, 1, 2, 3, 3, 3]
    mask = torch.ones(1, 4, dtype=torch.bool)
    weighted = head.concordance_loss(torch.tensor(y), torch.tensor(t), mask, w)
    repeated = head.concordance_loss(torch.tensor(y[:, rep]), torch.tensor(t[:, rep]), torch.ones(1, 7, dtype=torch.bool))
    assert weighted.item() == pytest.approx(repeated.item(), rel=1e-9)
    out = torch.zeros(1, 4, 1, requires_grad=True)
    one = torch.tensor([[True, False, False, False]])
    zero = head.float().concordance_loss(out, torch.zeros(1, 4), one)  # one position: no moments
    flat = head.concordance_loss(out, torch.zeros(1, 4), mask)  # no spread anywhere
    (zero + flat).backward()
    assert zero.item() == 0.0 and flat.item() == 0.0 and torch.isfinite(out.grad).all()


def test_train_config_refuses_a_bad_weight():
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="concordance"):
            TrainConfig(concordance=bad)


def _train(tmp_path, root, name, *extra):
    out = tmp_path / f"{name}.pt"
    try:
        rc = main(["train", "--env", "udacity", "--data", str(root), "--out", str(out), "--run-dir", str(tmp_path / name),
                   "--train.epochs", "1", "--policy.window", "2", "--train.batch-frames", "8", "--train.val-fraction",
                   "0.25", "--train.tensorboard", "", "--threads", "1", "--seed", "2", "--json",
                   str(tmp_path / f"{name}.json"), *extra])
    except SystemExit as exc:  # a value a config section refuses exits from the parser
        rc = exc.code
    return rc, out


def test_the_term_changes_what_udacity_training_learns_and_is_recorded(tmp_path, capsys):
    root, _ = write_recording(tmp_path / "rec", n=16, steering=[0.3 * np.sin(i / 2) for i in range(16)])
    rc, plain = _train(tmp_path, root, "plain")
    assert rc == 0
    rc, ccc = _train(tmp_path, root, "ccc", "--train.concordance", "1.0")
    assert rc == 0
    p, c = DrivingPolicy.load(plain).state_dict(), DrivingPolicy.load(ccc).state_dict()
    assert not all(torch.allclose(p[k], c[k]) for k in p)
    assert json.loads((tmp_path / "ccc.json").read_text())["config"]["concordance"] == 1.0
    rc, _ = _train(tmp_path, root, "neg", "--train.concordance", "-1")
    assert rc == 2 and "train.concordance must be a finite weight >= 0" in unbox(capsys.readouterr().err)


def test_a_discrete_head_refuses_the_term(tmp_path, capsys):
    from pathlib import Path
    sample = Path(__file__).resolve().parents[1] / "recordings" / "nac-drive" / "sample-v0"
    rc = main(["train", "--env", "carracing", "--data", str(sample), "--out", str(tmp_path / "d.pt"), "--run-dir",
               str(tmp_path / "d"), "--train.epochs", "1", "--policy.window", "2", "--train.batch-frames", "16",
               "--train.concordance", "1", "--train.tensorboard", "", "--threads", "1"])
    assert rc == 2 and "concordance is a loss term of continuous heads" in unbox(capsys.readouterr().err)
    assert not (tmp_path / "d.pt").exists()
