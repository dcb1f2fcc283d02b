"""A tiny run of the NAC benchmark (agent/bench.py): ours only, plus the missing-peer path."""

from __future__ import annotations

import io

from agent.bench.nac import ROW_KEYS, bench_nac, print_table


def test_bench_nac_tiny_rows_and_table():
    rows = bench_nac(sizes=(8,), block_sizes=(24,), repeats=2, peer=False, threads=1, verbose=False)
    assert [(r["model"], r["T"]) for r in rows] == [("ours-exact", 8), ("ours-blocks", 8), ("ours-blocks", 24)]
    for r in rows:
        assert set(r) == set(ROW_KEYS), r
        assert r["error"] is None, r["error"]
        assert len(r["times_ms"]) == r["repeats"] == 2
        assert all(t > 0 for t in r["times_ms"])
        assert min(r["times_ms"]) <= r["time_ms"] <= max(r["times_ms"])
        assert r["peak_mb"] is not None and r["peak_mb"] >= 0
        assert r["threads"] == 1 and r["mem_method"]
    buf = io.StringIO()
    print_table(rows, file=buf)
    out = buf.getvalue()
    assert "ours exact ms" in out and "torch-nac ms" in out and "peak RSS" in out
    assert any(line.strip().startswith("24 |") for line in out.splitlines())


def test_bench_nac_reports_why_the_peer_is_missing(tmp_path):
    rows = bench_nac(sizes=(4,), block_sizes=(), repeats=1, peer=True, peer_dir=tmp_path / "nowhere",
                     peer_install=False, threads=1, verbose=False)
    peer = [r for r in rows if r["model"] == "torch-nac"]
    assert len(peer) == 1 and peer[0]["time_ms"] is None and "not installed" in peer[0]["error"]
    ours = [r for r in rows if r["model"] != "torch-nac"]
    assert ours and all(r["time_ms"] > 0 for r in ours)
    buf = io.StringIO()
    print_table(rows, file=buf)
    assert "torch-nac column missing" in buf.getvalue()
