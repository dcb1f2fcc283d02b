"""Every shipped policy file loads through the public loader and acts: a format change fails here."""

import numpy as np
import pytest

from agent.actors.loading import POLICIES_DIR, load_policy

SHIPPED = sorted(p.name for p in POLICIES_DIR.glob("*") if p.suffix in (".pt", ".zip"))


def test_the_expected_files_ship():
    assert {"nac.pt", "nac-continuous.pt", "udacity-nac.pt", "carracing-expert-discrete-margin.zip", "carracing-expert-margin.zip"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policy_loads_and_acts(name, caplog):
    policy = load_policy(name)
    assert not any("format-1" in r.getMessage() for r in caplog.records), f"{name} needs `agent convert-policy`"
    if name.endswith(".zip"):  # the PPO expert acts from the privileged state
        from envs import make_carracing

        env = make_carracing(render_pixels=False, continuous=policy.continuous)
        env.reset(seed=0)
        a = policy.act(env)
        if policy.continuous:  # (steering, throttle)
            assert a.shape == (2,) and np.all(np.abs(a) <= 1.0)
        else:
            assert isinstance(a, int) and 0 <= a < 5
        env.step(a)
        env.close()
        return
    assert policy.metadata, "a shipped policy carries its training metadata"
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (3, *policy.config.obs_shape), dtype=np.uint8)
    state = None
    for f in frames:
        action, state = policy.predict(f, state)
    if policy.config.env == "carracing" and policy.config.action_space["type"] == "discrete":
        assert isinstance(action, int) and 0 <= action < 5
    elif policy.config.env == "carracing":
        assert np.shape(action) == (2,) and np.all(np.abs(action) <= 1.0)
    else:
        assert isinstance(action, float) and -1.0 <= action <= 1.0
    assert state.steps.tolist() == [3]


CARDED = ["nac.pt", "carracing-expert-discrete-margin.zip", "nac-continuous.pt", "carracing-expert-margin.zip",
          "udacity-nac.pt"]


@pytest.mark.parametrize("name", CARDED)
def test_each_shipped_policy_has_a_card_with_an_existing_recipe(name):
    from agent.eval.card import read_card

    card = read_card(POLICIES_DIR / name)
    assert card.summary and card.recipe, f"{name} has no card: agent info {name} --summary ... --recipe ..."
    assert (POLICIES_DIR.parent / card.recipe).is_file(), f"{name}'s recipe {card.recipe} is missing"
    for row in card.evaluations:  # every stored evaluation is of these very weights
        assert row["weights_sha256"] == card.weights_sha256


def test_policies_readme_holds_the_current_cards():
    """policies/README.md is `agent info --markdown` of the shipped files: edit a card, regenerate the page."""
    from agent.eval.card import read_card

    page = (POLICIES_DIR / "README.md").read_text()
    for name in CARDED:
        block = "\n".join(read_card(POLICIES_DIR / name).lines(markdown=True)).rstrip()
        assert block in page, f"policies/README.md is stale for {name}: regenerate it with agent info --markdown"


def test_the_provenance_table_names_the_shipped_weights():
    """docs/provenance.md names each file by its weights' digest: a file retrained without its provenance fails here."""
    import re

    from agent.eval.card import read_card

    page = (POLICIES_DIR.parent / "docs" / "provenance.md").read_text()
    for name in CARDED:
        row = re.search(r"^\| `policies/" + re.escape(name) + r"` \| `([0-9a-f]{8})` \|", page, re.MULTILINE)
        assert row is not None, f"docs/provenance.md has no table row for {name}"
        assert read_card(POLICIES_DIR / name).weights_sha256.startswith(row[1]), \
            f"docs/provenance.md names {name} by {row[1]}, not its weights: add how the new file was made"
