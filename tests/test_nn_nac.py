"""Tests of the NAC layer (agent/nn/nac.py): shapes, the ODE logits, selectors, causality, masking,
streaming and input validation, each through the fused CPU kernels and through the torch path.
All sizes are tiny so the whole file runs in a few seconds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from agent.nn.nac import (NAC, NACCache, NACIntermediates, select_topk_blocks, select_topk_exact)

MODES = ("steady", "exact", "euler")
SELECTORS = ("exact", "blocks")
D_IN, D_MODEL, HEADS, TOPK = 8, 16, 4, 4


@pytest.fixture(autouse=True, params=["kernels", "torch"])
def _path(request):
    """Every test runs twice: through the fused CPU kernels (agent/nn/nac_kernels.py, the default
    where they apply) and through the layer's torch path."""
    from agent.nn import nac_kernels

    if request.param == "kernels" and not nac_kernels.available():
        pytest.skip("numba is not installed")
    with nac_kernels.use_kernels(request.param == "kernels"):
        yield request.param


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny; one thread avoids OpenMP hand-offs, which cost milliseconds per
    op when the CPU is busy. The previous setting is restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def make(torch_seed: int = 0, **kw) -> NAC:
    """A small NAC; the same (torch_seed, kw) always gives the same weights."""
    cfg = dict(input_dim=D_IN, d_model=D_MODEL, num_heads=HEADS, topk=TOPK, mode="exact", seed=7)
    cfg.update(kw)
    torch.manual_seed(torch_seed)
    return NAC(**cfg)


def clone_weights(src: NAC, **kw) -> NAC:
    """A NAC with another configuration (mode, delta_t, ...) but the weights of ``src``."""
    dst = make(**{**src.config, **kw})
    dst.load_state_dict(src.state_dict())
    return dst


