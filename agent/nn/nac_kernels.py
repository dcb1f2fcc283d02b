"""Fused CPU kernels of the NAC layer's attention (steps 3-8 of :mod:`agent.nn.nac`), compiled by Numba.

Why: on the CPU, the layer's per-pair work is small (at T=1024, B=1 about 25 M multiply-adds) but
spread over about 60 torch operations, each of which reads and writes a (B, H, T, K, N) tensor
and pays the dispatcher's per-op cost. Issue 12 measured the layer at 5.5x torch's fused
``MultiheadAttention`` at T=16 and 4.2x in forward + backward (B=8, T=256). These kernels do the
whole pair computation of one query in registers, so each pair's inter, command and motor
activity never becomes a tensor:

- :func:`masked_topk`: the exact selector's ranking step. Given the scores q . k (computed by
  torch's matrix product, which is faster than any loop here), keep the K best allowed keys of
  every query (causal and key-mask rules as :func:`agent.nn.nac.select_topk_exact`).
- :class:`PairAttention`: given the selected keys, the first backbone layer's query and key halves
  (see :meth:`agent.nn.nac.NAC._pair_weights`) and the values, compute for every kept pair
  inter -> command -> motor -> (phi, omega), the time gate, the ODE logit (steady / exact /
  Euler, paper Eqs. 1-3), the softmax over the kept keys and the weighted sum of values. Its
  backward recomputes each query's pairs (nothing per pair is stored between forward and
  backward) and returns the gradients of every input that has one. The selection itself has no
  gradient, as in the torch path.

Both compute the same function as the torch path in :mod:`agent.nn.nac` (the tests compare
outputs and gradients in float32 and float64, for every mode, selector, mask and timestamp case);
float32 results differ by rounding only (the kernels accumulate in float64 where the torch path
stays in float32).

When they run: on CPU tensors of float32 or float64, when Numba is importable, and unless the
environment variable ``NAC_DRIVE_KERNELS=torch`` (or :func:`use_kernels`) turns them off.
Elsewhere (CUDA, half precision, intermediates for the runner's traces) the layer uses its torch
path. The kernels run on the calling thread (no thread pool of their own; ``nogil``). The first
call compiles them (a few seconds); Numba caches the machine code on disk (``cache=True``: in
``__pycache__`` beside this file, or Numba's user cache folder when that is read-only).

Notation as in :mod:`agent.nn.nac`: B batch, H heads, Tq queries, Tk keys, K kept keys per query,
d head width, F = N_inter + 2 (inter pre-activations, then the time gate's alpha and beta),
N_c command and N_m motor neurons.
"""

from __future__ import annotations

import contextlib
import math
import os

import numpy as np
import torch
from torch import Tensor

try:  # Numba is a dependency; without it (or on a platform it lacks) the layer keeps its torch path
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None

#: ODE modes, as the kernels number them
MODE_IDS = {"steady": 0, "exact": 1, "euler": 2}
_ENABLED = os.environ.get("NAC_DRIVE_KERNELS", "numba").strip().lower() not in ("torch", "0", "off", "no")


def available() -> bool:
    """Whether the kernels are importable and switched on (see :func:`use_kernels`)."""
    return numba is not None and _ENABLED


@contextlib.contextmanager
def use_kernels(enabled: bool):
    """Within this block, the NAC layer uses the kernels (``True``, where they apply) or its torch
    path (``False``). The previous setting is restored afterwards. Not thread-safe: it sets a
    module-wide switch (benchmarks and tests use it to compare the two paths)."""
    global _ENABLED
    before = _ENABLED
    _ENABLED = bool(enabled)
    try:
        yield
    finally:
        _ENABLED = before


def applies(*tensors: Tensor) -> bool:
    """Whether the kernels can take these tensors: all on the CPU, float32 or float64 alike."""
    if not available():
        return False
    dtype = tensors[0].dtype
    return dtype in (torch.float32, torch.float64) and all(
        t.device.type == "cpu" and t.dtype == dtype for t in tensors)


def _np(t: Tensor) -> np.ndarray:
    """A contiguous NumPy view of a CPU tensor (no copy when it is contiguous already)."""
    return t.detach().contiguous().numpy()


# --------------------------------------------------------------------------------------------
# The kernels (plain Python when Numba is missing, so the module still imports)
# --------------------------------------------------------------------------------------------

