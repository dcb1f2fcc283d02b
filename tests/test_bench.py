"""A tiny run of the NAC benchmark (agent/bench/nac.py): ours only, plus the missing-peer path; and the options of
`agent bench` (agent/bench/config.py)."""

from __future__ import annotations

import io

import pytest

from agent.bench.nac import ROW_KEYS, bench_nac, print_table


def test_bench_nac_tiny_rows_and_table():
    rows = bench_nac(sizes=(8,), block_sizes=(24,), repeats=2, peer=False, threads=1, verbose=False,
                     train_T=6, step_window=5, step_count=20)
    assert [(r["model"], r["task"], r["T"]) for r in rows] == [
        ("ours-exact", "forward", 8), ("ours-torch", "forward", 8), ("ours-blocks", "forward", 8), ("mha", "forward", 8),
        ("lstm", "forward", 8), ("ours-blocks", "forward", 24),
        ("ours-exact", "train", 6), ("ours-torch", "train", 6), ("mha", "train", 6), ("lstm", "train", 6),
        ("ours-exact", "step", 5), ("mha", "step", 5), ("lstm", "step", 5),
        # the threads rows: ours and MHA in one process, at 1 thread, then at torch's default
        ("ours-exact", "forward", 8), ("mha", "forward", 8), ("ours-exact", "train", 6), ("mha", "train", 6),
        ("ours-exact", "forward", 8), ("mha", "forward", 8), ("ours-exact", "train", 6), ("mha", "train", 6)]
    assert [r["paired"] for r in rows] == [False] * 13 + [True] * 8
    for r in rows:
        assert set(r) == set(ROW_KEYS), r
        assert r["error"] is None, r["error"]
        assert len(r["times_ms"]) == r["repeats"] == (20 if r["task"] == "step" else 2)
        assert all(t > 0 for t in r["times_ms"])
        assert min(r["times_ms"]) <= r["time_ms"] <= max(r["times_ms"])
        assert r["clock"] == "wall"
        if r["task"] == "step":
            assert r["time_ms"] <= r["p99_ms"] <= max(r["times_ms"])
        elif not r["paired"]:
            assert r["peak_mb"] is not None and r["peak_mb"] >= 0 and r["mem_method"]
        assert r["B"] == (8 if r["task"] == "train" else 1)
    assert all(r["threads"] == 1 for r in rows[:17])
    default = rows[-1]["threads"]  # torch's default in a fresh process
    assert default >= 1 and all(r["threads"] == default for r in rows[17:])
    buf = io.StringIO()
    print_table(rows, file=buf)
    out = buf.getvalue()
    assert "ours exact ms" in out and "ours torch ms" in out and "MHA ms" in out and "torch-nac ms" in out
    assert "peak RSS" in out and "torch path" in out
    assert any(line.strip().startswith("24 |") for line in out.splitlines())
    assert "forward + backward, B=8, T=6" in out and "streaming step, ours-exact, window 5" in out
    assert "forward at most 1.5x MHA (T=8):" in out and "streaming step under 1 ms at p99" in out
    assert "threads: ours (exact) and MHA in one process, interleaved" in out and "ours/MHA @1" in out
    assert f"ours/MHA @{default}" in out


def test_bench_nac_cpu_clock_needs_one_thread():
    with pytest.raises(ValueError, match="threads=1"):
        bench_nac(sizes=(4,), block_sizes=(), peer=False, threads=2, clock="cpu", verbose=False)


def test_bench_nac_reports_why_the_peer_is_missing(tmp_path):
    rows = bench_nac(sizes=(4,), block_sizes=(), repeats=1, peer=True, peer_dir=tmp_path / "nowhere",
                     peer_install=False, threads=1, verbose=False, baselines=(), train_T=None, step_window=None)
    peer = [r for r in rows if r["model"] == "torch-nac"]
    assert len(peer) == 1 and peer[0]["time_ms"] is None and "not installed" in peer[0]["error"]
    ours = [r for r in rows if r["model"] != "torch-nac"]
    assert ours and all(r["time_ms"] > 0 for r in ours)
    buf = io.StringIO()
    print_table(rows, file=buf)
    assert "torch-nac column missing" in buf.getvalue()


def test_bench_options_are_one_dataclass_per_subcommand(tmp_path, capsys):
    import json
    from pathlib import Path

    from agent.bench.config import BenchNac, BenchRollouts
    from agent.bench.rollouts import bench_rollouts
    from agent.cli import main

    # the default expert is the one nac.pt was taught by, and it ships
    expert = "carracing-expert-discrete-margin.zip"
    assert BenchRollouts().policies == (expert, "nac.pt") and bench_rollouts.__defaults__[0] == (expert, "nac.pt")
    assert (Path(__file__).resolve().parents[1] / "policies" / expert).is_file()
    assert BenchNac().block_sizes == (4096, 16384) and BenchRollouts().track_seed == 1_000_000
    for argv in (["--help"], ["nac", "--help"], ["rollouts", "--help"]):
        with pytest.raises(SystemExit) as e:
            main(["bench", *argv])
        assert e.value.code == 0
    assert "usage: agent bench" in capsys.readouterr().out
    # --json refuses an existing file unless --overwrite, before anything runs
    rows = tmp_path / "rows.json"
    rows.write_text("keep")
    for argv in (["nac"], ["drive"], ["bridge"], ["rollouts"]):
        assert main(["bench", *argv, "--json", str(rows)]) == 2
        assert f"agent bench: error: --json {rows} already exists" in capsys.readouterr().err
    assert rows.read_text() == "keep"
    assert main(["bench", "nac", "--clock", "cpu", "--threads", "2"]) == 2
    assert "--clock cpu measures one thread's CPU time: add --threads 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a value out of range: tyro says so
        main(["bench", "rollouts", "--episodes", "0"])
    assert e.value.code == 2
    # a tiny run writes the rows
    assert main(["bench", "rollouts", "--policies", expert, "--envs", "1", "--episodes", "1", "--max-steps", "3",
                 "--track-seed", "5", "--json", str(rows), "--overwrite"]) == 0
    written = json.loads(rows.read_text())
    assert [(r["policy"], r["envs"], r["steps"]) for r in written] == [(expert, 1, 3)]
