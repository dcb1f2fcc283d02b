"""The Triton kernels behind :mod:`agent.nn.nac_triton` (imported only from there, lazily: this module
imports ``triton`` at its top, and triton is an optional extra).

Two kernels over the same tiling, in the style of FlashAttention's forward (Dao et al. 2022,
"FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", Section 3.1: one
program per (batch x head, block of queries), the keys streamed through on-chip tiles, nothing
per pair written to global memory):

- :func:`nac_pair_fwd`: for ``BLOCK_Q`` queries of one head and their ``KP`` (K rounded up to a power
  of two) kept keys, the ``P = BLOCK_Q * KP`` pairs as the rows of 2-D tiles: the first backbone
  layer (the query half plus the gathered key half), inter -> command -> motor as two ``tl.dot``
  with IEEE float32 products (no TF32), the phi / omega heads, the time gate, the ODE logit
  (steady / exact / Euler, the NAC paper's Eqs. 3, 2 and 1), the softmax over each query's kept keys
  and the weighted sum of t_gate * v.
- :func:`nac_pair_bwd`: the same tile recomputed (nothing of the forward is stored), then the
  reverse pass by hand: softmax, the ODE solution's derivatives (Euler: carried forward through
  the steps as tangents, so no step is stored), the gates, the three tanh layers. Gradients of the
  queries' half are written by the program that owns the queries; the keys' half and the values,
  which several queries select, are added with ``tl.atomic_add``; the backbone weights' gradients
  are each program's partial sums, added in a fixed order by the caller (deterministic).
- :func:`nac_topk_exact`, :func:`nac_topk_blocks`: the two selectors (step 3), a block of queries
  per program and a running best-K per query; the exact one scores the keys a block at a time with
  ``tl.dot``, the blocks one streams the block centroids and keys one at a time.

Layouts (all contiguous, float32 unless said): qh (B H Tq, F), kh (B H Tk, F), v (B H Tk, D),
ix (B H Tq, K) int32 with -1 for an empty or invalid slot, Wc (Ni, Nc), bc (Nc,), Wm (Nc, Nm),
bm (Nm,), Wh (Nm, 2), bh (2,), qt (B, Tq), kt (B, Tk) timestamps (float32 or float64), out and dout
(B, Tq, H, D). F = Ni + 2 (inter pre-activations, then alpha and beta of the time gate).
"""

from __future__ import annotations

import triton
import triton.language as tl

#: ODE modes as the kernels number them (the same as agent.nn.nac_kernels.MODE_IDS)
MODE_IDS = {"steady": 0, "exact": 1, "euler": 2}


@triton.jit
def _tile_pairs(ix, bhx, qb, Tq, Tk, K, BLOCK_Q: tl.constexpr, KP: tl.constexpr):
    """The tile's (query, kept key) pairs: row r is query qi = qb * BLOCK_Q + r // KP, slot r % KP.
    Returns (qi, qok: a real query, ok: a kept key, kx: the key (0 where not kept), qrow, krow: int64
    rows of the query and key in the (B*H*T, .) halves)."""
    P: tl.constexpr = BLOCK_Q * KP
    r = tl.arange(0, P)
    qi = qb * BLOCK_Q + r // KP
    s = r % KP
    qok = qi < Tq
    key = tl.load(ix + (bhx * Tq + qi).to(tl.int64) * K + s, mask=qok & (s < K), other=-1)
    ok = key >= 0
    kx = tl.where(ok, key, 0)
    qrow = (bhx * Tq + qi).to(tl.int64)
    krow = (bhx * Tk + kx).to(tl.int64)
    return qi, qok, ok, kx, qrow, krow


