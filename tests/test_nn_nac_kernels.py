"""The NAC layer's fused CPU kernels (agent/nn/nac_kernels.py) against its torch path.

Both paths compute the same function: outputs and every gradient are compared in float64 (to
rounding) and float32 (to float32's precision), for each ODE mode and selector, with and without
timestamps and key masks, through the full layer, its streaming step and the policy cores. The
exact selector's ranking, the backward (against finite differences) and the float32 scalar
approximations are tested on their own."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agent.nn import nac_kernels
from agent.nn.nac import NAC, select_topk_blocks, select_topk_exact

pytestmark = pytest.mark.skipif(not nac_kernels.available(), reason="numba is not installed")

MODES = ("steady", "exact", "euler")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _layer(dtype, seed=0, **kw) -> NAC:
    torch.manual_seed(seed)
    cfg = dict(input_dim=12, d_model=16, num_heads=4, topk=4, mode="exact", seed=3)
    cfg.update(kw)
    return NAC(**cfg).to(dtype)


def _inputs(dtype, B=2, T=19, seed=1, with_t=True, with_mask=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 12, generator=g, dtype=torch.float64).to(dtype)
    t = torch.cumsum(0.02 + 0.1 * torch.rand(B, T, generator=g, dtype=torch.float64), 1) if with_t else None
    mask = None
    if with_mask:
        mask = torch.rand(B, T, generator=g) > 0.25
        mask[:, 0] = True
    return x, t, mask


def _run(m: NAC, x, t, mask, kernels: bool):
    """Output and the gradients of a fixed scalar of it w.r.t. x and every parameter."""
    m.zero_grad()
    x = x.clone().requires_grad_()
    with nac_kernels.use_kernels(kernels):
        y = m(x, t, mask)
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)
    (y * w).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("selector", ("exact", "blocks"))
@pytest.mark.parametrize("with_t,with_mask", [(False, False), (True, False), (False, True), (True, True)])
def test_kernels_equal_the_torch_path_in_float64(mode, selector, with_t, with_mask):
    m = _layer(torch.float64, mode=mode, selector=selector)
    x, t, mask = _inputs(torch.float64, with_t=with_t, with_mask=with_mask)
    y_k, gx_k, gp_k = _run(m, x, t, mask, kernels=True)
    y_t, gx_t, gp_t = _run(m, x, t, mask, kernels=False)
    torch.testing.assert_close(y_k, y_t, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(gx_k, gx_t, atol=1e-12, rtol=1e-10)
    assert gp_k.keys() == gp_t.keys()
    for name in gp_t:
        torch.testing.assert_close(gp_k[name], gp_t[name], atol=1e-11, rtol=1e-9, msg=name)
    assert any(g.abs().max() > 0 for g in gp_k.values())  # the gradients are not trivially zero


@pytest.mark.parametrize("mode", MODES)
def test_kernels_equal_the_torch_path_with_several_heads_to_a_backward_tile(mode):
    """T = 10: the backward packs three whole heads into each tile of TILE_QUERIES query rows (B H = 8
    heads: groups of 3, 3 and 2), as it does for a policy's window; output and every gradient as
    the torch path's, in float64."""
    assert nac_kernels.TILE_QUERIES // 10 == 3
    m = _layer(torch.float64, mode=mode)
    x, t, mask = _inputs(torch.float64, B=2, T=10, seed=3)
    assert 2 * m.num_heads == 8
    y_k, gx_k, gp_k = _run(m, x, t, mask, kernels=True)
    y_t, gx_t, gp_t = _run(m, x, t, mask, kernels=False)
    torch.testing.assert_close(y_k, y_t, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(gx_k, gx_t, atol=1e-12, rtol=1e-10)
    for name in gp_t:
        torch.testing.assert_close(gp_k[name], gp_t[name], atol=1e-11, rtol=1e-9, msg=name)
    assert any(g.abs().max() > 0 for g in gp_k.values())


@pytest.mark.parametrize("mode", MODES)
def test_kernels_equal_the_torch_path_in_float32(mode):
    m = _layer(torch.float32, mode=mode)
    x, t, mask = _inputs(torch.float32)
    y_k, gx_k, gp_k = _run(m, x, t, mask, kernels=True)
    y_t, gx_t, gp_t = _run(m, x, t, mask, kernels=False)
    torch.testing.assert_close(y_k, y_t, atol=2e-6, rtol=1e-4)
    torch.testing.assert_close(gx_k, gx_t, atol=2e-6, rtol=1e-4)
    for name in gp_t:
        scale = gp_t[name].abs().max().clamp(min=1e-3)
        assert (gp_k[name] - gp_t[name]).abs().max() <= 1e-4 * scale, name


def test_kernels_run_where_they_apply_and_the_switch_turns_them_off():
    q = torch.zeros(1, 1, 2, 4)
    assert nac_kernels.applies(q, q)
    assert not nac_kernels.applies(q.half(), q.half())  # half precision: torch path
    assert not nac_kernels.applies(q, q.double())  # mixed dtypes: torch path
    with nac_kernels.use_kernels(False):
        assert not nac_kernels.applies(q, q)
    assert nac_kernels.applies(q, q)
    # the layer still works where the kernels do not apply (its torch path)
    m = _layer(torch.float32)
    x, t, mask = _inputs(torch.float32)
    with torch.no_grad():
        y = m(x, t, mask)
        y_bf16 = m.to(torch.bfloat16)(x.to(torch.bfloat16), t, mask)
    torch.testing.assert_close(y_bf16.float(), y, atol=0.1, rtol=0.1)


@pytest.mark.parametrize("with_t", [False, True])
def test_streaming_step_through_the_kernels_equals_the_forward(with_t):
    m = _layer(torch.float64, mode="euler").eval()
    x, t, _ = _inputs(torch.float64, B=3, T=11, with_t=with_t, with_mask=False)
    with torch.no_grad():
        y = m(x, t)
        cache, steps = None, []
        for i in range(x.shape[1]):
            yi, cache = m.step(x[:, i], cache, None if t is None else t[:, i])
            steps.append(yi)
    torch.testing.assert_close(torch.stack(steps, 1), y, atol=1e-12, rtol=1e-10)


def test_long_sequences_in_query_chunks_equal_one_pass(monkeypatch):
    import agent.nn.nac as nac_module

    m = _layer(torch.float64).eval()
    x, t, mask = _inputs(torch.float64, T=40)
    monkeypatch.setattr(nac_kernels, "FUSED_MAX_T", 0)  # the chunked path, not the one-call forward
    with torch.no_grad():
        y_whole = m(x, t, mask)
        monkeypatch.setattr(nac_module, "ATTEND_QUERY_CHUNK", 7)
        y_chunks = m(x, t, mask)
    torch.testing.assert_close(y_chunks, y_whole, atol=1e-13, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("with_t,with_mask,T,selector", [(False, False, 19, "exact"), (True, True, 19, "exact"),
                                                         (True, False, 3, "exact"), (True, True, 40, "blocks"),
                                                         (False, False, 3, "blocks")])
def test_one_call_no_grad_forward_equals_the_other_paths(mode, causal, with_t, with_mask, T, selector, monkeypatch):
    """Under no_grad the layer runs in one kernel call (nac_kernels.fused_forward); it must give
    what the torch path and the autograd kernel path give (T=3 < topk=4: fewer keys than K), with
    either selector."""
    calls = []
    real = nac_kernels.fused_forward
    monkeypatch.setattr(nac_kernels, "fused_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for dtype, atol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
        m = _layer(dtype, mode=mode, causal=causal, selector=selector).eval()
        x, t, mask = _inputs(dtype, T=T, with_t=with_t, with_mask=with_mask)
        with torch.no_grad():
            y_fused = m(x, t, mask)
            with nac_kernels.use_kernels(False):
                y_torch = m(x, t, mask)
        y_grad = m(x, t, mask).detach()  # grad enabled: the PairAttention path
        torch.testing.assert_close(y_fused, y_torch, atol=atol, rtol=1e-4)
        torch.testing.assert_close(y_fused, y_grad, atol=atol, rtol=1e-4)
        assert y_fused.shape == (x.shape[0], T, 16) and not y_fused.requires_grad
    assert len(calls) == 2, "the no-grad forward took the one-call kernel once per dtype"
    with pytest.raises(ValueError, match="K <= T"):
        real(m.fused_weights(), x, None, None, 4, T + 1, True, mode, 1.0, 1e-2, 6)
    with pytest.raises(ValueError, match="do not fit"):
        real(m.fused_weights(), x, None, None, 4, min(T, 4), True, mode, 1.0, 1e-2, 6, (2, T))


def test_pair_attention_backward_matches_finite_differences():
    """gradcheck of the fused backward on its own (float64, every differentiable input)."""
    g = torch.Generator().manual_seed(0)
    B, H, Tq, Tk, d, K, Ni, Nc, Nm = 1, 2, 5, 5, 3, 3, 4, 3, 2
    F = Ni + 2
    r = lambda *s: (0.7 * torch.randn(*s, generator=g, dtype=torch.float64)).requires_grad_()  # noqa: E731
    q_half, k_half, v = r(B, H, Tq, F), r(B, H, Tk, F), r(B, H, Tk, d)
    Wc, bc, Wm, bm, Wh, bh = r(Ni, Nc), r(Nc), r(Nc, Nm), r(Nm), r(Nm, 2), r(2)
    qpos = torch.arange(Tq)
    scores = torch.randn(B, H, Tq, Tk, generator=g)
    idx, valid = select_topk_exact(scores[..., :1].expand(B, H, Tq, 1).contiguous().double(),
                                   torch.randn(B, H, Tk, 1, generator=g, dtype=torch.float64), K, qpos)
    times = torch.cumsum(torch.rand(B, Tk, generator=g, dtype=torch.float64), 1)
    for mode in MODES:
        for qt, kt in ((None, None), (times, times)):
            def f(*a):
                return nac_kernels.pair_attention(*a[:3], idx, valid, a[3:], qt, kt, mode, 0.8, 0.01, 4)
            assert torch.autograd.gradcheck(f, (q_half, k_half, v, Wc, bc, Wm, bm, Wh, bh), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,K", [(1, 4), (3, 4), (30, 4), (257, 8)])
def test_topk_exact_kernel_selects_what_torch_topk_selects(causal, T, K):
    g = torch.Generator().manual_seed(T)
    for dtype in (torch.float32, torch.float64):
        q = torch.randn(2, 3, T, 5, generator=g).to(dtype)
        k = torch.randn(2, 3, T, 5, generator=g).to(dtype)
        mask = torch.rand(2, T, generator=g) > 0.3
        for key_mask in (None, mask):
            qpos = torch.arange(T)
            idx, valid = select_topk_exact(q, k, K, qpos, key_mask, causal)
            with nac_kernels.use_kernels(False):
                idx_t, valid_t = select_topk_exact(q, k, K, qpos, key_mask, causal)
            assert idx.shape == idx_t.shape == (2, 3, T, min(K, T)) and idx.dtype == torch.int64
            assert torch.equal(valid, valid_t)
            # the same keys, highest score first
            assert torch.equal(idx[valid], idx_t[valid])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("T,K,block_size,n_blocks", [(1, 4, None, None), (10, 4, None, None), (100, 8, None, None),
                                                     (300, 8, None, None), (64, 8, 8, 3), (50, 3, 64, 1)])
def test_topk_blocks_kernel_selects_what_the_torch_blocks_selector_selects(causal, T, K, block_size, n_blocks):
    g = torch.Generator().manual_seed(T + K)
    q = torch.randn(2, 3, T, 6, generator=g)
    k = torch.randn(2, 3, T, 6, generator=g)
    mask = torch.rand(2, T, generator=g) > 0.3
    for key_mask in (None, mask):
        qpos = torch.arange(T)
        kw = dict(causal=causal, block_size=block_size, n_blocks=n_blocks)
        idx, valid = select_topk_blocks(q, k, K, qpos, key_mask, **kw)
        with nac_kernels.use_kernels(False):
            idx_t, valid_t = select_topk_blocks(q, k, K, qpos, key_mask, **kw)
        assert idx.shape == idx_t.shape and torch.equal(valid, valid_t)
        assert torch.equal(idx[valid], idx_t[valid])


def test_topk_exact_ties_go_to_the_earlier_key_and_blocked_keys_never_count():
    # identical keys: every score ties, so the K earliest allowed keys are kept, in index order
    q = torch.ones(1, 1, 6, 2)
    k = torch.ones(1, 1, 6, 2)
    key_mask = torch.tensor([[True, False, True, True, True, True]])
    idx, valid = nac_kernels.topk_exact(q, k, 3, torch.arange(6), key_mask, causal=True)
    assert idx[0, 0, 5].tolist() == [0, 2, 3] and valid[0, 0, 5].all()
    assert idx[0, 0, 1, :1].tolist() == [0] and valid[0, 0, 1].tolist() == [True, False, False]
    # a NaN score is never kept; -inf scores count as missing keys
    k2 = k.clone()
    k2[0, 0, 2] = float("nan")
    idx, valid = nac_kernels.topk_exact(q, k2, 3, torch.arange(6), None, causal=True)
    assert 2 not in idx[0, 0, 5][valid[0, 0, 5]].tolist()
    assert valid[0, 0, 2].tolist() == [True, True, False]


def test_topk_exact_with_many_ties_keeps_the_earliest_of_the_highest():
    # integer scores with many repeats: the K kept are the highest, the earlier key first among
    # equals (a stable sort by descending score), also where more than K tie at the threshold
    g = torch.Generator().manual_seed(5)
    T, K = 300, 8
    for dtype in (torch.float32, torch.float64):
        kv = torch.randint(0, 12, (1, 1, T, 1), generator=g).to(dtype)
        q = torch.ones(1, 1, T, 1, dtype=dtype)
        idx, valid = nac_kernels.topk_exact(q, kv, K, torch.arange(T), None, causal=True)
        scores = kv[0, 0, :, 0].numpy()
        for i in (0, 5, 7, 8, 40, 150, T - 1):
            order = np.lexsort((np.arange(i + 1), -scores[: i + 1]))[:K]
            n = min(K, i + 1)
            assert valid[0, 0, i].tolist() == [True] * n + [False] * (K - n)
            assert idx[0, 0, i, :n].tolist() == order.tolist()


def test_topk_exact_ranks_few_candidates_by_counting_and_many_by_insertion_alike():
    # _row_topk ranks up to RANK_SLOTS * K candidates by counting and inserts more (many ties); both
    # must keep the K highest, highest first, the earlier key first among equals
    T, K = 200, 4
    for dtype in (torch.float32, torch.float64):
        q = torch.ones(1, 1, T, 1, dtype=dtype)
        # all keys equal: every score ties, so the candidates outnumber RANK_SLOTS * K (insertion)
        flat = torch.ones(1, 1, T, 1, dtype=dtype)
        idx, valid = nac_kernels.topk_exact(q, flat, K, torch.arange(T), None, causal=True)
        assert T - 1 > nac_kernels.RANK_SLOTS * K
        assert idx[0, 0, T - 1].tolist() == [0, 1, 2, 3] and valid[0, 0, T - 1].all()
        # a few ties among distinct scores (ranking by counting): 5.0 at keys 7 and 3, 4.0 at 11 and 5
        kv = torch.zeros(1, 1, T, 1, dtype=dtype)
        kv[0, 0, [3, 7], 0] = 5.0
        kv[0, 0, [5, 11], 0] = 4.0
        kv[0, 0, 12:, 0] = -torch.arange(1, T - 11, dtype=dtype)  # below the rest, all distinct
        idx, valid = nac_kernels.topk_exact(q, kv, K, torch.arange(T), None, causal=True)
        assert idx[0, 0, T - 1].tolist() == [3, 7, 5, 11] and valid[0, 0, T - 1].all()


def test_topk_exact_ranks_more_candidates_than_the_vector_rank_holds_alike():
    # 4 distinct high scores, then 20 ties: the bisection cannot split the ties, so about 24
    # candidates (more than RANK_WIDTH, at most RANK_SLOTS * K) go to the scalar counting rank
    T, K = 60, 8
    for dtype in (torch.float32, torch.float64):
        q = torch.ones(1, 1, T, 1, dtype=dtype)
        kv = -torch.arange(1, T + 1, dtype=dtype).reshape(1, 1, T, 1) - 100.0  # distinct, below the rest
        kv[0, 0, [9, 2, 30, 17], 0] = torch.tensor([9.0, 8.0, 7.0, 6.0], dtype=dtype)
        ties = [1, 4, 6, 8, 10, 11, 13, 20, 21, 22, 25, 27, 28, 33, 35, 38, 40, 44, 50, 57]
        kv[0, 0, ties, 0] = 3.0
        assert nac_kernels.RANK_WIDTH < 24 <= nac_kernels.RANK_SLOTS * K
        idx, valid = nac_kernels.topk_exact(q, kv, K, torch.arange(T), None, causal=True)
        assert idx[0, 0, T - 1].tolist() == [9, 2, 30, 17, 1, 4, 6, 8] and valid[0, 0, T - 1].all()


@pytest.mark.skipif(nac_kernels.RANK_WIDTH == 0, reason="the vector rank is off (NAC_DRIVE_COMPRESS=off)")
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_vector_rank_counts_what_the_scalar_rank_counts(dtype):
    """_rank_in against numpy: each candidate's rank among a row of up to RANK_WIDTH (the higher
    first, the earlier first among equals), with ties, +inf and the -inf padding past the row."""
    import numba

    W = nac_kernels.RANK_WIDTH
    rank_in = nac_kernels._rank_in

    @numba.njit
    def ranks(cv, m):
        out = np.empty(m, np.int64)
        for t in range(m):
            out[t] = rank_in(cv, t)
        return out

    rng = np.random.default_rng(3)
    for m in range(1, W + 1):
        for _ in range(20):
            row = rng.integers(-3, 4, m).astype(dtype)  # small integers: many ties
            if m > 2:
                row[rng.integers(m)] = np.inf
            cv = np.full(W, -np.inf, dtype)
            cv[:m] = row
            want = np.empty(m, np.int64)
            want[np.lexsort((np.arange(m), -row))] = np.arange(m)  # stable descending order
            np.testing.assert_array_equal(ranks(cv, m), want)


@pytest.mark.skipif(nac_kernels.COMPRESS_WIDTH == 0, reason="the vector gather is off (NAC_DRIVE_COMPRESS=off)")
@pytest.mark.parametrize("dtype", (np.float32, np.float64))
def test_vector_gather_keeps_the_indices_the_scalar_comparison_keeps(dtype):
    """_compress_ge against numpy: the indices whose entry is >= thr, in order, a vector at a time,
    for a float64 thr between two float32 values (compared as float64, as the scalar loop does),
    NaN entries (never kept), -inf and ties at thr."""
    import numba

    W = nac_kernels.COMPRESS_WIDTH
    compress = nac_kernels._compress_ge

    @numba.njit
    def gather(buf, thr):
        cand = np.full(len(buf) + W, -1, np.int64)
        m = 0
        j = 0
        while j + W <= len(buf):
            m = compress(buf, j, thr, cand, m)
            j += W
        return cand[:m], j

    rng = np.random.default_rng(0)
    buf = rng.standard_normal(8 * W + 3).astype(dtype)
    buf[[1, 5]] = np.nan
    buf[2] = -np.inf
    thr32 = float(np.float32(0.3))
    buf[[3, 4 * W]] = thr32  # ties at thr: kept
    for thr in (thr32, float(np.nextafter(np.float32(0.3), np.float32(1))) - 1e-9, -np.inf, 5.0, -5.0):
        got, done = gather(buf, thr)
        assert done == 8 * W
        want = np.flatnonzero(buf[:done].astype(np.float64) >= thr)
        np.testing.assert_array_equal(got, want)


def test_float32_scalar_approximations_are_accurate():
    x = np.linspace(-30, 30, 20001).astype(np.float32)
    got = nac_kernels.float32_math(x)
    x64 = x.astype(np.float64)
    tanh = np.tanh(x64)
    assert np.abs(got["tanh"] - tanh).max() < 4e-7
    small = np.abs(x64) < 80
    assert np.max(np.abs(got["exp"] / np.exp(x64) - 1)[small]) < 1e-8
    assert np.max(np.abs(got["expm1"] - np.expm1(x64)) / np.maximum(np.abs(np.expm1(x64)), 1e-30)) < 1e-8
    assert np.abs(got["sigmoid"] - 1 / (1 + np.exp(-x64))).max() < 1e-8
    softplus = torch.nn.functional.softplus(torch.from_numpy(x64)).numpy()
    assert np.abs(got["softplus"] - softplus).max() < 1e-8
    # near 0, expm1 keeps its relative precision (no cancellation)
    tiny = np.array([1e-6, -3e-5, 2e-3], np.float32)
    assert np.allclose(nac_kernels.float32_math(tiny)["expm1"], np.expm1(tiny.astype(np.float64)), rtol=1e-6,
                       atol=0)


def test_blocks_selector_feeds_the_kernels_the_same_pairs():
    """The blocks selector stays in torch; its selection goes through the same pair kernel."""
    m = _layer(torch.float64, selector="blocks", topk=3).eval()
    x, t, mask = _inputs(torch.float64, T=37)
    q, k, _ = m.project(x)
    idx, valid = select_topk_blocks(q, k, 3, torch.arange(37), mask)
    assert valid.any()
    with torch.no_grad():
        y_k = m(x, t, mask)
        with nac_kernels.use_kernels(False):
            y_t = m(x, t, mask)
    torch.testing.assert_close(y_k, y_t, atol=1e-12, rtol=1e-10)
    assert math.isfinite(float(y_k.abs().sum()))


def test_environment_variable_switches_the_kernels_off():
    import os
    import subprocess
    import sys

    code = "from agent.nn import nac_kernels as k; print(k.available())"
    env = {**os.environ, "NAC_DRIVE_KERNELS": "torch"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    env["NAC_DRIVE_KERNELS"] = "numba"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


# --------------------------------------------------------------------------------------------
# Threads: the kernels' parallel builds give bit-identical results
# --------------------------------------------------------------------------------------------

needs_two_threads = pytest.mark.skipif(nac_kernels.numba is None or nac_kernels.numba.config.NUMBA_NUM_THREADS < 2,
                                       reason="Numba runs at most one thread here")


def _chunk_counts(monkeypatch) -> list[int]:
    """Let even these small calls run in parallel, and record each call's number of chunks (> 1:
    the parallel build ran)."""
    monkeypatch.setattr(nac_kernels, "PARALLEL_MIN_PAIRS", 0)
    monkeypatch.setattr(nac_kernels, "PARALLEL_MIN_SCORES", 0)
    chunks, real = [], nac_kernels._call

    def spy(kernels, n, items, *args):
        chunks.append(min(n, items))
        return real(kernels, n, items, *args)

    monkeypatch.setattr(nac_kernels, "_call", spy)
    return chunks


def _assert_bit_identical(one, two):
    assert len(one) == len(two)
    for i, (a, b) in enumerate(zip(one, two)):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), f"result {i} differs: max |diff| {(a.double() - b.double()).abs().max()}"


@needs_two_threads
@pytest.mark.parametrize("B,H,T", [(1, 4, 70), (1, 1, 45), (3, 2, 33), (2, 4, 130), (5, 3, 7)])
def test_kernels_give_bit_identical_results_on_one_and_two_threads(B, H, T, monkeypatch):
    """Both selectors, and PairAttention's forward and every gradient of its backward (each ODE mode,
    with and without timestamps), at torch.set_num_threads(1) and (2): the same bits (the parallel
    builds split the work into independent items and add every sum in the serial order). T = 70
    and 130 give heads of several tiles, T = 7 groups of four whole heads to a tile in the backward
    (the last group of three)."""
    chunks = _chunk_counts(monkeypatch)
    g = torch.Generator().manual_seed(100 * B + T)
    d, K, Ni, Nc, Nm = 8, 5, 6, 5, 4
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, q_half, k_half, v = r(B, H, T, d), r(B, H, T, d), r(B, H, T, Ni + 2), r(B, H, T, Ni + 2), r(B, H, T, d)
    Wc = r(Ni, Nc) * (torch.rand(Ni, Nc, generator=g) > 0.4)  # masked-out weights, as the NCP wiring's
    backbone = (Wc, r(Nc), r(Nc, Nm), r(Nm), r(Nm, 2), r(2))
    mask = torch.rand(B, T, generator=g) > 0.2
    mask[:, 0] = True
    times = torch.cumsum(0.02 + 0.1 * torch.rand(B, T, generator=g, dtype=torch.float64), 1)
    qpos = torch.arange(T)
    w = torch.linspace(-1, 1, B * T * H * d, dtype=torch.float64).view(B, T, H, d)
    for dtype in (torch.float32, torch.float64):
        def run():
            out = []
            for causal in (True, False):
                out += nac_kernels.topk_exact(q.to(dtype), k.to(dtype), K, qpos, mask, causal)
                out += nac_kernels.topk_blocks(q.to(dtype), k.to(dtype), K, qpos, mask, causal, 8, 3)
            idx, valid = out[0], out[1]
            for mode in MODES:
                for qt, kt in ((None, None), (times, times)):
                    leaves = [a.to(dtype).requires_grad_() for a in (q_half, k_half, v, *backbone)]
                    o = nac_kernels.pair_attention(*leaves[:3], idx, valid, leaves[3:], qt, kt, mode, 0.8, 0.01, 4)
                    out += [o.detach(), *torch.autograd.grad((o * w.to(dtype)).sum(), leaves)]
            return out

        torch.set_num_threads(1)
        one = run()
        torch.set_num_threads(2)
        try:
            two = run()
        finally:
            torch.set_num_threads(1)
        _assert_bit_identical(one, two)
    if nac_kernels._LAYER:  # a threading layer runs here: the parallel builds did run
        assert max(chunks) == 2


@needs_two_threads
@pytest.mark.parametrize("selector", ("exact", "blocks"))
def test_layer_gives_bit_identical_results_with_its_kernels_on_one_and_two_threads(selector, monkeypatch):
    """The whole layer through the kernels: the one-call no-grad forward, and forward + backward
    (every gradient), B = 1 and B = 3. The kernels take their thread count from
    torch.get_num_threads (1, then 2 here); torch's own operations stay on one thread, since
    their sums (the GEMMs' backward) may depend on torch's thread count."""
    chunks = _chunk_counts(monkeypatch)
    for dtype in (torch.float32, torch.float64):
        for B, T in ((1, 70), (3, 40)):
            m = _layer(dtype, mode="euler", selector=selector)
            x, t, mask = _inputs(dtype, B=B, T=T)
            res = []
            for n in (1, 2):
                with monkeypatch.context() as mp:
                    mp.setattr(torch, "get_num_threads", lambda n=n: n)
                    with torch.no_grad():
                        y_fused = m(x, t, mask)
                    y, gx, gp = _run(m, x, t, mask, kernels=True)
                res.append([y_fused, y, gx, *gp.values()])
            _assert_bit_identical(*res)
    if nac_kernels._LAYER:
        assert max(chunks) == 2


@needs_two_threads
@pytest.mark.parametrize("layer", ("workqueue", "no-such-layer"))
def test_kernels_with_workqueue_or_without_a_threading_layer(layer):
    """NUMBA_THREADING_LAYER=workqueue (not thread-safe): four Python threads calling the layer at
    once do not crash it (one call at a time runs in parallel, the others serially) and get the
    one-thread results; a layer that cannot start: one log line, then everything on one thread."""
    import os
    import subprocess
    import sys

    code = """
import logging, threading
logging.basicConfig(level=logging.INFO, format="LOG %(message)s")
import torch
from agent.nn import nac_kernels as nk
from agent.nn.nac import NAC
nk.PARALLEL_MIN_PAIRS = nk.PARALLEL_MIN_SCORES = 0
torch.manual_seed(0)
m = NAC(input_dim=12, d_model=16, num_heads=4, topk=4).eval()
x = torch.randn(2, 70, 12)
with torch.no_grad():
    ref = m(x)
torch.set_num_threads(2)
outs = [None] * 4
def work(i):
    with torch.no_grad():
        for _ in range(10):
            outs[i] = m(x)
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print("LAYER", repr(nk._LAYER), all(torch.equal(o, ref) for o in outs))
"""
    env = {**os.environ, "NUMBA_THREADING_LAYER": layer}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    logs = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("LOG NAC kernels")]
    if layer == "workqueue":
        assert "LAYER 'workqueue' True" in out.stdout
        assert len(logs) == 1 and "workqueue" in logs[0]
    else:
        assert "LAYER '' True" in out.stdout
        assert len(logs) == 1 and "no Numba threading layer could start" in logs[0] and "one thread" in logs[0]
