"""`agent bench nac --device cuda` (agent/bench/nac_cuda.py): the no-GPU error, the table's ratios and
pass/FAIL marks on fake rows, the streaming rows' code on the CPU, and (``-m cuda``) a tiny real run."""

from __future__ import annotations

import io

import pytest
import torch

from agent.bench import nac_cuda
from agent.bench.config import BenchNac
from agent.bench.nac_cuda import (CELL_KEYS, STEP_KEYS, TARGETS, CudaUnavailable, bench_nac_cuda, parse_cell,
                                  print_cuda_table, ratio_mark, verdicts)
from tests.cli_run import run_cli

ENV = dict(device="Fake GPU", torch="9.9.9+cu999", cuda="99.9", triton="9.9.9")


def _cell(B, T, fwd, train, mem, path="triton", error=None):
    row = {k: None for k in CELL_KEYS}
    row.update(kind="cell", nac_path=path, nac_ran=path, B=B, T=T, repeats=20, fwd_ms=fwd, train_ms=train,
               peak_fwd_mb=mem, peak_train_mb=mem, error=error, **ENV)
    return row


def _step(model, p50, p99, path="triton"):
    row = {k: None for k in STEP_KEYS}
    row.update(kind="step", nac_path=path, nac_ran=path, model=model, window=16, count=300, p50_ms=p50, p99_ms=p99,
               **ENV)
    return row