@triton.jit
def _tile_backbone(qh, kh, wc, bc, wm, bm, wh, bh, qrow, krow, qok, ok, ci, cc, cm, m_i, Ni, Nc, Nm, F, eps):
    """Steps 4-5 for the tile's pairs: the first layer from the q half and the gathered k half, the
    inter -> command -> motor backbone and the phi / omega heads. Returns (alpha, beta, inter, Wc,
    command, Wm, motor, w_phi, w_om, a_om, phi, omega); the backward reuses the intermediates."""
    pre = tl.load(qh + qrow[:, None] * F + ci[None, :], mask=qok[:, None] & m_i, other=0.0) \
        + tl.load(kh + krow[:, None] * F + ci[None, :], mask=ok[:, None] & m_i, other=0.0)
    alpha = tl.load(qh + qrow * F + Ni, mask=qok, other=0.0) + tl.load(kh + krow * F + Ni, mask=ok, other=0.0)
    beta = tl.load(qh + qrow * F + Ni + 1, mask=qok, other=0.0) + tl.load(kh + krow * F + Ni + 1, mask=ok,
                                                                            other=0.0)
    inter = 2.0 * tl.sigmoid(2.0 * pre) - 1.0  # tanh
    Wc = tl.load(wc + ci[:, None] * Nc + cc[None, :], mask=(ci[:, None] < Ni) & (cc[None, :] < Nc), other=0.0)
    Bc = tl.load(bc + cc, mask=cc < Nc, other=0.0)
    command = 2.0 * tl.sigmoid(2.0 * (tl.dot(inter, Wc, input_precision="ieee") + Bc[None, :])) - 1.0
    Wm = tl.load(wm + cc[:, None] * Nm + cm[None, :], mask=(cc[:, None] < Nc) & (cm[None, :] < Nm), other=0.0)
    Bm = tl.load(bm + cm, mask=cm < Nm, other=0.0)
    motor = 2.0 * tl.sigmoid(2.0 * (tl.dot(command, Wm, input_precision="ieee") + Bm[None, :])) - 1.0
    w_phi = tl.load(wh + cm * 2, mask=cm < Nm, other=0.0)
    w_om = tl.load(wh + cm * 2 + 1, mask=cm < Nm, other=0.0)
    a_phi = tl.sum(motor * w_phi[None, :], axis=1) + tl.load(bh)
    a_om = tl.sum(motor * w_om[None, :], axis=1) + tl.load(bh + 1)
    phi = tl.sigmoid(a_phi)
    omega = tl.maximum(a_om, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(a_om))) + eps  # softplus + eps
    return alpha, beta, inter, Wc, command, Wm, motor, w_phi, w_om, a_om, phi, omega


@triton.jit
def nac_pair_fwd(qh, kh, v, ix, wc, bc, wm, bm, wh, bh, qt, kt, out,
                 H, Tq, Tk, K, Ni, Nc, Nm, D, F, delta_t, eps, n_euler,
                 HAS_T: tl.constexpr, MODE: tl.constexpr, BLOCK_Q: tl.constexpr, KP: tl.constexpr,
                 NIP: tl.constexpr, NCP: tl.constexpr, NMP: tl.constexpr, DP: tl.constexpr):
    qb = tl.program_id(0)
    bhx = tl.program_id(1)
    b = bhx // H
    h = bhx % H
    P: tl.constexpr = BLOCK_Q * KP
    qi, qok, ok, kx, qrow, krow = _tile_pairs(ix, bhx, qb, Tq, Tk, K, BLOCK_Q, KP)
    ci = tl.arange(0, NIP)
    cc = tl.arange(0, NCP)
    cm = tl.arange(0, NMP)
    cd = tl.arange(0, DP)
    m_i = ci[None, :] < Ni
    # ---- steps 4-5: the pair backbone and phi, omega
    alpha, beta, inter, Wc, command, Wm, motor, w_phi, w_om, a_om, phi, omega = _tile_backbone(
        qh, kh, wc, bc, wm, bm, wh, bh, qrow, krow, qok, ok, ci, cc, cm, m_i, Ni, Nc, Nm, F, eps)
    # ---- step 6: the time gate and the ODE logit
    if HAS_T:
        b64 = b.to(tl.int64)
        tq = tl.load(qt + b64 * Tq + qi, mask=qok, other=0.0)
        tk = tl.load(kt + b64 * Tk + kx, mask=ok, other=0.0)
        z = alpha * (tq - tk).to(tl.float32) + beta
    else:
        z = alpha + beta
    tg = tl.sigmoid(z)
    tau = delta_t * tg
    if MODE == 0:
        logit = phi / omega
    elif MODE == 1:
        x = -omega * tau
        u = tl.exp(x)
        em1 = tl.where(u == 1.0, x, (u - 1.0) * x / tl.log(u))  # expm1(x), Kahan's form
        em1 = tl.where(x < -20.0, -1.0, em1)
        logit = phi / omega * -em1
    else:
        hstep = tau / n_euler
        logit = tl.zeros_like(phi)
        for _ in range(n_euler):
            logit = logit + hstep * (phi - omega * logit)
    # ---- step 7: softmax over each query's kept keys (invalid ones: weight 0)
    lm = tl.reshape(tl.where(ok, logit, -1e9), (BLOCK_Q, KP))
    e = tl.exp(lm - tl.max(lm, axis=1)[:, None])
    w = tl.reshape(e / tl.sum(e, axis=1)[:, None], (P,))
    w = tl.where(ok, w, 0.0)
    # ---- step 8: o_i = sum_j w_ij t_ij v_j
    vv = tl.load(v + krow[:, None] * D + cd[None, :], mask=ok[:, None] & (cd[None, :] < D), other=0.0)
    o = tl.sum(tl.reshape((w * tg)[:, None] * vv, (BLOCK_Q, KP, DP)), axis=1)  # (BLOCK_Q, DP)
    qo = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    optr = out + ((b * Tq + qo).to(tl.int64) * H + h)[:, None] * D + cd[None, :]
    tl.store(optr, o, mask=(qo[:, None] < Tq) & (cd[None, :] < D))


