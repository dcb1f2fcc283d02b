"""`agent train` as tyro generates it from agent.train.config.TrainRun: recipes (--config), their
stages and resumption, command-line overrides, the resolved config in the run folder and in the
policy file. Every run trains on the shipped sample recording with tiny settings (seconds each)."""

import json
import re
import sys
from pathlib import Path

import pytest
import tomli_w
from cli_run import unbox

from agent.actors.loading import load_policy
from agent.cli import main
from agent.cli.recipe import peak_rss_gb
from agent.train.config import load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = str(ROOT / "recordings" / "nac-drive" / "sample-v0")
#: the top level of every recipe here: the sample recording, on the CPU, with nothing written outside tmp_path
TINY = {"env": "carracing", "data": [SAMPLE], "seed": 0, "device": "cpu", "threads": 1,
        "train": {"batch_frames": 16, "val_fraction": 0.5, "tensorboard": ""}}


def _recipe(path: Path, **values) -> Path:
    path.write_text(tomli_w.dumps({**TINY, **values}))
    return path


def test_help_shows_a_shipped_recipe_as_the_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(ROOT / "recipes" / "nac-continuous.toml"), "--help"])
    assert exc.value.code == 0
    out = unbox(capsys.readouterr().out)
    assert "--train.epochs" in out and "--dagger.rounds" in out and "--teacher.expert" in out
    assert "policies/nac-continuous.pt" in out and "(default: 0.05)" in out  # the recipe's out and standstills


def test_a_two_stage_recipe_chains_its_stages_and_a_rerun_skips_them(tmp_path, capsys):
    final, root = tmp_path / "final.pt", tmp_path / "run"
    recipe = _recipe(tmp_path / "two.toml", out=str(final), run_dir=str(root), stages=[
        {"name": "bc", "policy": {"window": 2}, "train": {"epochs": 1}},
        {"name": "more", "train": {"epochs": 1}},  # init: the first stage's policy (the runner chains them)
    ])
    assert main(["train", "--config", str(recipe)]) == 0
    first = root / "bc" / "bc.pt"  # a stage before the last writes into the recipe's run folder
    outputs = [first, final, root / "bc" / "config.toml", root / "more" / "config.toml"]
    assert all(p.is_file() for p in outputs)
    assert (root / "bc" / "report.json").is_file() and (root / "more" / "report.json").is_file()
    assert load_config(root / "bc" / "config.toml").train.epochs == 1
    second = load_config(root / "more" / "config.toml")
    assert second.init == str(first) and second.out == str(final) and second.train.epochs == 1
    bc, more = load_policy(first), load_policy(final)
    assert more.config == bc.config and more.config.window == 2  # the second stage kept the first's architecture
    assert more.metadata["config"]["init"] == str(first)

    first_log = unbox(capsys.readouterr().err)
    for label in ("stage 1/2 bc", "stage 2/2 more"):  # each stage that ran gives its time and peak memory
        line = re.search(label + r" finished in ([0-9.]+) min; peak RSS so far ([0-9.]+) GB", first_log)
        assert line is not None and float(line[2]) > 0.05, first_log

    stamps = {p: p.stat().st_mtime_ns for p in outputs}
    assert main(["train", "--config", str(recipe)]) == 0
    assert {p: p.stat().st_mtime_ns for p in outputs} == stamps  # nothing retrained, nothing rewritten
    log = unbox(capsys.readouterr().err)
    assert "stage 1/2 bc: finished earlier" in log and "stage 2/2 more: finished earlier" in log
    assert "bc epoch" not in log


STAGES = [{"name": "bc", "policy": {"window": 2}, "train": {"epochs": 1}},
          {"name": "more", "train": {"epochs": 1}}]


def test_a_stage_added_after_the_last_copies_the_finished_one(tmp_path, capsys):
    """The two-stage recipe's last stage wrote --out; with a third stage added it is a middle stage,
    whose output lives in the run folder: the finished policy is copied there, not trained again."""
    first_out, root = tmp_path / "a.pt", tmp_path / "run"
    assert main(["train", "--config", str(_recipe(tmp_path / "two.toml", out=str(first_out), run_dir=str(root),
                                                  stages=STAGES))]) == 0
    three = _recipe(tmp_path / "three.toml", out=str(tmp_path / "b.pt"), run_dir=str(root),
                    stages=STAGES + [{"name": "last", "train": {"epochs": 1}}])
    capsys.readouterr()
    assert main(["train", "--config", str(three)]) == 0
    log = unbox(capsys.readouterr().err)
    middle = root / "more" / "more.pt"
    assert "stage 1/3 bc: finished earlier" in log
    assert "stage 2/3 more: finished earlier as" in log and "not trained again" in log  # (paths wrap in the log)
    assert log.count("bc epoch 1/1") == 1  # only the new stage trained
    assert middle.read_bytes() == first_out.read_bytes() and first_out.is_file()
    assert load_config(root / "more" / "config.toml").out == str(middle)
    assert load_config(root / "last" / "config.toml").init == str(middle) and (tmp_path / "b.pt").is_file()
    capsys.readouterr()  # a rerun finds every stage finished
    assert main(["train", "--config", str(three)]) == 0
    log = unbox(capsys.readouterr().err)
    assert all(f"stage {i}/3 {n}: finished earlier (" in log for i, n in ((1, "bc"), (2, "more"), (3, "last")))
    assert "bc epoch" not in log


