"""`agent expert train` from ExpertRun (--config recipes with stages) and `agent expert check-recovery`'s options."""

import json

import pytest

from agent.cli import main
from agent.cli.expert import CheckRecoveryRun
from agent.train.config import ExpertRun, load_config


def test_the_tiny_expert_run_wrote_its_resolved_config(tiny_expert):
    """conftest's expert: --ppo.timesteps, --envs and --run-dir on the command line; the resolved config in the run
    folder (the entropy bonus filled in) reads back as the run's config."""
    run = load_config(tiny_expert.parent / "run" / "config.toml", ExpertRun)
    assert run.ppo.timesteps == 256 and run.envs == 2 and run.out == str(tiny_expert) and run.device == "cpu"
    assert run.ppo.ent_coef == 0.003


def test_expert_train_refuses_an_existing_out(tiny_expert, capsys):
    assert main(["expert", "train", "--out", str(tiny_expert), "--ppo.timesteps", "256"]) == 2
    assert "already exists; choose another --out or pass --overwrite" in capsys.readouterr().err
    assert ExpertRun().out == "runs/expert/carracing-expert.zip"  # never a shipped file


@pytest.mark.parametrize("recipe, stages", [("recipes/carracing-expert-margin.toml", 3),
                                            ("recipes/carracing-expert-discrete-margin.toml", 2)])
def test_the_expert_recipes_parse(recipe, stages, capsys):
    from agent.cli.recipe import parse_stages

    parsed = parse_stages(ExpertRun, ["--config", recipe], prog="agent expert train", description="")
    assert len(parsed) == stages
    (_, first), (_, last) = parsed[0], parsed[-1]
    assert first.init is None and last.init == parsed[-2][1].out  # each stage starts from the one before
    assert last.out.startswith("policies/") and last.ppo.keep == "last" and last.ppo.wheel_off_penalty == 0.2
    with pytest.raises(SystemExit) as exc:
        main(["expert", "train", "--config", recipe, "--help"])
    assert exc.value.code == 0 and "--ppo.timesteps" in capsys.readouterr().out
    # the last stage writes the shipped file: refused before the first stage runs
    assert main(["expert", "train", "--config", recipe]) == 2
    assert f"{last.out} already exists (stage {parsed[-1][0]})" in capsys.readouterr().err


def test_expert_subcommands(capsys):
    assert main(["expert", "--help"]) == 0 and "check-recovery" in capsys.readouterr().out
    assert main(["expert", "trian"]) == 2 and "choose train" in capsys.readouterr().err


def test_check_recovery_options(tmp_path, capsys):
    import tyro

    run = tyro.cli(CheckRecoveryRun, args=[])
    assert run.teacher.expert == "carracing-expert-discrete-margin.zip" and run.track_seed == 600_000 and not run.teacher.start_rule
    run = tyro.cli(CheckRecoveryRun, args=["--teacher.expert", "e.zip", "--teacher.start-rule", "--teacher.brake-floor",
                                           "20", "--track-seed", "7"])
    assert run.teacher.rules.brake_floor == 20.0 and run.track_seed == 7
    js = tmp_path / "r.json"
    js.write_text(json.dumps({}))
    assert main(["expert", "check-recovery", "--json", str(js)]) == 2
    assert "--overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # a value the field refuses: tyro's parser reports it
        main(["expert", "check-recovery", "--episodes", "0"])
    assert exc.value.code == 2