@triton.jit
def nac_pair_bwd(qh, kh, v, ix, wc, bc, wm, bm, wh, bh, qt, kt, dout, dqh, dkh, dv, dw_part,
                 H, Tq, Tk, K, Ni, Nc, Nm, D, F, delta_t, eps, n_euler, NW,
                 HAS_T: tl.constexpr, MODE: tl.constexpr, BLOCK_Q: tl.constexpr, KP: tl.constexpr,
                 NIP: tl.constexpr, NCP: tl.constexpr, NMP: tl.constexpr, DP: tl.constexpr):
    qb = tl.program_id(0)
    bhx = tl.program_id(1)
    b = bhx // H
    h = bhx % H
    P: tl.constexpr = BLOCK_Q * KP
    # ================= the forward of the tile, recomputed (as nac_pair_fwd)
    qi, qok, ok, kx, qrow, krow = _tile_pairs(ix, bhx, qb, Tq, Tk, K, BLOCK_Q, KP)
    ci = tl.arange(0, NIP)
    cc = tl.arange(0, NCP)
    cm = tl.arange(0, NMP)
    cd = tl.arange(0, DP)
    m_i = ci[None, :] < Ni
    wc_ok = (ci[:, None] < Ni) & (cc[None, :] < Nc)
    wm_ok = (cc[:, None] < Nc) & (cm[None, :] < Nm)
    alpha, beta, inter, Wc, command, Wm, motor, w_phi, w_om, a_om, phi, omega = _tile_backbone(
        qh, kh, wc, bc, wm, bm, wh, bh, qrow, krow, qok, ok, ci, cc, cm, m_i, Ni, Nc, Nm, F, eps)
    if HAS_T:
        b64 = b.to(tl.int64)
        tq = tl.load(qt + b64 * Tq + qi, mask=qok, other=0.0)
        tk = tl.load(kt + b64 * Tk + kx, mask=ok, other=0.0)
        age = (tq - tk).to(tl.float32)
        z = alpha * age + beta
    else:
        age = tl.full((P,), 1.0, tl.float32)
        z = alpha + beta
    tg = tl.sigmoid(z)
    tau = delta_t * tg
    # the logit and its partial derivatives by phi, omega and tau
    if MODE == 0:
        logit = phi / omega
        da_phi = 1.0 / omega
        da_om = -phi / (omega * omega)
        da_tau = tl.zeros_like(phi)
    elif MODE == 1:
        x = -omega * tau
        u = tl.exp(x)
        em1 = tl.where(u == 1.0, x, (u - 1.0) * x / tl.log(u))
        em1 = tl.where(x < -20.0, -1.0, em1)
        E = -em1  # 1 - exp(-omega tau)
        logit = phi / omega * E
        da_phi = E / omega
        da_om = -phi / (omega * omega) * E + phi / omega * (u * tau)
        da_tau = phi * u
    else:
        # a_{n+1} = a_n + h (phi - omega a_n), h = tau / N; tangents carried along the steps
        hstep = tau / n_euler
        logit = tl.zeros_like(phi)
        da_phi = tl.zeros_like(phi)
        da_om = tl.zeros_like(phi)
        da_h = tl.zeros_like(phi)
        for _ in range(n_euler):
            rate = phi - omega * logit
            keep = 1.0 - hstep * omega
            da_h = da_h * keep + rate
            da_om = da_om * keep - hstep * logit
            da_phi = da_phi * keep + hstep
            logit = logit + hstep * rate
        da_tau = da_h / n_euler
    lm = tl.reshape(tl.where(ok, logit, -1e9), (BLOCK_Q, KP))
    e = tl.exp(lm - tl.max(lm, axis=1)[:, None])
    w = tl.reshape(e / tl.sum(e, axis=1)[:, None], (P,))
    w = tl.where(ok, w, 0.0)
    dmask = ok[:, None] & (cd[None, :] < D)
    vv = tl.load(v + krow[:, None] * D + cd[None, :], mask=dmask, other=0.0)
    # ================= the reverse pass
    dptr = dout + ((b * Tq + qi).to(tl.int64) * H + h)[:, None] * D + cd[None, :]
    do = tl.load(dptr, mask=qok[:, None] & (cd[None, :] < D), other=0.0)  # (P, DP): each pair's query row
    # o = sum_j c_j v_j with c = w t
    tl.atomic_add(dv + krow[:, None] * D + cd[None, :], (w * tg)[:, None] * do, mask=dmask)
    dc = tl.sum(do * vv, axis=1)
    dw = dc * tg
    dtg = dc * w
    # softmax: dlogit = w (dw - sum_j w_j dw_j) per query
    wdw = tl.reshape(w * dw, (BLOCK_Q, KP))
    row = tl.reshape(tl.zeros((BLOCK_Q, KP), tl.float32) + tl.sum(wdw, axis=1)[:, None], (P,))
    dlogit = w * (dw - row)
    dphi = dlogit * da_phi
    domega = dlogit * da_om
    dtg = dtg + delta_t * (dlogit * da_tau)
    dz = dtg * tg * (1.0 - tg)
    dalpha = dz * age
    dbeta = dz
    g_phi = dphi * phi * (1.0 - phi)
    g_om = domega * tl.sigmoid(a_om)
    # the gate heads: gates = motor @ Wh + bh
    dmotor = g_phi[:, None] * w_phi[None, :] + g_om[:, None] * w_om[None, :]
    dmp = dmotor * (1.0 - motor * motor)
    dcommand = tl.dot(dmp, tl.trans(Wm), input_precision="ieee")
    dcp = dcommand * (1.0 - command * command)
    dinter = tl.dot(dcp, tl.trans(Wc), input_precision="ieee")
    dpre = dinter * (1.0 - inter * inter)  # (P, NIP)
    # ---- the weights' gradients: this program's partial sums, laid out Wc | bc | Wm | bm | Wh | bh
    part = dw_part + (tl.program_id(1) * tl.num_programs(0) + qb).to(tl.int64) * NW
    dWc = tl.dot(tl.trans(inter), dcp, input_precision="ieee")  # (NIP, NCP)
    tl.store(part + ci[:, None] * Nc + cc[None, :], dWc, mask=wc_ok)
    o_bc = Ni * Nc
    tl.store(part + o_bc + cc, tl.sum(dcp, axis=0), mask=cc < Nc)
    o_wm = o_bc + Nc
    dWm = tl.dot(tl.trans(command), dmp, input_precision="ieee")  # (NCP, NMP)
    tl.store(part + o_wm + cc[:, None] * Nm + cm[None, :], dWm, mask=wm_ok)
    o_bm = o_wm + Nc * Nm
    tl.store(part + o_bm + cm, tl.sum(dmp, axis=0), mask=cm < Nm)
    o_wh = o_bm + Nm
    tl.store(part + o_wh + cm * 2, tl.sum(motor * g_phi[:, None], axis=0), mask=cm < Nm)
    tl.store(part + o_wh + cm * 2 + 1, tl.sum(motor * g_om[:, None], axis=0), mask=cm < Nm)
    o_bh = o_wh + 2 * Nm
    tl.store(part + o_bh, tl.sum(g_phi, axis=0))
    tl.store(part + o_bh + 1, tl.sum(g_om, axis=0))
    # ---- the first layer: dq_half (this program's queries: plain stores), dk_half (atomic)
    kmask = ok[:, None] & m_i
    tl.atomic_add(dkh + krow[:, None] * F + ci[None, :], dpre, mask=kmask)
    tl.atomic_add(dkh + krow * F + Ni, dalpha, mask=ok)
    tl.atomic_add(dkh + krow * F + Ni + 1, dbeta, mask=ok)
    qo = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    qo_ok = qo < Tq
    qorow = (bhx * Tq + qo).to(tl.int64)
    dq = tl.sum(tl.reshape(dpre, (BLOCK_Q, KP, NIP)), axis=1)
    tl.store(dqh + qorow[:, None] * F + ci[None, :], dq, mask=qo_ok[:, None] & m_i)
    tl.store(dqh + qorow * F + Ni, tl.sum(tl.reshape(dalpha, (BLOCK_Q, KP)), axis=1), mask=qo_ok)
    tl.store(dqh + qorow * F + Ni + 1, tl.sum(tl.reshape(dbeta, (BLOCK_Q, KP)), axis=1), mask=qo_ok)


