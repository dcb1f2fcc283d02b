"""agent.drive.encoding: probes find a planted signal and not noise, the Figure 4 test flips, real drives."""

import json

import numpy as np
import pytest
import torch

from agent.drive import encoding as E

NAMES = ("nothing", "right", "left", "gas", "brake")  # CarRacing's discrete actions (envs.carracing.ACTION_NAMES)


def planted(n_tracks=4, steps=150, seed=0, heads=3):
    """Synthetic samples: head 0's phi follows the steering class, head 2's omega the throttle class,
    head 1 is noise; the 'CNN features' hold the action one-hot under noise."""
    rng = np.random.default_rng(seed)
    n = n_tracks * steps
    action = rng.choice(5, size=n, p=[0.15, 0.2, 0.2, 0.35, 0.1])
    steer = np.array([0, 2, 1, 0, 0])[action]  # straight, left, right as STEERING_CLASSES
    throttle = np.array([0, 0, 0, 1, 2])[action]
    phi = rng.uniform(0.2, 0.8, (n, heads))
    omega = rng.uniform(0.05, 0.3, (n, heads))
    phi[:, 0] = 0.3 + 0.2 * steer + rng.normal(0, 0.03, n)
    omega[:, 2] = 0.1 + 0.1 * throttle + rng.normal(0, 0.01, n)
    logits = phi / omega
    feats = np.eye(5)[action] * 2 + rng.normal(0, 1, (n, 5))
    feats = np.concatenate([feats, rng.normal(0, 1, (n, 11))], 1).astype(np.float32)
    by_age = {q: np.repeat(a[:, :, None], 2, 2) + rng.normal(0, 0.01, (n, heads, 2))
              for q, a in (("phi", phi), ("omega", omega), ("logits", logits))}
    return E.EncodingSamples(phi, omega, logits, by_age, feats, action.astype(np.int64), rng.uniform(0, 80, n),
                             np.repeat(np.arange(n_tracks) + 700_000, steps), np.tile(np.arange(steps), n_tracks), NAMES)


@pytest.fixture(scope="module")
def probes():
    return E.probe_scores(planted(), targets=("steering", "throttle", "action"), max_iter=500)


def test_labels_follow_the_action_names():
    s = planted(n_tracks=1, steps=20)
    s.action[:5] = [0, 1, 2, 3, 4]
    assert s.steering()[:5].tolist() == [0, 2, 1, 0, 0]  # right is action 1, left action 2 (gymnasium #1369)
    assert s.throttle()[:5].tolist() == [0, 0, 0, 1, 2]
    lo, hi = s.speed_edges()
    sc = s.speed_class()
    assert set(sc.tolist()) <= {0, 1, 2} and np.all(s.speed[sc == 0] < lo) and np.all(s.speed[sc == 2] >= hi)
    s.speed[3] = np.nan
    assert s.speed_class()[3] == -1
    with pytest.raises(ValueError, match="unknown target"):
        s.labels("yaw")


def test_the_probe_finds_the_planted_steering_head_and_not_the_noise_head(probes):
    st = probes["targets"]["steering"]["rows"]
    chance = probes["targets"]["steering"]["chance"]
    assert chance == pytest.approx(1 / 3)
    assert st["chance"]["balanced_accuracy"] == pytest.approx(1 / 3)
    assert st["head 0"]["balanced_accuracy"] > 0.9 and st["head 0"]["above_chance"]
    assert st["head 1"]["balanced_accuracy"] < 0.45 and not st["head 1"]["above_chance"]
    assert [d["head"] for d in E.carriers(probes, "steering")][0] == 0
    assert min(st["head 0"]["recall"].values()) > 0.8 and st["chance"]["recall"]["straight"] == 1.0
    # throttle lives in head 2's omega, not in head 0
    th = probes["targets"]["throttle"]["rows"]
    assert th["head 2"]["balanced_accuracy"] > 0.9 > 0.45 > th["head 1"]["balanced_accuracy"]
    assert th["head 0"]["balanced_accuracy"] < 0.7  # steering implies coasting: some throttle information
    assert E.carriers(probes, "throttle")[0]["head"] == 2
    # the 'CNN features' carry the whole action; the paired difference is recorded against them
    ac = probes["targets"]["action"]["rows"]
    assert ac["CNN features"]["balanced_accuracy"] > 0.6 > ac["head 1"]["balanced_accuracy"]
    assert ac["head 1"]["minus_cnn"]["mean"] < 0
    assert probes["folds"] == 4 and len(st["head 0"]["folds"]) == 4


