"""agent explain: the report of where policies look (regions), how faithful their maps are, and its files."""

import json

import pytest

from agent.drive.explain_report import ExplainConfig, write_explain_report
from agent.train.config import ConfigError


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    from agent.nn.policy import DrivingPolicy, default_config

    d = tmp_path_factory.mktemp("policies")
    nac = DrivingPolicy(default_config("carracing", window=2)).eval().save(d / "tiny-nac.pt")
    gru = DrivingPolicy(default_config("carracing", core="gru", window=2)).eval().save(d / "tiny-gru.pt")
    return nac, gru


def test_report_of_two_policies(tiny_files, tmp_path):
    nac, gru = tiny_files
    said = []
    cfg = ExplainConfig(policies=(str(nac), str(gru)), tracks=(700_000,), steps=4, max_steps=40,
                        methods=("HiResCAM",), layers=("conv3",), sanity_steps=2, traces=True, out=str(tmp_path / "x"))
    rep = write_explain_report(cfg.check(), say=said.append)
    out = tmp_path / "x"
    for f in ("explain.json", "explain.md", "regions.png", "tiny-nac/faithfulness.json", "tiny-gru/faithfulness.md"):
        assert (out / f).is_file(), f
    saved = json.loads((out / "explain.json").read_text())
    assert set(saved["policies"]) == {"tiny-nac", "tiny-gru"}
    for p in ("tiny-nac", "tiny-gru"):
        r = rep["policies"][p]
        assert set(r["regions"]) == {"live: HiResCAM @ conv1", "paper: Grad-CAM @ conv3"}
        live = r["regions"]["live: HiResCAM @ conv1"]
        assert live["steps"] == r["steps"] >= 2
        shares = [g["pooled_mass"] for g in live["regions"].values()]
        assert sum(shares) == pytest.approx(1.0) or live["empty"] == live["steps"]
        rows = {(x["method"], x["layer"]) for x in r["faithfulness"]["rows"]}
        assert rows == {("HiResCAM", "conv3"), ("RandomCAM", "conv3"), ("SobelCAM", "-"), ("road", "-")}
    assert rep["policies"]["tiny-gru"]["encoding"] == {"skipped": "the gru core has no NAC traces"}
    enc = rep["policies"]["tiny-nac"]["encoding"]
    assert "figure4" in enc and "skipped" in enc["probes"]  # one track: no whole-track folds for the probes
    assert (out / "tiny-nac" / "encoding.md").is_file() and not (out / "tiny-gru" / "encoding.md").exists()
    md = (out / "explain.md").read_text()
    assert "## Where the policy looks" in md and "tiny-gru, live: HiResCAM @ conv1" in md and "regions.png" in md
    # a second run refuses to replace the report without --overwrite
    with pytest.raises(ConfigError, match="already exists.*--overwrite"):
        cfg.check()


@pytest.mark.parametrize("kw,match", [(dict(policies=()), "at least one policy"),
                                      (dict(policies=("a.pt",), tracks=()), "at least one track"),
                                      (dict(policies=("a.pt",), tracks=(1, 2), steps=3), "at least 2 per track"),
                                      (dict(policies=("a/x.pt", "b/x.pt")), "different file names")])
def test_bad_options_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        ExplainConfig(**kw)


def test_a_continuous_policy_is_refused_with_the_reason(tmp_path):
    from agent.nn.policy import DrivingPolicy, default_config

    from agent.cli import main

    path = DrivingPolicy(default_config("carracing", continuous=True, window=2)).save(tmp_path / "cont.pt")
    code = main(["explain", str(path), "--tracks", "700000", "--steps", "4", "--max-steps", "20",
                 "--out", str(tmp_path / "r")])
    assert code == 2 and not (tmp_path / "r" / "explain.json").exists()
