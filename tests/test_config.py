"""The configuration tree of `agent train` (agent.train.config): validation once, TOML, resolution."""
from pathlib import Path

import pytest

from agent.cli.recipe import parse_stages

from agent.train.config import (ConfigError, DaggerSection, ExpertRun, PPOSection, PolicySection, TeacherSection, TrainRun,
                                TrainSection, UdacitySection, from_dict, load_config, load_recipe, to_dict, to_toml, torch_device)

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("make, field", [
    (lambda: TrainSection(epochs=-1), "train.epochs"),
    (lambda: TrainSection(lr=0.0), "train.lr"),
    (lambda: TrainSection(class_weights=(0.0, 0.0)), "train.class_weights"),
    (lambda: TrainSection(standstills=1.5), "train.standstills"),
    (lambda: PolicySection(core="transformer-xl"), "policy.core"),
    (lambda: PolicySection(window=0), "policy.window"),
    (lambda: TeacherSection(creep_speed=-1.0), "teacher.creep_speed"),
    (lambda: TeacherSection(brake_floor=float("inf")), "teacher.brake_floor"),
    (lambda: DaggerSection(beta=2.0), "dagger.beta"),
    (lambda: DaggerSection(track_seed=999_990, rounds=2, episodes=8), "dagger.track_seed"),
    (lambda: DaggerSection(disturb_kinds=("flip",)), "dagger.disturb_kinds"),
    (lambda: UdacitySection(smooth_labels=2), "udacity.smooth_labels"),
    (lambda: TrainRun(device="tpu"), "device must be"),
    (lambda: TrainRun(threads=-1), "threads"),
    (lambda: PPOSection(lr=-1.0), "ppo.lr"),
    (lambda: ExpertRun(out="expert.pt"), "out must be a .zip"),
])
def test_each_section_names_the_bad_field(make, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        make()


@pytest.mark.parametrize("run, words", [
    (TrainRun(), "data"),
    (TrainRun(data=("a",), dagger=DaggerSection(rounds=1)), "teacher.expert"),
    (TrainRun(data=("a",), udacity=UdacitySection(augment_prob=0.1)), "udacity.augment_prob only apply"),
    (TrainRun(data=("a",), env="udacity", dagger=DaggerSection(rounds=1)), "dagger.rounds only apply"),
    (TrainRun(data=("a",), train=TrainSection(epochs=0)), "needs init"),
    (TrainRun(data=("a",), init="p.pt", policy=PolicySection(window=8)), "policy.window"),
    (TrainRun(data=("a",), teacher=TeacherSection(expert="e.zip", brake_floor=20.0), dagger=DaggerSection(rounds=1)),
     "start_rule"),
])
def test_cross_section_checks(run, words):
    with pytest.raises(ConfigError, match=words):
        run.check()


def test_resolved_fills_every_per_env_default():
    r = TrainRun(data=("a",)).resolved()
    assert (r.train.epochs, r.train.lr, r.policy.core, r.policy.window, r.policy.dashboard) == \
        (8, 1e-3, "nac-steady", 4, "speed")
    assert r.policy.core_options["num_heads"] == 16
    u = TrainRun(data=("a",), env="udacity", policy=PolicySection(core_options={"topk": 4})).resolved()
    assert (u.train.epochs, u.policy.core, u.policy.window, u.policy.core_options["topk"]) == (40, "nac-exact", 8, 4)


def test_toml_round_trip(tmp_path):
    run = TrainRun(data=("rec-a", "rec-b"), seed=3, train=TrainSection(class_weights=(1, 1, 1, 1, 4)),
                   teacher=TeacherSection(expert="e.zip", start_rule=True, brake_floor=20.0),
                   dagger=DaggerSection(rounds=2, disturb_kinds=("stop",))).resolved()
    path = tmp_path / "run.toml"
    path.write_text(to_toml(run))
    back = load_config(path)
    assert back == run
    assert to_dict(back)["teacher"] == {"expert": "e.zip", "start_rule": True, "creep_speed": 0.0,
                                        "brake_floor": 20.0, "grass_rule": False}


def test_bad_files_give_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nepochs = 2")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    bad.write_text("data = ['a']\n[train]\nepoch = 2\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(bad)
    bad.write_text("data = ['a']\n[dagger]\nrounds = 'two'\n")
    with pytest.raises(ConfigError, match="rounds"):
        load_config(bad)
    bad.write_text("data = ['a']\n[train]\nlr = -1.0\n")
    with pytest.raises(ConfigError, match=r"train\.lr must be > 0"):
        load_config(bad)
    yml = tmp_path / "x.yaml"
    yml.write_text("data: [a]")
    with pytest.raises(ConfigError, match="TOML"):
        load_config(yml)


def test_from_dict_is_strict_about_sections():
    with pytest.raises(ConfigError, match="unknown key"):
        from_dict(TrainRun, {"data": ["a"], "optimizer": {"lr": 1.0}})


def test_device_auto_resolves_to_a_torch_device():
    import torch

    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert torch_device("auto") == want and torch_device("cpu") == "cpu"


def test_device_that_torch_does_not_see_is_a_clear_error():
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ConfigError, match=r"--device cuda:%d: .* use --device cpu" % n):
        torch_device(f"cuda:{n}")  # one past the last GPU (cuda:0 on a machine without one)
    if n == 0:
        with pytest.raises(ConfigError, match="sees no CUDA GPU"):
            torch_device("cuda")
    else:
        assert torch_device("cuda") == "cuda"


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.name)
def test_every_recipe_loads_and_validates(recipe):
    cls = ExpertRun if recipe.name.startswith("carracing-expert") else TrainRun  # `agent expert train --config`
    if cls is TrainRun:  # chained as `agent train --config` chains them (a later stage starts from the one before)
        stages = parse_stages(TrainRun, ["--config", str(recipe)], prog="agent train", description="")
        last = load_recipe(recipe, cls)[-1][1]
    else:
        stages = load_recipe(recipe, cls)
        [cfg.check() for _, cfg in stages]
        last = stages[-1][1]
    assert last.out is not None and last.out.startswith("policies/"), "a recipe names the shipped file it remakes"
    assert (RECIPES.parent / last.out).is_file(), f"{recipe.name} remakes {last.out}, which is not shipped"


