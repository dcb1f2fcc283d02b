"""Recordings in Minari's layout (ROOT/namespace/name-vN), readable by Minari's own tools; agent.log."""

import logging

import numpy as np
import pytest

from agent.cli import main
from agent.data.recordings import RecordingError, dataset_layout, load_demonstrations, resolve_recording
from agent.log import get_logger, progress, setup_logging


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """2 episodes of 5 steps by the shipped expert, through the real CLI, at ROOT/nac-drive/tiny-v0."""
    root = tmp_path_factory.mktemp("datasets")
    rc = main(["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "2", "--max-steps", "5",
               "--track-seed", "3", "--out", str(root / "nac-drive" / "tiny-v0")])
    assert rc == 0
    return root


def test_minari_finds_the_recording(tiny, monkeypatch):
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tiny))
    ds = minari.load_dataset("nac-drive/tiny-v0")
    assert ds.total_episodes == 2 and ds.total_steps == 10
    assert ds.spec.dataset_id == "nac-drive/tiny-v0"
    assert list(minari.list_local_datasets()) == ["nac-drive/tiny-v0"]
    assert (tiny / "nac-drive" / "namespace_metadata.json").is_file()
    assert sorted(p.name for p in tiny.iterdir()) == ["nac-drive"]  # no staging folder left behind

    # load_demonstrations reads the same frames, by folder and by id
    demos = load_demonstrations(tiny / "nac-drive" / "tiny-v0")
    by_id = load_demonstrations("nac-drive/tiny-v0")
    assert demos.seeds == by_id.seeds == [3, 4]
    for e, ep in enumerate(ds.iterate_episodes()):
        np.testing.assert_array_equal(demos.frames[e], np.asarray(ep.observations)[:5])
        np.testing.assert_array_equal(by_id.frames[e], demos.frames[e])
        np.testing.assert_array_equal(demos.actions[e], np.asarray(ep.actions))
    assert demos.frames[0].shape == (5, 96, 96, 3) and demos.frames[0].dtype == np.uint8


def test_overwrite_replaces_the_dataset(tiny, tmp_path):
    out = tiny / "nac-drive" / "tiny-v0"
    rc = main(["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "1", "--max-steps", "3",
               "--out", str(out)])
    assert rc == 2
    rc = main(["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "1", "--max-steps", "3",
               "--out", str(tmp_path / "ns" / "copy-v1")])
    assert rc == 0
    rc = main(["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "2", "--max-steps", "3",
               "--out", str(tmp_path / "ns" / "copy-v1"), "--overwrite"])
    assert rc == 0 and [len(a) for a in load_demonstrations(tmp_path / "ns" / "copy-v1").actions] == [3, 3]


@pytest.mark.parametrize("out, fix", [("recordings/expert-40", "recordings/nac-drive/expert-40-v0"),
                                      ("expert-0-19-v0", "nac-drive/expert-0-19-v0"),
                                      ("x/nac-drive/bad name", "x/nac-drive/bad_name-v0"),
                                      ("recordings/sample-v0", "recordings/nac-drive/sample-v0")])
def test_bad_out_is_refused_with_a_suggestion(out, fix, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = main(["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "1", "--max-steps", "3", "--out",
               out])
    err = capsys.readouterr().err
    assert rc == 2 and "<namespace>/<name>-v<N>" in err and f"try --out {fix}" in err
    assert list(tmp_path.iterdir()) == []  # nothing created


@pytest.mark.parametrize("argv, message", [
    ([], "give the demonstrator: --teacher.expert EXPERT.zip"),
    (["--keyboard", "--teacher.expert", "carracing-expert-discrete-margin.zip"], "not both"),
    (["--keyboard", "--teacher.start-rule"], "--teacher.start-rule: the teacher's rules are the PPO expert's"),
    (["--teacher.expert", "carracing-expert-discrete-margin.zip", "--teacher.brake-floor", "20"], "add --teacher.start-rule"),
    (["--teacher.expert", "carracing-expert-margin.zip", "--teacher.creep-speed", "10"], "--teacher.creep-speed: "),
    (["--teacher.expert", "nac.pt"], "takes the PPO expert's .zip"),
])
def test_collect_refuses_a_demonstrator_it_cannot_use(argv, message, tmp_path, monkeypatch, capsys):
    """The demonstrator is --teacher.expert (with the teacher's rules, strictly: a continuous expert has no creep
    rule) or --keyboard (no rules), one of the two."""
    monkeypatch.chdir(tmp_path)
    assert main(["collect", *argv, "--episodes", "1", "--out", "recordings/nac-drive/r-v0"]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_dataset_layout():
    root, dataset_id = dataset_layout("some/where/nac-drive/expert-0-19-v3")
    assert dataset_id == "nac-drive/expert-0-19-v3" and root.is_absolute() and root.parts[-2:] == ("some", "where")
    with pytest.raises(RecordingError, match="try --out"):
        dataset_layout("nac-drive/expert")


def test_shipped_sample_by_path_and_id(monkeypatch):
    monkeypatch.delenv("MINARI_DATASETS_PATH", raising=False)
    sample = resolve_recording("nac-drive/sample-v0")  # found under the repository's recordings/
    assert sample.parts[-3:] == ("recordings", "nac-drive", "sample-v0")
    demos = load_demonstrations("nac-drive/sample-v0")
    assert demos.seeds == [0, 1] and [len(a) for a in demos.actions] == [100, 100]
    with pytest.raises(RecordingError, match="does not exist.*looked at"):
        load_demonstrations("nac-drive/nothing-v0")


# ------------------------------------------------------------------------------ agent.log
def test_progress_is_quiet_without_a_terminal(monkeypatch):
    monkeypatch.delenv("NAC_PROGRESS", raising=False)
    bar = progress(range(3), desc="x")  # pytest captures stderr: not a terminal
    assert bar.disable and list(bar) == [0, 1, 2]
    monkeypatch.setenv("NAC_PROGRESS", "1")
    bar = progress(total=3)
    assert not bar.disable and bar.mininterval == 0.5
    bar.close()
    assert progress(total=3, disable=True).disable  # the caller can still turn it off
    monkeypatch.setenv("NAC_PROGRESS", "0")
    assert progress(total=3).disable


def test_logging_is_installed_once(capsys):
    setup_logging()
    setup_logging(verbose=True)
    handlers = [h for h in logging.getLogger("agent").handlers if type(h).__name__ == "RichHandler"]
    assert len(handlers) == 1 and logging.getLogger("agent").level == logging.DEBUG
    setup_logging()
    get_logger("agent.test").info("progress message")
    out, err = capsys.readouterr()
    assert "progress message" in err and out == ""