# --------------------------------------------------------------------------------------------
# The selectors (step 3): a running top-K per query, one key (or block) at a time
# --------------------------------------------------------------------------------------------


@triton.jit
def _keep_best(vals, ids, score, new_id, slot):
    """Into each row's best-K buffer (vals, ids: (BLOCK_Q, KP); padding slots hold +inf so they are
    never the minimum), put ``score`` (BLOCK_Q,) in place of the row's lowest value when higher
    (strictly: on a tie the earlier entry stays)."""
    low, at = tl.min(vals, axis=1, return_indices=True, return_indices_tie_break_left=True)
    hit = (slot[None, :] == at[:, None]) & (score > low)[:, None]
    return tl.where(hit, score[:, None], vals), tl.where(hit, new_id, ids)


@triton.jit
def nac_topk_exact(q, k, qpos, kmask, idx_out, valid_out, H, Tq, Tk, D, K,
                   HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, KP: tl.constexpr,
                   DP: tl.constexpr, BLOCK_K: tl.constexpr, PRECHECK: tl.constexpr, SLOTS: tl.constexpr):
    """The exact selector: for BLOCK_Q queries of one head, the K keys of highest q . k among the
    allowed ones (at or before the query's position when causal, unmasked). The keys come BLOCK_K at
    a time: one ``tl.dot`` (IEEE float32) scores the block, then each query's best remaining score in
    the block goes into its best-K buffer while it beats the buffer's lowest (at most K times a block,
    and usually far fewer once the buffer holds good keys), in descending order, ties to the earlier
    key, evicting the lowest kept (on a tie the latest key): the kept set is the K best under (score
    descending, key ascending), ties keep the earlier key. q (B H Tq, D), k (B H Tk, D), qpos (Tq,)
    int64, kmask (B, Tk) int8; idx_out (B H Tq, K) int64 (0 where invalid) and valid_out
    (B H Tq, K) int8, or with SLOTS idx_out (B H Tq, K) int32 alone, -1 where invalid (valid_out
    unused). DP >= 16 and BLOCK_Q, BLOCK_K >= 16 (``tl.dot``'s smallest tile). PRECHECK:
    a block first checks that some score beats a query's lowest kept (the same selection)."""
    qb = tl.program_id(0)
    bhx = tl.program_id(1)
    b = bhx // H
    qi = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    qok = qi < Tq
    cd = tl.arange(0, DP)
    slot = tl.arange(0, KP)
    kc = tl.arange(0, BLOCK_K)
    qrow = (bhx * Tq + qi).to(tl.int64)
    qv = tl.load(q + qrow[:, None] * D + cd[None, :], mask=qok[:, None] & (cd[None, :] < D), other=0.0)
    pos = tl.load(qpos + qi, mask=qok, other=0)
    vals = tl.zeros((BLOCK_Q, KP), tl.float32) + tl.where(slot < K, float("-inf"), float("inf"))[None, :]
    ids = tl.zeros((BLOCK_Q, KP), tl.int64) - 1
    end = Tk
    if CAUSAL:
        end = tl.minimum(tl.max(tl.where(qok, pos, 0)) + 1, Tk)
    for j0 in range(0, end, BLOCK_K):
        kj = j0 + kc
        kin = kj < end
        kt = tl.load(k + (bhx * Tk + kj).to(tl.int64)[None, :] * D + cd[:, None],
                     mask=kin[None, :] & (cd[:, None] < D), other=0.0)  # (DP, BLOCK_K)
        s = tl.dot(qv, kt, input_precision="ieee")  # (BLOCK_Q, BLOCK_K)
        allowed = qok[:, None] & kin[None, :]
        if CAUSAL:
            allowed = allowed & (kj[None, :] <= pos[:, None])
        if HAS_MASK:
            allowed = allowed & (tl.load(kmask + b.to(tl.int64) * Tk + kj, mask=kin, other=0) != 0)[None, :]
        s = tl.where(allowed, s, float("-inf"))
        more = 1
        if PRECHECK:  # skip the block without a merge round when no score beats a query's lowest kept
            more = tl.max((tl.max(s, axis=1) > tl.min(vals, axis=1)).to(tl.int32), axis=0)
        while more > 0:
            best, at_k = tl.max(s, axis=1, return_indices=True, return_indices_tie_break_left=True)
            low = tl.min(vals, axis=1)
            # the slot that leaves: the lowest value, on a tie the latest key (unique: ids * KP + slot)
            leave = tl.where(vals == low[:, None], ids * KP + slot[None, :], -KP - 1)
            hit = best > low
            put = (leave == tl.max(leave, axis=1)[:, None]) & hit[:, None]
            vals = tl.where(put, best[:, None], vals)
            ids = tl.where(put, (j0 + at_k).to(tl.int64)[:, None], ids)
            s = tl.where((kc[None, :] == at_k[:, None]) | (~hit)[:, None], float("-inf"), s)
            more = tl.max(hit.to(tl.int32), axis=0)
    ok = (vals > float("-inf")) & (slot[None, :] < K)
    optr = qrow[:, None] * K + slot[None, :]
    omask = qok[:, None] & (slot[None, :] < K)
    if SLOTS:  # one int32 slot table, -1 = no key: what the pair kernels read
        tl.store(idx_out + optr, tl.where(ok, ids, -1).to(tl.int32), mask=omask)
    else:
        tl.store(idx_out + optr, tl.where(ok, ids, 0), mask=omask)
        tl.store(valid_out + optr, ok.to(tl.int8), mask=omask)