#: LLVM fast-math flags the kernels may use: contraction into fused multiply-adds and reassociation
#: of sums (so the loops over pairs vectorise), but not "no NaNs / no infinities" (the softmax
#: uses -inf, and NaN inputs must stay visible)
_FASTMATH = {"contract", "reassoc", "nsz", "arcp"}


def _jit(fn):
    if numba is None:  # pragma: no cover
        return fn
    return numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)(fn)


@_jit
def _masked_topk_kernel(scores, qpos, key_mask, has_mask, causal, K, idx, valid):  # pragma: no cover - compiled
    """scores (B, H, Tq, Tk); qpos (Tq,) int64; key_mask (B, Tk) bool (read when has_mask);
    writes idx (B, H, Tq, K) int64 and valid (B, H, Tq, K) bool: the K highest allowed scores of
    each row, highest first (the earlier key wins a tie); slots beyond the allowed keys get key 0
    and valid False."""
    B, H, Tq, Tk = scores.shape
    vals = np.empty(K, dtype=np.float64)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                end = Tk
                if causal:
                    end = min(Tk, qpos[i] + 1)
                n = 0
                for j in range(end):
                    if has_mask and not key_mask[b, j]:
                        continue
                    s = scores[b, h, i, j]
                    if s != s:  # NaN never ranks
                        continue
                    if n == K and s <= vals[K - 1]:
                        continue
                    # insert s keeping vals sorted in decreasing order
                    pos = n if n < K else K - 1
                    while pos > 0 and vals[pos - 1] < s:
                        if pos < K:
                            vals[pos] = vals[pos - 1]
                            idx[b, h, i, pos] = idx[b, h, i, pos - 1]
                        pos -= 1
                    vals[pos] = s
                    idx[b, h, i, pos] = j
                    if n < K:
                        n += 1
                for s_ in range(K):
                    valid[b, h, i, s_] = s_ < n
                    if s_ >= n:
                        idx[b, h, i, s_] = 0


def _tanh(x):
    """tanh of a scalar inside the kernels: Eigen's rational approximation for float32 (maximum
    error 2.2e-7, measured against ``math.tanh`` over [-12, 12]; pure arithmetic, so the compiler
    vectorises the loops over pairs), ``math.tanh`` for float64 (exact to the last bit or so)."""
    return math.tanh(x)


#: Eigen's fast float tanh (Eigen/src/Core/MathFunctionsImpl.h, generic_fast_tanh_float): inputs
#: clamped to +-TANH_CLAMP, then an odd degree-13 over even degree-6 rational function
TANH_CLAMP = 7.99881172180175781
TANH_NUM = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
            1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)  # x^13 ... x^1
TANH_DEN = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)  # x^6 ... x^0


def tanh_float32_approx(x):
    """The float32 tanh of the kernels (see :func:`_tanh`); also usable on NumPy arrays (tests)."""
    c = TANH_CLAMP
    x = min(max(x, -c), c) if np.isscalar(x) else np.clip(x, -c, c)
    x2 = x * x
    p = TANH_NUM[0]
    for a in TANH_NUM[1:]:
        p = p * x2 + a
    q = TANH_DEN[0]
    for a in TANH_DEN[1:]:
        q = q * x2 + a
    return x * p / q


if numba is not None:
    from numba import types as _types
    from numba.extending import overload as _overload

    _n0, _n1, _n2, _n3, _n4, _n5, _n6 = TANH_NUM
    _d0, _d1, _d2, _d3 = TANH_DEN

    @_overload(_tanh, jit_options=dict(cache=True, error_model="numpy", fastmath=_FASTMATH))
    def _tanh_overload(x):  # pragma: no cover - compiled
        if isinstance(x, _types.Float) and x.bitwidth == 32:
            def fast(x):
                y = min(max(x, -TANH_CLAMP), TANH_CLAMP)
                y2 = y * y
                p = (((((_n0 * y2 + _n1) * y2 + _n2) * y2 + _n3) * y2 + _n4) * y2 + _n5) * y2 + _n6
                q = ((_d0 * y2 + _d1) * y2 + _d2) * y2 + _d3
                return y * p / q
            return fast
        return lambda x: math.tanh(x)


@_jit
def _sigmoid(x):  # pragma: no cover - compiled
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@_jit
def _softplus(x):  # pragma: no cover - compiled
    # torch.nn.functional.softplus with beta 1, threshold 20
    if x > 20.0:
        return x
    return math.log1p(math.exp(x))


