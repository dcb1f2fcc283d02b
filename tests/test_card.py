"""Model cards (agent.eval.card): digests, confidence intervals, attaching evaluations, zips."""
import json
import zipfile

import numpy as np
import pytest
import torch

from agent.eval.card import (ZIP_CARD_MEMBER, CardError, file_sha256, identity, mean_ci, read_card,
                             summarize_evaluation, update_card, weights_sha256)
from agent.nn.policy import DrivingPolicy, default_config


@pytest.fixture
def tiny_pt(tmp_path):
    torch.manual_seed(0)
    return DrivingPolicy(default_config("carracing", window=2)).save(tmp_path / "tiny.pt", metadata={"command": "x"})


def _evaluation(path, seeds, returns):
    return {"env": "carracing", "policy": str(path), "seeds": list(seeds), "returns": list(returns),
            "laps_finished": 3, **{k: v for k, v in identity(path).items() if k != "policy_file"}}


def test_mean_ci_matches_student_t():
    x = [900.0, 910.0, 920.0, 880.0]
    mean, low, high = mean_ci(x)
    half = 3.182446305284263 * np.std(x, ddof=1) / 2  # t(0.975, 3) * s / sqrt(4)
    assert mean == pytest.approx(902.5)
    assert (low, high) == pytest.approx((902.5 - half, 902.5 + half))
    with pytest.raises(CardError):
        mean_ci([1.0])
    with pytest.raises(CardError):
        mean_ci([1.0, float("nan")])


def test_weights_digest_ignores_the_card_but_not_the_weights(tiny_pt, tmp_path):
    w0, f0 = weights_sha256(tiny_pt), file_sha256(tiny_pt)
    update_card(tiny_pt, summary="a tiny test policy")
    assert weights_sha256(tiny_pt) == w0 and file_sha256(tiny_pt) != f0
    policy = DrivingPolicy.load(tiny_pt)
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    other = policy.save(tmp_path / "other.pt")
    assert weights_sha256(other) != w0


def test_attach_evaluation_and_print(tiny_pt):
    ev = _evaluation(tiny_pt, range(1_000_000, 1_000_005), [900, 910, 905, 300, 920])
    card = update_card(tiny_pt, summary="s", recipe="recipes/x.toml", teacher="t.zip", evaluations=[(ev, "e.json")])
    assert card.evaluations[0]["tracks"] == "1,000,000-1,000,004"
    assert card.evaluations[0]["unseen"] and card.evaluations[0]["at_least_600"] == 4
    assert card.evaluations[0]["worst"] == 300.0
    text = "\n".join(card.lines())
    assert "recipes/x.toml" in text and "unseen 1,000,000-1,000,004" in text and card.file_sha256 in text
    md = "\n".join(read_card(tiny_pt).lines(markdown=True))
    assert md.startswith("### tiny.pt") and "| unseen 1,000,000-1,000,004 | 5 |" in md
    # the same tracks again replace the row; the weights still load
    ev2 = _evaluation(tiny_pt, range(1_000_000, 1_000_005), [900, 910, 905, 700, 920])
    card = update_card(tiny_pt, evaluations=[(ev2, "e2.json")])
    assert len(card.evaluations) == 1 and card.evaluations[0]["worst"] == 700.0
    DrivingPolicy.load(tiny_pt)


def test_an_evaluation_of_other_weights_is_refused(tiny_pt, tmp_path):
    other = DrivingPolicy(default_config("carracing", window=3)).save(tmp_path / "other.pt")
    ev = _evaluation(other, [1, 2], [1.0, 2.0])
    before = tiny_pt.read_bytes()
    with pytest.raises(CardError, match="another policy"):
        update_card(tiny_pt, evaluations=[(ev, "other.json")])
    ev.pop("weights_sha256")
    with pytest.raises(CardError, match="records no weights_sha256"):
        update_card(tiny_pt, evaluations=[(ev, "old.json")])
    assert tiny_pt.read_bytes() == before  # nothing written


def test_summarize_refuses_what_is_not_a_closed_loop_evaluation():
    with pytest.raises(CardError):
        summarize_evaluation({"seeds": [1, 2], "returns": [1.0]})
    with pytest.raises(CardError):
        summarize_evaluation({"mse": 0.1})


