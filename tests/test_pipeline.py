"""The workflow through the real entry points, with tiny budgets: collect -> train (+DAgger) -> evaluate."""

import json

import numpy as np
import pytest

from agent.cli import main
from agent.actors.record import collect
from agent.data.recordings import RecordingError, load_demonstrations
from agent.actors.rollout import Episode
from envs import make_carracing


@pytest.fixture(scope="module")
def recording(tiny_expert, tmp_path_factory):
    out = tmp_path_factory.mktemp("rec") / "nac-drive" / "expert-3-v0"
    rc = main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "3", "--track-seed", "5", "--max-steps",
               "24", "--out", str(out)])
    assert rc == 0
    return out


def test_collect_writes_a_minari_dataset(recording):
    import minari

    ds = minari.MinariDataset(recording / "data")
    assert ds.total_episodes == 3 and ds.total_steps == 72
    demos = load_demonstrations(recording)
    assert [len(a) for a in demos.actions] == [24, 24, 24]
    assert demos.frames[0].shape == (24, 96, 96, 3) and demos.frames[0].dtype == np.uint8
    assert demos.seeds == [5, 6, 7]
    # frames are the student's view, recorded losslessly: the same as a fresh rollout's frames
    env = make_carracing()
    obs, _ = env.reset(seed=5)
    np.testing.assert_array_equal(demos.frames[0][0], obs)


def test_collect_refuses_to_overwrite(recording, tiny_expert, capsys):
    rc = main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "1", "--out", str(recording)])
    assert rc == 2 and "--overwrite" in capsys.readouterr().err


def test_collect_bad_expert_path(tmp_path, capsys):
    rc = main(["collect", "--teacher.expert", str(tmp_path / "nope.zip"), "--episodes", "1", "--out",
               str(tmp_path / "ns" / "r-v0")])
    assert rc == 2 and "nope.zip" in capsys.readouterr().err
    assert not (tmp_path / "ns").exists()


def test_interrupted_recording_keeps_finished_episodes(tmp_path):
    class Interrupting:
        def __init__(self):
            self.calls = 0

        def reset(self):
            pass

        def act(self, obs, env, info=None):
            from agent.actors.rollout import Decision

            self.calls += 1
            if self.calls > 25:  # in the third episode (10 steps each)
                raise KeyboardInterrupt
            return Decision(3, 3)

    writer = collect(make_carracing(), Interrupting(), 5, 0, tmp_path / "nac-drive" / "rec-v0", "test", max_steps=10, progress=False)
    assert writer.episodes == 2
    demos = load_demonstrations(tmp_path / "nac-drive" / "rec-v0")
    assert len(demos.actions) == 2 and demos.seeds == [0, 1]


def test_collect_to_a_relative_path(tiny_expert, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["collect", "--teacher.expert", str(tiny_expert), "--episodes", "2", "--max-steps", "5",
               "--out", "recordings/nac-drive/rel-v0"])
    assert rc == 0
    assert len(load_demonstrations("recordings/nac-drive/rel-v0").actions) == 2
    assert [p.name for p in (tmp_path / "recordings").iterdir()] == ["nac-drive"]  # no staging left behind
    assert sorted(p.name for p in (tmp_path / "recordings" / "nac-drive").iterdir()) == \
        ["namespace_metadata.json", "rel-v0"]


def test_load_demonstrations_errors(tmp_path):
    with pytest.raises(RecordingError, match="does not exist"):
        load_demonstrations(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="not a Minari dataset"):
        load_demonstrations(tmp_path / "empty")
    with pytest.raises(ValueError):
        Episode(0, np.zeros((3, 96, 96, 3), np.uint8), np.zeros(3, np.int64), None, np.zeros(3), np.zeros(3, bool),
                np.zeros(3, bool), np.zeros(4))  # 3 steps need 4 frames


def test_train_dagger_evaluate(recording, tiny_expert, tmp_path, capsys):
    out = tmp_path / "nac.pt"
    report = tmp_path / "report.json"
    rc = main(["train", "--data", str(recording), "--out", str(out), "--run-dir", str(tmp_path / "run"),
               "--policy.window", "4", "--train.epochs", "1", "--train.batch-frames", "16",
               "--teacher.expert", str(tiny_expert), "--dagger.rounds", "1", "--dagger.episodes", "1",
               "--dagger.epochs", "1", "--dagger.max-steps", "12", "--train.tensorboard", str(tmp_path / "tb"),
               "--json", str(report)])
    assert rc == 0 and out.is_file()
    text = capsys.readouterr().out
    assert "held-out accuracy" in text and "DAgger round 1/1" in text
    rep = json.loads(report.read_text())
    assert rep["n_val_sequences"] == 1 and rep["n_train_sequences"] == 3  # 2 recorded + 1 DAgger episode
    assert len(rep["dagger_returns"]) == 1
    assert list((tmp_path / "tb").rglob("events.out.tfevents*"))

    js = tmp_path / "eval.json"
    rc = main(["evaluate", "--policy", str(out), "--episodes", "2", "--track-seed", "1000000", "--max-steps", "15",
               "--workers", "1", "--json", str(js)])
    assert rc == 0
    res = json.loads(js.read_text())
    assert set(res) >= {"env", "policy", "seeds", "returns", "steps", "mean_return", "std_return"}
    assert res["seeds"] == [1000000, 1000001] and res["steps"] == [15, 15]
    assert res["mean_return"] == pytest.approx(np.mean(res["returns"]))


def test_evaluate_accepts_the_expert(tiny_expert, capsys):
    rc = main(["evaluate", "--policy", str(tiny_expert), "--episodes", "1", "--max-steps", "10", "--workers", "1"])
    assert rc == 0 and "mean return" in capsys.readouterr().out


def test_train_refuses_dagger_without_expert(recording, tmp_path, capsys):
    rc = main(["train", "--data", str(recording), "--out", str(tmp_path / "x.pt"), "--run-dir", str(tmp_path / "x"),
               "--dagger.rounds", "1"])
    assert rc == 2 and "dagger.rounds needs teacher.expert" in capsys.readouterr().err


def test_help_of_every_command(capsys):
    assert main(["--help"]) == 0 and main(["expert", "--help"]) == 0  # the lists of commands
    for cmd in (["collect", "--help"], ["train", "--help"], ["evaluate", "--help"], ["drive", "--help"],
                ["expert", "train", "--help"], ["expert", "check-recovery", "--help"], ["bench", "nac", "--help"],
                ["plot-traces", "--help"], ["wiring", "--help"], ["convert-policy", "--help"],
                ["average-policies", "--help"], ["lodo-table", "--help"], ["lodo-compare", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(cmd)
        assert e.value.code == 0, cmd
    out = capsys.readouterr().out
    assert "--policy" in out and "--teacher.start-rule" in out and "--udacity.floor" in out and "--ppo.lr" in out