@_jit
def _dense_tanh(x, W, bias, y):  # pragma: no cover - compiled
    """y (N_out, K) = tanh(bias + W^T x) for x (N_in, K): one sparse layer for the K pairs of a
    query at once (pairs innermost, so the loops vectorise; masked-out weights are skipped)."""
    n_in, n_out = W.shape
    K = x.shape[1]
    for c in range(n_out):
        bc = bias[c]
        for s in range(K):
            y[c, s] = bc
        for n in range(n_in):
            w = W[n, c]
            if w != 0:
                for s in range(K):
                    y[c, s] += w * x[n, s]
        for s in range(K):
            y[c, s] = _tanh(y[c, s])


@_jit
def _dense_backward(x, W, g, dW, db, dx):  # pragma: no cover - compiled
    """Backward of y = tanh(bias + W^T x) for the K pairs of a query, where x (N_in, K) is itself a
    tanh output: given g (N_out, K), the gradient at y's pre-activation, accumulate
    dW += x g^T and db += sum over pairs of g, and write dx (N_in, K), the gradient at x's
    pre-activation: (W g) * (1 - x^2)."""
    n_in, n_out = W.shape
    K = x.shape[1]
    for c in range(n_out):
        acc = 0.0
        for s in range(K):
            acc += g[c, s]
        db[c] += acc
    for n in range(n_in):
        for s in range(K):
            dx[n, s] = 0.0
        for c in range(n_out):
            acc = 0.0
            for s in range(K):
                acc += x[n, s] * g[c, s]
            dW[n, c] += acc
            w = W[n, c]
            if w != 0:
                for s in range(K):
                    dx[n, s] += w * g[c, s]
        for s in range(K):
            xs = x[n, s]
            dx[n, s] *= 1.0 - xs * xs


@_jit
def _pairs(b, h, i, q_half, k_half, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
           mode, delta_t, eps, n_euler, cast, kh, inter, command, motor, phi, omega, aom, tg, age, logit):  # pragma: no cover
    """One query's K kept pairs, forward: fills inter (N_i, K), command (N_c, K), motor (N_m, K) and
    phi, omega, a_omega, t_gate, age, logit (K,). Invalid slots are computed too (on key 0) and
    left to the caller to ignore."""
    K = idx.shape[3]
    Ni = Wc.shape[0]
    Nm = Wm.shape[1]
    F = kh.shape[0]
    for s in range(K):  # gather the key halves, pairs innermost
        j = idx[b, h, i, s]
        for n in range(F):
            kh[n, s] = k_half[b, h, j, n]
    for n in range(Ni):  # inter = tanh(q half + k half)
        qn = q_half[b, h, i, n]
        for s in range(K):
            inter[n, s] = _tanh(qn + kh[n, s])
    _dense_tanh(inter, Wc, bc, command)
    _dense_tanh(command, Wm, bm, motor)
    for s in range(K):
        a_phi = bh[0]
        a_om = bh[1]
        for m in range(Nm):
            a_phi += motor[m, s] * Wh[m, 0]
            a_om += motor[m, s] * Wh[m, 1]
        p = _sigmoid(a_phi)
        w = _softplus(a_om) + eps
        if has_t:
            # the key's age in the timestamps' own dtype, then cast to the compute dtype (as torch)
            cast[0] = q_times[b, i] - k_times[b, idx[b, h, i, s]]
            a = cast[0]
        else:
            a = 1.0
        alpha = q_half[b, h, i, Ni] + kh[Ni, s]
        beta = q_half[b, h, i, Ni + 1] + kh[Ni + 1, s]
        t = _sigmoid(alpha * a + beta)
        tau = delta_t * t
        if mode == 0:
            lg = p / w
        elif mode == 1:
            lg = p / w * -math.expm1(-w * tau)
        else:
            hstep = tau / n_euler
            lg = 0.0
            for _ in range(n_euler):
                lg = lg + hstep * (p - w * lg)
        phi[s] = p
        omega[s] = w
        aom[s] = a_om
        tg[s] = t
        age[s] = a
        logit[s] = lg


@_jit
def _softmax_valid(b, h, i, valid, logit, weight):  # pragma: no cover - compiled
    """Softmax of logit over the valid slots into weight (0 elsewhere, all 0 when none is valid);
    returns how many slots are valid."""
    K = valid.shape[3]
    mx = -np.inf
    n = 0
    for s in range(K):
        if valid[b, h, i, s]:
            n += 1
            if logit[s] > mx:
                mx = logit[s]
    tot = 0.0
    for s in range(K):
        if valid[b, h, i, s]:
            e = math.exp(logit[s] - mx)
            weight[s] = e
            tot += e
        else:
            weight[s] = 0.0
    for s in range(K):
        weight[s] = weight[s] / tot if tot > 0 else 0.0
    return n


