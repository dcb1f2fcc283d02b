"""DAgger's wrong-way weights: the frames taken while the car drove against the lap's direction,
their weight in the loss, and the option's path through `agent train`."""

import numpy as np
import pytest
from cli_run import run_cli

from agent.actors.rollout import Episode
from agent.cli import main
from agent.train.config import ConfigError, DaggerSection
from agent.train.dagger import episode_weights, wrong_way_weights


def _episode(wheels, wrong):
    n = len(wheels)
    return Episode(seed=0, observations=None, actions=np.zeros(n, np.int64), labels=np.zeros(n, np.int64),
                   rewards=np.zeros(n, np.float32), terminations=np.zeros(n, bool), truncations=np.zeros(n, bool),
                   speeds=np.zeros(n + 1, np.float32), wheels_off=np.asarray(wheels, np.int8),
                   wrong_way=None if wrong is None else np.asarray(wrong, bool))


def test_wrong_way_weights_mark_the_frames_taken_after_a_wrong_way_step():
    wrong = np.array([0, 0, 1, 1, 0, 1], bool)  # wrong way after steps 2, 3 and 5
    w = wrong_way_weights(wrong, 6, 0.0)
    # frame i is the observation after step i - 1: frames 3 and 4 (and none for step 5: the episode ends)
    assert w.tolist() == [1, 1, 1, 0, 0, 1] and w.dtype == np.float32
    assert wrong_way_weights(wrong, 6, 0.5).tolist() == [1, 1, 1, 0.5, 0.5, 1]
    assert wrong_way_weights(np.ones(3, bool), 3, 0.0).tolist() == [1, 0, 0]  # the reset's frame never


def test_wrong_way_weights_off_and_refused():
    assert wrong_way_weights(np.ones(2, bool), 2, 1.0) is None
    assert wrong_way_weights(None, 2, 0.0) is None  # an env without a track
    with pytest.raises(ValueError, match="shape"):
        wrong_way_weights(np.ones(2, bool), 3, 0.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="finite and >= 0"):
            wrong_way_weights(np.ones(2, bool), 2, bad)


def test_episode_weights_multiply_the_edge_and_the_wrong_way_weights():
    ep = _episode([0, 2, 0, 0, 0], [0, 0, 1, 1, 0])
    assert episode_weights(ep) is None
    assert episode_weights(ep, wrong_way_weight=0.0).tolist() == [1, 1, 1, 0, 0]
    assert episode_weights(ep, edge_weight=3.0, edge_horizon=0).tolist() == [1, 1, 3, 1, 1]
    both = episode_weights(ep, edge_weight=3.0, edge_horizon=0, wrong_way_weight=0.5)
    assert both.tolist() == [1, 1, 3, 0.5, 0.5] and both.dtype == np.float32
    assert episode_weights(_episode([0, 0], None), wrong_way_weight=0.0) is None


def test_the_config_refuses_a_bad_wrong_way_weight():
    assert DaggerSection(rounds=1, wrong_way_weight=0.0).wrong_way_weight == 0.0
    with pytest.raises(ConfigError, match="dagger.wrong_way_weight must be a finite weight >= 0"):
        DaggerSection(rounds=1, wrong_way_weight=-0.5)


def test_dagger_wrong_way_weight_trains_through_the_cli(tiny_expert, tmp_path, capsys, caplog):
    rec = tmp_path / "recordings" / "nac-drive" / "demo-v0"
    assert main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--max-steps", "20",
                 "--track-seed", "0", "--out", str(rec)]) == 0
    out = tmp_path / "nac.pt"
    with caplog.at_level("INFO"):
        rc = main(["train", "--data", str(rec), "--out", str(out), "--run-dir", str(tmp_path / "run"),
                   "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "8", "--teacher.expert",
                   str(tiny_expert), "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.epochs", "1",
                   "--dagger.max-steps", "40", "--dagger.wrong-way-weight", "0", "--train.tensorboard", ""])
    assert rc == 0 and out.is_file()
    assert any("steps driven the wrong way (their frames weigh 0)" in r.getMessage() for r in caplog.records)
    capsys.readouterr()
    rc, err = run_cli(["train", "--data", str(rec), "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x"),
                       "--dagger.wrong-way-weight", "0"], capsys)
    assert rc == 2 and "dagger.wrong_way_weight weighs DAgger's relabelled frames: it needs dagger.rounds" in err