@triton.jit
def nac_topk_blocks(q, k, qpos, kmask, cent, block_ok, idx_out, valid_out, H, Tq, Tk, D, K, BS, NB, N_OTHER,
                    HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_Q: tl.constexpr, KP: tl.constexpr,
                    MP: tl.constexpr, DP: tl.constexpr, SLOTS: tl.constexpr):
    """The blocks selector (the NAC paper's Section 2.3, Algorithm 2) for BLOCK_Q queries of one head:
    the N_OTHER blocks whose centroids score highest (among the blocks before the query's own when
    causal, which is then always kept), then the K best allowed keys inside the kept blocks.
    cent (B H NB, D) centroids of the valid keys, block_ok (B, NB) int8 (a block has a valid key);
    the rest as :func:`nac_topk_exact`."""
    qb = tl.program_id(0)
    bhx = tl.program_id(1)
    b = bhx // H
    qi = qb * BLOCK_Q + tl.arange(0, BLOCK_Q)
    qok = qi < Tq
    cd = tl.arange(0, DP)
    qrow = (bhx * Tq + qi).to(tl.int64)
    qv = tl.load(q + qrow[:, None] * D + cd[None, :], mask=qok[:, None] & (cd[None, :] < D), other=0.0)
    pos = tl.load(qpos + qi, mask=qok, other=0)
    own = pos // BS
    # ---- the blocks: the N_OTHER best-scoring allowed centroids
    bslot = tl.arange(0, MP)
    bvals = tl.zeros((BLOCK_Q, MP), tl.float32) + tl.where(bslot < N_OTHER, float("-inf"), float("inf"))[None, :]
    bids = tl.zeros((BLOCK_Q, MP), tl.int64) - 1
    for c in range(0, NB):
        cv = tl.load(cent + (bhx * NB + c).to(tl.int64) * D + cd, mask=cd < D, other=0.0)
        allowed = qok & (tl.load(block_ok + b.to(tl.int64) * NB + c) != 0)
        if CAUSAL:
            allowed = allowed & (c < own)
        score = tl.where(allowed, tl.sum(qv * cv[None, :], axis=1), float("-inf"))
        bvals, bids = _keep_best(bvals, bids, score, c, bslot)
    bkept = bvals > float("-inf")
    # ---- the keys of the kept blocks (the own block first when causal)
    slot = tl.arange(0, KP)
    vals = tl.zeros((BLOCK_Q, KP), tl.float32) + tl.where(slot < K, float("-inf"), float("inf"))[None, :]
    ids = tl.zeros((BLOCK_Q, KP), tl.int64) - 1
    n_sel = N_OTHER
    if CAUSAL:
        n_sel = N_OTHER + 1
    for t in range(0, n_sel):
        if CAUSAL:
            o = t - 1  # slot 0: the own block
            blk = tl.where(t == 0, own, tl.sum(tl.where(bslot[None, :] == o, bids, 0), axis=1))
            blk_ok = (t == 0) | (tl.sum(tl.where(bslot[None, :] == o, bkept.to(tl.int32), 0), axis=1) != 0)
        else:
            blk = tl.sum(tl.where(bslot[None, :] == t, bids, 0), axis=1)
            blk_ok = tl.sum(tl.where(bslot[None, :] == t, bkept.to(tl.int32), 0), axis=1) != 0
        blk_ok = blk_ok & qok
        for u in range(0, BS):
            kp = blk * BS + u  # (BLOCK_Q,) key positions
            allowed = blk_ok & (kp < Tk) & (kp >= 0)
            if CAUSAL:
                allowed = allowed & (kp <= pos)
            if HAS_MASK:
                allowed = allowed & (tl.load(kmask + b.to(tl.int64) * Tk + kp, mask=allowed, other=0) != 0)
            kv = tl.load(k + (bhx * Tk + kp).to(tl.int64)[:, None] * D + cd[None, :],
                         mask=allowed[:, None] & (cd[None, :] < D), other=0.0)
            score = tl.where(allowed, tl.sum(qv * kv, axis=1), float("-inf"))
            vals, ids = _keep_best(vals, ids, score, kp[:, None], slot)
    ok = (vals > float("-inf")) & (slot[None, :] < K)
    optr = qrow[:, None] * K + slot[None, :]
    omask = qok[:, None] & (slot[None, :] < K)
    if SLOTS:  # one int32 slot table, -1 = no key: what the pair kernels read
        tl.store(idx_out + optr, tl.where(ok, ids, -1).to(tl.int32), mask=omask)
    else:
        tl.store(idx_out + optr, tl.where(ok, ids, 0), mask=omask)
        tl.store(valid_out + optr, ok.to(tl.int8), mask=omask)