@_jit
def _scratch(dtype_like, K, F, Ni, Nc, Nm):  # pragma: no cover - compiled
    dt = dtype_like.dtype
    return (np.empty((F, K), dt), np.empty((Ni, K), dt), np.empty((Nc, K), dt), np.empty((Nm, K), dt))


@_jit
def _forward_kernel(q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                    mode, delta_t, eps, n_euler, out):  # pragma: no cover - compiled
    """out (B, Tq, H, d) = sum over kept keys of softmax(logit) * t_gate * v_j, per head."""
    B, H, Tq, F = q_half.shape
    K = idx.shape[3]
    d = v.shape[3]
    Ni, Nc = Wc.shape
    Nm = Wm.shape[1]
    kh, inter, command, motor = _scratch(q_half, K, F, Ni, Nc, Nm)
    phi, omega, aom = np.empty(K), np.empty(K), np.empty(K)
    tg, age, logit, weight = np.empty(K), np.empty(K), np.empty(K), np.empty(K)
    cast = np.empty(1, dtype=q_half.dtype)
    acc = np.empty(d)
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                _pairs(b, h, i, q_half, k_half, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                       mode, delta_t, eps, n_euler, cast, kh, inter, command, motor, phi, omega, aom, tg, age, logit)
                _softmax_valid(b, h, i, valid, logit, weight)
                acc[:] = 0.0
                for s in range(K):
                    if weight[s] != 0.0:
                        g = weight[s] * tg[s]
                        j = idx[b, h, i, s]
                        for e in range(d):
                            acc[e] += g * v[b, h, j, e]
                for e in range(d):
                    out[b, i, h, e] = acc[e]


