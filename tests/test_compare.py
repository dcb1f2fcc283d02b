"""``agent compare``: variants, width matching, the plan, the statistics, and a tiny comparison of
two cores through the real entry point (the sample recording, a tiny expert, tiny budgets)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import tyro

from agent.compare.cells import (REFERENCE, Protocol, Variant, choose_width, parse_variants, update_plan)
from agent.compare.report import bootstrap_ci, paired_difference

SAMPLE = "recordings/nac-drive/sample-v0"


# ----------------------------------------------------------------------------- variants
def test_variant_names_are_canonical():
    v = Variant.parse(" nac-steady@topk=2@T=16 ")
    assert v.core == "nac-steady" and v.options == (("T", 16), ("topk", 2))
    assert v.name == "nac-steady@T=16@topk=2" and Variant.parse(v.name) == v
    assert Variant.parse("nac-exact@sparsity=0.90").name == "nac-exact@sparsity=0.9"
    assert Variant.parse("lstm").name == "lstm" and Variant.parse("lstm@width=32").get("width") == 32


@pytest.mark.parametrize("text, message", [
    ("transformer", "unknown core"),
    ("lstm@topk=2", "only apply to the nac-"),
    ("nac-steady@depth=2", "bad option"),
    ("nac-steady@T", "bad option"),
    ("nac-steady@T=four", "needs a int"),
    ("nac-steady@T=4@T=8", "given twice"),
    ("nac-steady@T=0", ">= 1"),
    ("nac-steady@sparsity=1.0", "sparsity must be in"),
    ("nac-steady@wiring=random", "wiring must be"),
])
def test_bad_variants_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        Variant.parse(text)


def test_windows_expand_the_cores_without_their_own_T():
    vs = parse_variants("nac-steady,lstm@T=2,nac-steady", windows=[1, 8])
    assert [v.name for v in vs] == ["nac-steady@T=1", "nac-steady@T=8", "lstm@T=2"]
    with pytest.raises(ValueError, match="no cores"):
        parse_variants(" , ")


# ----------------------------------------------------------------------------- sizes
def test_widths_match_nac_steady_within_the_issue_factor():
    p = Protocol(data=[SAMPLE])
    for core in ("lstm", "gru", "none", "mha"):
        width, params, reference = choose_width(Variant.parse(core), p)
        assert width % 4 == 0 and 1 / 1.5 <= params / reference <= 1.5, (core, width, params, reference)
        # the chosen width is the closest in ratio among its neighbours
        from agent.compare.cells import core_parameters

        for other in (width - 4, width + 4):
            if other >= 4:
                assert abs(np.log(core_parameters(Variant.parse(core), p, other) / reference)) >= \
                    abs(np.log(params / reference)) - 1e-12
    width, params, reference = choose_width(Variant.parse(REFERENCE), p)
    assert width == 64 and params == reference
    assert choose_width(Variant.parse("lstm@width=8"), p)[0] == 8


def test_effective_parameters_count_only_the_kept_connections():
    from agent.nn.cores import count_effective_parameters, count_parameters
    from agent.nn.nac import NAC, SparseLinear

    mask = torch.zeros(6, 4, dtype=torch.bool)
    mask[:3] = True
    layer = SparseLinear(mask)
    assert count_parameters(layer) == 6 * 4 + 4 and count_effective_parameters(layer) == 3 * 4 + 4
    ncp = NAC(32, 16, 4, wiring="ncp")
    fc = NAC(32, 16, 4, wiring="fc")
    assert count_parameters(ncp) == count_parameters(fc)  # the same layers ...
    assert count_effective_parameters(fc) == count_parameters(fc) > count_effective_parameters(ncp)  # all kept
    for name in ("q", "k", "v"):
        assert bool(fc.sensory[name].mask.all()) and not bool(ncp.sensory[name].mask.all())
    assert all(bool(m.mask.all()) for m in (fc.to_inter, fc.to_command, fc.to_motor))
    with pytest.raises(ValueError, match="wiring"):
        NAC(32, 16, 4, wiring="dense")


# ----------------------------------------------------------------------------- statistics
def test_bootstrap_interval_holds_the_mean_and_narrows_with_data():
    rng = np.random.default_rng(1)
    small, large = rng.normal(800, 100, 20), rng.normal(800, 100, 500)
    lo, hi = bootstrap_ci(small)
    assert lo < small.mean() < hi
    lo2, hi2 = bootstrap_ci(large)
    assert hi2 - lo2 < (hi - lo) / 2
    assert bootstrap_ci(small) == (lo, hi)  # a fixed seed: the report repeats
    assert all(np.isnan(bootstrap_ci([])))


def test_paired_difference_uses_the_shared_episodes():
    a = {(0, t): 800.0 + t for t in range(30)}
    b = {(0, t): 790.0 + t for t in range(30)}
    b[(1, 0)] = 0.0  # an episode a does not have is ignored
    d = paired_difference(a, b)
    assert d["episodes"] == 30 and d["mean"] == pytest.approx(10.0) and d["ci95"] == pytest.approx([10.0, 10.0])
    # one training seed: the interval excludes 0, but it covers tracks only, so it is not called real
    assert d["excludes_zero"] and d["seeds"] == 1 and not d["real"]
    two = paired_difference({**a, **{(1, t): v for (_, t), v in a.items()}}, {**b, **{(1, t): v for (_, t), v in b.items()
                                                                                    if _ == 0}})
    assert two["seeds"] == 2 and two["real"]
    noise = {k: v + (5.0 if k[1] % 2 else -5.0) for k, v in a.items()}
    assert not paired_difference(noise, a)["excludes_zero"]
    assert paired_difference(a, {(9, 9): 1.0}) is None


def test_hierarchical_interval_widens_with_training_seed_spread():
    """Two seeds whose tracks agree within each seed but whose means differ by 200: the two-level
    interval must cover that spread, the one-level bootstrap over the pooled episodes does not."""
    from agent.compare.report import hierarchical_bootstrap_ci

    rng = np.random.default_rng(2)
    eps = {(s, t): 600.0 + 200.0 * s + rng.normal(0, 10) for s in (0, 1) for t in range(30)}
    lo, hi = hierarchical_bootstrap_ci(eps)
    flat_lo, flat_hi = bootstrap_ci(list(eps.values()))
    assert lo < 650 and hi > 750  # the resampled seeds reach 600 or 800 alike
    assert (hi - lo) > 2 * (flat_hi - flat_lo)
    one_seed = {k: v for k, v in eps.items() if k[0] == 0}
    assert hierarchical_bootstrap_ci(one_seed) == pytest.approx(bootstrap_ci(list(one_seed.values())), abs=5.0)
    assert all(np.isnan(hierarchical_bootstrap_ci({})))


# ----------------------------------------------------------------------------- the plan
def test_one_folder_keeps_one_protocol(tmp_path):
    p = Protocol(data=[SAMPLE], epochs=2)
    update_plan(tmp_path, p, ["nac-steady__s0"])
    plan = update_plan(tmp_path, p, ["lstm__s0", "nac-steady__s0"])
    assert plan["cells"] == ["nac-steady__s0", "lstm__s0"]
    with pytest.raises(ValueError, match="epochs: 2 -> 3"):
        update_plan(tmp_path, Protocol(data=[SAMPLE], epochs=3), ["gru__s0"])


# ----------------------------------------------------------------------------- end to end
def _compare(out, expert, *extra):
    from agent.cli import main

    return main(["compare", "--cores", "nac-steady,lstm", "--seeds", "0", "--data", SAMPLE, "--teacher.expert",
                 str(expert), "--epochs", "1", "--dagger.rounds", "1", "--dagger.episodes", "1", "--dagger.max-steps",
                 "12", "--dagger.epochs", "1", "--episodes", "2", "--max-steps", "15", "--latency-steps", "10",
                 "--device", "cpu", "--out", str(out), *extra])


def test_compare_two_cores_end_to_end_and_resume(tmp_path, tiny_expert, capsys):
    from agent.cli import main

    out = tmp_path / "cmp"
    assert _compare(out, tiny_expert) == 0
    report = json.loads((out / "report.json").read_text())
    rows = {r["variant"]: r for r in report["rows"]}
    assert set(rows) == {"nac-steady", "lstm"} and report["missing"] == []
    for name, row in rows.items():
        cell = json.loads((out / f"{name}__s0" / "cell.json").read_text())
        assert cell["closed_loop"]["seeds"] == [1_000_000, 1_000_001]
        assert cell["closed_loop"]["steps"] == [15, 15]
        assert len(cell["closed_loop_bc"]["returns"]) == 2  # the BC policy drove the same tracks
        assert 0.0 <= cell["heldout_accuracy"] <= 1.0 and cell["heldout_frames"] > 0
        assert cell["latency_ms"]["p99"] >= cell["latency_ms"]["p50"] > 0
        assert len(cell["dagger_returns"]) == 1 and cell["protocol"]["dagger_rounds"] == 1
        assert row["mean"] == pytest.approx(np.mean(cell["closed_loop"]["returns"]))
        assert row["episodes"] == 2
    assert rows["lstm"]["difference_from_reference"]["episodes"] == 2
    assert rows["nac-steady"]["core_parameter_ratio"] == 1.0
    assert 1 / 1.5 <= rows["lstm"]["core_parameter_ratio"] <= 1.5
    md = (out / "report.md").read_text()
    assert "| nac-steady |" in md and "| lstm |" in md and (out / "compare.png").stat().st_size > 0

    # resume: finished cells are kept, not retrained
    stamp = os.stat(out / "lstm__s0" / "policy.pt").st_mtime_ns
    capsys.readouterr()
    assert _compare(out, tiny_expert) == 0
    assert "cell lstm__s0 (kept)" in capsys.readouterr().out
    assert os.stat(out / "lstm__s0" / "policy.pt").st_mtime_ns == stamp

    # an interrupted cell (trained, not evaluated) resumes at its evaluation
    (out / "lstm__s0" / "cell.json").unlink()
    assert main(["compare", "--out", str(out), "--report-only", "--json", str(tmp_path / "summary.json")]) == 0
    report = json.loads((out / "report.json").read_text())
    assert json.loads((tmp_path / "summary.json").read_text()) == report
    assert main(["compare", "--out", str(out), "--report-only", "--json", str(tmp_path / "summary.json")]) == 2
    assert "already exists; choose another path or pass --overwrite" in capsys.readouterr().err
    assert [r["variant"] for r in report["rows"]] == ["nac-steady"] and report["missing"] == ["lstm__s0"]
    assert "Missing cells (1): lstm__s0" in (out / "report.md").read_text()
    assert _compare(out, tiny_expert) == 0
    assert os.stat(out / "lstm__s0" / "policy.pt").st_mtime_ns == stamp
    assert (out / "lstm__s0" / "cell.json").is_file()

    # another protocol in the same folder is refused, with the difference named
    capsys.readouterr()
    assert _compare(out, tiny_expert, "--window", "2") == 2
    assert "window: 4 -> 2" in capsys.readouterr().err


def test_compare_rejects_bad_requests(tmp_path, capsys):
    from agent.cli import main
    from agent.compare.config import CompareConfig
    from agent.train.config import ConfigError

    assert main(["compare", "--cores", "lstm@topk=2", "--data", SAMPLE, "--out", str(tmp_path / "a")]) == 2
    assert "only apply to the nac-" in capsys.readouterr().err
    assert main(["compare", "--data", str(tmp_path / "nothing"), "--out", str(tmp_path / "b")]) == 2
    assert "agent collect" in capsys.readouterr().err
    assert main(["compare", "--seeds", "0,x", "--data", SAMPLE, "--out", str(tmp_path / "b")]) == 2
    assert "--seeds must be comma-separated integers" in capsys.readouterr().err
    assert main(["compare", "--data", SAMPLE, "--teacher.expert", "None", "--out", str(tmp_path / "b")]) == 2
    assert "--dagger.rounds needs --teacher.expert" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--track-seed 5 is a training track"):
        CompareConfig(track_seed=5)
    with pytest.raises(SystemExit) as e:  # on the command line tyro reports it
        main(["compare", "--data", SAMPLE, "--track-seed", "5", "--out", str(tmp_path / "c")])
    assert e.value.code == 2
    assert main(["compare", "--out", str(tmp_path / "none"), "--report-only"]) == 2


def test_compare_options_map_onto_the_protocol():
    from agent.compare.config import CompareConfig
    from agent.compare.cells import Protocol

    cfg = CompareConfig()
    # the default teacher is the one that taught the shipped student, and it ships; its start rule is on
    assert cfg.teacher.expert == "carracing-expert-discrete-margin.zip" and cfg.teacher.start_rule is True
    assert (Path(__file__).resolve().parents[1] / "policies" / cfg.teacher.expert).is_file()
    assert cfg.protocol() == Protocol(data=list(cfg.data))  # the options' defaults are the protocol's
    assert (cfg.workers, cfg.cell_threads, CompareConfig(workers=2).cell_threads) == (1, 0, 1)
    cfg = tyro.cli(CompareConfig, args=["--teacher.no-start-rule", "--teacher.creep-speed", "10", "--track-seed",
                                         "2000000", "--dagger.track-seed", "7", "--no-eval-bc"])
    p = cfg.protocol()
    assert (p.start_rule, p.creep_speed, p.eval_seed, p.dagger_seed, p.eval_bc) == (False, 10.0, 2_000_000, 7, False)
    # a plan written before the teacher's other rules were protocol fields still loads, unchanged
    old = {k: v for k, v in asdict(Protocol(data=[SAMPLE])).items() if k not in ("creep_speed", "brake_floor",
                                                                                  "grass_rule")}
    assert Protocol(**old) == Protocol(data=[SAMPLE])


# ----------------------------------------------------------------------------- the report from cell files
def _fake_cell(out, variant: str, seed: int, returns, accuracy=0.9, window=4):
    """A finished cell.json as run_cell writes it (no training), for the report's own tests."""
    from agent.compare.cells import Variant, cell_name

    v = Variant.parse(variant)
    tracks = list(range(1_000_000, 1_000_000 + len(returns)))
    block = {"seeds": tracks, "returns": list(map(float, returns)), "steps": [1000] * len(returns),
             "longest_standstill_steps": [0] * (len(returns) - 1) + [120], "off_road_steps": [10] * len(returns),
             "mean": float(np.mean(returns)), "std": float(np.std(returns))}
    cell = {"cell": cell_name(v, seed), "variant": v.name, "core": v.core, "options": dict(v.options), "seed": seed,
            "window": window, "width": 64, "core_parameters": 1000, "core_parameter_ratio": 1.0, "topk_effective": None,
            "heldout_accuracy": accuracy, "heldout_accuracy_bc": accuracy - 0.01, "closed_loop": block,
            "closed_loop_bc": dict(block, returns=[r - 50 for r in block["returns"]]),
            "latency_ms": {"p50": 2.0, "p99": 3.0}, "train_seconds": 600.0}
    folder = out / cell_name(v, seed)
    folder.mkdir(parents=True)
    (folder / "cell.json").write_text(json.dumps(cell))