def test_folds_never_split_a_track(monkeypatch):
    seen = []
    from sklearn import model_selection

    real = model_selection.GroupKFold.split

    def spy(self, X, y=None, groups=None):
        for tr, te in real(self, X, y, groups):
            seen.append((set(groups[tr]), set(groups[te])))
            yield tr, te

    monkeypatch.setattr(model_selection.GroupKFold, "split", spy)
    E.probe_scores(planted(n_tracks=3, steps=40), targets=("steering",), sets={"x": np.zeros((120, 1))})
    assert len(seen) == 3 and all(not (a & b) for a, b in seen)


def test_probe_scores_refuses_one_track_and_skips_a_one_class_target():
    s = planted(n_tracks=1, steps=30)
    with pytest.raises(ValueError, match="at least 2 tracks"):
        E.probe_scores(s)
    s = planted(n_tracks=2, steps=30)
    s.action[:] = 3  # gas only
    r = E.probe_scores(s, targets=("steering",), sets={"x": np.zeros((60, 1))})
    assert "skipped" in r["targets"]["steering"]
    r = E.probe_scores(planted(n_tracks=2, steps=30), targets=("throttle",), sets={"x": (np.zeros((60, 1)), 0.5)})
    assert r["targets"]["throttle"]["rows"]["x"]["C"] == 0.5 and r["targets"]["throttle"]["rows"]["chance"]["C"] is None
    with pytest.raises(ValueError, match="rows"):
        E.probe_scores(planted(n_tracks=2, steps=30), sets={"x": np.zeros((5, 1))})


def test_action_distributions_give_the_planted_medians():
    s = planted()
    d = E.action_distributions(s, "steering")
    assert d["classes"] == ["straight", "left", "right"]
    assert d["phi"]["0"]["left"]["median"] == pytest.approx(0.5, abs=0.01)
    assert d["phi"]["0"]["right"]["median"] == pytest.approx(0.7, abs=0.01)
    assert d["phi"]["0"]["straight"]["q25"] < d["phi"]["0"]["straight"]["median"] < d["phi"]["0"]["straight"]["q75"]
    m = d["omega"]["mean"]["left"]["mean"]
    assert m["lo"] < m["mean"] < m["hi"] and m["n"] == d["counts"]["left"]
    a = E.action_distributions(s, "action")
    assert sum(a["counts"].values()) == len(s) and set(a["logits"]) == {"0", "1", "2", "mean"}
    with pytest.raises(ValueError):
        E.action_distributions(s, "colour")