def test_stages_change_only_what_they_name(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("""data = ["a"]\nseed = 1\n[train]\nstandstills = 0.05\n
[[stages]]\nname = "bc"\ntrain = { epochs = 8 }\n
[[stages]]\nname = "dagger"\ntrain = { epochs = 0 }\nteacher = { expert = "e.zip" }\ndagger = { rounds = 2 }\n""")
    (bc_name, bc), (dg_name, dg) = load_recipe(path)
    assert (bc_name, bc.train.epochs, bc.train.standstills, bc.dagger.rounds, bc.seed) == ("bc", 8, 0.05, 0, 1)
    assert (dg_name, dg.train.epochs, dg.train.standstills, dg.dagger.rounds, dg.teacher.expert) == \
        ("dagger", 0, 0.05, 2, "e.zip")
    with pytest.raises(ConfigError, match="several stages"):
        load_config(path)
    path.write_text("""data = ["a"]\n[[stages]]\nname = "x"\n[[stages]]\nname = "x"\n""")
    with pytest.raises(ConfigError, match="unique name"):
        load_recipe(path)
    path.write_text("""data = ["a"]\n[[stages]]\nname = "x"\ntrain = { epochs = -2 }\n""")
    with pytest.raises(ConfigError, match=r"stage x.*train\.epochs"):
        load_recipe(path)


def test_core_options_true_and_false_are_booleans():
    assert PolicySection(core_options={"input_norm": "true", "topk": 4, "name": "x"}).core_options == \
        {"input_norm": True, "topk": 4, "name": "x"}


def test_a_core_given_on_the_command_line_builds_the_first_stage_and_later_stages_inherit_it(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text("""data = ["a"]\nout = "x/p.pt"\n[policy]\nwindow = 4\n[teacher]\nexpert = "e.zip"\n
[[stages]]\nname = "bc"\ntrain = { epochs = 8 }\n
[[stages]]\nname = "dagger"\ntrain = { epochs = 0 }\ndagger = { rounds = 2 }\n""")
    (_, bc), (_, dg) = parse_stages(TrainRun, ["--config", str(path), "--policy.core", "none", "--policy.window", "1",
                                               "--seed", "1"], prog="agent train", description="")
    assert (bc.policy.core, bc.policy.window, bc.init) == ("none", 1, None)
    assert (dg.policy.core, dg.policy.window) == (None, None) and dg.init == bc.out  # the first stage's policy's own
    assert bc.run_dir == str(Path("runs/recipes/p-s1/bc")) and dg.run_dir == str(Path("runs/recipes/p-s1/dagger"))
    path.write_text(path.read_text().replace('train = { epochs = 0 }', 'train = { epochs = 0 }\npolicy = { window = 2 }'))
    with pytest.raises(Exception, match="init keeps the policy file's own policy.window"):  # a stage's own choice
        parse_stages(TrainRun, ["--config", str(path)], prog="agent train", description="")