def test_report_reads_the_cells_that_exist(tmp_path):
    from agent.compare.report import window_sweeps, write_report

    update_plan(tmp_path, Protocol(data=[SAMPLE]), ["nac-steady__s0", "nac-steady__s1", "lstm__s0", "lstm__s1",
                                                     "nac-steady@T=8__s0", "gru__s0"])
    rng = np.random.default_rng(0)
    base = rng.normal(800, 60, 30)
    for s in (0, 1):  # two training runs 10 apart
        _fake_cell(tmp_path, "nac-steady", s, base + 10 * s - 5)
        _fake_cell(tmp_path, "lstm", s, base - 100 + 10 * s - 5)  # 100 worse on every episode: a real difference
    _fake_cell(tmp_path, "nac-steady@T=8", 0, base + 1, window=8)
    rep = write_report(tmp_path)
    summary = rep["summary"]
    rows = {r["variant"]: r for r in summary["rows"]}
    assert list(rows) == ["nac-steady", "lstm", "nac-steady@T=8"]  # the plan's order
    assert summary["missing"] == ["gru__s0"]
    lstm = rows["lstm"]
    assert lstm["episodes"] == 60 and lstm["mean"] == pytest.approx(base.mean() - 100)
    d = lstm["difference_from_reference"]  # the training run is the unit: 2 runs each, sd 7.07 pooled (2 df)
    assert d["seeds"] == [2, 2] and d["df"] == 2 and d["mean"] == pytest.approx(-100) and d["real"]
    assert summary["runs"]["pooled_sd"] == pytest.approx(np.sqrt(50.0))
    assert lstm["difference_from_reference_bootstrap"]["episodes"] == 60
    t8d = rows["nac-steady@T=8"]["difference_from_reference"]  # one run against two
    assert t8d["seeds"] == [1, 2] and t8d["mean"] == pytest.approx(1.0) and not t8d["real"]
    assert rows["nac-steady"]["episodes_with_stall"] == 2 and rows["nac-steady"]["bc_mean"] == pytest.approx(
        base.mean() - 50)
    # the best variant (T=8, +1 against the mean of the two runs, one run of its own) is inside the noise
    assert "nac-steady" in summary["headline"] and "no difference detected" in summary["headline"]
    sweeps = window_sweeps(summary["rows"])
    assert list(sweeps) == ["nac-steady"] and [w for w, _ in sweeps["nac-steady"]] == [4, 8]
    md = (tmp_path / "report.md").read_text()
    assert "Missing cells (1): gru__s0" in md and "| lstm | 4 |" in md
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert json.loads((tmp_path / "report.json").read_text())["rows"][1]["variant"] == "lstm"
    # a variant with options is also set against its base core, on the episodes both have
    t8 = rows["nac-steady@T=8"]
    assert t8["base"] == "nac-steady" and rows["lstm"]["base"] is None
    assert t8["difference_from_base"]["mean"] == pytest.approx(1.0) and t8["difference_from_base"]["seeds"] == [1, 2]
    assert "## Variants against their base core" in md and "| nac-steady@T=8 | nac-steady |" in md
    # the window sweep is scored on the seeds all its points share: the base ran seeds 0 and 1, T=8 seed 0 only
    sp = summary["window_sweeps"]["nac-steady"]
    assert [q["window"] for q in sp] == [4, 8] and all(q["seeds"] == [0] and q["episodes"] == 30 for q in sp)
    assert sp[0]["mean"] == pytest.approx(base.mean() - 5) and sp[1]["mean"] == pytest.approx(base.mean() + 1)  # seed 0
    assert sp[0]["ci95"][0] < sp[0]["mean"] < sp[0]["ci95"][1]
    assert "## Return against window T" in md and "| variant | seeds | T=4 | T=8 |" in md and f"| nac-steady | 0 | {sp[0]['mean']:.1f} [" in md


def test_sweep_points_without_a_shared_seed_are_empty():
    from agent.compare.report import sweep_points

    a = {"seeds": [0], "returns": {"0:1000000": 700.0, "0:1000001": 720.0}}
    b = {"seeds": [1], "returns": {"1:1000000": 650.0}}
    assert sweep_points([(4, a), (8, b)]) == []
    assert [q["mean"] for q in sweep_points([(4, a), (8, a)])] == [710.0, 710.0]
