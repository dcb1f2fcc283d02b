"""The Neuronal Attention Circuit (NAC) layer.

Razzaq et al., "Neuronal Attention Circuit (NAC) for Representation Learning", arXiv 2512.10282.
The mathematics is restated in ``docs/design.md`` section 3; the numbered steps below follow it.

Notation: B batch, T sequence length, D_in input features, d_model model width, H heads,
d = d_model / H head width, K keys kept per query.

1. Sensory gates q, k, v = S(x): sparse linear maps D_in -> d_model, each with the sensory->inter
   connectivity of an ``ncps.wirings.AutoNCP`` wiring (sparsity s). They act per time step, so
   they are parallel over T and a streaming step needs only the newest frame.
2. Heads: (B, T, d_model) -> (B, H, T, d).
3. Top-K curation on the scores s_ij = q_i . k_j / sqrt(d) (keys j <= i when causal):
   ``selector="exact"`` (O(T^2) scores) or ``"blocks"``, the paper's sub-quadratic square-root
   partition (Section 2.3, Algorithm 2): keys in blocks of ~sqrt(T), queries scored against
   block centroids, exact top-k inside the chosen blocks; memory linear in T.
4. Pair input u_ij = [q_i ; k_j] (2d).
5. Backbone: the inter -> command -> motor layers of a second AutoNCP wiring (sparse masks,
   tanh between layers) map u_ij to motor activity; two heads give
   phi_ij = sigmoid(a_phi) in (0, 1) and omega_ij = softplus(a_omega) + eps > 0.
   Unlike the authors' code (one recurrent NCP step from a zero state, which leaves the motor
   neurons without input, so phi and omega are one constant for all pairs), phi and omega
   here depend on u_ij.
6. The logit solves da/dt = -omega a + phi, a(0) = 0 (paper Eq. 1), up to the per-pair time
   tau_ij = delta_t * t_ij, with t_ij = sigmoid(alpha(u_ij) * t + beta(u_ij)) (paper Section 2.3,
   "Construction of Time Vector") and t the key's age t_i - t_j in seconds (1 when no timestamps
   are given, as in the paper):
   steady  a = phi / omega                                  (paper Eq. 3)
   exact   a = phi / omega * (1 - exp(-omega tau))          (paper Eq. 2, closed form)
   euler   N explicit Euler steps of size tau / N from 0    (paper Eq. 1 discretised)
7. Weights: softmax over the K kept keys; masked or missing keys are excluded (zero weight).
   (The authors multiply logits by a 0/1 mask, so masked keys keep weight.)
8. Output o_i = sum_j w_ij t_ij v_j per head; heads concatenated; a linear map to d_model.

Steps 4-8 have three implementations of the same function: the torch path below, fused CPU kernels
(:mod:`agent.nn.nac_kernels`, Numba) and fused CUDA kernels (:mod:`agent.nn.nac_triton`, Triton, an
optional extra); :meth:`NAC.attend` picks one by the tensors' device and dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agent.nn import nac_kernels, nac_triton

MODES = ("steady", "exact", "euler")
SELECTORS = ("exact", "blocks")
#: the backbone and sensory-gate wirings: the paper's NCP, or fully connected (its NAC-FC ablation)
WIRINGS = ("ncp", "fc")


# --------------------------------------------------------------------------------------------
# Wiring helpers
# --------------------------------------------------------------------------------------------


def _autoncp(units: int, output_size: int, sparsity: float, seed: int, input_dim: int):
    from ncps.wirings import AutoNCP

    wiring = AutoNCP(units, output_size, sparsity_level=sparsity, seed=seed)
    wiring.build(input_dim)
    return wiring


def sensory_wiring(input_dim: int, n_out: int, sparsity: float, seed: int):
    """An ``AutoNCP`` wiring whose inter layer has exactly ``n_out`` neurons.

    Its sensory -> inter adjacency is the mask of a sensory gate D_in -> n_out. AutoNCP splits
    ``units - output_size`` neurons 60/40 into inter and command neurons, so the smallest unit
    count that yields ``n_out`` inter neurons is searched for.
    """
    ic = n_out
    while ic - max(int(0.4 * ic), 1) < n_out:
        ic += 1
    return _autoncp(ic + 1, 1, sparsity, seed, input_dim)


def _layer_masks(wiring) -> tuple[Tensor, Tensor, Tensor]:
    """Boolean masks (sensory->inter, inter->command, command->motor) of an NCP wiring."""
    inter, command, motor = (wiring.get_neurons_of_layer(i) for i in range(3))
    s = torch.as_tensor(wiring.sensory_adjacency_matrix != 0)
    a = torch.as_tensor(wiring.adjacency_matrix != 0)
    return s[:, inter], a[inter][:, command], a[command][:, motor]


_MASKS_FROM_STATE = contextvars.ContextVar("nac_masks_from_state", default=False)


@contextlib.contextmanager
def masks_from_state_dict():
    """Within this block, new :class:`NACLayer` objects do not build their sensory-gate wirings:
    their q, k, v masks are placeholders (every connection) that a ``load_state_dict(..., strict=True)``
    must then overwrite with the stored ones (the masks are buffers of every policy file).

    Building them means three ncps ``AutoNCP`` wirings over D_in sensory neurons, which ncps does
    neuron by neuron in Python: for CarRacing's D_in = 2430 about 1.3 s each, so about 4 s of every
    ``drive`` start before this (measured on the 2-core development CPU). Loading a policy file
    (:meth:`agent.nn.policy.DrivingPolicy.from_payload`) uses it; a newly made layer still builds
    its wirings. The backbone's wiring (32 neurons) is always built: it is cheap and
    :attr:`NACLayer.wiring` is drawn by ``agent wiring``.
    """
    token = _MASKS_FROM_STATE.set(True)
    try:
        yield
    finally:
        _MASKS_FROM_STATE.reset(token)


@functools.lru_cache(maxsize=32)
def _sensory_mask(input_dim: int, n_out: int, sparsity: float, seed: int) -> Tensor:
    """(input_dim, n_out) bool sensory-gate mask; cached, since ncps builds wide wirings slowly."""
    return _layer_masks(sensory_wiring(input_dim, n_out, sparsity, seed))[0]


class _Tanh(torch.autograd.Function):
    """tanh(x) computed as 2 sigmoid(2x) - 1, with the backward 1 - tanh^2 from the saved output.

    The same function as :func:`torch.tanh` (to about 2e-7 in float32); measured 2.4x faster than
    ``torch.tanh`` on this project's CPU (torch 2.13), where tanh is the costliest op of the
    backbone (three activations per key-query pair).
    """

    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x * 2).mul_(2).sub_(1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


#: below this many elements :func:`torch.tanh` is the faster one (its single op beats the
#: four of :class:`_Tanh` plus the autograd.Function call: 5 against 25 us at 960 elements)
FAST_TANH_MIN_NUMEL = 16384


def fast_tanh(x: Tensor) -> Tensor:
    """tanh of any tensor: :class:`_Tanh` from ``FAST_TANH_MIN_NUMEL`` elements on, else
    :func:`torch.tanh` (differentiable; the two agree to about 2e-7 in float32)."""
    return _Tanh.apply(x) if x.numel() >= FAST_TANH_MIN_NUMEL else torch.tanh(x)


class DerivedWeights:
    """Mixin for modules whose forward uses tensors derived from their parameters (masked, fused).

    :meth:`derived` builds such a tensor every call while autograd may need it (grad enabled and
    one of its parameters requires a gradient) or while the module trains; in eval mode otherwise
    it builds it once and keeps it (also under grad with frozen weights, as Grad-CAM runs). The kept
    tensors are dropped by :meth:`train` / :meth:`eval`, by ``load_state_dict``, and rebuilt when
    a parameter moves to another device, dtype or storage. Weights changed in place while in eval
    mode need :meth:`clear_derived` (optimisers step in train mode, so training never does).
    """

    def _init_derived(self) -> None:
        self.register_load_state_dict_post_hook(lambda module, incompatible: module.clear_derived())

    def clear_derived(self) -> None:
        """Forget the kept derived tensors (they are rebuilt on the next call)."""
        self.__dict__.pop("_derived_cache", None)

    def train(self, mode: bool = True):
        """``nn.Module.train``, forgetting the kept derived tensors (the weights may change)."""
        self.clear_derived()
        return super().train(mode)

    def derived(self, name: str, params: tuple[Tensor, ...], build):
        """``build()``, kept between calls at inference (eval mode; grad disabled or ``params`` frozen)."""
        if self.training or (torch.is_grad_enabled() and any(p.requires_grad for p in params)):
            return build()
        key = tuple((p.data_ptr(), p.device, p.dtype) for p in params)
        cache = self.__dict__.setdefault("_derived_cache", {})
        hit = cache.get(name)
        if hit is None or hit[0] != key:
            hit = cache[name] = (key, build())
        return hit[1]


class SparseLinear(DerivedWeights, nn.Module):
    """``y = x @ (W * M) + b`` with a fixed boolean connectivity mask M (in, out), kept as a buffer.

    Each output's weights are initialised uniformly in +-1/sqrt(fan_in), with fan_in counted
    over the connections the mask keeps.
    """

    def __init__(self, mask: Tensor):
        super().__init__()
        mask = mask.to(torch.bool)
        if mask.dim() != 2:
            raise ValueError(f"mask must be 2-D (in, out), got shape {tuple(mask.shape)}")
        if not mask.any(0).all():
            raise ValueError("every output of a SparseLinear needs at least one input connection")
        self.register_buffer("mask", mask)
        self._init_derived()
        fan_in = mask.sum(0).clamp(min=1).float()
        bound = 1.0 / fan_in.sqrt()
        self.weight = nn.Parameter((torch.rand(mask.shape) * 2 - 1) * bound)
        self.bias = nn.Parameter((torch.rand(mask.shape[1]) * 2 - 1) * bound)

    @property
    def in_features(self) -> int:
        """Input size (rows of the mask)."""
        return self.mask.shape[0]

    @property
    def out_features(self) -> int:
        """Output size (columns of the mask)."""
        return self.mask.shape[1]

    def masked_weight(self) -> Tensor:
        """W * M (in, out); kept between calls at inference (see :class:`DerivedWeights`)."""
        return self.derived("masked", (self.weight,), lambda: self.weight * self.mask)

    def forward(self, x: Tensor) -> Tensor:
        """(..., in) -> (..., out): x (W * M) + b."""
        return x @ self.masked_weight() + self.bias


# --------------------------------------------------------------------------------------------
# Intermediates and streaming cache
# --------------------------------------------------------------------------------------------


@dataclass
class NACIntermediates:
    """What the layer computed, for interpretation and tests. Pair tensors are (B, H, T, K).

    Attributes:
        phi: content-target gate, in (0, 1).
        omega: time-constant gate, > 0.
        logits: the ODE solution a_ij (before masking).
        weights: softmax attention weights over the kept keys (0 for invalid keys).
        indices: key positions kept per query (int64); meaningless where ``valid`` is False.
        t_gate: the time vector t_ij in (0, 1).
        valid: kept key exists and is allowed (causal, unmasked) (bool).
        neurons: activity of each NCP neuron group: ``sensory`` (B, T, 3 * d_model) for q, k, v;
            ``inter``, ``command``, ``motor`` (B, H, T, K, N_group).
    """

    phi: Tensor
    omega: Tensor
    logits: Tensor
    weights: Tensor
    indices: Tensor
    t_gate: Tensor
    valid: Tensor
    neurons: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class NACCache:
    """Keys, values and timestamps of the last frames, for one-frame-at-a-time inference.

    Attributes:
        k, v: (B, H, L, d) for the L cached frames (L <= window).
        times: (B, L) timestamps in seconds, or None when the layer runs without timestamps.
        mask: (B, L) bool, True = a real frame of this row's episode, or None (all real). A row
            whose episode restarted keeps its older slots masked, so one batched cache serves
            rows at different points of their episodes.
    """

    k: Tensor
    v: Tensor
    times: Tensor | None
    mask: Tensor | None = None

    def reset_rows(self, rows: Tensor) -> "NACCache":
        """The cache with every cached frame of the rows where ``rows`` (B,) bool is True masked out."""
        mask = self.mask if self.mask is not None else torch.ones(self.k.shape[0], self.length, dtype=torch.bool,
                                                                  device=self.k.device)
        return NACCache(self.k, self.v, self.times, mask & ~rows.to(mask.device)[:, None])

    @property
    def length(self) -> int:
        """Positions held (the window's length so far)."""
        return self.k.shape[2]


# --------------------------------------------------------------------------------------------
# Top-K selectors
# --------------------------------------------------------------------------------------------


def _blocked(qpos: Tensor, Tk: int, key_mask: Tensor | None, causal: bool) -> Tensor | None:
    """(B or 1, 1, Tq, Tk) or (Tq, Tk) bool: True where key j may NOT be attended by the query at
    key position qpos (a future key when causal, or a masked key); None when every key is allowed."""
    blocked = None
    if causal:
        blocked = torch.arange(Tk, device=qpos.device)[None, :] > qpos[:, None]  # (Tq, Tk)
    if key_mask is not None:
        masked = ~key_mask[:, None, None, :]  # (B, 1, 1, Tk)
        blocked = masked if blocked is None else blocked | masked
    return blocked


#: queries processed at once by :meth:`NAC.attend` (without intermediates)
ATTEND_QUERY_CHUNK = 1024
#: queries ranked at once by the exact selector when causal (see :func:`select_topk_exact`)
EXACT_QUERY_CHUNK = 64


def select_topk_exact(q: Tensor, k: Tensor, topk: int, qpos: Tensor, key_mask: Tensor | None = None,
                      causal: bool = True, query_chunk: int = EXACT_QUERY_CHUNK) -> tuple[Tensor, Tensor]:
    """Exact top-K keys per query by the score q . k / sqrt(d).

    The scores are ranked without the 1/sqrt(d) factor, which does not change their order. (A
    two-stage ranking by block maxima was measured and dropped: the extra passes over the
    (B, H, Tq, Tk) scores cost more than ``topk`` itself on the CPU.) When causal, queries are
    ranked ``query_chunk`` at a time against only the keys up to the chunk's last position, so
    the future half of the score matrix is never computed and working memory is
    O(query_chunk Tk), not O(Tq Tk). The result does not depend on ``query_chunk``. On CPU
    float32/float64 tensors the ranking runs in one fused kernel instead
    (:func:`agent.nn.nac_kernels.topk_exact`: a query at a time, O(Tk) memory; the same keys,
    ties going to the earlier key), and on CUDA float32 tensors, with triton installed, in a
    Triton kernel (:func:`agent.nn.nac_triton.topk_exact`: the same keys, in another slot order).

    Args:
        q: (B, H, Tq, d); k: (B, H, Tk, d).
        qpos: (Tq,) int64, the key position of each query (for causality).
        key_mask: (B, Tk) bool, True = valid key.

    Returns:
        indices (B, H, Tq, K) int64 and valid (B, H, Tq, K) bool, K = min(topk, Tk).
    """
    Tk = k.shape[2]
    Tq = q.shape[2]
    K = min(topk, Tk)
    with torch.no_grad():  # only the ranking is used: no gradient flows through the selection
        if nac_triton.applies(q, k):  # CUDA float32: the Triton kernel, a block of queries at a time
            return nac_triton.topk_exact(q, k, K, qpos, key_mask, causal)
        if nac_kernels.applies(q, k):  # scores and ranking in one kernel, a query at a time
            return nac_kernels.topk_exact(q, k, K, qpos, key_mask, causal)
        if not causal or Tq <= query_chunk:
            return _topk_rows(q, k, K, qpos, key_mask, causal)
        # causal: a chunk of queries needs only the keys up to its last query's position, so the
        # lower triangle alone is scored and ranked (about half the work and O(chunk Tk) memory)
        out = []
        for s in range(0, Tq, query_chunk):
            pc = qpos[s:s + query_chunk]
            end = min(int(pc.max()) + 1, Tk)
            kc = k[:, :, :end]
            mc = key_mask[:, :end] if key_mask is not None else None
            idx, valid = _topk_rows(q[:, :, s:s + query_chunk], kc, min(K, end), pc, mc, causal)
            if idx.shape[-1] < K:  # fewer keys than K so far: pad with invalid slots
                idx = F.pad(idx, (0, K - idx.shape[-1]))
                valid = F.pad(valid, (0, K - valid.shape[-1]), value=False)
            out.append((idx, valid))
        return torch.cat([o[0] for o in out], 2), torch.cat([o[1] for o in out], 2)


def _topk_rows(q: Tensor, k: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None, causal: bool):
    """Score every key for every query, mask, rank: indices and valid, (B, H, Tq, K)."""
    scores = q @ k.transpose(-1, -2)  # (B, H, Tq, Tk)
    blocked = _blocked(qpos, k.shape[2], key_mask, causal)
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    vals, idx = scores.topk(K, dim=-1)  # (B, H, Tq, K)
    return idx, torch.isfinite(vals)


def blocks_layout(Tk: int, topk: int, block_size: int | None = None, n_blocks: int | None = None) -> tuple[int, int]:
    """The blocks selector's (block_size, n_blocks) for Tk keys: block_size ceil(sqrt(Tk)) and
    n_blocks ceil(topk / block_size) + 1 (at most the number of blocks) unless given (paper
    Section 2.3, Algorithm 2)."""
    bs = block_size or max(1, math.ceil(math.sqrt(Tk)))
    return bs, min(math.ceil(Tk / bs), n_blocks or (math.ceil(topk / bs) + 1))


def select_topk_blocks(q: Tensor, k: Tensor, topk: int, qpos: Tensor, key_mask: Tensor | None = None,
                       causal: bool = True, block_size: int | None = None, n_blocks: int | None = None,
                       query_chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """Sub-quadratic top-K by square-root partitioning (paper Section 2.3, Algorithm 2).

    Keys are split into blocks of ``block_size`` (default ceil(sqrt(Tk))); each query scores the
    block centroids (means of the valid keys), keeps ``n_blocks`` blocks (default
    ceil(K / block_size) + 1) and takes the exact top-K keys inside them. When causal, the
    query's own block (its most recent keys) is always kept, and the other blocks are chosen only
    among blocks that end before it, so no future key is ever looked at. Queries are processed in
    chunks of ``query_chunk`` (default block_size), so working memory is O(Tk d), not O(Tq Tk).
    On CPU float32/float64 tensors the same selection runs in one fused kernel, a query at a time
    (:func:`agent.nn.nac_kernels.topk_blocks`), and on CUDA float32 tensors, with triton installed,
    in a Triton kernel (:func:`agent.nn.nac_triton.topk_blocks`; the same keys, in another slot order).

    Args and returns: as :func:`select_topk_exact`.
    """
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    device = q.device
    bs, m = blocks_layout(Tk, topk, block_size, n_blocks)
    nb = math.ceil(Tk / bs)
    K = min(topk, Tk)
    if nac_triton.applies(q, k):  # CUDA float32: the same selection in a Triton kernel
        with torch.no_grad():
            return nac_triton.topk_blocks(q, k, K, qpos, key_mask, causal, bs, m)
    if nac_kernels.applies(q, k):  # the same selection in one kernel, a query at a time
        return nac_kernels.topk_blocks(q, k, K, qpos, key_mask, causal, bs, m)
    pad = nb * bs - Tk
    kmask = key_mask if key_mask is not None else torch.ones(B, Tk, dtype=torch.bool, device=device)
    kb = F.pad(k, (0, 0, 0, pad)).view(B, H, nb, bs, d)  # (B, H, nb, bs, d)
    mb = F.pad(kmask, (0, pad), value=False).view(B, 1, nb, bs)  # (B, 1, nb, bs)
    count = mb.sum(-1)  # (B, 1, nb)
    centroids = (kb * mb[..., None]).sum(3) / count.clamp(min=1)[..., None]  # (B, H, nb, d)
    block_ok = count > 0  # (B, 1, nb)
    chunk = query_chunk or bs
    b_ix = torch.arange(B, device=device)[:, None, None, None]
    h_ix = torch.arange(H, device=device)[None, :, None, None]
    out_idx, out_valid = [], []
    for s in range(0, Tq, chunk):
        qc, pc = q[:, :, s:s + chunk], qpos[s:s + chunk]  # (B, H, c, d), (c,)
        c = qc.shape[2]
        bscore = torch.einsum("bhqd,bhnd->bhqn", qc, centroids)  # (B, H, c, nb)
        ok = block_ok[:, :, None, :].expand(B, H, c, nb)
        own = pc // bs  # (c,)
        if causal:
            earlier = torch.arange(nb, device=device)[None, :] < own[:, None]  # (c, nb)
            ok = ok & earlier[None, None]
            n_other = m - 1
        else:
            n_other = m
        bscore = bscore.masked_fill(~ok, float("-inf"))
        if n_other > 0:
            bval, bsel = bscore.topk(n_other, dim=-1)  # (B, H, c, n_other)
            bsel_ok = torch.isfinite(bval)
        else:
            bsel = torch.zeros(B, H, c, 0, dtype=torch.long, device=device)
            bsel_ok = torch.zeros(B, H, c, 0, dtype=torch.bool, device=device)
        if causal:
            bsel = torch.cat([own.view(1, 1, c, 1).expand(B, H, c, 1), bsel], -1)  # (B, H, c, m)
            bsel_ok = torch.cat([torch.ones(B, H, c, 1, dtype=torch.bool, device=device), bsel_ok], -1)
        cand_k = kb[b_ix, h_ix, bsel]  # (B, H, c, m, bs, d)
        cand_pos = bsel[..., None] * bs + torch.arange(bs, device=device)  # (B, H, c, m, bs)
        cand_ok = bsel_ok[..., None] & mb[b_ix, 0, bsel]  # (B, H, c, m, bs)
        if causal:
            cand_ok = cand_ok & (cand_pos <= pc.view(1, 1, c, 1, 1))
        cand_k = cand_k.flatten(3, 4)  # (B, H, c, m*bs, d)
        cand_pos, cand_ok = cand_pos.flatten(3, 4), cand_ok.flatten(3, 4)  # (B, H, c, m*bs)
        sc = torch.einsum("bhqd,bhqnd->bhqn", qc, cand_k) / math.sqrt(d)
        sc = sc.masked_fill(~cand_ok, float("-inf"))
        kk = min(K, sc.shape[-1])
        vals, sel = sc.topk(kk, dim=-1)  # (B, H, c, kk)
        idx, valid = cand_pos.gather(-1, sel), torch.isfinite(vals)
        if kk < K:  # fewer candidates than K: pad with invalid entries
            idx = F.pad(idx, (0, K - kk))
            valid = F.pad(valid, (0, K - kk), value=False)
        out_idx.append(idx.clamp(max=Tk - 1))
        out_valid.append(valid)
    return torch.cat(out_idx, 2), torch.cat(out_valid, 2)


# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------


class NAC(DerivedWeights, nn.Module):
    """Neuronal Attention Circuit: multi-head attention whose logits solve an NCP-gated linear ODE.

    Args:
        input_dim: D_in, features per time step.
        d_model: model width; must be divisible by ``num_heads``.
        num_heads: H.
        topk: K, keys kept per query (paper default 8).
        mode: "steady" (a = phi/omega), "exact" (closed form at tau) or "euler" (explicit Euler).
        sparsity: NCP wiring sparsity in [0, 1) (paper default 0.5).
        euler_steps: N, Euler steps in "euler" mode.
        delta_t: integration horizon scale; each pair integrates to tau_ij = delta_t * t_ij
            (paper ablations use 1.0).
        causal: queries attend only to keys at or before their own position.
        selector: "exact" top-k, or "blocks" (sub-quadratic square-root partition).
        seed: seed of both AutoNCP wirings (weights follow torch's global RNG).
        backbone_units: neurons of the backbone wiring (inter + command + motor).
        motor_neurons: motor neurons of the backbone; the phi and omega heads read them.
        eps: lower bound added to omega.
        wiring: "ncp" (the paper's NAC: the sensory gates and the backbone are AutoNCP wirings) or
            "fc", the paper's NAC-FC ablation (section 5, "NAC with isolated NCPs"): the same
            layers with every connection kept, fully connected layers in place of the NCP gating.

    Raises:
        ValueError: for an unknown mode, selector or wiring, d_model not divisible by num_heads, or
            sizes/sparsity out of range.

    Shapes: ``forward(x)`` takes x (B, T, input_dim) and returns y (B, T, d_model).
    """

    def __init__(self, input_dim: int, d_model: int, num_heads: int, topk: int = 8, mode: str = "steady",
                 sparsity: float = 0.5, euler_steps: int = 6, delta_t: float = 1.0, causal: bool = True,
                 selector: str = "exact", seed: int = 22222, backbone_units: int = 32, motor_neurons: int = 8,
                 eps: float = 1e-2, wiring: str = "ncp"):
        super().__init__()
        self._init_derived()
        if wiring not in WIRINGS:
            raise ValueError(f"wiring must be one of {WIRINGS}, got {wiring!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if selector not in SELECTORS:
            raise ValueError(f"selector must be one of {SELECTORS}, got {selector!r}")
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
        if not 0.0 <= sparsity < 1.0:
            raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
        if topk < 1 or euler_steps < 1 or delta_t <= 0:
            raise ValueError("topk and euler_steps must be >= 1 and delta_t > 0")
        if backbone_units - motor_neurons < 3 or motor_neurons < 1:
            raise ValueError("backbone_units must exceed motor_neurons by at least 3")
        self.config = dict(input_dim=input_dim, d_model=d_model, num_heads=num_heads, topk=topk, mode=mode,
                           sparsity=sparsity, euler_steps=euler_steps, delta_t=delta_t, causal=causal,
                           selector=selector, seed=seed, backbone_units=backbone_units,
                           motor_neurons=motor_neurons, eps=eps, wiring=wiring)
        self.input_dim, self.d_model, self.num_heads = input_dim, d_model, num_heads
        self.head_dim = d_model // num_heads
        self.topk, self.mode, self.selector, self.causal = topk, mode, selector, causal
        self.euler_steps, self.delta_t, self.eps = euler_steps, delta_t, eps

        # 1. sensory gates: sensory->inter masks of three AutoNCP wirings
        dense = wiring == "fc"  # NAC-FC: every connection of the same layers
        placeholder = dense or _MASKS_FROM_STATE.get()  # masks_from_state_dict: the stored masks come next
        self.sensory = nn.ModuleDict({
            name: SparseLinear(torch.ones(input_dim, d_model, dtype=torch.bool) if placeholder
                               else _sensory_mask(input_dim, d_model, sparsity, seed + i).clone())
            for i, name in enumerate(("q", "k", "v"))
        })
        # 5. backbone: inter -> command -> motor of an AutoNCP wiring over the 2d pair input
        self.wiring = _autoncp(backbone_units, motor_neurons, sparsity, seed + 3, 2 * self.head_dim)
        m_si, m_ic, m_cm = _layer_masks(self.wiring)
        if dense:
            m_si, m_ic, m_cm = (torch.ones_like(m) for m in (m_si, m_ic, m_cm))
        self.to_inter, self.to_command, self.to_motor = SparseLinear(m_si), SparseLinear(m_ic), SparseLinear(m_cm)
        self.head_phi = nn.Linear(motor_neurons, 1)
        self.head_omega = nn.Linear(motor_neurons, 1)
        self.time_affine = nn.Linear(2 * self.head_dim, 2)  # alpha, beta
        self.out = nn.Linear(d_model, d_model)

    # ---------------------------------------------------------------- pieces
    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sensory gates and head split: x (B, T, D_in) -> q, k, v each (B, H, T, d).

        The three gates run as one matrix product with their masked weights side by side.
        """
        B, T, _ = x.shape
        gates = [self.sensory[n] for n in ("q", "k", "v")]
        w = self.derived("qkv_weight", tuple(g.weight for g in gates),
                         lambda: torch.cat([g.masked_weight() for g in gates], 1))  # (D_in, 3 d_model)
        b = self.derived("qkv_bias", tuple(g.bias for g in gates), lambda: torch.cat([g.bias for g in gates]))
        qkv = torch.addmm(b, x.reshape(B * T, -1), w).view(B, T, 3, self.num_heads, self.head_dim)
        # unbind, not slicing: its backward stacks the three gradients instead of zero-filling a
        # (B, T, 3, H, d) tensor per slice
        return tuple(g.transpose(1, 2) for g in qkv.unbind(2))  # (B, H, T, d) each

    def _pair_weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """The first backbone layer and the time affine, split into their query and key halves.

        to_inter(u) and time_affine(u) of the pair input u = [q ; k] (2d) equal
        q @ Wq + k @ Wk + b, so each half is applied once per query and once per key
        (B H T d, not B H T K 2d), then the key half is gathered per pair and added.

        Returns: Wq (d, F), b (F,), Wk (d, F), F = N_inter + 2 (inter pre-activations, alpha, beta).
        """
        d = self.head_dim
        params = (self.to_inter.weight, self.to_inter.bias, self.time_affine.weight, self.time_affine.bias)

        def build():
            w = torch.cat([self.to_inter.masked_weight(), self.time_affine.weight.t()], 1)  # (2d, F)
            return w[:d], torch.cat([self.to_inter.bias, self.time_affine.bias]), w[d:]

        return self.derived("pair_weights", params, build)

    def _gate_heads(self) -> tuple[Tensor, Tensor]:
        """The phi and omega heads side by side: W (N_motor, 2), b (2,)."""
        params = (self.head_phi.weight, self.head_phi.bias, self.head_omega.weight, self.head_omega.bias)
        return self.derived("gate_heads", params, lambda: (
            torch.cat([self.head_phi.weight, self.head_omega.weight], 0).t(),
            torch.cat([self.head_phi.bias, self.head_omega.bias])))

    def fused_weights(self) -> tuple:
        """Every weight of the layer as the contiguous arrays that
        :func:`agent.nn.nac_kernels.fused_forward` reads (masks applied, gates side by side, the
        output map transposed; the gates' and the output map's weights and biases as torch tensors,
        the backbone's as NumPy arrays); kept between calls at inference (see :class:`DerivedWeights`; a
        submodule replaced by another after the first call also needs :meth:`clear_derived`)."""
        cache = self.__dict__.setdefault("_derived_cache", {})
        params = cache.get("fused_params")  # the Parameter objects (walking the modules costs ~15 us a call)
        if params is None:
            params = cache["fused_params"] = tuple(self.parameters())

        def build():
            with torch.no_grad():
                gates = [self.sensory[n] for n in ("q", "k", "v")]
                wqkv = torch.cat([g.masked_weight() for g in gates], 1)
                bqkv = torch.cat([g.bias for g in gates])
                wq, bq, wk = self._pair_weights()
                wh, bh = self._gate_heads()
                arrays = (wqkv, bqkv, wq, bq, wk, self.to_command.masked_weight(), self.to_command.bias,
                          self.to_motor.masked_weight(), self.to_motor.bias, wh, bh, self.out.weight.t(),
                          self.out.bias)
                # the sensory gates and the output map stay torch tensors (torch.addmm does them);
                # the rest are NumPy arrays for the compiled kernel
                return tuple(a.detach().contiguous() if i in nac_kernels.FUSED_TORCH_WEIGHTS
                             else a.detach().contiguous().numpy() for i, a in enumerate(arrays))

        return self.derived("fused", params, build)

    def solve_logits(self, phi: Tensor, omega: Tensor, tau: Tensor) -> Tensor:
        """a(tau) of da/dt = -omega a + phi, a(0) = 0, by the layer's mode (all tensors same shape)."""
        if self.mode == "steady":
            return phi / omega
        if self.mode == "exact":
            return phi / omega * -torch.expm1(-omega * tau)
        h = tau / self.euler_steps
        a = torch.zeros_like(phi)
        for _ in range(self.euler_steps):
            a = a + h * (phi - omega * a)
        return a

    def _select(self, q, k, qpos, key_mask):
        if self.selector == "blocks":
            return select_topk_blocks(q, k, self.topk, qpos, key_mask, self.causal)
        return select_topk_exact(q, k, self.topk, qpos, key_mask, self.causal)

    def _select_slots(self, q, k, qpos, key_mask) -> Tensor:
        """The layer's selector through the Triton kernels, as the int32 slot table (B, H, Tq, K) of
        :func:`agent.nn.nac_triton.topk_exact` with ``slots=True`` (-1 = no key): the same keys as
        :meth:`_select`."""
        Tk = k.shape[2]
        K = min(self.topk, Tk)
        with torch.no_grad():  # no gradient flows through the selection
            if self.selector == "blocks":
                bs, m = blocks_layout(Tk, self.topk)
                return nac_triton.topk_blocks(q, k, K, qpos, key_mask, self.causal, bs, m, slots=True)
            return nac_triton.topk_exact(q, k, K, qpos, key_mask, self.causal, slots=True)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, qpos: Tensor, key_mask: Tensor | None = None,
               q_times: Tensor | None = None, k_times: Tensor | None = None,
               return_intermediates: bool = False) -> tuple[Tensor, NACIntermediates | None]:
        """Steps 3-8 for queries q (B, H, Tq, d) over keys/values (B, H, Tk, d).

        qpos (Tq,) gives each query's key position; q_times (B, Tq) and k_times (B, Tk) are
        timestamps in seconds (or None). Returns o (B, Tq, d_model) and optional intermediates.

        Without intermediates, more than ``ATTEND_QUERY_CHUNK`` queries are processed that many
        at a time (the key side once), so the per-pair tensors, (B, H, chunk, K, ...), and the
        selectors' working memory bound the memory instead of (B, H, Tq, K, ...); the output is
        the same. The Triton path keeps no per-pair tensor, so it takes every query in one call
        (chunks would only multiply its kernel launches). Without intermediates, on CPU
        float32/float64 tensors, steps 4-8 run in the fused kernels of :mod:`agent.nn.nac_kernels`
        (the same function, no per-pair tensor at all), and on CUDA float32 tensors, when triton is
        installed, in the Triton kernels of :mod:`agent.nn.nac_triton` (``NAC_TRITON=off`` keeps the
        torch path; ``NAC_TRITON=on`` asks for them on any float32 tensors, CPU ones through
        Triton's interpreter).

        Raises:
            ImportError: ``NAC_TRITON=on`` without triton installed.
        """
        wq, bq, wk = self._pair_weights()
        whole = return_intermediates  # every query in one call (else chunks of ATTEND_QUERY_CHUNK)
        if not return_intermediates and nac_triton.applies(q, k, v, wq):
            whole = True
            # CUDA float32 (or NAC_TRITON=on): steps 4-8 in the Triton kernels of agent.nn.nac_triton.
            # q, k, v laid out once: the matrix products and the kernels then read them as they are
            # (each would copy the transposed views of the projection on its own: launches on a GPU)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            k_half = k @ wk  # (B, H, Tk, F): the key half of the first layer

            def one(qc, pc, tc, _intermediates=False):
                return self._attend_kernels(qc, k, v, k_half, wq, bq, pc, key_mask, tc, k_times, triton=True), None
        elif not return_intermediates and nac_kernels.applies(q, k, v, wq):
            # the key side laid out once for every chunk of queries: v contiguous, and k as a view
            # of its contiguous transpose (B, H, d, Tk), which the ranking kernels read
            k = k.transpose(-1, -2).contiguous().transpose(-1, -2)
            v = v.contiguous()
            k_half = k @ wk  # (B, H, Tk, F): the key half of the first layer

            def one(qc, pc, tc, _intermediates=False):
                return self._attend_kernels(qc, k, v, k_half, wq, bq, pc, key_mask, tc, k_times), None
        else:
            kv = torch.cat([k @ wk, v], -1)  # (B, H, Tk, F + d): the key half of the first layer, and v

            def one(qc, pc, tc, intermediates=False):
                return self._attend_queries(qc, k, kv, wq, bq, pc, key_mask, tc, k_times, intermediates)
        Tq = q.shape[2]
        if whole or Tq <= ATTEND_QUERY_CHUNK:
            return one(q, qpos, q_times, return_intermediates)
        C = ATTEND_QUERY_CHUNK
        outs = [one(q[:, :, s:s + C], qpos[s:s + C], None if q_times is None else q_times[:, s:s + C])[0]
                for s in range(0, Tq, C)]
        return torch.cat(outs, 1), None

    def _attend_kernels(self, q, k, v, k_half, wq, bq, qpos, key_mask, q_times, k_times,
                        triton: bool = False) -> Tensor:
        """:meth:`attend` for one block of queries through fused kernels: the CPU kernels of
        :mod:`agent.nn.nac_kernels`, or with ``triton`` the Triton kernels of
        :mod:`agent.nn.nac_triton`; k_half (B, H, Tk, F) is the key half of the first layer.
        Returns o (B, Tq, d_model)."""
        B, H, Tq, d = q.shape
        if triton:
            # the selector writes the int32 slot table the pair kernel reads (no conversions between
            # them): on a GPU each operation is a kernel launch, and at T <= 1024 the launches, not
            # the arithmetic, set the layer's time
            idx, valid = self._select_slots(q, k, qpos, key_mask), None  # (B, H, Tq, K) int32
            pair_attention = nac_triton.pair_attention
        else:
            idx, valid = self._select(q, k, qpos, key_mask)  # (B, H, Tq, K)
            pair_attention = nac_kernels.pair_attention
        q_half = q @ wq + bq  # (B, H, Tq, F)
        wh, bh = self._gate_heads()
        if triton:  # the kernel reads it contiguous: kept so at inference, not copied every call
            wh = self.derived("gate_heads_contiguous", (self.head_phi.weight, self.head_omega.weight), wh.contiguous)
        backbone = (self.to_command.masked_weight(), self.to_command.bias, self.to_motor.masked_weight(),
                    self.to_motor.bias, wh, bh)
        o = pair_attention(q_half, k_half, v, idx, valid, backbone, q_times, k_times, self.mode, self.delta_t,
                           self.eps, self.euler_steps)  # (B, Tq, H, d)
        return self.out(o.reshape(B, Tq, H * d))

    def _attend_queries(self, q, k, kv, wq, bq, qpos, key_mask, q_times, k_times, return_intermediates):
        """:meth:`attend` for one block of queries; kv (B, H, Tk, F + d) is the key side and
        wq (d, F), bq (F,) the query half of :meth:`_pair_weights`."""
        B, H, Tq, d = q.shape
        Tk = k.shape[2]
        idx, valid = self._select(q, k, qpos, key_mask)  # (B, H, Tq, K)
        K = idx.shape[-1]
        # steps 4-5, first layer: per-query and per-key halves, then one gather of [key half ; v]
        F_ = wq.shape[1]
        n_inter = F_ - 2
        q_half = q @ wq + bq  # (B, H, Tq, F)
        rows = idx + (torch.arange(B * H, device=q.device) * Tk).view(B, H, 1, 1)  # (B, H, Tq, K)
        pair = kv.reshape(B * H * Tk, F_ + d).index_select(0, rows.reshape(-1)).view(B, H, Tq, K, F_ + d)
        # split/unbind rather than slicing: their backward writes each gradient once (a slice's
        # backward zero-fills a full-size tensor per slice)
        k_half, vj = pair.split([F_, d], -1)  # (B, H, Tq, K, F), (B, H, Tq, K, d)
        pre_inter, pre_time = (k_half + q_half.unsqueeze(3)).split([n_inter, 2], -1)
        inter = fast_tanh(pre_inter)  # (B, H, Tq, K, N_inter)
        alpha, beta = pre_time.unbind(-1)  # (B, H, Tq, K) each
        command = fast_tanh(self.to_command(inter))  # (B, H, Tq, K, N_command)
        motor = fast_tanh(self.to_motor(command))  # (B, H, Tq, K, N_motor)
        wh, bh = self._gate_heads()
        gates = motor @ wh + bh  # (B, H, Tq, K, 2)
        a_phi, a_omega = gates.unbind(-1)  # (B, H, Tq, K) each
        phi = torch.sigmoid(a_phi)
        omega = F.softplus(a_omega) + self.eps
        if q_times is not None and k_times is not None:
            # key age in seconds, subtracted in the timestamps' own dtype (float64 clock times keep
            # their precision) and only then cast
            k_age = k_times[:, None, None, :].expand(B, H, Tq, Tk).gather(-1, idx)
            age = (q_times[:, None, :, None] - k_age).to(phi.dtype)  # (B, H, Tq, K)
            t_gate = torch.sigmoid(alpha * age + beta)  # (B, H, Tq, K)
        else:  # age 1 for every pair
            t_gate = torch.sigmoid(alpha + beta)
        logits = self.solve_logits(phi, omega, self.delta_t * t_gate)  # (B, H, Tq, K)
        weights = torch.softmax(logits.masked_fill(~valid, -1e9), dim=-1) * valid  # (B, H, Tq, K)
        o = ((weights * t_gate).unsqueeze(-2) @ vj).squeeze(-2)  # (B, H, Tq, d)
        o = self.out(o.transpose(1, 2).reshape(B, Tq, H * d))  # (B, Tq, d_model)
        inter_out = None
        if return_intermediates:
            inter_out = NACIntermediates(phi=phi, omega=omega, logits=logits, weights=weights, indices=idx,
                                         t_gate=t_gate, valid=valid,
                                         neurons=dict(inter=inter, command=command, motor=motor))
        return o, inter_out

    # ---------------------------------------------------------------- public API
    def forward(self, x: Tensor, t: Tensor | None = None, mask: Tensor | None = None,
                return_intermediates: bool = False):
        """Full-sequence forward.

        Args:
            x: (B, T, input_dim) float.
            t: (B, T) timestamps in seconds, or None (then t = 1 for every pair, as in the paper).
            mask: (B, T) bool, True = valid; invalid positions are never attended to.
            return_intermediates: also return a :class:`NACIntermediates`.

        Under ``torch.no_grad``, without intermediates, on CPU float32/float64 tensors with
        T <= ``nac_kernels.FUSED_MAX_T`` (either selector), the whole layer runs in one kernel call
        (:func:`agent.nn.nac_kernels.fused_forward`; the same function).

        Returns:
            y (B, T, d_model), or (y, intermediates).

        Raises:
            ValueError: if x is not 3-D with input_dim features, or t/mask are not (B, T).
        """
        if x.dim() != 3 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must be (B, T, {self.input_dim}), got {tuple(x.shape)}")
        B, T, _ = x.shape
        for name, a in (("t", t), ("mask", mask)):
            if a is not None and tuple(a.shape) != (B, T):
                raise ValueError(f"{name} must be (B, T) = ({B}, {T}), got {tuple(a.shape)}")
        if (not return_intermediates and T <= nac_kernels.FUSED_MAX_T and not torch.is_grad_enabled()
                and nac_kernels.applies(x, self.out.weight) and not nac_triton.applies(x, self.out.weight)):
            # no gradient asked for: the whole layer in one kernel call (the same function)
            blocks = blocks_layout(T, self.topk) if self.selector == "blocks" else None
            return nac_kernels.fused_forward(self.fused_weights(), x, t, mask, self.num_heads, min(self.topk, T),
                                             self.causal, self.mode, self.delta_t, self.eps, self.euler_steps,
                                             blocks)
        q, k, v = self.project(x)  # (B, H, T, d) each
        qpos = torch.arange(T, device=x.device)
        y, inter = self.attend(q, k, v, qpos, mask, t, t, return_intermediates)
        if not return_intermediates:
            return y
        inter.neurons["sensory"] = torch.cat([q, k, v], dim=1).transpose(1, 2).reshape(B, T, 3 * self.d_model)
        return y, inter

    def step(self, x: Tensor, cache: NACCache | None = None, t: Tensor | None = None, window: int | None = None,
             return_intermediates: bool = False):
        """Streaming inference: one new time step attends over the cached last frames.

        Equals the last position of ``forward`` on the same window (causal layers only).

        Args:
            x: (B, input_dim), the newest time step.
            cache: the previous call's cache, or None at the start of an episode.
            t: (B,) timestamp of the newest step in seconds, or None. Timestamps are cached in
                their own dtype (float64 clock times keep their precision).
            window: keep at most this many frames (the newest included); None keeps all.

        Returns:
            (y (B, d_model), cache) or (y, cache, intermediates) with T = 1 in the pair tensors.

        Raises:
            ValueError: if the layer is not causal, x is not (B, input_dim), t is not (B,), or
                timestamps are given on some steps only.
        """
        if not self.causal:
            raise ValueError("streaming needs a causal NAC (causal=True)")
        if x.dim() != 2 or x.shape[-1] != self.input_dim:
            raise ValueError(f"x must be (B, {self.input_dim}), got {tuple(x.shape)}")
        B = x.shape[0]
        if t is not None and t.numel() != B:
            raise ValueError(f"t must be (B,) = ({B},), got {tuple(t.shape)}")
        q, k, v = self.project(x.view(B, 1, self.input_dim))  # (B, H, 1, d)
        if cache is None:
            times = t.reshape(B, 1) if t is not None else None
            cache = NACCache(k, v, times)
        else:
            if (t is None) != (cache.times is None):
                raise ValueError("give timestamps on every streaming step or on none")
            times = torch.cat([cache.times, t.reshape(B, 1).to(cache.times.dtype)], 1) if t is not None else None
            mask = None
            if cache.mask is not None:  # the newest frame is always real
                mask = torch.cat([cache.mask, torch.ones(B, 1, dtype=torch.bool, device=x.device)], 1)
            cache = NACCache(torch.cat([cache.k, k], 2), torch.cat([cache.v, v], 2), times, mask)
        if window is not None and cache.length > window:
            cache = NACCache(cache.k[:, :, -window:], cache.v[:, :, -window:],
                             cache.times[:, -window:] if cache.times is not None else None,
                             cache.mask[:, -window:] if cache.mask is not None else None)
        L = cache.length
        qpos = torch.full((1,), L - 1, dtype=torch.long, device=x.device)
        qt = cache.times[:, -1:] if cache.times is not None else None
        y, inter = self.attend(q, cache.k, cache.v, qpos, cache.mask, qt, cache.times, return_intermediates)
        if not return_intermediates:
            return y[:, 0], cache
        inter.neurons["sensory"] = torch.cat([q, k, v], dim=1).transpose(1, 2).reshape(B, 1, 3 * self.d_model)
        return y[:, 0], cache, inter
