"""DAgger's edge weights: which frames weigh more, the weighted loss, and the path from a
relabelled episode to a training batch."""

import numpy as np
import pytest
import torch
from cli_run import run_cli

from agent.cli import main
from agent.data.recordings import Demonstrations
from agent.data.windows import DemonstrationSource, WindowDataset
from agent.nn.heads import CategoricalHead, RegressionHead
from agent.train.dagger import edge_weights


def test_edge_weights_mark_the_edge_and_the_steps_that_lead_there():
    wheels = np.array([0, 0, 0, 0, 2, 0, 0, 0, 0, 0], np.int8)  # a wheel off after step 4
    w = edge_weights(wheels, 10, 3.0, horizon=2)
    # frames 3 and 4 lead there within 2 steps; frame 5 was taken on the edge (after step 4)
    assert w.tolist() == [1, 1, 1, 3, 3, 3, 1, 1, 1, 1]
    assert w.dtype == np.float32
    assert edge_weights(wheels, 10, 3.0, horizon=0).tolist() == [1, 1, 1, 1, 1, 3, 1, 1, 1, 1]
    # leaving the road: the frames that lead there weigh more, those taken fully off the road do not
    leaving = np.array([0, 2, 4, 4, 3, 0], np.int8)
    assert edge_weights(leaving, 6, 2.0, horizon=1).tolist() == [1, 2, 2, 1, 1, 2]


def test_edge_weights_off_when_the_weight_is_one_or_the_env_has_no_wheels():
    assert edge_weights(np.array([1, 0], np.int8), 2, 1.0, 10) is None
    assert edge_weights(None, 2, 4.0, 10) is None
    with pytest.raises(ValueError, match="shape"):
        edge_weights(np.array([1, 0], np.int8), 3, 4.0, 10)
    with pytest.raises(ValueError, match=">= 0"):
        edge_weights(np.array([1, 0], np.int8), 2, -1.0, 10)


def test_weighted_cross_entropy_is_the_weighted_mean_and_one_everywhere_is_the_plain_loss():
    head = CategoricalHead(4, 3, 8, "relu")
    torch.manual_seed(0)
    out = torch.randn(2, 3, 3)
    target = torch.tensor([[0, 1, 2], [2, 2, 0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    plain = head.loss(out, target, mask)
    assert torch.allclose(head.loss(out, target, mask, torch.ones(2, 3)), plain)
    weight = torch.tensor([[1.0, 4.0, 9.0], [1.0, 1.0, 2.0]])
    per = torch.nn.functional.cross_entropy(out.flatten(0, 1), target.flatten(), reduction="none").view(2, 3)
    m = mask.float()
    expected = (per * weight * m).sum() / (weight * m).sum()  # the padded position's 9 does not count
    assert torch.allclose(head.loss(out, target, mask, weight), expected)
    assert not torch.allclose(head.loss(out, target, mask, weight), plain)
    with pytest.raises(ValueError, match="finite and >= 0"):
        head.loss(out, target, mask, -weight)


def test_weighted_mse_ignores_padded_nan_targets():
    head = RegressionHead(4, 2, 8, "relu", [-1, -1], [1, 1])
    out = torch.zeros(1, 3, 2, requires_grad=True)
    target = torch.tensor([[[1.0, 1.0], [0.0, 2.0], [float("nan"), float("nan")]]])
    mask = torch.tensor([[True, True, False]])
    loss = head.loss(out, target, mask, torch.tensor([[3.0, 1.0, 1.0]]))
    assert torch.isclose(loss, torch.tensor((3 * 1.0 + 1 * 2.0) / 4))
    loss.backward()
    assert torch.isfinite(out.grad).all() and out.grad[0, 2].abs().sum() == 0


def _demos(weights=None):
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (6, 8, 8, 3), dtype=np.uint8), rng.integers(0, 255, (4, 8, 8, 3), dtype=np.uint8)]
    actions = [np.arange(6) % 5, np.arange(4) % 5]
    return Demonstrations(frames, [a.astype(np.int64) for a in actions], [0, 1], [0.0, 0.0], weights=weights)


def test_weights_travel_through_extend_subset_and_the_window_items():
    plain = _demos()
    weighted = _demos([np.full(6, 2.0, np.float32), np.array([1, 5, 1, 1], np.float32)])
    both = plain.extend(weighted)
    assert [w.tolist() for w in both.frame_weights()][:2] == [[1.0] * 6, [1.0] * 4]
    assert both.subset([3]).weights[0].tolist() == [1, 5, 1, 1]
    ds = WindowDataset(DemonstrationSource(both), window=4, shuffle_borders=False)
    items = [ds[i] for i in range(len(ds))]
    assert all("weight" in it for it in items)
    last = items[-1]  # episode 3's one window: its weights, the padding 0
    assert last["weight"].tolist() == [1, 5, 1, 1]
    assert "weight" not in WindowDataset(DemonstrationSource(plain), window=4, shuffle_borders=False)[0]
    with pytest.raises(ValueError, match="weights must be"):
        _demos([np.ones(5, np.float32), np.ones(4, np.float32)])


def test_dagger_edge_weight_trains_through_the_cli(tiny_expert, tmp_path, capsys):
    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    out = tmp_path / "nac.pt"
    rc = main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "run"), "--policy.window",
               "2", "--train.epochs", "1", "--train.batch-frames", "8", "--teacher.expert", str(tiny_expert),
               "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1", "--dagger.max-steps", "40",
               "--dagger.disturb", "200", "--dagger.edge-weight", "4", "--train.tensorboard", ""])
    assert rc == 0 and out.is_file()
    capsys.readouterr()
    rc, err = run_cli(["train", "--data", str(rec), "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x"),
                       "--dagger.edge-weight", "4"], capsys)
    assert rc == 2 and "dagger.edge_weight weighs DAgger's relabelled frames: it needs dagger.rounds" in err
    rc, err = run_cli(["train", "--data", str(rec), "--out", str(tmp_path / "y.pt"), "--run-dir", str(tmp_path / "y"),
                       "--dagger.edge-weight", "-1", "--dagger.rounds", "1", "--teacher.expert", str(tiny_expert)],
                      capsys)  # refused by tyro's parser
    assert rc == 2 and "dagger.edge_weight must be a finite weight >= 0" in err