def test_a_file_another_run_wrote_is_not_taken_for_the_finished_stage(tmp_path, capsys):
    first_out, root = tmp_path / "a.pt", tmp_path / "run"
    assert main(["train", "--config", str(_recipe(tmp_path / "two.toml", out=str(first_out), run_dir=str(root),
                                                  stages=STAGES))]) == 0
    first_out.write_bytes((root / "bc" / "bc.pt").read_bytes())  # the first stage's policy under that name
    three = _recipe(tmp_path / "three.toml", out=str(tmp_path / "b.pt"), run_dir=str(root),
                    stages=STAGES + [{"name": "last", "train": {"epochs": 1}}])
    capsys.readouterr()
    assert main(["train", "--config", str(three)]) == 2  # not adopted; and training anew would overwrite the
    err = unbox(capsys.readouterr().err)  # run folder's record of the finished run: refused, nothing lost
    assert "finished earlier as" not in err and "holds another run's config" in err
    assert not (root / "more" / "more.pt").exists() and not (tmp_path / "b.pt").exists()


@pytest.fixture(scope="module")
def overridden(tmp_path_factory):
    """A one-stage recipe that says 3 epochs, run with --train.epochs 1 on the command line."""
    tmp = tmp_path_factory.mktemp("override")
    recipe = _recipe(tmp / "three.toml", out=str(tmp / "p.pt"), run_dir=str(tmp / "run"), policy={"window": 2},
                     train={**TINY["train"], "epochs": 3})
    assert main(["train", "--config", str(recipe), "--train.epochs", "1", "--json", str(tmp / "report.json")]) == 0
    return tmp


def test_the_command_line_overrides_the_recipe(overridden):
    resolved = load_config(overridden / "run" / "config.toml")
    assert resolved.train.epochs == 1  # the command line's, over the recipe's 3
    assert resolved.train.batch_frames == 16 and resolved.policy.window == 2  # the recipe's, where not overridden
    assert resolved.policy.core == "nac-steady" and resolved.train.lr is not None  # per-env defaults filled in
    assert len(json.loads((overridden / "report.json").read_text())["epochs"]) == 1


def test_the_policy_stores_the_run_folders_resolved_config(overridden):
    resolved = load_config(overridden / "run" / "config.toml")
    assert load_policy(overridden / "p.pt").metadata["config"] == to_dict(resolved)


def test_the_card_names_the_recipe_and_the_teacher(overridden, tmp_path):
    from agent.cli.train import _teacher_text
    from agent.eval.card import read_card
    from agent.train.config import TeacherSection, TrainRun

    card = read_card(overridden / "p.pt")
    assert card.recipe == str(overridden / "three.toml") and card.teacher is None  # no teacher in this recipe
    t = TeacherSection(expert="policies/x.zip", start_rule=True, creep_speed=10.0, brake_floor=20.0, grass_rule=True)
    assert _teacher_text(TrainRun(teacher=t)) == ("x.zip with the start rule, the creep rule (10 units/s), the brake "
                                                  "floor (20 units/s) and the grass rule")
    assert _teacher_text(TrainRun(teacher=TeacherSection(expert="x.zip", start_rule=True))) == "x.zip with the start rule"
    # without --config there is no recipe to name
    assert main(["train", "--env", "carracing", "--data", SAMPLE, "--out", str(tmp_path / "q.pt"), "--run-dir",
                 str(tmp_path / "q"), "--policy.window", "2", "--train.epochs", "1", "--train.batch-frames", "16",
                 "--train.tensorboard", "", "--threads", "1"]) == 0
    assert read_card(tmp_path / "q.pt").recipe is None


def test_an_unknown_recipe_key_is_refused_in_one_line(tmp_path, capsys):
    recipe = _recipe(tmp_path / "bad.toml", out=str(tmp_path / "p.pt"), run_dir=str(tmp_path / "run"),
                     train={**TINY["train"], "epochz": 3})
    capsys.readouterr()
    assert main(["train", "--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("agent train: error: ")
    assert "unknown key(s) epochz" in err and "bad.toml" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "p.pt").exists()  # refused before anything ran


def test_a_section_value_is_refused_by_the_parser_naming_the_field(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # a section's own check runs while tyro builds the config
        main(["train", "--data", SAMPLE, "--out", str(tmp_path / "p.pt"), "--run-dir", str(tmp_path / "run"),
              "--train.val-fraction", "1.5"])
    assert exc.value.code == 2
    assert "train.val_fraction must be in [0, 1), got 1.5" in unbox(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_a_run_written_before_a_new_option_is_the_same_run(tmp_path):
    """A run folder written before an option existed holds no value for it: with the option's default
    it is the same run (a rerun skips or continues it); any changed value makes another run."""
    from agent.cli.recipe import resolved_text, same_config
    from agent.train.config import TrainRun

    cfg = load_config(_recipe(tmp_path / "one.toml", out=str(tmp_path / "p.pt"), train={"epochs": 1}))
    text = resolved_text(cfg)
    older = "\n".join(line for line in text.splitlines() if not line.startswith("concordance ="))
    assert older != text and "concordance" not in older
    assert same_config(text, cfg) and same_config(older, cfg)
    assert not same_config(older.replace("epochs = 1", "epochs = 2"), cfg)
    assert not same_config(text.replace(f'out = "{tmp_path / "p.pt"}"', 'out = "q.pt"'), cfg)
    assert same_config(text.replace(f'out = "{tmp_path / "p.pt"}"', 'out = "q.pt"'), cfg, ignore=("out",))
    assert not same_config("not toml [", cfg) and isinstance(cfg, TrainRun)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_peak_rss_is_in_gb_and_not_below_the_current_rss():
    """getrusage's ru_maxrss is KiB on Linux: read as bytes it would be 1024x too small, as MiB 1024x too large."""
    now_kb = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))
    own, child = peak_rss_gb()
    assert now_kb * 1024 / 1e9 <= own < 1024 * now_kb * 1024 / 1e9 / 4 and child >= 0