def test_no_gpu_is_one_line_and_exit_code_2(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, err = run_cli(["bench", "nac", "--device", "cuda"], capsys)
    assert rc == 2
    assert err.startswith("agent bench: error: --device cuda: torch") and "sees no CUDA GPU" in err
    assert "Traceback" not in err and "use --device cpu" in err
    with pytest.raises(CudaUnavailable, match="sees no CUDA GPU"):
        bench_nac_cuda(cells=("2x8",), verbose=False)


def test_cpu_stays_the_default_and_cells_are_checked(capsys):
    cfg = BenchNac()
    assert cfg.device == "cpu" and cfg.thread_counts == (1, 0) and cfg.nac_path == "triton"
    assert parse_cell("64x4096") == (64, 4096)
    for bad in ("8", "8x", "0x16", "axb"):
        with pytest.raises(ValueError, match="BxT"):
            parse_cell(bad)
    rc, err = run_cli(["bench", "nac", "--device", "cuda", "--cuda-cells", "8y16"], capsys)
    assert rc == 2 and "--cuda-cells takes BxT" in err


def test_paired_only_gives_the_threads_rows_at_the_thread_counts():
    from agent.bench.nac import bench_nac, print_table

    rows = bench_nac(sizes=(8,), block_sizes=(), repeats=1, peer=False, verbose=False, train_T=None,
                     step_window=None, paired_threads=(1, 2), paired_only=True)
    assert [(r["model"], r["threads"], r["paired"]) for r in rows] == [
        ("ours-exact", 1, True), ("mha", 1, True), ("ours-exact", 2, True), ("mha", 2, True)]
    assert all(r["error"] is None for r in rows)
    buf = io.StringIO()
    print_table(rows, file=buf)
    out = buf.getvalue()
    assert out.startswith("threads: ours (exact) and MHA") and "ours/MHA @2" in out and "ours @1/@2" in out


def test_paired_verdicts_judge_the_most_threads_against_issue_42s_targets():
    from agent.bench.nac import paired_verdicts

    def row(model, task, T, threads, ms):
        return dict(model=model, task=task, T=T, threads=threads, time_ms=ms, paired=True)

    rows = [row("ours-exact", "forward", 16, 2, 9.0), row("mha", "forward", 16, 2, 1.0),  # T=16: no target
            row("ours-exact", "forward", 256, 1, 9.0), row("mha", "forward", 256, 1, 1.0),  # 1 thread: not judged
            row("ours-exact", "forward", 256, 2, 1.5), row("mha", "forward", 256, 2, 1.0),
            row("ours-exact", "forward", 1024, 2, 1.6), row("mha", "forward", 1024, 2, 1.0),
            row("ours-exact", "train", 256, 2, 4.2), row("mha", "train", 256, 2, 2.0)]
    assert paired_verdicts(rows) == [
        "targets (issue 42, at 2 threads):",
        "  forward at T=256: 1.50x, at most 1.5x: met",
        "  forward at T=1024: 1.60x, at most 1.5x: NOT met",
        "  forward + backward at T=256: 2.10x, at most 2x: NOT met"]
    at16 = [dict(r, threads=16) for r in rows if r["threads"] == 2]
    assert paired_verdicts(at16) == [
        "targets (issue 42, at 16 threads):",
        "  forward at T=256: 1.50x, at most 2x: met",
        "  forward at T=1024: 1.60x, at most 2x: met"]
    assert paired_verdicts([]) == []


def test_ratio_marks():
    assert ratio_mark(3.0, 2.0, 2.0) == (1.5, "1.50x pass")
    assert ratio_mark(4.0, 2.0, 2.0) == (2.0, "2.00x pass")  # at the target is met
    assert ratio_mark(4.2, 2.0, 2.0) == (pytest.approx(2.1), "2.10x FAIL")
    assert ratio_mark(None, 2.0, 2.0) == (None, "-") and ratio_mark(1.0, 0.0, 2.0) == (None, "-")


def test_table_ratios_and_marks_from_fake_rows():
    rows = [
        # forward 1.5x MHA (pass) and 3x SDPA (FAIL); f+b 1.9x / 2.5x; memory 1.2x / 1.6x
        _cell(8, 256, {"nac": 3.0, "mha": 2.0, "sdpa": 1.0}, {"nac": 9.5, "mha": 5.0, "sdpa": 3.8},
              {"nac": 12.0, "mha": 10.0, "sdpa": 7.5}),
        _cell(64, 4096, {}, {}, {}, error="OutOfMemoryError: CUDA out of memory"),
        _step("nac-layer", 0.3, 0.8),
        _step("policy nac.pt", 0.9, 1.4),
    ]
    buf = io.StringIO()
    print_cuda_table(rows, file=buf)
    out = buf.getvalue()
    assert "device: Fake GPU; torch 9.9.9+cu999 (CUDA 99.9); triton 9.9.9" in out
    assert "forward <= 2x, forward + backward <= 2x, peak memory <= 1.5x" in out and "p99 <= 1 ms" in out
    line = next(x for x in out.splitlines() if x.startswith("| triton (triton) | 8 | 256 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[3:8] == ["3.00", "2.00", "1.00", "1.50x pass", "3.00x FAIL"]
    assert cells[8:13] == ["9.50", "5.00", "3.80", "1.90x pass", "2.50x FAIL"]
    assert cells[13:] == ["12.0 / 10.0 / 7.5", "1.20x pass", "1.60x FAIL"]
    assert "| triton (triton) | 64 | 4096 | error: OutOfMemoryError: CUDA out of memory |" in out
    assert "| triton (triton) | nac-layer | 16 | 300 | 0.300 | 0.800 | pass |" in out
    assert "| triton (triton) | policy nac.pt | 16 | 300 | 0.900 | 1.400 | FAIL |" in out
    v = verdicts(rows)
    assert len(v) == 8 and sum(met for *_, met in v) == 4
    assert "targets met: 4 of 8; not met:" in out and "1 row(s) without numbers" in out
    assert TARGETS == {"forward": 2.0, "train": 2.0, "memory": 1.5, "step_p99_ms": 1.0}
    # the header names the markdown columns with their targets
    assert "| fwd NAC/MHA (<= 2x) |" in out and "| mem NAC/SDPA (<= 1.5x) |" in out


def test_a_cell_on_the_cpu_times_every_model_interleaved():
    row = nac_cuda._cell(dict(nac_path="torch", repeats=2), 2, 8, torch, device="cpu")
    assert set(row) == set(CELL_KEYS) and row["error"] is None, row["error"]
    assert row["nac_ran"] == "torch" and (row["B"], row["T"]) == (2, 8)
    for key in ("fwd", "train"):
        assert set(row[f"{key}_ms"]) == {"nac", "mha", "sdpa"}
        assert all(len(t) == 2 and min(t) > 0 for t in row[f"{key}_times_ms"].values())
        assert row[f"peak_{key}_mb"] == {"nac": None, "mha": None, "sdpa": None}  # CUDA only
    # a path that cannot run is an error, never the other path's numbers
    bad = nac_cuda._cell(dict(nac_path="triton", repeats=2), 2, 8, torch, device="cpu")
    assert "the triton path was asked for but the torch path would run" in bad["error"] and bad["fwd_ms"] == {}


def test_a_profiled_cell_says_where_the_time_goes():
    row = nac_cuda._cell(dict(nac_path="torch", repeats=1, profile=True), 2, 8, torch, device="cpu")
    assert row["error"] is None and set(row["profile"]) == {"fwd", "train"}
    for pr in row["profile"].values():
        assert pr["error"] is None and pr["wall_ms"] > 0
        assert pr["launches"] == 0 and pr["kernels"] == []  # no GPU kernels on the CPU
    # the table's profile section, from a GPU-like row
    cell = _cell(8, 256, {"nac": 3.0, "mha": 2.0, "sdpa": 1.0}, {"nac": 9.5, "mha": 5.0, "sdpa": 3.8},
                 {"nac": 10.0, "mha": 8.0, "sdpa": 7.0})
    cell["profile"] = {"fwd": {"wall_ms": 0.8, "device_ms": 0.2, "launches": 14, "error": None,
                               "kernels": [{"kernel": "nac_topk_exact", "ms": 0.12, "count": 1}]},
                       "train": {"error": "RuntimeError: profiler"}}
    buf = io.StringIO()
    print_cuda_table([cell], file=buf)
    out = buf.getvalue()
    assert "| triton | 8 | 256 | fwd | 0.80 | 0.20 | 14 | nac_topk_exact 0.120 x1 |" in out
    assert "| triton | 8 | 256 | train | error: RuntimeError: profiler |" in out


def test_streaming_rows_of_the_layer_and_the_policy_on_the_cpu():
    spec = dict(nac_path="torch", step_window=4, step_count=5, policy="nac.pt")
    rows = nac_cuda._steps(spec, torch, device="cpu")
    assert [r["model"] for r in rows] == ["nac-layer", "policy nac.pt"]
    for r in rows:
        assert set(r) == set(STEP_KEYS) and r["error"] is None, r["error"]
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["torch"] == torch.__version__ and r["nac_ran"] == "torch"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bench_tiny():
    paths = ("triton", "torch") if nac_cuda._nac_ran(torch) == "triton" else ("torch",)
    rows = bench_nac_cuda(cells=("2x8", "1x32"), repeats=2, nac_paths=paths, step_window=4, step_count=5,
                          policy="nac.pt", timeout_s=240, verbose=False)
    cells = [r for r in rows if r["kind"] == "cell"]
    assert [(r["nac_path"], r["B"], r["T"]) for r in cells] == [(p, B, T) for p in paths for B, T in ((2, 8), (1, 32))]
    for r in rows:
        assert r["error"] is None, r
        assert r["nac_ran"] == r["nac_path"] and r["device"] and r["torch"] == torch.__version__
    for r in cells:
        for key in ("fwd_ms", "train_ms", "peak_fwd_mb", "peak_train_mb"):
            assert set(r[key]) == {"nac", "mha", "sdpa"} and all(v >= 0 for v in r[key].values())
        assert all(len(v) == 2 for v in r["fwd_times_ms"].values())
    buf = io.StringIO()
    print_cuda_table(rows, file=buf)
    assert "targets met:" in buf.getvalue()