def rand_x(B: int = 2, T: int = 12, seed: int = 1, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(B, T, D_IN, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rand_times(B: int, T: int, seed: int = 2, offset: float = 0.0, dtype=torch.float32) -> torch.Tensor:
    """Increasing, irregular timestamps in seconds (steps of 20-120 ms)."""
    g = torch.Generator().manual_seed(seed)
    dt = 0.02 + 0.1 * torch.rand(B, T, generator=g, dtype=torch.float64)
    return (offset + torch.cumsum(dt, 1)).to(dtype)


# --------------------------------------------------------------------------------------------
# Shapes, dtypes and ranges
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("mode", MODES)
def test_shapes_dtypes_of_output_and_intermediates(mode, selector):
    m = make(mode=mode, selector=selector)
    B, T = 2, 12
    x = rand_x(B, T)
    y, it = m(x, return_intermediates=True)
    assert isinstance(it, NACIntermediates)
    assert y.shape == (B, T, D_MODEL) and y.dtype == torch.float32
    assert torch.isfinite(y).all()
    K = min(TOPK, T)
    for name in ("phi", "omega", "logits", "weights", "t_gate"):
        v = getattr(it, name)
        assert v.shape == (B, HEADS, T, K), name
        assert v.dtype == torch.float32, name
        assert torch.isfinite(v).all(), name
    assert it.indices.shape == (B, HEADS, T, K) and it.indices.dtype == torch.int64
    assert it.valid.shape == (B, HEADS, T, K) and it.valid.dtype == torch.bool
    assert ((it.indices >= 0) & (it.indices < T)).all()

    # neuron groups: sensory (B, T, 3 d_model) and the backbone layers (B, H, T, K, N_group)
    assert set(it.neurons) == {"sensory", "inter", "command", "motor"}
    assert it.neurons["sensory"].shape == (B, T, 3 * D_MODEL)
    sizes = [len(m.wiring.get_neurons_of_layer(i)) for i in range(3)]
    assert sizes[2] == m.config["motor_neurons"]
    for group, n in zip(("inter", "command", "motor"), sizes):
        assert it.neurons[group].shape == (B, HEADS, T, K, n), group
        assert it.neurons[group].dtype == torch.float32
    # the sensory activity is the three sensory gates' outputs, q | k | v
    with torch.no_grad():
        qkv = torch.cat([m.sensory[n](x) for n in ("q", "k", "v")], -1)
    torch.testing.assert_close(it.neurons["sensory"].detach(), qkv)

    # ranges: phi in (0, 1), omega >= eps, t_gate in (0, 1), weights a distribution over valid keys
    assert ((it.phi > 0) & (it.phi < 1)).all()
    assert (it.omega >= m.eps).all()
    assert ((it.t_gate > 0) & (it.t_gate < 1)).all()
    assert (it.weights[~it.valid] == 0).all()
    has_key = it.valid.any(-1)
    torch.testing.assert_close(it.weights.sum(-1)[has_key], torch.ones(int(has_key.sum())))
    # causal: the first query sees only key 0, the last query sees K keys
    assert it.valid[:, :, 0].sum(-1).eq(1).all() and it.valid[:, :, -1].all()


@pytest.mark.parametrize("selector", SELECTORS)
def test_step_intermediates_shapes(selector):
    m = make(selector=selector)
    x = rand_x(2, 6)
    cache = None
    for i in range(6):
        y, cache, it = m.step(x[:, i], cache, return_intermediates=True)
    K = min(TOPK, 6)
    assert y.shape == (2, D_MODEL)
    assert isinstance(cache, NACCache) and cache.length == 6 and cache.times is None
    for name in ("phi", "omega", "logits", "weights", "indices", "t_gate", "valid"):
        assert getattr(it, name).shape == (2, HEADS, 1, K), name
    assert it.neurons["sensory"].shape == (2, 1, 3 * D_MODEL)
    assert it.neurons["motor"].shape[:4] == (2, HEADS, 1, K)


def test_phi_and_omega_depend_on_the_pair():
    """The authors' backbone gives one constant phi and omega for all pairs (std 0); ours must not."""
    for seed in range(3):
        m = make(torch_seed=seed, seed=7 + seed)
        with torch.no_grad():
            _, it = m(rand_x(2, 16, seed=10 + seed), return_intermediates=True)
        v = it.valid
        assert it.phi[v].std() > 1e-3, f"seed {seed}: phi is (nearly) constant over pairs"
        assert it.omega[v].std() > 1e-3, f"seed {seed}: omega is (nearly) constant over pairs"
        # and within one query, across its kept keys
        full = v.all(-1)
        assert (it.phi.std(-1)[full] > 1e-5).float().mean() > 0.9
        assert (it.omega.std(-1)[full] > 1e-5).float().mean() > 0.9


# --------------------------------------------------------------------------------------------
# The ODE logits
# --------------------------------------------------------------------------------------------


def test_steady_mode_is_phi_over_omega():
    m = make(mode="steady")
    with torch.no_grad():
        _, it = m(rand_x(), return_intermediates=True)
    torch.testing.assert_close(it.logits, it.phi / it.omega)


def test_exact_mode_tends_to_steady_as_horizon_grows():
    ref = make(mode="steady")
    x = rand_x()
    with torch.no_grad():
        y_steady = ref(x)
        errors = []
        for dt in (0.25, 1.0, 4.0, 16.0, 1000.0):
            y, it = clone_weights(ref, mode="exact", delta_t=dt)(x, return_intermediates=True)
            errors.append((it.logits - it.phi / it.omega).abs().max().item())
    assert all(a > b for a, b in zip(errors, errors[1:])), errors  # monotone approach
    assert errors[0] > 0.1  # a short horizon is far from steady, so the test can fail
    assert errors[-1] < 1e-5
    torch.testing.assert_close(y, y_steady, atol=1e-5, rtol=1e-5)


def test_exact_mode_small_horizon_is_linear_in_tau():
    """a(tau) = phi tau + O(tau^2) near 0."""
    m = make(mode="exact", delta_t=1e-4)
    with torch.no_grad():
        _, it = m(rand_x(), return_intermediates=True)
    tau = m.delta_t * it.t_gate
    torch.testing.assert_close(it.logits, it.phi * tau, rtol=1e-3, atol=1e-9)


def test_euler_with_many_steps_matches_exact():
    ref = make(mode="exact")
    x = rand_x()
    with torch.no_grad():
        y_exact, it_exact = ref(x, return_intermediates=True)
        y_euler, it_euler = clone_weights(ref, mode="euler", euler_steps=2000)(x, return_intermediates=True)
        _, it_coarse = clone_weights(ref, mode="euler", euler_steps=1)(x, return_intermediates=True)
    torch.testing.assert_close(it_euler.phi, it_exact.phi)  # same weights, same pairs
    err_fine = (it_euler.logits - it_exact.logits).abs().max().item()
    err_coarse = (it_coarse.logits - it_exact.logits).abs().max().item()
    assert err_fine < 1e-3, err_fine
    assert err_coarse > 10 * err_fine  # Euler converges as the step shrinks
    torch.testing.assert_close(y_euler, y_exact, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mode,kw", [("exact", dict(delta_t=1.0)), ("exact", dict(delta_t=50.0)),
                                     ("euler", dict(delta_t=1.0, euler_steps=6)),
                                     ("euler", dict(delta_t=5.0, euler_steps=40))])
def test_logits_within_theorem1_bounds(mode, kw):
    """Paper Theorem 1: 0 <= a(t) <= phi / omega (for Euler when h omega <= 1)."""
    m = make(mode=mode, **kw)
    with torch.no_grad():
        _, it = m(rand_x(2, 16), return_intermediates=True)
    if mode == "euler":
        h = m.delta_t * it.t_gate / m.euler_steps
        assert (h * it.omega <= 1).all(), "precondition of the bound"
    bound = it.phi / it.omega
    assert (it.logits >= 0).all()
    assert (it.logits <= bound * (1 + 1e-6)).all()
    assert (it.logits > 0).any() and (it.logits < bound).any()


@pytest.mark.parametrize("delta_t", [1.0, 0.25])
def test_exact_logits_are_at_most_phi_tau_so_weights_stay_within_exp_delta_t(delta_t):
    """Exact mode: a = phi/omega (1 - exp(-omega tau)) <= phi tau <= delta_t (1 - e^-x <= x), whatever
    omega is; so two kept keys' weights differ by a factor of at most exp(delta_t) (e for the paper's
    delta_t = 1). README, "Why NAC-Exact and NAC-Steady tie on Udacity"."""
    m = make(mode="exact", delta_t=delta_t)
    with torch.no_grad():  # push omega towards its smallest values, where phi/omega alone is large
        m.head_omega.bias.fill_(-8.0)
        _, it = m(rand_x(2, 16), return_intermediates=True)
    tau = delta_t * it.t_gate
    assert (it.phi / it.omega > 10 * delta_t).any()  # the steady logit would be far larger here
    assert (it.logits <= it.phi * tau * (1 + 1e-5) + 1e-7).all()
    assert (it.logits <= delta_t).all()
    ratio = (torch.where(it.valid, it.weights, -torch.inf).amax(-1, keepdim=True)
             / torch.where(it.valid, it.weights, torch.inf).amin(-1, keepdim=True))
    ratio = ratio[it.valid.sum(-1, keepdim=True) >= 2]
    assert ratio.numel() and (ratio <= math.exp(delta_t) * (1 + 1e-5)).all()


# --------------------------------------------------------------------------------------------
# Causality, masking, dense equivalence
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("selector,T,i", [("exact", 12, 5), ("blocks", 12, 5), ("blocks", 100, 45),
                                          ("blocks", 100, 60)])
def test_causal_outputs_ignore_the_future(selector, T, i):
    m = make(selector=selector)
    x = rand_x(2, T)
    t = rand_times(2, T)
    x2, t2 = x.clone(), t.clone()
    x2[:, i + 1:] = 5 * torch.randn(2, T - i - 1, D_IN)
    t2[:, i + 1:] += 3.0
    with torch.no_grad():
        y, y2 = m(x, t), m(x2, t2)
    torch.testing.assert_close(y2[:, :i + 1], y[:, :i + 1], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(y2[:, i + 1:], y[:, i + 1:], atol=1e-3)  # the future did change


@pytest.mark.parametrize("selector", SELECTORS)
def test_masked_keys_get_zero_weight(selector):
    m = make(selector=selector)
    B, T = 2, 12
    x = rand_x(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, [0, 3, 4, 8]] = False
    mask[1, [6, 11]] = False
    with torch.no_grad():
        y, it = m(x, mask=mask, return_intermediates=True)
        x2 = x.clone()
        x2[~mask] = 10 * torch.randn(int((~mask).sum()), D_IN)
        y2 = m(x2, mask=mask)
    key_ok = mask[:, None, None, :].expand(B, HEADS, T, T).gather(-1, it.indices)  # (B, H, T, K)
    assert (it.weights[~key_ok] == 0).all()
    assert not (it.valid & ~key_ok).any()
    assert (it.valid & key_ok).any()
    # the query at position 0 of batch 0 has no allowed key at all: zero weights, finite output
    assert it.weights[0, :, 0].eq(0).all() and torch.isfinite(y).all()
    # changing the masked positions' inputs does not move the outputs at unmasked positions
    torch.testing.assert_close(y2[mask], y[mask], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(y2[~mask], y[~mask], atol=1e-3)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_t", [False, True])
def test_exact_selector_with_large_k_is_dense_attention(mode, with_t):
    """With K >= T, exact top-k attention is the softmax over all causally allowed keys."""
    B, T = 2, 10
    m = make(mode=mode, topk=T + 3).double()
    x = rand_x(B, T, dtype=torch.float64)
    t = rand_times(B, T, dtype=torch.float64) if with_t else None
    with torch.no_grad():
        y = m(x, t)
        # dense recomputation from the layer's own pieces, all T x T pairs
        q, k, v = m.project(x)  # (B, H, T, d)
        d = m.head_dim
        u = torch.cat([q[:, :, :, None].expand(B, HEADS, T, T, d), k[:, :, None].expand(B, HEADS, T, T, d)], -1)
        motor = torch.tanh(m.to_motor(torch.tanh(m.to_command(torch.tanh(m.to_inter(u))))))
        phi = torch.sigmoid(m.head_phi(motor)).squeeze(-1)
        omega = F.softplus(m.head_omega(motor)).squeeze(-1) + m.eps
        alpha, beta = m.time_affine(u).unbind(-1)
        age = (t[:, :, None] - t[:, None, :])[:, None] if with_t else torch.ones_like(phi)
        t_gate = torch.sigmoid(alpha * age + beta)
        logits = m.solve_logits(phi, omega, m.delta_t * t_gate)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        w = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1)
        o = torch.einsum("bhqk,bhkd->bhqd", w * t_gate, v)
        y_dense = m.out(o.transpose(1, 2).reshape(B, T, D_MODEL))
    torch.testing.assert_close(y, y_dense, atol=1e-10, rtol=1e-8)


# --------------------------------------------------------------------------------------------
# The blocks selector
# --------------------------------------------------------------------------------------------


def _check_indices(idx, valid, qpos, T, K, causal):
    B, H, Tq, _ = idx.shape
    assert idx.shape == (B, H, Tq, K) and idx.dtype == torch.int64 and valid.dtype == torch.bool
    assert ((idx >= 0) & (idx < T)).all()
    if causal:
        assert (idx <= qpos.view(1, 1, Tq, 1))[valid].all(), "a valid key lies in the future"
    # distinct valid keys per query
    big = torch.where(valid, idx, -1 - torch.arange(K).view(1, 1, 1, K))  # invalid slots get unique fillers
    srt = big.sort(-1).values
    assert (srt[..., 1:] != srt[..., :-1]).all(), "a key is kept twice for one query"
    # as many keys as the query is allowed to see, up to K
    n_allowed = (qpos + 1).clamp(max=K) if causal else torch.full((Tq,), min(K, T))
    assert torch.equal(valid.sum(-1), n_allowed.view(1, 1, Tq).expand(B, H, Tq))


@pytest.mark.parametrize("T", [100, 1000])
@pytest.mark.parametrize("causal", [True, False])
def test_blocks_selector_indices_valid_distinct_causal(T, causal):
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(1, 2, T, 8, generator=g), torch.randn(1, 2, T, 8, generator=g)
    qpos = torch.arange(T)
    K = 8
    idx, valid = select_topk_blocks(q, k, K, qpos, causal=causal)
    _check_indices(idx, valid, qpos, T, K, causal)
    ie, ve = select_topk_exact(q, k, K, qpos, causal=causal)
    _check_indices(ie, ve, qpos, T, K, causal)


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_selector_with_all_blocks_equals_exact(causal):
    T, K = 100, 8
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(2, 2, T, 8, generator=g), torch.randn(2, 2, T, 8, generator=g)
    qpos = torch.arange(T)
    key_mask = torch.rand(2, T, generator=g) > 0.2
    ib, vb = select_topk_blocks(q, k, K, qpos, key_mask, causal, block_size=10, n_blocks=10)
    ie, ve = select_topk_exact(q, k, K, qpos, key_mask, causal)
    assert torch.equal(vb.sum(-1), ve.sum(-1))
    big = T + 1
    assert torch.equal(torch.where(vb, ib, big).sort(-1).values, torch.where(ve, ie, big).sort(-1).values)


@pytest.mark.parametrize("causal", [True, False])
def test_blocks_selector_recall_on_block_structured_keys(causal):
    """Keys that are similar within a block (like consecutive frames): centroid routing finds
    most of the exact top-k. Deterministic data, margins well below the measured recall
    (about 0.93 causal, 0.98 non-causal)."""
    T, d, bs, K = 400, 16, 20, 8
    g = torch.Generator().manual_seed(0)
    centers = 2 * torch.randn(1, 2, T // bs, d, generator=g)
    k = centers.repeat_interleave(bs, 2) + 0.3 * torch.randn(1, 2, T, d, generator=g)
    q = torch.randn(1, 2, T, d, generator=g)
    qpos = torch.arange(T)
    ie, ve = select_topk_exact(q, k, K, qpos, causal=causal)
    ib, vb = select_topk_blocks(q, k, K, qpos, causal=causal)
    assert bs == math.ceil(math.sqrt(T))  # the default block size
    hit = ((ie[..., :, None] == ib[..., None, :]) & ve[..., :, None] & vb[..., None, :]).any(-1) & ve
    recall = hit.sum(-1).float() / ve.sum(-1).float()  # (1, 2, T)
    assert recall.mean() > 0.85, recall.mean()
    assert (recall >= 0.75).float().mean() > 0.8


# --------------------------------------------------------------------------------------------
# Gradients
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("mode", MODES)
def test_gradients_are_finite(mode, selector):
    m = make(mode=mode, selector=selector)
    x = rand_x(2, 10).requires_grad_(True)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 2] = False
    y = m(x, rand_times(2, 10), mask)
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    assert m.head_phi.weight.grad.abs().sum() > 0 and m.head_omega.weight.grad.abs().sum() > 0
    assert m.time_affine.weight.grad.abs().sum() > 0


# --------------------------------------------------------------------------------------------
# Streaming
# --------------------------------------------------------------------------------------------


def _stream(m, x, t=None, window=None):
    ys, cache = [], None
    for i in range(x.shape[1]):
        y, cache = m.step(x[:, i], cache, None if t is None else t[:, i], window)
        ys.append(y)
        assert cache.length == (i + 1 if window is None else min(i + 1, window))
    return torch.stack(ys, 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_t", [False, True])
def test_streaming_unlimited_window_equals_forward(mode, with_t):
    m = make(mode=mode)
    B, T = 2, 14
    x = rand_x(B, T)
    t = rand_times(B, T) if with_t else None
    with torch.no_grad():
        y_full = m(x, t)
        y_stream = _stream(m, x, t)
    assert torch.allclose(y_stream, y_full, atol=1e-5), (y_stream - y_full).abs().max()


@pytest.mark.parametrize("selector", SELECTORS)
@pytest.mark.parametrize("with_t", [False, True])
def test_streaming_window_equals_forward_on_each_window(selector, with_t):
    m = make(selector=selector, mode="exact")
    B, T, W = 2, 20, 9
    x = rand_x(B, T)
    t = rand_times(B, T) if with_t else None
    with torch.no_grad():
        y_stream = _stream(m, x, t, window=W)
        for i in range(T):
            s = max(0, i - W + 1)
            y_win = m(x[:, s:i + 1], None if t is None else t[:, s:i + 1])[:, -1]
            assert torch.allclose(y_stream[:, i], y_win, atol=1e-5), (i, (y_stream[:, i] - y_win).abs().max())
        # the window matters: past position W the windowed stream differs from full attention
        y_full = m(x, t)
    assert not torch.allclose(y_stream[:, W:], y_full[:, W:], atol=1e-4)


def test_timestamps_only_matter_through_differences():
    """Shifting every timestamp by a constant (e.g. absolute clock times) leaves outputs unchanged."""
    m = make()
    B, T = 2, 12
    x = rand_x(B, T)
    t = rand_times(B, T, dtype=torch.float64)
    t_abs = t + 1.7e9  # seconds since the epoch, float64
    with torch.no_grad():
        y, y_abs = m(x, t), m(x, t_abs)
        y_stream = _stream(m, x, t_abs, window=6)
        y_last = m(x[:, -6:], t[:, -6:])[:, -1]
        y_notime = m(x)
    torch.testing.assert_close(y_abs, y, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(y_stream[:, -1], y_last, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(y, y_notime, atol=1e-4)  # the timestamps do matter


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    (dict(mode="rk4"), "mode must be one of"),
    (dict(selector="lsh"), "selector must be one of"),
    (dict(d_model=18, num_heads=4), "divisible by num_heads"),
    (dict(sparsity=1.0), "sparsity"),
    (dict(topk=0), "topk"),
])
def test_bad_constructor_arguments_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        make(**kw)


def test_bad_forward_inputs_raise():
    m = make()
    with pytest.raises(ValueError, match=r"x must be \(B, T, 8\)"):
        m(torch.randn(12, D_IN))
    with pytest.raises(ValueError, match=r"x must be \(B, T, 8\)"):
        m(torch.randn(2, 12, D_IN + 1))
    with pytest.raises(ValueError, match=r"t must be \(B, T\)"):
        m(rand_x(2, 12), t=torch.zeros(2, 11))
    with pytest.raises(ValueError, match=r"t must be \(B, T\)"):
        m(rand_x(2, 12), t=torch.zeros(12))
    with pytest.raises(ValueError, match=r"mask must be \(B, T\)"):
        m(rand_x(2, 12), mask=torch.ones(2, 12, 1, dtype=torch.bool))


def test_bad_step_inputs_raise():
    m = make()
    with pytest.raises(ValueError, match=r"x must be \(B, 8\)"):
        m.step(torch.randn(2, 3, D_IN))
    with pytest.raises(ValueError, match=r"x must be \(B, 8\)"):
        m.step(torch.randn(2, D_IN + 2))
    with pytest.raises(ValueError, match=r"t must be \(B,\)"):
        m.step(torch.randn(2, D_IN), t=torch.zeros(2, 2))
    _, cache = m.step(torch.randn(2, D_IN), t=torch.zeros(2))
    with pytest.raises(ValueError, match="timestamps on every streaming step"):
        m.step(torch.randn(2, D_IN), cache)
    with pytest.raises(ValueError, match="causal"):
        make(causal=False).step(torch.randn(2, D_IN))


# --------------------------------------------------------------------------------------------
# The fast paths: they compute the same function as the plain formulation
# --------------------------------------------------------------------------------------------


def test_fast_tanh_matches_torch_tanh_and_its_gradient():
    from agent.nn.nac import FAST_TANH_MIN_NUMEL, fast_tanh

    x = torch.linspace(-12, 12, FAST_TANH_MIN_NUMEL + 1, dtype=torch.float64, requires_grad=True)
    y = fast_tanh(x)
    torch.testing.assert_close(y, torch.tanh(x), atol=1e-14, rtol=0)
    (g,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(g, 1 - torch.tanh(x.detach()) ** 2, atol=1e-13, rtol=0)
    x32 = x.detach().float()
    assert (fast_tanh(x32) - torch.tanh(x32)).abs().max() < 1e-6


@pytest.mark.parametrize("with_mask", [False, True])
def test_exact_selector_query_chunks_do_not_change_the_selection(with_mask):
    g = torch.Generator().manual_seed(3)
    B, H, T, d, K = 2, 3, 90, 8, 5
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H, T, d, generator=g)
    key_mask = (torch.rand(B, T, generator=g) > 0.3) if with_mask else None
    qpos = torch.arange(T)
    i_all, v_all = select_topk_exact(q, k, K, qpos, key_mask, causal=True, query_chunk=T)
    i_ch, v_ch = select_topk_exact(q, k, K, qpos, key_mask, causal=True, query_chunk=7)
    assert torch.equal(v_all, v_ch)
    assert torch.equal(i_all[v_all], i_ch[v_ch])
    # each query keeps min(K, its allowed keys) valid slots
    allowed = torch.ones(B, T, dtype=torch.bool) if key_mask is None else key_mask
    n_allowed = (allowed.cumsum(1).clamp(max=K))[:, None, :].expand(B, H, T)
    assert torch.equal(v_ch.sum(-1), n_allowed)


@pytest.mark.parametrize("selector", SELECTORS)
def test_attend_query_chunks_give_the_same_output(selector, monkeypatch):
    import agent.nn.nac as nac_module

    m = make(selector=selector).double().eval()
    x, t = rand_x(2, 40, dtype=torch.float64), rand_times(2, 40, dtype=torch.float64)
    with torch.no_grad():
        y_whole = m(x, t)
        monkeypatch.setattr(nac_module, "ATTEND_QUERY_CHUNK", 9)
        y_chunks = m(x, t)
    torch.testing.assert_close(y_chunks, y_whole, atol=1e-12, rtol=0)


def test_kept_inference_weights_follow_loaded_and_trained_weights():
    """Fused/masked weights are kept between no-grad calls in eval mode; loading other weights,
    switching to training and back, or changing dtype must never leave stale ones in use."""
    m, other = make(torch_seed=0).eval(), make(torch_seed=1).eval()
    x = rand_x()
    with torch.no_grad():
        y0, y_other = m(x), other(x)
        m.load_state_dict(other.state_dict())
        torch.testing.assert_close(m(x), y_other)  # not y0
        m.train()
        opt = torch.optim.SGD(m.parameters(), lr=0.5)
    with torch.enable_grad():
        m(x).pow(2).sum().backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        y_trained = m(x)
        assert not torch.allclose(y_trained, y_other)
        # what a fresh layer with these weights computes
        fresh = make(torch_seed=5).eval()
        fresh.load_state_dict(m.state_dict())
        torch.testing.assert_close(y_trained, fresh(x))
        torch.testing.assert_close(m.double()(x.double()), fresh.double()(x.double()))
    assert not torch.allclose(y0, y_other)
