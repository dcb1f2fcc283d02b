"""`agent train` with [collect]: the teacher's episodes recorded first, in chunks, kept on a rerun.

The shipped discrete expert drives 3 episodes of 12 steps in chunks of 2 (tracks 0-1 and 2); one
epoch of behaviour cloning on them follows.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.actors.loading import load_policy
from agent.cli import main
from agent.train.collect import PENDING_SUFFIX, STAMP_NAME, chunk_paths, default_prefix, rules_tag
from agent.train.config import CollectSection, ConfigError, TeacherSection, TrainRun
from tests.cli_run import run_cli, unbox

ROOT = Path(__file__).resolve().parents[1]
TEACHER = str(ROOT / "policies" / "carracing-expert-discrete-margin.zip")
RULES = ["--teacher.start-rule", "--teacher.creep-speed", "10", "--teacher.brake-floor", "20", "--teacher.grass-rule"]


def _args(tmp: Path, *extra: str) -> list[str]:
    return ["train", "--collect.episodes", "3", "--collect.chunk", "2", "--collect.max-steps", "12",
            "--collect.out", str(tmp / "recs" / "nac-drive" / "teach"), "--teacher.expert", TEACHER, *RULES,
            "--train.epochs", "1", "--policy.window", "2", "--out", str(tmp / "p.pt"), "--run-dir", str(tmp / "run"),
            "--threads", "1", *extra]


def _hdf5(folder: Path) -> Path:
    return folder / "data" / "main_data.hdf5"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("collect")
    assert main(_args(tmp)) == 0
    return tmp


def test_the_teacher_records_its_chunks_and_the_student_trains_on_them(recorded):
    chunks = sorted((recorded / "recs" / "nac-drive").glob("teach-*-v0"))
    assert [c.name for c in chunks] == ["teach-0-1-v0", "teach-2-2-v0"]
    stamp = json.loads((chunks[0] / STAMP_NAME).read_text())
    assert stamp["tracks"] == [0, 1] and stamp["teacher"] == Path(TEACHER).name and stamp["max_steps"] == 12
    assert stamp["rules"] == {"start_rule": True, "creep_speed": 10.0, "brake_floor": 20.0, "grass_rule": True}
    assert not list((recorded / "recs" / "nac-drive").glob(f"*{PENDING_SUFFIX}"))
    meta = load_policy(recorded / "p.pt").metadata
    assert [Path(p).name for p in meta["recordings"]] == ["teach-0-1-v0", "teach-2-2-v0"]
    assert meta["config"]["collect"]["episodes"] == 3


def test_a_rerun_records_nothing_again(recorded, capsys):
    before = {c: _hdf5(c).stat().st_mtime_ns for c in (recorded / "recs" / "nac-drive").glob("teach-*-v0")}
    capsys.readouterr()
    assert main(_args(recorded, "--overwrite")) == 0
    after = {c: _hdf5(c).stat().st_mtime_ns for c in before}
    assert after == before
    assert "3 on disk, 0 to record" in unbox(capsys.readouterr().err)


def test_a_chunk_cut_short_is_recorded_again(tmp_path, recorded, capsys):
    tmp = tmp_path / "copy"
    shutil.copytree(recorded / "recs", tmp / "recs")
    chunk = tmp / "recs" / "nac-drive" / "teach-0-1-v0"
    kept = tmp / "recs" / "nac-drive" / "teach-2-2-v0"
    # as a kill leaves it: the stamp is still the pending one beside the folder
    (chunk / STAMP_NAME).rename(chunk.with_name(chunk.name + PENDING_SUFFIX))
    before, kept_before = _hdf5(chunk).stat().st_mtime_ns, _hdf5(kept).stat().st_mtime_ns
    capsys.readouterr()
    assert main(_args(tmp)) == 0
    assert _hdf5(chunk).stat().st_mtime_ns != before and _hdf5(kept).stat().st_mtime_ns == kept_before
    assert (chunk / STAMP_NAME).is_file() and not chunk.with_name(chunk.name + PENDING_SUFFIX).exists()
    assert "recording it again" in unbox(capsys.readouterr().err)


def test_a_chunk_of_other_rules_is_refused_and_kept(tmp_path, recorded, capsys):
    tmp = tmp_path / "copy"
    shutil.copytree(recorded / "recs", tmp / "recs")
    chunk = tmp / "recs" / "nac-drive" / "teach-2-2-v0"
    before = _hdf5(chunk).stat().st_mtime_ns
    stamp = json.loads((chunk / STAMP_NAME).read_text())
    stamp["rules"]["grass_rule"] = False
    (chunk / STAMP_NAME).write_text(json.dumps(stamp))
    rc, err = run_cli(_args(tmp), capsys)
    assert rc == 2 and "teach-2-2-v0 was recorded with other settings (rules differ" in err
    assert _hdf5(chunk).stat().st_mtime_ns == before


def test_a_folder_not_recorded_by_train_is_refused(tmp_path, recorded, capsys):
    tmp = tmp_path / "copy"
    shutil.copytree(recorded / "recs", tmp / "recs")
    (tmp / "recs" / "nac-drive" / "teach-0-1-v0" / STAMP_NAME).unlink()
    rc, err = run_cli(_args(tmp), capsys)
    assert rc == 2 and "teach-0-1-v0 exists but was not recorded by `agent train`" in err


def test_chunks_and_default_names():
    teacher = TeacherSection(expert="policies/carracing-expert-discrete-margin.zip", start_rule=True,
                             creep_speed=10.0, brake_floor=20.0, grass_rule=True)
    assert rules_tag(teacher) == "start-creep10-floor20-grass" and rules_tag(TeacherSection()) == "norules"
    assert default_prefix(teacher) == Path("recordings/nac-drive/carracing-expert-discrete-margin-start-creep10-floor20-grass")
    chunks = chunk_paths(CollectSection(episodes=25, track_seed=100, chunk=10, out="r/ns/t"), teacher)
    assert [(p.name, first, n) for p, first, n in chunks] == [("t-100-109-v0", 100, 10), ("t-110-119-v0", 110, 10),
                                                              ("t-120-124-v0", 120, 5)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(collect=CollectSection(episodes=4)), "collect.episodes needs teacher.expert"),
    (dict(data=("x",), collect=CollectSection(chunk=5)), "collect.chunk only apply with collect.episodes"),
])
def test_collect_options_that_do_not_go_together_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TrainRun(**kwargs).check()


def test_teacher_tracks_stay_below_dagger_and_evaluation_tracks():
    with pytest.raises(ConfigError, match="must lie in 0..499999"):
        CollectSection(episodes=10, track_seed=499_995)
    with pytest.raises(ConfigError, match="collect.chunk >= 1"):
        CollectSection(episodes=10, chunk=0)


def test_an_existing_out_is_refused_before_anything_is_recorded(tmp_path, capsys):
    (tmp_path / "p.pt").write_text("x")
    rc, err = run_cli(_args(tmp_path), capsys)
    assert rc == 2 and "p.pt already exists; choose another --out or pass --overwrite" in err
    assert not (tmp_path / "recs").exists()  # nothing recorded, nothing trained