@_jit
def _backward_kernel(grad_out, q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                     mode, delta_t, eps, n_euler,
                     d_q_half, d_k_half, d_v, dWc, dbc, dWm, dbm, dWh, dbh):  # pragma: no cover - compiled
    """Gradients of sum(grad_out * out) with respect to q_half, k_half, v and the backbone's weights
    (accumulated into the zeroed d_* arrays; float64 accumulators for the weights). Each query's
    pairs are recomputed (nothing per pair is kept from the forward)."""
    B, H, Tq, F = q_half.shape
    K = idx.shape[3]
    d = v.shape[3]
    Ni, Nc = Wc.shape
    Nm = Wm.shape[1]
    kh, inter, command, motor = _scratch(q_half, K, F, Ni, Nc, Nm)
    d_pre, d_pc, d_pm, _ = _scratch(q_half, K, Ni, Nc, Nm, 1)
    phi, omega, aom = np.empty(K), np.empty(K), np.empty(K)
    tg, age, logit, weight = np.empty(K), np.empty(K), np.empty(K), np.empty(K)
    d_w, d_tg = np.empty(K), np.empty(K)
    d_aphi, d_aom, d_alpha, d_beta = np.empty(K), np.empty(K), np.empty(K), np.empty(K)
    cast = np.empty(1, dtype=q_half.dtype)
    euler_a = np.empty(max(n_euler, 1))
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                _pairs(b, h, i, q_half, k_half, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times,
                       has_t, mode, delta_t, eps, n_euler, cast, kh, inter, command, motor, phi, omega, aom,
                       tg, age, logit)
                if _softmax_valid(b, h, i, valid, logit, weight) == 0:
                    continue
                # o_i = sum_s w_s tg_s v_j: gradients of w_s, tg_s and v_j
                wdw = 0.0
                for s in range(K):
                    d_w[s] = 0.0
                    d_tg[s] = 0.0
                    if not valid[b, h, i, s]:
                        continue
                    j = idx[b, h, i, s]
                    dg = 0.0
                    g = weight[s] * tg[s]
                    for e in range(d):
                        go = grad_out[b, i, h, e]
                        dg += go * v[b, h, j, e]
                        d_v[b, h, j, e] += g * go
                    d_w[s] = dg * tg[s]
                    d_tg[s] = dg * weight[s]
                    wdw += weight[s] * d_w[s]
                for s in range(K):
                    if not valid[b, h, i, s]:
                        d_aphi[s] = 0.0
                        d_aom[s] = 0.0
                        d_alpha[s] = 0.0
                        d_beta[s] = 0.0
                        continue
                    dl = weight[s] * (d_w[s] - wdw)  # softmax backward
                    p, w, t = phi[s], omega[s], tg[s]
                    tau = delta_t * t
                    # the ODE logit's backward: d phi, d omega, d tau
                    if mode == 0:
                        dp = dl / w
                        dom = -dl * p / (w * w)
                        dtau = 0.0
                    elif mode == 1:
                        ex = math.exp(-w * tau)
                        one_m = -math.expm1(-w * tau)
                        dp = dl * one_m / w
                        dom = dl * (-p / (w * w) * one_m + p / w * tau * ex)
                        dtau = dl * p * ex
                    else:
                        hstep = tau / n_euler
                        a = 0.0
                        for n in range(n_euler):
                            euler_a[n] = a
                            a = a + hstep * (p - w * a)
                        da = dl
                        dp = 0.0
                        dom = 0.0
                        dhs = 0.0
                        for n in range(n_euler - 1, -1, -1):
                            a = euler_a[n]
                            dp += da * hstep
                            dom -= da * hstep * a
                            dhs += da * (p - w * a)
                            da = da * (1.0 - hstep * w)
                        dtau = dhs / n_euler
                    d_pre_t = (d_tg[s] + dtau * delta_t) * t * (1.0 - t)  # the time gate's sigmoid
                    d_alpha[s] = d_pre_t * age[s]
                    d_beta[s] = d_pre_t
                    d_aphi[s] = dp * p * (1.0 - p)
                    d_aom[s] = dom * _sigmoid(aom[s])  # softplus' derivative
                    dbh[0] += d_aphi[s]
                    dbh[1] += d_aom[s]
                # motor <- the phi and omega heads
                for m in range(Nm):
                    wh0 = Wh[m, 0]
                    wh1 = Wh[m, 1]
                    a0 = 0.0
                    a1 = 0.0
                    for s in range(K):
                        mo = motor[m, s]
                        a0 += mo * d_aphi[s]
                        a1 += mo * d_aom[s]
                        d_pm[m, s] = (d_aphi[s] * wh0 + d_aom[s] * wh1) * (1.0 - mo * mo)
                    dWh[m, 0] += a0
                    dWh[m, 1] += a1
                _dense_backward(command, Wm, d_pm, dWm, dbm, d_pc)
                _dense_backward(inter, Wc, d_pc, dWc, dbc, d_pre)
                for n in range(Ni):
                    acc = 0.0
                    for s in range(K):
                        acc += d_pre[n, s]
                    d_q_half[b, h, i, n] += acc
                for s in range(K):
                    if valid[b, h, i, s]:
                        j = idx[b, h, i, s]
                        for n in range(Ni):
                            d_k_half[b, h, j, n] += d_pre[n, s]
                        d_k_half[b, h, j, Ni] += d_alpha[s]
                        d_k_half[b, h, j, Ni + 1] += d_beta[s]
                        d_q_half[b, h, i, Ni] += d_alpha[s]
                        d_q_half[b, h, i, Ni + 1] += d_beta[s]


# --------------------------------------------------------------------------------------------
# Torch-facing functions
# --------------------------------------------------------------------------------------------


def masked_topk(scores: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None, causal: bool) -> tuple[Tensor, Tensor]:
    """The K highest allowed scores' key positions per query (the exact selector's ranking).

    Args:
        scores: (B, H, Tq, Tk) float32/float64 on the CPU (any ranking-preserving scale).
        K: keys kept per query, at most Tk.
        qpos: (Tq,) int64, each query's key position (keys after it are not allowed when causal).
        key_mask: (B, Tk) bool, True = a key that may be attended, or None (all may).
        causal: whether keys after qpos are excluded.

    Returns:
        indices (B, H, Tq, K) int64 (highest score first; invalid slots hold 0) and valid
        (B, H, Tq, K) bool (False where fewer than K keys are allowed). The same set of keys as
        ``torch.topk`` on the masked scores, with ties broken towards the earlier key.
    """
    B, H, Tq, _ = scores.shape
    idx = np.empty((B, H, Tq, K), dtype=np.int64)
    valid = np.empty((B, H, Tq, K), dtype=np.bool_)
    mask = _np(key_mask.to(torch.bool)) if key_mask is not None else np.ones((1, 1), dtype=np.bool_)
    _masked_topk_kernel(_np(scores), _np(qpos.to(torch.int64)), mask, key_mask is not None, bool(causal), int(K),
                        idx, valid)
    return torch.from_numpy(idx), torch.from_numpy(valid)