def _fig4_samples(phi_left, phi_right, lg_left, lg_right, phi_straight=1.2, n=300, seed=0):
    rng = np.random.default_rng(seed)
    action = rng.choice([0, 1, 2, 3], size=n)
    steer = np.array([0, 2, 1, 0, 0])[action]
    phi = np.select([steer == 1, steer == 2], [phi_left, phi_right], phi_straight) + rng.normal(0, 0.02, n)
    lg = np.select([steer == 1, steer == 2], [lg_left, lg_right], 0.62) + rng.normal(0, 0.01, n)
    phi, lg = phi[:, None], lg[:, None]
    return E.EncodingSamples(phi, np.ones_like(phi), lg, {}, np.zeros((n, 1), np.float32), action.astype(np.int64),
                             np.zeros(n), np.repeat([0, 1], n // 2), np.arange(n), NAMES)


def test_figure4_claim_holds_on_the_paper_s_numbers_and_fails_when_swapped():
    ok = E.figure4_claim(_fig4_samples(phi_left=0.95, phi_right=1.45, lg_left=0.4, lg_right=0.8))
    assert ok["holds_on_mean"] and ok["heads_holding"] == ["0"]
    assert ok["heads"]["0"]["phi_range"]["share"] == 1.0 and ok["heads"]["mean"]["logit_direction"]["holds"]
    bad = E.figure4_claim(_fig4_samples(phi_left=1.45, phi_right=0.95, lg_left=0.8, lg_right=0.4))
    assert not bad["holds_on_mean"] and bad["heads_holding"] == []
    h = bad["heads"]["0"]
    assert h["phi_range"]["holds"] and not h["phi_left"]["holds"] and not h["phi_right"]["holds"]
    assert not h["logit_left"]["holds"] and not h["phi_direction"]["holds"]
    assert "does not hold" in bad["verdict"] and "cannot be tested" not in bad["verdict"]
    no_right = _fig4_samples(phi_left=0.95, phi_right=1.45, lg_left=0.4, lg_right=0.8)
    no_right = no_right.subset(no_right.steering() != 2)
    nr = E.figure4_claim(no_right)
    assert nr["heads"]["0"]["phi_right"]["holds"] is None and not nr["holds_on_mean"]
    assert "phi_right, logit_right cannot be tested" in nr["verdict"]
    # a sigmoid phi in (0, 1) (this project's NAC) can never be above 1.3, nor stay in [0.8, 1.6]
    sig = E.figure4_claim(_fig4_samples(phi_left=0.5, phi_right=0.7, lg_left=0.4, lg_right=0.8))
    assert not sig["heads"]["0"]["phi_range"]["holds"] and not sig["heads"]["0"]["phi_right"]["holds"]
    assert sig["heads"]["0"]["phi_direction"]["holds"] and sig["counts"]["phi_left"] == 1
    assert "phi_range" in E.figure4_markdown(sig) or "0.8" in E.figure4_markdown(sig)


@pytest.fixture(scope="module")
def tiny_policy():
    from agent.nn.policy import DrivingPolicy, default_config

    torch.set_num_threads(1)
    return DrivingPolicy(default_config("carracing", window=3, d_model=16, core_kwargs={"num_heads": 2, "topk": 3})).eval()


def test_collect_keeps_the_features_the_core_received(tiny_policy):
    got = []
    hook = tiny_policy.features.register_forward_hook(lambda m, i, o: got.append(o.detach().clone()))
    try:
        s = E.collect_encoding_samples(tiny_policy, [700_000], max_steps=8)
    finally:
        hook.remove()
    assert len(got) == 8 and len(s) == 8 - 2  # the first window - 1 steps are dropped
    np.testing.assert_allclose(s.features, torch.cat(got[2:]).numpy(), rtol=1e-5, atol=1e-6)
    assert s.phi.shape == (6, 2) and s.by_age["omega"].shape == (6, 2, 3)
    assert np.all((s.phi > 0) & (s.phi < 1)) and np.all(s.omega > 0)
    assert s.step.tolist() == list(range(2, 8)) and np.all(np.isfinite(s.speed))
    assert s.action_names == NAMES


def test_encoding_report_writes_its_files(tiny_policy, tmp_path):
    path = tiny_policy.save(tmp_path / "tiny.pt")
    rep = E.encoding_report(path, [700_000, 700_001], 16, tmp_path / "out")
    for f in ("encoding.json", "encoding.md", "encoding.png"):
        assert (tmp_path / "out" / f).is_file(), f
    saved = json.loads((tmp_path / "out" / "encoding.json").read_text())
    assert saved["steps"] == rep["steps"] == 12 and saved["steps_per_track"] == {"700000": 6, "700001": 6}
    assert "figure4" in saved and saved["probes"]["folds"] == 2
    assert saved["probes"]["targets"]["speed"]["rows"]["CNN features, C=0.01"]["C"] == 0.01
    assert "## Probes" in (tmp_path / "out" / "encoding.md").read_text()
    one = E.encoding_report(path, [700_000], 4, None)  # one track: no folds, the rest is measured
    assert "skipped" in one["probes"] and one["steps"] == 2


def test_main_runs(tiny_policy, tmp_path, capsys):
    path = tiny_policy.save(tmp_path / "tiny.pt")
    assert E.main([str(path), "--tracks", "700000", "700001", "--steps", "10", "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "encoding.md").is_file() and "Verdict" in capsys.readouterr().out
