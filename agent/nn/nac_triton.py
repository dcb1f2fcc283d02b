"""A fused NAC attention kernel for CUDA, written in Triton (an optional extra: ``pip install -e .[triton]``).

What it computes: steps 4-8 of the NAC layer (:mod:`agent.nn.nac`; Razzaq et al., "Neuronal
Attention Circuit (NAC) for Representation Learning", arXiv 2512.10282, Section 2.3 and Eqs. 1-3)
for the keys a selector kept: the pair input's first backbone layer, the NCP backbone
inter -> command -> motor, the phi / omega gates, the time gate t_ij, the logit a_ij of
da/dt = -omega a + phi at tau_ij = delta_t t_ij (``steady`` Eq. 3, ``exact`` Eq. 2, ``euler``
Eq. 1 in N explicit steps), the softmax over the kept keys and o_i = sum_j w_ij t_ij v_j. The
same function, with the same arguments, as :class:`agent.nn.nac_kernels.PairAttention` (the CPU
kernels) and the torch path's :meth:`agent.nn.nac.NAC._attend_queries`; tests/test_nac_triton.py
compares them. Step 3, the selection of the K keys (no gradient, as in every path), has a Triton
kernel for each selector: :func:`topk_exact` (exact top-K) and :func:`topk_blocks` (the paper's
square-root partition, Section 2.3, Algorithm 2), which :func:`agent.nn.nac.select_topk_exact` and
:func:`agent.nn.nac.select_topk_blocks` use where :func:`applies`.

How: one Triton program per (batch x head, block of ``BLOCK_Q`` queries), the pairs of the tile as
rows of on-chip 2-D tiles, no per-pair tensor in global memory (FlashAttention's tiling over queries,
Dao et al. 2022, Section 3.1; the kernels are in :mod:`agent.nn._nac_triton_kernels`). The backward is
a second kernel that recomputes the tile's forward and runs the reverse pass by hand (FlashAttention's
recomputation, Section 3.1 "Recomputation"); see that module for the details.

When it runs: :meth:`agent.nn.nac.NAC.attend` uses it, without intermediates, on CUDA float32
tensors when triton is importable (``NAC_TRITON=auto``, the default); ``NAC_TRITON=off`` (or
:func:`set_mode` / :func:`use_triton`) keeps the torch path, and ``NAC_TRITON=on`` asks for it on
any float32 tensors (on the CPU that means Triton's interpreter, for tests) and fails with a clear
error where triton is not installed. It is never used on the CPU by default.

Devices: on CUDA tensors the kernels are compiled by Triton. On CPU tensors they run only in
Triton's interpreter, which ``TRITON_INTERPRET=1`` turns on and which must be set before triton is
first imported (Triton decides at import time, for every kernel of the process and on every device,
since its own library functions such as ``tl.sigmoid`` are jitted when ``triton.language`` is
imported); it is slow (numpy per tile operation) and meant for tests at small sizes.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os

import torch
from torch import Tensor

#: where the NAC layer uses the Triton kernels: "auto" (CUDA float32 tensors, triton installed),
#: "on" (every float32 tensor; CPU ones through Triton's interpreter) or "off"
BACKEND_MODES = ("auto", "on", "off")
INSTALL_HINT = "install the triton extra: pip install -e .[triton]"
#: queries per program (a power of two); the pairs per program are BLOCK_Q * next_pow2(K), at least 16
BLOCK_Q = 16
#: keys the exact selector scores at once (one ``tl.dot`` of BLOCK_Q x BLOCK_K), a power of two >= 16
BLOCK_K = 32
#: the exact selector's launch tunables (see :func:`topk_exact`); the values measured on an H200 on 2026-11-27
SELECT_TUNING = {"block_k": BLOCK_K, "num_warps": 4, "precheck": False}


def _env_mode() -> str:
    mode = os.environ.get("NAC_TRITON", "auto").strip().lower()
    return mode if mode in BACKEND_MODES else "auto"


_MODE = _env_mode()


@functools.lru_cache(maxsize=1)
def installed() -> bool:
    """Whether the ``triton`` package can be imported (looked up once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def mode() -> str:
    """The current backend mode (see :data:`BACKEND_MODES`)."""
    return _MODE


def set_mode(new: str) -> str:
    """Set the backend mode for this process ("auto", "on" or "off"); returns the previous one.

    Raises:
        ValueError: for another value.
    """
    global _MODE
    if new not in BACKEND_MODES:
        raise ValueError(f"NAC Triton mode must be one of {BACKEND_MODES}, got {new!r}")
    before, _MODE = _MODE, new
    return before


@contextlib.contextmanager
def use_triton(new: str | bool = "on"):
    """Within this block the NAC layer's Triton mode is ``new`` (``True`` = "on", ``False`` = "off");
    the previous mode is restored afterwards. Not thread-safe (a module-wide switch)."""
    before = set_mode({True: "on", False: "off"}.get(new, new) if isinstance(new, bool) else new)
    try:
        yield
    finally:
        set_mode(before)


def applies(*tensors: Tensor) -> bool:
    """Whether :meth:`agent.nn.nac.NAC.attend` should use the Triton kernels for these tensors.

    "auto": triton installed and every tensor a CUDA float32 tensor. "on": every tensor float32,
    on any device. "off": never.

    Raises:
        ImportError: in "on" mode when triton is not installed (:data:`INSTALL_HINT`).
    """
    if _MODE == "off":
        return False
    if not all(t.dtype == torch.float32 for t in tensors):
        return False
    if _MODE == "on":
        if not installed():
            raise ImportError(f"the NAC layer's Triton kernels were asked for (NAC_TRITON=on) but triton is not "
                              f"installed; {INSTALL_HINT}")
        return True
    return installed() and all(t.is_cuda for t in tensors)


def kernels():
    """The kernels module :mod:`agent.nn._nac_triton_kernels` (imported on first use).

    Raises:
        ImportError: when triton is not installed (:data:`INSTALL_HINT`).
    """
    try:
        from agent.nn import _nac_triton_kernels
    except ImportError as e:
        if installed():
            raise
        raise ImportError(f"the NAC layer's Triton kernels need triton; {INSTALL_HINT}") from e
    return _nac_triton_kernels


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` was set when triton was
    first imported; it decides for every kernel of the process, on every device).

    Raises:
        ImportError: when triton is not installed (:data:`INSTALL_HINT`).
    """
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernels().nac_pair_fwd, InterpretedFunction)


def _ready(device: torch.device):
    """The kernels module, after checking that they can run on ``device``."""
    kn = kernels()
    if device.type != "cuda" and not interpreted():
        raise RuntimeError(f"the NAC Triton kernels run on {device.type} tensors only in Triton's interpreter: set "
                           "TRITON_INTERPRET=1 before triton is first imported (or use CUDA tensors)")
    return kn


def _pow2(n: int, floor: int = 1) -> int:
    return max(floor, 1 << max(0, int(n) - 1).bit_length())


def _layout(q_half, k_half, v, idx, valid, Wc, Wm, q_times, k_times, block_q):
    """Contiguous float32 operands, the int32 slot table (-1 = no key; ``valid`` None: ``idx`` is
    that table already) and the launch constants."""
    B, H, Tq, F = q_half.shape
    Tk, D = v.shape[2], v.shape[3]
    K = idx.shape[-1]
    Ni, Nc, Nm = Wc.shape[0], Wc.shape[1], Wm.shape[1]
    if F != Ni + 2:
        raise ValueError(f"q_half has {F} features, the backbone's inter layer {Ni} (+2 expected)")
    KP = _pow2(K)
    bq = _pow2(block_q if block_q is not None else BLOCK_Q)
    bq = max(bq, _pow2(-(-16 // KP)))  # at least 16 pairs per program (tl.dot's smallest tile)
    # the kernels read one int32 slot table, -1 = no key (the selectors write it so with slots=True)
    ix = idx.contiguous() if valid is None else torch.where(valid, idx, -1).to(torch.int32).contiguous()
    has_t = q_times is not None and k_times is not None
    if has_t:
        dt = torch.promote_types(q_times.dtype, k_times.dtype)  # the difference in the stamps' own dtype
        qt, kt = q_times.to(dt).contiguous(), k_times.to(dt).contiguous()
    else:
        qt = kt = _placeholder(q_half.device, torch.float32)
    shape = dict(B=B, H=H, Tq=Tq, Tk=Tk, K=K, Ni=Ni, Nc=Nc, Nm=Nm, D=D, F=F)
    const = dict(HAS_T=has_t, BLOCK_Q=bq, KP=KP, NIP=_pow2(Ni, 16), NCP=_pow2(Nc, 16), NMP=_pow2(Nm, 16),
                 DP=_pow2(D))
    return ix, qt, kt, shape, const


def _check(q_half, k_half, v, idx, valid, weights, mode):
    tensors = (q_half, k_half, v, *weights)
    if any(t.dtype != torch.float32 for t in tensors):
        raise TypeError("the NAC Triton kernels take float32 tensors, got "
                        f"{sorted({str(t.dtype) for t in tensors})}")
    devices = {t.device for t in (*tensors, idx) + (() if valid is None else (valid,))}
    if len(devices) != 1:
        raise ValueError(f"the NAC Triton kernels need every tensor on one device, got {devices}")
    if mode not in ("steady", "exact", "euler"):
        raise ValueError(f"mode must be 'steady', 'exact' or 'euler', got {mode!r}")
    B, H, Tq, _ = q_half.shape
    if valid is None:
        if idx.dtype != torch.int32 or idx.dim() != 4 or tuple(idx.shape[:3]) != (B, H, Tq):
            raise ValueError(f"without valid, idx must be the int32 slot table (B, H, Tq, K) = ({B}, {H}, {Tq}, K) "
                             f"(-1 = no key), got {idx.dtype} {tuple(idx.shape)}")
    elif idx.shape != valid.shape or tuple(idx.shape[:3]) != (B, H, Tq):
        raise ValueError(f"idx and valid must be (B, H, Tq, K) = ({B}, {H}, {Tq}, K), got {tuple(idx.shape)} "
                         f"and {tuple(valid.shape)}")
    if k_half.shape[:3] != v.shape[:3] or k_half.shape[3] != q_half.shape[3]:
        raise ValueError(f"k_half (B, H, Tk, F) and v (B, H, Tk, d) do not fit q_half {tuple(q_half.shape)}: "
                         f"{tuple(k_half.shape)}, {tuple(v.shape)}")


class TritonPairAttention(torch.autograd.Function):
    """Steps 4-8 of the NAC layer for the selected pairs, forward and backward in Triton kernels.

    ``TritonPairAttention.apply(q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times,
    k_times, mode, delta_t, eps, euler_steps, block_q)``: the arguments of
    :class:`agent.nn.nac_kernels.PairAttention`, plus ``block_q`` (queries per program, None for
    :data:`BLOCK_Q`; rounded up to a power of two).

    Args:
        q_half: (B, H, Tq, F) float32, the query half of the first backbone layer and of the time
            affine, bias included (``q @ Wq + b``; :meth:`agent.nn.nac.NAC._pair_weights`), F = N_i + 2.
        k_half: (B, H, Tk, F) float32, the key half (``k @ Wk``).
        v: (B, H, Tk, d) float32 values.
        idx, valid: (B, H, Tq, K) the selected keys (int64) and whether each slot holds one (bool);
            or idx the int32 slot table of the selectors' ``slots=True`` (-1 = no key) and valid None.
        Wc (N_i, N_c), bc (N_c,), Wm (N_c, N_m), bm (N_m,), Wh (N_m, 2), bh (2,): the backbone's
            inter -> command and command -> motor layers (masked weights) and the phi / omega heads.
        q_times (B, Tq), k_times (B, Tk): timestamps in seconds (the age is their difference in
            their own dtype, then float32), or both None (age 1, as in the paper).
        mode: "steady", "exact" or "euler"; delta_t: the horizon scale (tau = delta_t t_ij);
            eps: omega's lower bound; euler_steps: N in "euler" mode.

    Returns:
        o (B, Tq, H, d) float32: per head, sum_j w_ij t_ij v_j over the kept keys (0 for a query
        without a valid key), so ``o.reshape(B, Tq, H * d)`` is the heads' concatenation.

    Gradients flow to q_half, k_half, v and the six backbone tensors (not to the selection or the
    timestamps); the backward is not itself differentiable. dk_half and dv are summed with atomic
    adds (their order, and so their last bits, may vary between runs on a GPU).

    Raises:
        TypeError: tensors that are not float32. ValueError: mismatched shapes, devices or mode.
        ImportError: triton not installed (:data:`INSTALL_HINT`).
    """

    @staticmethod
    def forward(ctx, q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, mode, delta_t, eps,
                euler_steps, block_q=None):
        weights = (Wc, bc, Wm, bm, Wh, bh)
        _check(q_half, k_half, v, idx, valid, weights, mode)
        kn = _ready(q_half.device)
        q_half, k_half, v = (t.contiguous() for t in (q_half, k_half, v))
        weights = tuple(w.contiguous() for w in weights)
        ix, qt, kt, s, const = _layout(q_half, k_half, v, idx, valid, Wc, Wm, q_times, k_times, block_q)
        out = torch.empty(s["B"], s["Tq"], s["H"], s["D"], dtype=torch.float32, device=q_half.device)
        grid = (-(-s["Tq"] // const["BLOCK_Q"]), s["B"] * s["H"])
        args = (s["H"], s["Tq"], s["Tk"], s["K"], s["Ni"], s["Nc"], s["Nm"], s["D"], s["F"], float(delta_t),
                float(eps), int(euler_steps))
        if s["Tq"] and s["B"] * s["H"]:
            kn.nac_pair_fwd[grid](q_half, k_half, v, ix, *weights, qt, kt, out, *args,
                                                             MODE=kn.MODE_IDS[mode], **const)
        ctx.save_for_backward(q_half, k_half, v, ix, qt, kt, *weights)
        ctx.launch = (grid, args, kn.MODE_IDS[mode], const, s)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q_half, k_half, v, ix, qt, kt, *weights = ctx.saved_tensors
        grid, args, mode_id, const, s = ctx.launch
        kn = _ready(q_half.device)
        Ni, Nc, Nm = s["Ni"], s["Nc"], s["Nm"]
        sizes = (Ni * Nc, Nc, Nc * Nm, Nm, Nm * 2, 2)
        nw = sum(sizes)
        dq = torch.zeros_like(q_half)
        dk = torch.zeros_like(k_half)
        dv = torch.zeros_like(v)
        parts = torch.zeros(grid[0] * grid[1], nw, dtype=torch.float32, device=q_half.device)
        if s["Tq"] and s["B"] * s["H"]:
            kn.nac_pair_bwd[grid](
                q_half, k_half, v, ix, *weights, qt, kt, grad_out.to(torch.float32).contiguous(), dq, dk, dv, parts,
                *args, nw, MODE=mode_id, **const)
        flat = parts.sum(0)  # the programs' partial sums, in a fixed order
        dws = [g.view(w.shape) for g, w in zip(flat.split(sizes), weights)]
        return (dq, dk, dv, None, None, *dws, None, None, None, None, None, None, None)


_PLACEHOLDERS: dict = {}


def _placeholder(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A one-element tensor for a pointer argument the kernel does not read (no key mask, no
    timestamps), kept per device and dtype so that a call allocates (on CUDA: launches) nothing for it."""
    key = (device, dtype)
    t = _PLACEHOLDERS.get(key)
    if t is None:
        t = _PLACEHOLDERS[key] = torch.zeros(1, dtype=dtype, device=device)
    return t


def _select_args(q, k, qpos, key_mask, block_q):
    if q.dtype != torch.float32 or k.dtype != torch.float32:
        raise TypeError(f"the NAC Triton selectors take float32 q and k, got {q.dtype} and {k.dtype}")
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    if k.shape[:2] != q.shape[:2] or k.shape[3] != d or tuple(qpos.shape) != (Tq,):
        raise ValueError(f"q (B, H, Tq, d), k (B, H, Tk, d) and qpos (Tq,) do not fit: {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(qpos.shape)}")
    if key_mask is not None and tuple(key_mask.shape) != (B, Tk):
        raise ValueError(f"key_mask must be (B, Tk) = ({B}, {Tk}), got {tuple(key_mask.shape)}")
    kmask = key_mask.to(torch.int8).contiguous() if key_mask is not None else _placeholder(q.device, torch.int8)
    bq = _pow2(block_q if block_q is not None else BLOCK_Q)
    return B, H, Tq, Tk, d, q.contiguous(), k.contiguous(), qpos.to(torch.int64).contiguous(), kmask, bq


def topk_exact(q: Tensor, k: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None, causal: bool,
               block_q: int | None = None, block_k: int | None = None, num_warps: int | None = None,
               precheck: bool | None = None, slots: bool = False) -> tuple[Tensor, Tensor] | Tensor:
    """The exact selector (step 3 of :mod:`agent.nn.nac`) in a Triton kernel: for each query the K
    allowed keys of highest score q . k (keys up to the query's position when causal, unmasked
    ones), ``block_q`` queries per program, the keys scored ``block_k`` at a time and merged into a
    running best-K per query (ties keep the earlier key). The same selection as
    :func:`agent.nn.nac.select_topk_exact` (the slots in another order: the attention is a sum over
    them, so the order does not matter).

    Args:
        q: (B, H, Tq, d) float32; k: (B, H, Tk, d) float32, on one device.
        K: keys per query, 1 <= K <= Tk. qpos: (Tq,) int64, each query's key position.
        key_mask: (B, Tk) bool, True = valid key, or None. causal: only keys j <= qpos.
        block_q: queries per program (None: :data:`BLOCK_Q`; at least 16).
        block_k, num_warps, precheck: the kernel's tunables, None for :data:`SELECT_TUNING`: keys
            scored at once (a power of two >= 16), warps per program, and whether a key block first
            checks that some score beats a query's lowest kept before its merge rounds. They change
            the speed, never the selection (``agent bench nac --device cuda --selector-sweep``).
        slots: return the int32 slot table the pair kernels read instead (below).

    Returns:
        idx (B, H, Tq, K) int64 (0 where not valid) and valid (B, H, Tq, K) bool; with ``slots``,
        one (B, H, Tq, K) int32 table, the key or -1 where no key (one kernel writes it: no
        conversions after it, which on a GPU are launches of their own).

    Raises:
        TypeError: q or k not float32. ValueError: shapes that do not fit, K outside [1, Tk], a
        block_k that is not a power of two >= 16, num_warps not in 1, 2, 4, 8.
        ImportError: triton not installed. RuntimeError: CPU tensors without Triton's interpreter.
    """
    B, H, Tq, Tk, d, q, k, qpos, kmask, bq = _select_args(q, k, qpos, key_mask, block_q)
    if not 1 <= K <= Tk:
        raise ValueError(f"K must be in [1, Tk = {Tk}], got {K}")
    bk = SELECT_TUNING["block_k"] if block_k is None else int(block_k)
    warps = SELECT_TUNING["num_warps"] if num_warps is None else int(num_warps)
    pre = SELECT_TUNING["precheck"] if precheck is None else bool(precheck)
    if bk < 16 or bk & (bk - 1) or warps not in (1, 2, 4, 8):
        raise ValueError(f"block_k must be a power of two >= 16 and num_warps 1, 2, 4 or 8, got {bk} and {warps}")
    kn = _ready(q.device)
    idx, valid = _select_out(B, H, Tq, K, q.device, slots)
    if Tq and B * H:
        bq = _pow2(bq, 16)  # tl.dot's smallest tile
        kn.nac_topk_exact[(-(-Tq // bq), B * H)](q, k, qpos, kmask, idx, valid, H, Tq, Tk, d, K,
                                                 HAS_MASK=key_mask is not None, CAUSAL=bool(causal),
                                                 BLOCK_Q=bq, KP=_pow2(K), DP=_pow2(d, 16), BLOCK_K=bk,
                                                 PRECHECK=pre, SLOTS=bool(slots), num_warps=warps)
    return idx if slots else (idx, valid.bool())


def _select_out(B, H, Tq, K, device, slots):
    """The selectors' outputs: (int32 slot table, an unused placeholder) or (int64 idx, int8 valid)."""
    if slots:
        return torch.empty(B, H, Tq, K, dtype=torch.int32, device=device), _placeholder(device, torch.int8)
    return (torch.empty(B, H, Tq, K, dtype=torch.int64, device=device),
            torch.empty(B, H, Tq, K, dtype=torch.int8, device=device))


def topk_blocks(q: Tensor, k: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None, causal: bool,
                block_size: int, n_blocks: int, block_q: int | None = None,
                slots: bool = False) -> tuple[Tensor, Tensor] | Tensor:
    """The blocks selector (the NAC paper's sub-quadratic square-root partition, Section 2.3,
    Algorithm 2) in a Triton kernel: keys in blocks of ``block_size``; each query scores the block
    centroids (the means of the valid keys, computed here in torch as
    :func:`agent.nn.nac.select_topk_blocks` does), keeps ``n_blocks`` blocks (when causal: its own
    block and the n_blocks - 1 best among the blocks that end before it) and takes the K best
    allowed keys inside them, streamed one at a time. The same selection as
    :func:`agent.nn.nac.select_topk_blocks` (slots in another order; ties keep the earlier key).

    Args: as :func:`topk_exact`, plus block_size >= 1 and 1 <= n_blocks <= ceil(Tk / block_size)
    (:func:`agent.nn.nac.blocks_layout`). Returns and raises: as :func:`topk_exact`.
    """
    B, H, Tq, Tk, d, q, k, qpos, kmask, bq = _select_args(q, k, qpos, key_mask, block_q)
    bs, m = int(block_size), int(n_blocks)
    nb = -(-Tk // bs) if bs >= 1 else 0
    if not 1 <= K <= Tk or not (bs >= 1 and 1 <= m <= nb):
        raise ValueError(f"K must be in [1, Tk = {Tk}] and (block_size, n_blocks) fit Tk, got K={K}, "
                         f"({block_size}, {n_blocks})")
    kn = _ready(q.device)
    with torch.no_grad():  # the centroids as select_topk_blocks computes them
        valid_keys = key_mask if key_mask is not None else torch.ones(B, Tk, dtype=torch.bool, device=q.device)
        pad = nb * bs - Tk
        kb = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(B, H, nb, bs, d)
        mb = torch.nn.functional.pad(valid_keys, (0, pad), value=False).view(B, 1, nb, bs)
        count = mb.sum(-1)  # (B, 1, nb)
        cent = ((kb * mb[..., None]).sum(3) / count.clamp(min=1)[..., None]).contiguous()  # (B, H, nb, d)
        block_ok = (count[:, 0] > 0).to(torch.int8).contiguous()  # (B, nb)
    n_other = m - 1 if causal else m
    idx, valid = _select_out(B, H, Tq, K, q.device, slots)
    if Tq and B * H:
        kn.nac_topk_blocks[(-(-Tq // bq), B * H)](q, k, qpos, kmask, cent, block_ok, idx, valid, H, Tq, Tk, d, K, bs,
                                                  nb, n_other, HAS_MASK=key_mask is not None, CAUSAL=bool(causal),
                                                  BLOCK_Q=bq, KP=_pow2(K), MP=_pow2(n_other), DP=_pow2(d),
                                                  SLOTS=bool(slots))
    return idx if slots else (idx, valid.bool())


def compile_kernels(arch: int = 90, modes: tuple[str, ...] = ("steady", "exact", "euler"), with_times=(True, False),
                    selectors: tuple[bool, ...] = (True, False)) -> list[str]:
    """Compile the kernels ahead of time for an NVIDIA GPU of compute capability ``arch`` (90: H100)
    down to its machine code (cubin), with Triton's bundled ptxas: no GPU or driver needed, so a
    CPU machine can check that the compiled (not interpreted) kernels build. Representative sizes:
    K = 8, d = 8, the default backbone (16-wide tiles). Needs ``TRITON_INTERPRET`` unset when triton
    was first imported.

    Args:
        arch: compute capability as an int (80: A100, 90: H100/H200).
        modes: the ODE modes whose forward and backward to build.
        with_times: build them with timestamps (True) and/or without (False).
        selectors: causal values to build both selectors with.

    Returns:
        one line per compiled kernel: its name and constants.

    Raises:
        RuntimeError: under Triton's interpreter. ImportError: triton not installed.
        triton.CompilationError (or the backend's error): a kernel that does not build.
    """
    kn = kernels()
    if interpreted():
        raise RuntimeError("compile_kernels needs TRITON_INTERPRET unset when triton is first imported")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", int(arch), 32)
    types = {n: "*fp32" for n in ("qh", "kh", "v", "wc", "bc", "wm", "bm", "wh", "bh", "out", "dout", "dqh", "dkh",
                                  "dv", "dw_part", "q", "k", "cent")}
    types.update(ix="*i32", qt="*fp64", kt="*fp64", delta_t="fp32", eps="fp32", qpos="*i64", kmask="*i8",
                 block_ok="*i8", idx_out="*i64", valid_out="*i8")
    jobs = []
    for m in modes:
        for has_t in with_times:
            const = dict(HAS_T=has_t, MODE=kn.MODE_IDS[m], BLOCK_Q=BLOCK_Q, KP=8, NIP=16, NCP=16, NMP=16, DP=8)
            jobs += [(kn.nac_pair_fwd, const), (kn.nac_pair_bwd, const)]
    for causal in selectors:
        const = dict(HAS_MASK=True, CAUSAL=causal, BLOCK_Q=BLOCK_Q, KP=8, DP=8)
        jobs += [(kn.nac_topk_exact, dict(const, DP=16, BLOCK_K=BLOCK_K, PRECHECK=pre, SLOTS=sl))
                 for pre in (False, True) for sl in (False, True)]
        jobs += [(kn.nac_topk_blocks, dict(const, MP=2, SLOTS=sl)) for sl in (False, True)]
    done = []
    for fn, const in jobs:
        sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in fn.arg_names}
        if const.get("SLOTS"):
            sig["idx_out"] = "*i32"
        compiled = triton.compile(ASTSource(fn, sig, const), target=target)
        if "cubin" not in compiled.asm:
            raise RuntimeError(f"{fn.__name__} {const}: no cubin")
        done.append(f"{fn.__name__} {const}")
    return done


def pair_attention(q_half: Tensor, k_half: Tensor, v: Tensor, idx: Tensor, valid: Tensor,
                   backbone: tuple[Tensor, ...], q_times: Tensor | None, k_times: Tensor | None,
                   mode: str, delta_t: float, eps: float, euler_steps: int, block_q: int | None = None) -> Tensor:
    """:class:`TritonPairAttention` (see there for shapes, units and errors); ``backbone`` =
    (Wc, bc, Wm, bm, Wh, bh). The same signature as :func:`agent.nn.nac_kernels.pair_attention`,
    plus ``block_q``, the queries per program (None: :data:`BLOCK_Q`)."""
    return TritonPairAttention.apply(q_half, k_half, v, idx, valid, *backbone, q_times, k_times, mode, delta_t, eps,
                                     euler_steps, block_q)


__all__ = ["BACKEND_MODES", "BLOCK_K", "BLOCK_Q", "INSTALL_HINT", "SELECT_TUNING", "TritonPairAttention", "applies", "compile_kernels",
           "installed", "interpreted",
           "kernels", "mode", "pair_attention", "set_mode", "topk_blocks", "topk_exact", "use_triton"]