def _fake_expert_zip(path, data_size=None):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data", json.dumps({"policy_kwargs": {"net_arch": [64, 64]}, "num_timesteps": 256}))
        zf.writestr("policy.pth", b"weights")
    return path


def test_expert_zip_card_is_a_member_and_keeps_the_weights(tmp_path):
    z = _fake_expert_zip(tmp_path / "e.zip")
    w = weights_sha256(z)
    card = update_card(z, summary="the teacher", extra={"rules": "start rule"})
    assert card.kind == "ppo-expert" and card.weights_sha256 == w and card.config["net_arch"] == [64, 64]
    with zipfile.ZipFile(z) as zf:
        assert set(zf.namelist()) == {"data", "policy.pth", ZIP_CARD_MEMBER}
        assert zf.read("policy.pth") == b"weights"
    assert "rules: start rule" in "\n".join(read_card(z).lines()).replace("          ", "")


def test_a_zip_member_that_inflates_too_far_is_refused_before_reading(tmp_path, monkeypatch):
    import agent.eval.card as card_mod

    z = _fake_expert_zip(tmp_path / "e.zip")
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr(ZIP_CARD_MEMBER, "x" * 4096)
    monkeypatch.setattr(card_mod, "MAX_MEMBER_BYTES", 1024)
    with pytest.raises(CardError, match="would inflate"):
        read_card(z)


def test_not_a_policy(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a torch file")
    with pytest.raises(CardError):
        read_card(bad)
    with pytest.raises(FileNotFoundError):
        read_card(tmp_path / "missing.pt")


def test_udacity_offline_evaluations_are_a_table_of_recordings(tmp_path):
    policy = DrivingPolicy(default_config("udacity", window=2)).save(tmp_path / "u.pt")
    ev = {"env": "udacity", "recordings": [{"recording": "drive-2018", "n_frames": 40, "mse": 0.0275, "ratio": 0.7588},
                                           {"recording": "drive-2020", "n_frames": 9, "mse": 0.0839, "ratio": 0.889}],
          **{k: v for k, v in identity(policy).items() if k != "policy_file"}}
    card = update_card(policy, evaluations=[(ev, "u.json")])
    assert card.evaluations[0]["kind"] == "offline" and card.evaluations[0]["tracks"] == "drive-2018, drive-2020"
    md = "\n".join(card.lines(markdown=True))
    assert "| drive-2018 | 40 | 0.0275 | 0.759 |" in md and "95 % CI" not in md
    with pytest.raises(CardError, match="no scored recording"):
        summarize_evaluation({"env": "udacity", "recordings": [{"recording": "x"}]})


def test_udacity_intent_measures_reach_the_card(tmp_path):
    """Issue "Udacity steering that turns", item 1: the card keeps the intent measures when the result has them."""
    policy = DrivingPolicy(default_config("udacity", window=2)).save(tmp_path / "u.pt")
    intent = {"smoothed_ratio": 0.5391, "smoothed_corr": 0.6884, "right_way_left": 0.969, "right_way_right": 0.953,
              "curve_mean_abs_pred": 0.138, "curve_mean_abs_label": 0.164}
    ev = {"env": "udacity", "recordings": [{"recording": "a", "n_frames": 40, "mse": 0.024, "ratio": 0.665, **intent},
                                           {"recording": "b", "n_frames": 9, "mse": 0.09, "ratio": 0.99}],
          **{k: v for k, v in identity(policy).items() if k != "policy_file"}}
    card = update_card(policy, evaluations=[(ev, "u.json")])
    assert card.evaluations[0]["recordings"][0]["smoothed_ratio"] == 0.539
    assert "smoothed_ratio" not in card.evaluations[0]["recordings"][1]
    md = "\n".join(read_card(policy).lines(markdown=True))
    assert "| a | 40 | 0.0240 | 0.665 | 0.539 | 0.69 | 0.97 / 0.95 | 0.138 vs 0.164 |" in md
    assert "| b | 9 | 0.0900 | 0.990 | - | - | - / - | - vs - |" in md
    assert "| \\|pred\\| vs \\|label\\| in curves |" in md  # escaped, not four more cells