def _times(q_times: Tensor | None, k_times: Tensor | None) -> tuple[np.ndarray, np.ndarray, bool]:
    if q_times is None or k_times is None:
        dummy = np.zeros((1, 1), dtype=np.float64)
        return dummy, dummy, False
    # both in the same dtype (float64 clock times keep their precision: the difference comes first)
    dtype = torch.promote_types(q_times.dtype, k_times.dtype)
    return _np(q_times.to(dtype)), _np(k_times.to(dtype)), True


class PairAttention(torch.autograd.Function):
    """Steps 4-8 of the NAC layer for the selected pairs, forward and backward in fused kernels.

    ``PairAttention.apply(q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times,
    mode, delta_t, eps, euler_steps)``

    Args:
        q_half: (B, H, Tq, F), the query half of the first backbone layer and of the time affine,
            bias included (``q @ Wq + b``; see :meth:`agent.nn.nac.NAC._pair_weights`).
        k_half: (B, H, Tk, F), the key half (``k @ Wk``).
        v: (B, H, Tk, d) values.
        idx, valid: (B, H, Tq, K) the selected keys (int64) and whether each slot holds one (bool).
        Wc (N_i, N_c), bc (N_c,): the inter -> command layer (masked weights); Wm (N_c, N_m),
            bm (N_m,): command -> motor; Wh (N_m, 2), bh (2,): the phi and omega heads.
        q_times (B, Tq), k_times (B, Tk): timestamps in seconds, or both None (age 1, as the paper).
        mode: "steady", "exact" or "euler"; delta_t: the integration horizon scale; eps: omega's
            lower bound; euler_steps: N in "euler" mode.

    Returns:
        o (B, Tq, H, d): per head, the attention-weighted sum of t_gate * v over the kept keys (0
        for a query without any valid key), laid out so that ``o.reshape(B, Tq, H * d)`` is the
        heads' concatenation.

    Gradients flow to q_half, k_half, v and the six backbone tensors (not to the selection or the
    timestamps). The backward is not itself differentiable (no double backward).
    """

    @staticmethod
    def forward(ctx, q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, mode, delta_t, eps,
                euler_steps):
        B, H, Tq, _ = q_half.shape
        d = v.shape[-1]
        dtype = q_half.dtype
        qt, kt, has_t = _times(q_times, k_times)
        ins = [_np(a.to(dtype)) for a in (q_half, k_half, v, Wc, bc, Wm, bm, Wh, bh)]
        ix, ok = _np(idx), _np(valid)
        out = np.empty((B, Tq, H, d), dtype=ins[0].dtype)
        args = (MODE_IDS[mode], float(delta_t), float(eps), int(euler_steps))
        _forward_kernel(*ins[:3], ix, ok, *ins[3:], qt, kt, has_t, *args, out)
        ctx.save_for_backward(q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh)
        ctx.kernel = (qt, kt, has_t, args)
        return torch.from_numpy(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh = ctx.saved_tensors
        qt, kt, has_t, args = ctx.kernel
        dtype = q_half.dtype
        ins = [_np(a) for a in (q_half, k_half, v, Wc, bc, Wm, bm, Wh, bh)]
        d_in = [np.zeros(a.shape, dtype=a.dtype) for a in ins[:3]]  # q_half, k_half, v
        d_w = [np.zeros(a.shape, dtype=np.float64) for a in ins[3:]]  # the weights, float64 sums
        _backward_kernel(_np(grad_out.to(dtype)), *ins[:3], _np(idx), _np(valid), *ins[3:], qt, kt, has_t, *args,
                         *d_in, *d_w)
        grads = [torch.from_numpy(g) for g in d_in] + [None, None] + [torch.from_numpy(g).to(dtype) for g in d_w]
        return (*grads, None, None, None, None, None, None)


def pair_attention(q_half: Tensor, k_half: Tensor, v: Tensor, idx: Tensor, valid: Tensor,
                   backbone: tuple[Tensor, ...], q_times: Tensor | None, k_times: Tensor | None,
                   mode: str, delta_t: float, eps: float, euler_steps: int) -> Tensor:
    """:class:`PairAttention` (see there for shapes); ``backbone`` = (Wc, bc, Wm, bm, Wh, bh)."""
    return PairAttention.apply(q_half, k_half, v, idx, valid, *backbone, q_times, k_times, mode, delta_t, eps,
                               euler_steps)


__all__ = ["MODE_IDS", "PairAttention", "applies", "available", "masked_topk", "pair_attention", "use_kernels"]
