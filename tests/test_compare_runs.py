"""agent compare --runs: recipe runs against the quality bar, and the cores with the run as the unit."""
import json

import numpy as np
import pytest

from agent.cli import main
from agent.compare.runs import parse_run_spec, runs_markdown, runs_summary
from tests.cli_run import run_cli


def _eval(path, start, returns, standstills=None):
    path.write_text(json.dumps({"seeds": list(range(start, start + len(returns))), "returns": list(returns),
                                "longest_standstill_steps": standstills or [0] * len(returns), "laps_finished": 3}))
    return str(path)


@pytest.fixture()
def runs(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.normal(920, 10, 20)
    specs = []
    for core, shift in (("nac-steady", 0.0), ("gru", -40.0)):
        for seed, noise in ((0, -3.0), (1, 3.0)):
            a = _eval(tmp_path / f"{core}-{seed}-a.json", 1_000_000, base[:10] + shift + noise)
            b = _eval(tmp_path / f"{core}-{seed}-b.json", 2_000_000, base[10:] + shift + noise)
            specs.append(f"{core}:{seed}={a},{b}")
    return specs


def test_the_cores_compare_with_the_run_as_unit(runs):
    s = runs_summary(runs)
    assert s["reference"] == "nac-steady" and s["tracks"] == 20 and s["df"] == 2
    assert s["pooled_sd"] == pytest.approx(np.std([-3.0, 3.0], ddof=1))
    gru = next(c for c in s["cores"] if c["core"] == "gru")
    d = gru["difference_from_reference"]
    assert d["mean"] == pytest.approx(-40.0) and d["real"] and d["ci95"][1] < 0
    passes = {(r["core"], r["seed"]): r["passes"] for r in s["runs"]}
    assert all(passes[("nac-steady", k)] for k in (0, 1)) and not any(passes[("gru", k)] for k in (0, 1))


def test_a_track_below_600_or_a_standstill_fails_the_bar(tmp_path):
    ok = _eval(tmp_path / "ok.json", 1_000_000, [950.0] * 5)
    low = _eval(tmp_path / "low.json", 2_000_000, [950.0] * 4 + [590.0])
    stand = _eval(tmp_path / "stand.json", 2_000_000, [950.0] * 5, standstills=[0, 0, 51, 0, 0])
    s = runs_summary([f"nac:0={ok},{low}", f"nac:1={ok},{stand}"])
    assert [r["passes"] for r in s["runs"]] == [False, False]
    assert s["runs"][0]["sets"][1]["at_least_600"] == 4 and s["runs"][1]["sets"][1]["standstills"] == 1


def test_the_command_writes_the_report_and_refuses_bad_specs(runs, tmp_path, capsys):
    assert main(["compare", "--out", str(tmp_path / "rep"), "--runs", *runs]) == 0
    md = (tmp_path / "rep" / "runs.md").read_text()
    assert "gru scores 40.0 points below nac-steady" in md and "rough" in md
    rc, err = run_cli(["compare", "--out", str(tmp_path / "rep"), "--runs", "nac=x.json"], capsys)
    assert rc == 2 and "CORE:SEED=EVAL.json" in err
    with pytest.raises(ValueError, match="twice"):
        runs_summary([runs[0], runs[0]])
    assert parse_run_spec("nac-steady:3=a.json,b.json")[1] == 3


def test_the_page_says_what_each_core_is_and_names_none_frame_stacking(tmp_path):
    from agent.compare.runs import runs_markdown, runs_summary

    rng = np.random.default_rng(1)
    specs = []
    for core in ("nac-steady", "none"):
        for seed in (0, 1):
            a = _eval(tmp_path / f"{core}-{seed}.json", 1_000_000, rng.normal(900, 20, 10))
            specs.append(f"{core}:{seed}={a}")
    md = runs_markdown(runs_summary(specs))
    section = md[md.index("## What the cores are"):md.index("## The cores")]
    assert "**none**" in section and "frame stacking" in section and "no memory" in section
    assert "**nac-steady**" in section and "memory by attention" in section


def test_the_tails_count_tracks_below_600_and_excursions_per_core(tmp_path):
    def ev(name, start, returns, off):
        path = tmp_path / name
        path.write_text(json.dumps({"seeds": list(range(start, start + len(returns))), "returns": returns,
                                    "off_road_steps": off, "laps_finished": 3}))
        return str(path)

    # nac: one excursion that cost the track (480), one it came back from; gru: three excursions, all recovered
    specs = [f"nac:0={ev('n0.json', 1_000_000, [920.0, 480.0, 910.0, 915.0], [0, 140, 0, 60])}",
             f"nac:1={ev('n1.json', 1_000_000, [925.0, 918.0, 912.0, 905.0], [0, 0, 0, 0])}",
             f"gru:0={ev('g0.json', 1_000_000, [700.0, 910.0, 690.0, 900.0], [120, 0, 200, 0])}",
             f"gru:1={ev('g1.json', 1_000_000, [905.0, 650.0, 915.0, 910.0], [0, 90, 0, 10])}"]
    s = runs_summary(specs)
    tails = {c["core"]: c["tail"] for c in s["cores"]}
    assert tails["nac"]["episodes"] == 8 and tails["nac"]["below_600"] == 1
    assert tails["nac"]["excursions"] == 2 and tails["nac"]["excursions_below_600"] == 1
    assert tails["gru"]["below_600"] == 0 and tails["gru"]["excursions"] == 3 and tails["gru"]["excursions_below_600"] == 0
    lo, hi = tails["nac"]["rate_ci95"]
    assert 0 < lo < 1 / 8 < hi < 1 and tails["gru"]["rate_ci95"][0] == 0
    assert tails["nac"]["fisher_p_vs_reference"] is None and tails["gru"]["fisher_p_vs_reference"] == pytest.approx(1.0)
    md = runs_markdown(s)
    assert "## The tails" in md and "| gru | 8 | 0 |" in md and "gru 0 of 8, nac 1 of 8" in md
    assert [x["excursions"] for x in s["runs"][0]["sets"]] == [2]


def test_a_tail_without_off_road_counts_says_so(tmp_path):
    a = _eval(tmp_path / "a.json", 1_000_000, [900.0, 500.0])
    s = runs_summary([f"nac:0={a}"])
    t = s["cores"][0]["tail"]
    assert t["below_600"] == 1 and t["excursions"] is None and s["runs"][0]["sets"][0]["excursions"] is None


def test_the_runs_report_is_not_overwritten_without_overwrite(runs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["compare", "--out", str(out), "--runs", *runs]) == 0
    (out / "runs.md").write_text("kept")
    rc, err = run_cli(["compare", "--out", str(out), "--runs", *runs], capsys)
    assert rc == 2 and "--overwrite" in err and (out / "runs.md").read_text() == "kept"
    assert main(["compare", "--out", str(out), "--overwrite", "--runs", *runs]) == 0
    assert "## The tails" in (out / "runs.md").read_text()
