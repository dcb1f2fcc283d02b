"""Fused CPU kernels of the NAC layer's attention (steps 3-8 of :mod:`agent.nn.nac`), compiled by Numba.

Why: on the CPU, the layer's per-pair work is small (at T=1024, B=1 about 25 M multiply-adds) but
spread over about 60 torch operations, each of which reads and writes a (B, H, T, K, N) tensor
and pays the dispatcher's per-op cost; the exact selector's ``topk`` over the (T, T) scores cost
more than the rest. Issue 12 asks for the layer at the cost of torch's fused attention. These
kernels do the selection a query at a time and the pair computation a tile of pairs at a time,
so no per-pair tensor is ever built:

- :func:`topk_exact`: the exact selector's ranking. For each query, its scores q . k over the
  allowed keys (four queries' rows at a time, no (Tq, Tk) matrix), and their K highest found by
  counting above a threshold (a first guess from the scores' mean and spread, then bisection;
  vectorised counts, no per-key branch; causal and key-mask rules as
  :func:`agent.nn.nac.select_topk_exact`).
- :func:`topk_blocks`: the blocks selector (paper Section 2.3, Algorithm 2) a query at a time:
  centroids, the chosen blocks, the top K inside them (as :func:`agent.nn.nac.select_topk_blocks`).
- :class:`PairAttention`: given the selected keys, the first backbone layer's query and key halves
  (see :meth:`agent.nn.nac.NAC._pair_weights`) and the values, compute for every kept pair
  inter -> command -> motor -> (phi, omega), the time gate, the ODE logit (steady / exact /
  Euler, paper Eqs. 1-3), the softmax over the kept keys and the weighted sum of values, for
  ``TILE_QUERIES`` queries' pairs at a time with the pairs innermost (so the loops vectorise).
  The forward keeps nothing per pair: the backward computes each tile's activations again
  (FlashAttention's recomputation) and returns the gradients of every input that has one. The
  selection itself has no gradient, as in the torch path.
- :func:`fused_forward`: the whole layer without gradients (sensory gates, heads, the ranking of
  either selector, the pairs and the output map) in one kernel call between two torch GEMMs, for the no-grad forward of
  :meth:`agent.nn.nac.NAC.forward`: at short sequences the Python around fifteen torch operations
  and three kernel calls cost more than the arithmetic.

Both compute the same function as the torch path in :mod:`agent.nn.nac` (tests/test_nn_nac_kernels.py
compares outputs and gradients in float32 and float64, for every mode, selector, mask and
timestamp case, and runs ``gradcheck`` on the backward; tests/test_nn_nac.py runs every layer test
through both paths). float64 work is exact to rounding; float32 work uses fast approximations of
tanh and exp (see ``_tanh``), well inside float32's precision.

When they run: on CPU tensors of float32 or float64, when Numba is importable, and unless the
environment variable ``NAC_DRIVE_KERNELS=torch`` (or :func:`use_kernels` / :func:`set_enabled`)
turns them off. Elsewhere (CUDA, half precision, intermediates for the runner's traces) the layer
uses its torch path.

Threads: each kernel call runs on as many threads as torch uses (``torch.get_num_threads()``,
capped by ``numba.config.NUMBA_NUM_THREADS``, and set for the calling thread with
``numba.set_num_threads`` at each call), over work that is independent, split the way
FlashAttention splits attention (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact
Attention with IO-Awareness", Section 3.1 and its parallelism over batch, heads and blocks of
queries), with Numba's explicit parallel loops (``numba.prange`` in a function compiled with
``parallel=True``; Numba's documentation, "Automatic parallelization with @jit", "Explicit
Parallel Loops"):

- the selectors and :func:`fused_forward`: first each head (batch x head) on its own (its key
  norms or block centroids; for :func:`fused_forward` also its heads' layout and first-layer
  halves), then (head, block of queries) items; the blocks are whole heads unless B H gives fewer
  than ``ITEMS_PER_THREAD`` items a thread (B = 1 with 4 heads), and whole groups of four
  queries (the score loop's) or whole tiles;
- :class:`PairAttention`'s forward: its tiles of ``TILE_QUERIES`` query rows (of B H Tq);
- its backward: whole heads (batch x head; several to a tile when a head has fewer than
  ``TILE_QUERIES`` queries), each a tile at a time in order: it computes the tile's
  activations again (nothing per pair is kept by the forward) and adds the tile's gradients into
  the head's own query, key and value rows (only a head's queries select its keys), query after
  query and slot after slot, and the backbone weights' gradients into the head's own sums; then
  the heads' sums are added serially in head order.

Every output element is thus computed by the same float operations in the same order on any
number of threads, the serial kernels' order (tests/test_nn_nac_kernels.py checks bit-identical
results at 1 and 2 threads). One thread, and calls with little work (under
``PARALLEL_MIN_PAIRS`` pairs or ``PARALLEL_MIN_SCORES`` scores, such as the streaming step)
run a serial build of the same drivers, which never touches a thread pool (``nogil``).

The threading layer: Numba's parallel loops need one (tbb, omp or workqueue). Unless
``NUMBA_THREADING_LAYER`` names one, the kernels ask for a thread-safe one (``threadsafe``:
tbb if installed, else OpenMP, which Numba's Linux wheels bring), since the caller's or the
DataLoader's threads may call them at the same time; if none starts, ``workqueue`` (built in, not
thread-safe), on which one call at a time runs in parallel and a concurrent one serially; if no
layer starts at all, one thread and a one-line warning in the log. GNU OpenMP is not fork-safe:
in a process forked after it started, the kernels run serially.

The first use on a machine compiles them (the serial build took about 16 s for float32 and float64
on the 2-core development CPU; each driver's parallel build compiles on its first multi-threaded
call, and the compiled helpers are shared); Numba caches the machine code on disk (``cache=True``,
the parallel builds included: in ``__pycache__`` beside this file, or Numba's user cache folder
when that is read-only), and later processes load it in about 0.3 s.

Notation as in :mod:`agent.nn.nac`: B batch, H heads, Tq queries, Tk keys, K kept keys per query,
d head width, F = N_inter + 2 (inter pre-activations, then the time gate's alpha and beta),
N_i inter, N_c command and N_m motor neurons, P = TILE_QUERIES * K pairs per tile.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import types

import numpy as np
import torch
from torch import Tensor

try:  # Numba is a dependency; without it (or on a platform it lacks) the layer keeps its torch path
    import numba
    from numba import prange
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None
    prange = range

_log = logging.getLogger(__name__)

#: ODE modes, as the kernels number them
MODE_IDS = {"steady": 0, "exact": 1, "euler": 2}
_ENABLED = os.environ.get("NAC_DRIVE_KERNELS", "numba").strip().lower() not in ("torch", "0", "off", "no")


def available() -> bool:
    """Whether the kernels are importable and switched on (see :func:`use_kernels`)."""
    return numba is not None and _ENABLED


def set_enabled(enabled: bool) -> bool:
    """Switch the kernels on (where they apply) or off for this process; returns the previous
    setting. Not thread-safe: a module-wide switch (benchmarks and tests compare the two paths)."""
    global _ENABLED
    before, _ENABLED = _ENABLED, bool(enabled)
    return before


@contextlib.contextmanager
def use_kernels(enabled: bool):
    """Within this block, the NAC layer uses the kernels (``True``, where they apply) or its torch
    path (``False``); the previous setting is restored afterwards (see :func:`set_enabled`)."""
    before = set_enabled(enabled)
    try:
        yield
    finally:
        set_enabled(before)


def applies(*tensors: Tensor) -> bool:
    """Whether the kernels can take these tensors: all on the CPU, float32 or float64 alike."""
    if not available():
        return False
    dtype = tensors[0].dtype
    return dtype in (torch.float32, torch.float64) and all(t.is_cpu and t.dtype == dtype for t in tensors)


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


def _jit(fn=None, *, inline: bool = False):
    if fn is None:
        return lambda f: _jit(f, inline=inline)
    if numba is None:  # pragma: no cover
        return fn
    return numba.njit(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH,
                      inline="always" if inline else "never")(fn)


#: what ``parallel`` may do in the drivers (:func:`_variants`): run their ``prange`` loops on threads,
#: nothing else (no automatic parallelisation of array expressions, no fusion of loops, no
#: reductions across threads: those would change the order of the float operations)
_PARALLEL = dict(comprehension=False, reduction=False, inplace_binop=False, setitem=False, numpy=False, stencil=False,
                 fusion=False, prange=True)


def _variants(fn):
    """A driver's two compiled forms, (parallel, serial): the parallel one runs its ``prange`` loops
    on the threads of Numba's threading layer (``parallel=True``, see :data:`_PARALLEL`), the serial
    one runs them as plain loops. Both call the same serial helpers, so they do the same float
    operations in the same order for every output (tests/test_nn_nac_kernels.py checks that the
    results are bit-identical). The serial one compiles a copy of the function under another name:
    Numba's disk cache files a function by its qualified name and its key has no compile options,
    so the two would otherwise overwrite each other's cache. Each compiles on its first call."""
    if numba is None:  # pragma: no cover
        return fn, fn
    opts = dict(cache=True, nogil=True, error_model="numpy", fastmath=_FASTMATH)
    par = numba.njit(parallel=dict(_PARALLEL), **opts)(fn)
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + "_serial"
    copy.__module__, copy.__doc__ = fn.__module__, fn.__doc__
    return par, numba.njit(**opts)(copy)


#: lanes of :func:`_compress_ge` (64-bit indices, 512 bits; LLVM splits the vector where registers
#: are narrower: 18-33 ns a row of 128 entries for Numba's x86-64, haswell and host targets, against
#: 68-78 for the scalar loop; 16 lanes crashed LLVM 22's code generation); 0
#: (``NAC_DRIVE_COMPRESS=off``) keeps the scalar gather everywhere
_COMPRESS_OFF = os.environ.get("NAC_DRIVE_COMPRESS", "").strip().lower() in ("off", "0", "no")
COMPRESS_WIDTH = 0 if numba is None or _COMPRESS_OFF else 8

#: lanes of :func:`_rank_in`: :func:`_row_topk` ranks up to this many candidates (the usual case:
#: at most TOPK_SLACK K = 16 for K = 8) with one vector compare each (34 against 79 ns a row of
#: about 12 float32 candidates on the 2-core development CPU); 0 (``NAC_DRIVE_COMPRESS=off``, which
#: turns off both hand-written vector intrinsics) keeps the scalar double loop
RANK_WIDTH = 0 if numba is None or _COMPRESS_OFF else 16

if numba is not None:
    from llvmlite import ir as _ir
    from numba.core import cgutils as _cgutils
    from numba.extending import intrinsic as _intrinsic

    def _splat(builder, value, ty):
        """LLVM IR: the vector type ``ty`` with ``value`` in every lane (an insert into lane 0 and a
        broadcast shuffle, which LLVM turns into one broadcast instruction)."""
        zeros = _ir.Constant(_ir.VectorType(_ir.IntType(32), ty.count), [0] * ty.count)
        one = builder.insert_element(_ir.Constant(ty, _ir.Undefined), value, _ir.Constant(_ir.IntType(32), 0))
        return builder.shuffle_vector(one, _ir.Constant(ty, _ir.Undefined), zeros)

    def _popcount(builder, mask):
        """LLVM IR: how many lanes of the i1 vector ``mask`` are set, as an i64 (a bitcast of the
        mask to an integer and ``llvm.ctpop``)."""
        i64 = _ir.IntType(64)
        bits = builder.zext(builder.bitcast(mask, _ir.IntType(mask.type.count)), i64)
        ctpop = _cgutils.get_or_insert_function(builder.module, _ir.FunctionType(i64, [i64]), "llvm.ctpop.i64")
        return builder.call(ctpop, [bits])

    @_intrinsic
    def _compress_ge(typingctx, buf, j, thr, cand, m):
        """cand[m:m + c] = the indices j .. j + COMPRESS_WIDTH - 1 (in order) whose entry of buf is
        at least thr, c of them; returns m + c. One vector compare and LLVM's target-independent
        ``llvm.experimental.vector.compress`` (one ``vpcompressq`` into a register with AVX-512),
        then a store of the whole vector: cand needs COMPRESS_WIDTH (at most 8) entries of room
        past m, which the next call or the scalar tail overwrites. The entries are compared as
        float64, as ``buf[j] >= thr`` with a float64 thr compares them (NaN never counts). buf and cand must be
        C-contiguous (buf: float32 or float64, cand: int64), and j + COMPRESS_WIDTH <= len(buf).
        Replaces the scalar gather's loop-carried count (about 1.3 cycles an entry) with about
        0.2 (measured on the 2-core development CPU, AMD Zen 4: 20-29 ns against 85-91 ns a row
        of 128 entries)."""
        from numba.core import types as _types

        if not (isinstance(buf, _types.Array) and buf.ndim == 1 and buf.layout == "C"
                and buf.dtype in (_types.float32, _types.float64) and isinstance(cand, _types.Array)
                and cand.ndim == 1 and cand.layout == "C" and cand.dtype == _types.int64):
            return None
        width = COMPRESS_WIDTH
        sig = _types.int64(buf, _types.int64, _types.float64, cand, _types.int64)

        def codegen(context, builder, signature, args):
            bufv, jv, thrv, candv, mv = args
            bufty, _, _, candty, _ = signature.args
            data = _cgutils.create_struct_proxy(bufty)(context, builder, value=bufv).data
            out = _cgutils.create_struct_proxy(candty)(context, builder, value=candv).data
            i64, f64 = _ir.IntType(64), _ir.DoubleType()
            vin = _ir.VectorType(context.get_value_type(bufty.dtype), width)
            x = builder.load(builder.bitcast(builder.gep(data, [jv]), vin.as_pointer()), align=4)
            vf64 = _ir.VectorType(f64, width)
            if bufty.dtype == _types.float32:
                x = builder.fpext(x, vf64)
            keep = builder.fcmp_ordered(">=", x, _splat(builder, thrv, vf64))
            vi64 = _ir.VectorType(i64, width)
            index = builder.add(_splat(builder, jv, vi64), _ir.Constant(vi64, list(range(width))))
            mod = builder.module
            compress = _cgutils.get_or_insert_function(
                mod, _ir.FunctionType(vi64, [vi64, _ir.VectorType(_ir.IntType(1), width), vi64]),
                f"llvm.experimental.vector.compress.v{width}i64")
            packed = builder.call(compress, [index, keep, _ir.Constant(vi64, _ir.Undefined)])
            builder.store(packed, builder.bitcast(builder.gep(out, [mv]), vi64.as_pointer()), align=8)
            return builder.add(mv, _popcount(builder, keep))

        return sig, codegen

    @_intrinsic
    def _rank_in(typingctx, cv, t):
        """The rank of cv[t] among cv[:RANK_WIDTH]: how many entries are above it, plus how many
        equal ones come before it (the higher first, the earlier first among equals). One vector
        load of the RANK_WIDTH entries, two compares against cv[t], a compare of the lane numbers
        against t, and the population count of the mask: the branch-free counting rank of
        :func:`_row_topk` for a whole row of candidates at once, where the scalar double loop
        compared them one pair at a time. Entries past the candidates must be -inf (never above
        or equal to a candidate); cv: C-contiguous float32 or float64 with at least RANK_WIDTH
        entries. NaN never counts as above or equal (the candidates are never NaN)."""
        from numba.core import types as _types

        if not (isinstance(cv, _types.Array) and cv.ndim == 1 and cv.layout == "C"
                and cv.dtype in (_types.float32, _types.float64)):
            return None
        width = RANK_WIDTH
        sig = _types.int64(cv, _types.int64)

        def codegen(context, builder, signature, args):
            cvv, tv = args
            cvty = signature.args[0]
            data = _cgutils.create_struct_proxy(cvty)(context, builder, value=cvv).data
            vty = _ir.VectorType(context.get_value_type(cvty.dtype), width)
            vi64 = _ir.VectorType(_ir.IntType(64), width)
            row = builder.load(builder.bitcast(data, vty.as_pointer()), align=4)
            x = _splat(builder, builder.load(builder.gep(data, [tv])), vty)
            before = builder.icmp_signed("<", _ir.Constant(vi64, list(range(width))), _splat(builder, tv, vi64))
            above = builder.or_(builder.fcmp_ordered(">", row, x),
                                builder.and_(builder.fcmp_ordered("==", row, x), before))
            return _popcount(builder, above)

        return sig, codegen


# --------------------------------------------------------------------------------------------
# Threads: how many a call runs on, and the threading layer
# --------------------------------------------------------------------------------------------

#: a pair kernel call (:class:`PairAttention`, :func:`fused_forward`) with fewer selected pairs
#: (B H Tq K) than this runs on one thread: waking the threading layer's threads costs some
#: microseconds, about the work of this many pairs (the streaming step, B H K pairs, stays serial)
PARALLEL_MIN_PAIRS = 2048

#: the same for the selectors (:func:`topk_exact`, :func:`topk_blocks`), counted in query-key
#: scores (B H Tq Tk)
PARALLEL_MIN_SCORES = 65536

#: work items per thread the selectors and :func:`fused_forward` aim at when B H alone gives fewer:
#: each head's queries are then split into blocks (the results do not depend on the split)
ITEMS_PER_THREAD = 4

_LAYER: str | None = None  # the threading layer in use: None before the first parallel call, "" if none started
_LAYER_PID = 0  # the process that started it
_LAYER_LOCK = threading.Lock()  # one thread starts the layer
_WORKQUEUE_LOCK = threading.Lock()  # workqueue: one parallel call at a time (it is not thread-safe)
_NOTED: set[str] = set()


def _note(key: str, level: int, msg: str, *args) -> None:
    """Log msg once per process and key."""
    if key not in _NOTED:
        _NOTED.add(key)
        _log.log(level, msg, *args)


def _start_layer() -> str:
    """Start Numba's threading layer (once) and return its name, or "" when none could start.

    Unless the user chose one (``NUMBA_THREADING_LAYER``), a thread-safe layer is asked for first
    (``threadsafe``: tbb, else OpenMP), since the DataLoader's or the caller's threads may call
    the kernels at the same time; failing that, ``workqueue`` (always built in), which is not
    thread-safe: :func:`_call` then lets one call at a time use it. A layer already started by
    other code in this process is kept."""
    global _LAYER, _LAYER_PID
    with _LAYER_LOCK:
        if _LAYER is not None:
            return _LAYER
        layer, err = "", ""
        try:
            layer = numba.threading_layer()  # started already (by other code in this process)
        except ValueError:
            asked = numba.config.THREADING_LAYER
            for choice in (("threadsafe", "workqueue") if asked == "default" else (asked,)):
                numba.config.THREADING_LAYER = choice  # read when the layer starts, and only then
                try:
                    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)  # starts the layer
                    layer = numba.threading_layer()
                    break
                except (ValueError, ImportError, OSError) as e:
                    err = str(e).splitlines()[0] if str(e) else type(e).__name__
                finally:
                    numba.config.THREADING_LAYER = asked
        if not layer:
            _log.warning("NAC kernels: no Numba threading layer could start (%s); they run on one thread", err)
        elif layer == "workqueue":
            _log.info("NAC kernels: Numba's threading layer is workqueue (not thread-safe): one call at a time "
                      "runs on threads, a concurrent one on its caller's thread")
        _LAYER, _LAYER_PID = layer, os.getpid()
        return layer


def _threads(work: int, floor: int) -> int:
    """The threads a kernel call with this much work runs on: torch's thread count
    (``torch.get_num_threads()``, capped by ``numba.config.NUMBA_NUM_THREADS``) when the work is at
    least floor and a threading layer runs here, else 1."""
    if work < floor:
        return 1
    n = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
    if n <= 1:
        return 1
    layer = _LAYER if _LAYER is not None else _start_layer()
    if not layer:
        return 1
    if layer == "omp" and os.getpid() != _LAYER_PID:
        # GNU OpenMP is not fork-safe: Numba would end a forked child that uses it
        _note("fork", logging.INFO, "NAC kernels: this process was forked after OpenMP started; they run on one "
                                    "thread here")
        return 1
    return n


def _query_block(heads: int, Tq: int, n: int, unit: int) -> int:
    """Queries per work item (a multiple of unit): a head's all when there are at least
    ITEMS_PER_THREAD items per thread (n threads) without splitting, else fewer."""
    if n <= 1:
        return max(Tq, 1)
    per_head = -(-ITEMS_PER_THREAD * n // max(heads, 1))
    qb = -(-Tq // per_head)
    return max(-(-qb // unit) * unit, unit)


def _call(kernels, n: int, items: int, *args) -> None:
    """Run a driver (its (parallel, serial) pair from :func:`_variants`) on n threads, in
    min(n, items) chunks of its independent work items (the chunk count goes last in its
    arguments): the parallel form sets Numba's thread count for this thread
    (``numba.set_num_threads``) first; with one thread or one chunk, or while another thread runs
    a workqueue call, the serial form."""
    chunks = max(1, min(n, items))
    if chunks > 1:
        guard = _WORKQUEUE_LOCK if _LAYER == "workqueue" else None
        if guard is None or guard.acquire(blocking=False):
            try:
                numba.set_num_threads(n)
                kernels[0](*args, chunks)
                return
            finally:
                if guard is not None:
                    guard.release()
    kernels[1](*args, 1)


#: :func:`_row_topk` ranks up to this many times K candidates by counting (branch-free, O(m^2));
#: more (ties, or a guess that missed) go through the insertion
RANK_SLOTS = 4


#: :func:`_row_topk`'s first threshold aims at this many times K scores above it: 1.2 rather than
#: 1.5 leaves about 10.3 candidates a row instead of 11.6 (K = 8, T = 256), for the ranking by
#: counting (quadratic in them), at the price of a second count on about one row in seven
TOPK_GUESS = 1.2


#: the bisection of :func:`_row_topk` stops once at most this many times K entries lie at or above
#: its threshold (the insertion then drops the extra ones): fewer passes over the row
TOPK_SLACK = 2


@_jit
def _guess_z(n_max, K):  # pragma: no cover - compiled
    """z (n_max + 1,): for n finite scores, z[n] standard deviations above their mean leave about
    TOPK_GUESS K of n normal samples above (:func:`_row_topk`'s first guess; 0 where n <= 3 K): the
    upper normal quantile of TOPK_GUESS K / n by Abramowitz and Stegun 26.2.23 (absolute error under 4.5e-4,
    ample for a guess). A table per call, so a row pays a look-up instead of a log and a sqrt."""
    z = np.zeros(n_max + 1)
    for n in range(3 * K + 1, n_max + 1):
        t = math.sqrt(-2.0 * math.log(TOPK_GUESS * K / n))
        z[n] = t - (2.515517 + t * (0.802853 + t * 0.010328)) / (1.0 + t * (1.432788 + t * (0.189269 + t * 0.001308)))
    return z


@_jit(inline=True)  # numba inlines it into each caller: the call cost about a third of a row's
def _row_topk(buf, L, K, bound, keys, vals, cand, zt, slots, cv):  # pragma: no cover - compiled
    """The K highest of buf[:L], whose finite entries lie in [-bound, bound] (NaN and -inf entries
    never count). A threshold with at least K and at most TOPK_SLACK * K entries at or above it is
    found by counting: each count is a loop the compiler vectorises, so there is no per-entry
    branch. The first guess is the finite scores' mean plus z standard deviations, with z the
    normal quantile for TOPK_GUESS K of them above it (zt (>= L + 1,) from :func:`_guess_z`; one pass
    gives the mean, the spread and the count of finite entries); it lands in the range on about
    six rows in seven of attention scores, where bisection from the Cauchy-Schwarz bound took about
    five counts. Then two more guesses a third of a standard
    deviation on, then bisection. The entries at or above the threshold are gathered into cand
    (>= L,) int64, a work array, by a branch-free pass (every index is written, the count
    advances by the comparison: under 1 ns an entry, where a branch per entry was mispredicted on
    every kept one). Up to len(slots) candidates (slots (>= RANK_SLOTS K,) int64 and cv (at least as
    long and at least RANK_WIDTH, buf's dtype) are work arrays) are then ranked by counting, without
    a branch (up to RANK_WIDTH of them with one vector compare each, :func:`_rank_in`); more
    (many ties) are inserted in index order. Either way ties go to the earlier entries. Writes keys
    (K,) / vals (K,) highest first (the earlier entry first among equals) and returns how many were
    found (<= K)."""
    thr = -np.inf
    if L > K:
        cast = vals[:1]  # compare and sum in buf's own dtype (float32 work: twice the lanes of float64)
        cast[0] = 0.0
        zero = cast[0]
        s1 = zero
        s2 = zero
        for j in range(L):  # the sum and sum of squares of all (any -inf or NaN makes the guess
            x = buf[j]      # NaN, and bisection takes over)
            s1 += x
            s2 += x * x
        finite = L  # a finite sum: no -inf, +inf or NaN entry. Else count the entries above -inf
        if not math.isfinite(s1):  # (a separate pass: counting in the loop above cost 6 ns a row)
            finite = 0
            for j in range(L):
                finite += buf[j] > -np.inf
        if finite > K:
            # invariant: at least K entries are >= lo, fewer than K are >= hi
            lo = -bound - 1.0
            hi = bound + 1.0
            mean = s1 / finite
            sd = math.sqrt(max(s2 / finite - mean * mean, 0.0))
            guess = mean + sd * zt[finite]
            stop = TOPK_SLACK * K
            for it in range(200):
                cast[0] = guess if (it < 3 and lo < guess < hi) else lo + 0.5 * (hi - lo)
                mid = cast[0]
                if not (lo < mid < hi):  # ties: the interval cannot be split any further
                    break
                c = 0
                for j in range(L):
                    c += buf[j] >= mid
                if c >= K:
                    lo = mid
                    if c <= stop:
                        break
                    guess = mid + sd / 3.0
                else:
                    hi = mid
                    guess = mid - sd / 3.0
            else:
                lo = -np.inf
            thr = lo
    m = 0  # the candidates, in index order (branch-free: every index written, m advances on a hit)
    if thr > -np.inf:
        j0 = 0
        if COMPRESS_WIDTH > 0 and len(cand) >= L + COMPRESS_WIDTH:
            while j0 + COMPRESS_WIDTH <= L:  # COMPRESS_WIDTH entries a step (see _compress_ge)
                m = _compress_ge(buf, j0, thr, cand, m)
                j0 += COMPRESS_WIDTH
        for j in range(j0, L):
            cand[m] = j
            m += buf[j] >= thr
    else:
        for j in range(L):
            cand[m] = j
            m += buf[j] > -np.inf
    if m <= len(slots):
        # few candidates (the usual case: at most TOPK_SLACK * K): each one's rank among them,
        # counted without a branch (the higher first, the earlier index first among equals), then
        # written to its slot. Inserting them one by one mispredicted a branch or two per
        # candidate, on every row: a third of the ranking's time on fresh inputs
        for t in range(m):
            cv[t] = buf[cand[t]]
        if RANK_WIDTH > 0 and m <= RANK_WIDTH <= len(cv):
            for t in range(m, RANK_WIDTH):  # past the candidates: never above or equal to one
                cv[t] = -np.inf
            for t in range(m):
                slots[_rank_in(cv, t)] = cand[t]
        else:
            for t in range(m):
                x = cv[t]
                r = 0
                for u in range(m):
                    y = cv[u]
                    r += (y > x) | ((y == x) & (u < t))
                slots[r] = cand[t]
        n = min(m, K)
        for t in range(n):
            keys[t] = slots[t]
            vals[t] = buf[slots[t]]
        return n
    n = 0
    for t in range(m):  # in index order, so ties go to the earlier entries
        j = cand[t]
        x = buf[j]
        if n < K:
            # insertion into vals/keys, highest first, the earlier index first among equals
            u = n
            n += 1
        elif x > vals[K - 1]:  # above the K-th so far: the last one drops out
            u = K - 1
        else:
            continue
        while u > 0 and vals[u - 1] < x:
            vals[u] = vals[u - 1]
            keys[u] = keys[u - 1]
            u -= 1
        vals[u] = x
        keys[u] = j
    return n


@_jit
def _key_norms_max(kb, like):  # pragma: no cover - compiled
    """The largest squared norm of the keys of one head, kb (d, Tk) (keys transposed), summed feature
    by feature along the keys (a loop over a key's features is strided) in an (Tk,) row of like's dtype."""
    d, Tk = kb.shape
    row = np.empty(Tk, like.dtype)
    row[:Tk] = 0.0
    for e in range(d):
        for j in range(Tk):
            row[j] += kb[e, j] * kb[e, j]
    k2max = 0.0
    for j in range(Tk):
        k2max = max(k2max, row[j])
    return k2max


@_jit
def _topk_exact_work(like, Tk, K):  # pragma: no cover - compiled
    """The work arrays of :func:`_topk_exact_rows` (one set per thread)."""
    dt = like.dtype
    return (np.empty((4, Tk), dt), np.empty(Tk + COMPRESS_WIDTH, np.int64), np.empty(K, dt), np.empty(K, np.int64),
            np.empty(RANK_SLOTS * K, np.int64), np.empty(max(RANK_SLOTS * K, RANK_WIDTH), dt), np.empty(4, np.int64))


@_jit
def _topk_exact_rows(q, kT, qpos, key_mask, has_mask, causal, K, b, h, i_start, i_end, k2max, zt, bufs, cand,
                     vals, keys, slots, cv, Ls, idx, valid):  # pragma: no cover - compiled
    """The exact selector for queries i_start .. i_end - 1 (i_start a multiple of 4) of head (b, h):
    q (B, H, Tq, d), kT (B, H, d, Tk) (keys transposed); qpos (Tq,) int64; key_mask (B, Tk) bool
    (read when has_mask); k2max: the head's largest squared key norm (:func:`_key_norms_max`); zt:
    :func:`_guess_z` (Tk, K); bufs .. Ls: :func:`_topk_exact_work`. For every query, its scores
    q . k over the allowed keys and their K highest: writes idx[b, h, i] (K,) int64 (highest first, 0
    in empty slots) and valid[b, h, i] (K,) bool. NaN and -inf scores are never kept. The scores are
    computed for four queries at a time (each key feature read once for the four: about half the
    time of one query at a time at Tk = 1024, where the keys no longer fit the L1 cache), in four
    rows of O(Tk)."""
    d = q.shape[3]
    Tk = kT.shape[3]
    QB = 4
    b0, b1, b2, b3 = bufs[0], bufs[1], bufs[2], bufs[3]
    kb = kT[b, h]
    for i0 in range(i_start, i_end, QB):
        nb = min(QB, i_end - i0)
        Lmax = 0
        for u in range(QB):  # the block's queries (the last one repeated to fill it)
            i = i0 + min(u, nb - 1)
            Ls[u] = min(Tk, qpos[i] + 1) if causal else Tk
            Lmax = max(Lmax, Ls[u])
        q0, q1, q2, q3 = q[b, h, i0], q[b, h, i0 + min(1, nb - 1)], q[b, h, i0 + min(2, nb - 1)], \
            q[b, h, i0 + min(3, nb - 1)]
        b0[:Lmax] = 0.0
        b1[:Lmax] = 0.0
        b2[:Lmax] = 0.0
        b3[:Lmax] = 0.0
        e = 0
        while e + 4 <= d:  # the scores, vectorised over the keys, four features a pass
            ka, kb_, kc, kd = kb[e], kb[e + 1], kb[e + 2], kb[e + 3]
            a0, c0, d0, f0 = q0[e], q0[e + 1], q0[e + 2], q0[e + 3]
            a1, c1, d1, f1 = q1[e], q1[e + 1], q1[e + 2], q1[e + 3]
            a2, c2, d2, f2 = q2[e], q2[e + 1], q2[e + 2], q2[e + 3]
            a3, c3, d3, f3 = q3[e], q3[e + 1], q3[e + 2], q3[e + 3]
            for j in range(Lmax):
                x, y, z, w = ka[j], kb_[j], kc[j], kd[j]
                b0[j] += a0 * x + c0 * y + d0 * z + f0 * w
                b1[j] += a1 * x + c1 * y + d1 * z + f1 * w
                b2[j] += a2 * x + c2 * y + d2 * z + f2 * w
                b3[j] += a3 * x + c3 * y + d3 * z + f3 * w
            e += 4
        while e < d:
            ke = kb[e]
            a0, a1, a2, a3 = q0[e], q1[e], q2[e], q3[e]
            for j in range(Lmax):
                x = ke[j]
                b0[j] += a0 * x
                b1[j] += a1 * x
                b2[j] += a2 * x
                b3[j] += a3 * x
            e += 1
        for u in range(nb):
            i = i0 + u
            L = Ls[u]
            q2n = 0.0
            for e in range(d):
                q2n += q[b, h, i, e] * q[b, h, i, e]
            if has_mask:
                for j in range(L):
                    if not key_mask[b, j]:
                        bufs[u, j] = -np.inf
            # |q . k| <= |q| max |k| (Cauchy-Schwarz) bounds every score of this head
            bound = math.sqrt(q2n * k2max) * (1.0 + 1e-4)
            n = _row_topk(bufs[u], L, K, bound, keys, vals, cand, zt, slots, cv)
            for t in range(K):
                valid[b, h, i, t] = t < n
                idx[b, h, i, t] = keys[t] if t < n else 0


@_jit
def _item(it, n_qb):  # pragma: no cover - compiled
    """Work item ``it`` -> (head row bh of B H, query block j of n_qb): the blocks of a head in order,
    every other head's in reverse (a snake), so the chunks' every-n_chunks-th items pair early query
    blocks with late ones. Under the causal rule a late block scores up to 2 n_qb - 1 times the keys
    of the first: with the blocks in order, two chunks over two blocks a head got all the early
    blocks and all the late ones (3:1 of the work, 1.33x on two threads at best); block j of one head
    and block n_qb - 1 - j of the next together score the same keys for every j (the load-balanced
    split of causal attention of context parallelism, which gives each device chunks i and 2N - 1 - i:
    Dubey et al. 2024, "The Llama 3 Herd of Models", Section 3.3.2)."""
    bh = it // n_qb
    j = it - bh * n_qb
    if bh % 2 == 1:
        j = n_qb - 1 - j
    return bh, j


@_jit
def _topk_exact_chunk(c, n_chunks, q, kT, qpos, key_mask, has_mask, causal, K, qb, k2max, zt, idx,
                      valid):  # pragma: no cover - compiled
    """Chunk c of n_chunks of the exact selector: the items (head, block of qb queries) c,
    c + n_chunks, ... in :func:`_item`'s order (so a chunk gets early and late blocks alike: under the
    causal rule late queries score more keys), with one set of work arrays."""
    B, H, Tq, _ = q.shape
    bufs, cand, vals, keys, slots, cv, Ls = _topk_exact_work(q, kT.shape[3], K)
    n_qb = (Tq + qb - 1) // qb
    for it in range(c, B * H * n_qb, n_chunks):
        bh, j = _item(it, n_qb)
        i0 = j * qb
        _topk_exact_rows(q, kT, qpos, key_mask, has_mask, causal, K, bh // H, bh % H, i0, min(Tq, i0 + qb),
                         k2max[bh], zt, bufs, cand, vals, keys, slots, cv, Ls, idx, valid)


def _topk_exact_run(q, kT, qpos, key_mask, has_mask, causal, K, qb, idx, valid, n_chunks):  # pragma: no cover
    """Driver of the exact selector (see :func:`topk_exact`): each head's largest key norm, then
    n_chunks chunks of (head, query block) items (:func:`_topk_exact_chunk`); each loop's
    iterations are independent, so ``prange`` may run them on threads."""
    B, H = q.shape[0], q.shape[1]
    k2max = np.empty(B * H)
    for bh in prange(B * H):
        k2max[bh] = _key_norms_max(kT[bh // H, bh % H], q)
    zt = _guess_z(kT.shape[3], K)
    for c in prange(n_chunks):
        _topk_exact_chunk(c, n_chunks, q, kT, qpos, key_mask, has_mask, causal, K, qb, k2max, zt, idx, valid)


_TOPK_EXACT = _variants(_topk_exact_run)


@_jit
def _block_centroids(kb, key_mask, has_mask, b, bs, cent, count):  # pragma: no cover - compiled
    """For one head's keys kb (d, Tk) in blocks of bs: cent (n_blocks, d), the mean of each block's
    valid keys, and count (n_blocks,) how many; returns (the largest squared centroid norm, the
    largest squared key norm)."""
    d, Tk = kb.shape
    nb = cent.shape[0]
    c2max = 0.0
    k2max = 0.0
    for blk in range(nb):
        n = 0
        for e in range(d):
            cent[blk, e] = 0.0
        for j in range(blk * bs, min(Tk, blk * bs + bs)):
            if has_mask and not key_mask[b, j]:
                continue
            n += 1
            s2 = 0.0
            for e in range(d):
                cent[blk, e] += kb[e, j]
                s2 += kb[e, j] * kb[e, j]
            k2max = max(k2max, s2)
        count[blk] = n
        s2 = 0.0
        for e in range(d):
            cent[blk, e] /= max(n, 1)
            s2 += cent[blk, e] * cent[blk, e]
        c2max = max(c2max, s2)
    return c2max, k2max


@_jit
def _topk_blocks_work(like, nb, bs, m, K):  # pragma: no cover - compiled
    """The work arrays of :func:`_topk_blocks_rows` (one set per thread)."""
    dt = like.dtype
    return (np.empty(nb, dt), np.empty(max(m, 1), dt), np.empty(max(m, 1), np.int64), np.empty(m * bs, dt),
            np.empty(m * bs, np.int64), np.empty(max(nb, m * bs) + COMPRESS_WIDTH, np.int64), np.empty(K, dt),
            np.empty(K, np.int64),
            np.empty(RANK_SLOTS * max(K, m), np.int64), np.empty(max(RANK_SLOTS * max(K, m), RANK_WIDTH), dt))


@_jit
def _topk_blocks_rows(q, kT, qpos, key_mask, has_mask, causal, K, bs, m, b, h, i_start, i_end, cent, count, c2max,
                      k2max, zt_blocks, zt, bbuf, bvals, bkeys, cbuf, cpos, cand, vals, keys, slots, cv, idx,
                      valid):  # pragma: no cover - compiled
    """The blocks selector (see :func:`topk_blocks`) for queries i_start .. i_end - 1 of head (b, h):
    q (B, H, Tq, d), kT (B, H, d, Tk); cent, count, c2max, k2max: the head's
    :func:`_block_centroids`; zt_blocks, zt: :func:`_guess_z` tables for the blocks and the keys;
    bbuf .. cv: :func:`_topk_blocks_work`. Writes idx[b, h, i] / valid[b, h, i] (K,)."""
    d = q.shape[3]
    Tk = kT.shape[3]
    nb = cent.shape[0]
    kb = kT[b, h]
    for i in range(i_start, i_end):
        qi = q[b, h, i]
        q2 = 0.0
        for e in range(d):
            q2 += qi[e] * qi[e]
        pos = qpos[i]
        own = pos // bs
        # the blocks: a query's own block when causal, plus the best n_other by centroid score
        for blk in range(nb):
            ok = count[blk] > 0 and (not causal or blk < own)
            if ok:
                acc = 0.0
                for e in range(d):
                    acc += qi[e] * cent[blk, e]
                bbuf[blk] = acc
            else:
                bbuf[blk] = -np.inf
        nsel = 0
        if causal:
            bkeys[0] = own
            nsel = 1
        n_other = m - 1 if causal else m
        if n_other > 0:
            nfound = _row_topk(bbuf, nb, n_other, math.sqrt(q2 * c2max) * (1.0 + 1e-4) + 1e-30,
                               bkeys[nsel:], bvals[nsel:], cand, zt_blocks, slots, cv)
            nsel += nfound
        # the candidate keys of the chosen blocks, scored; then the K best of them
        nc = 0
        for t in range(nsel):
            blk = bkeys[t]
            for j in range(blk * bs, min(Tk, blk * bs + bs)):
                cpos[nc] = j
                if (has_mask and not key_mask[b, j]) or (causal and j > pos):
                    cbuf[nc] = -np.inf
                else:
                    acc = 0.0
                    for e in range(d):
                        acc += qi[e] * kb[e, j]
                    cbuf[nc] = acc if acc == acc else -np.inf
                nc += 1
        n = _row_topk(cbuf, nc, K, math.sqrt(q2 * k2max) * (1.0 + 1e-4) + 1e-30, keys, vals, cand, zt,
                      slots, cv)
        out_i = idx[b, h, i]
        out_v = valid[b, h, i]
        for t in range(K):
            out_v[t] = t < n
            out_i[t] = cpos[keys[t]] if t < n else 0


@_jit
def _topk_blocks_chunk(c, n_chunks, q, kT, qpos, key_mask, has_mask, causal, K, bs, m, qb, cent, count, c2max,
                       k2max, zt_blocks, zt, idx, valid):  # pragma: no cover - compiled
    """Chunk c of n_chunks of the blocks selector: the items (head, block of qb queries) c,
    c + n_chunks, ... in :func:`_item`'s order, with one set of work arrays."""
    B, H, Tq, _ = q.shape
    bbuf, bvals, bkeys, cbuf, cpos, cand, vals, keys, slots, cv = _topk_blocks_work(q, cent.shape[1], bs, m, K)
    n_qb = (Tq + qb - 1) // qb
    for it in range(c, B * H * n_qb, n_chunks):
        bh, j = _item(it, n_qb)
        i0 = j * qb
        _topk_blocks_rows(q, kT, qpos, key_mask, has_mask, causal, K, bs, m, bh // H, bh % H, i0, min(Tq, i0 + qb),
                          cent[bh], count[bh], c2max[bh], k2max[bh], zt_blocks, zt, bbuf, bvals, bkeys, cbuf, cpos,
                          cand, vals, keys, slots, cv, idx, valid)


def _topk_blocks_run(q, kT, qpos, key_mask, has_mask, causal, K, bs, m, qb, idx, valid,
                     n_chunks):  # pragma: no cover - compiled
    """Driver of the blocks selector (see :func:`topk_blocks`) for q (B, H, Tq, d) and kT
    (B, H, d, Tk): each head's block centroids, then n_chunks chunks of (head, query block) items."""
    B, H, _, d = q.shape
    Tk = kT.shape[3]
    nb = (Tk + bs - 1) // bs
    cent = np.empty((B * H, nb, d), dtype=q.dtype)
    count = np.empty((B * H, nb), dtype=np.int64)
    c2max = np.empty(B * H)
    k2max = np.empty(B * H)
    for bh in prange(B * H):
        cm, km = _block_centroids(kT[bh // H, bh % H], key_mask, has_mask, bh // H, bs, cent[bh], count[bh])
        c2max[bh] = cm
        k2max[bh] = km
    zt_blocks = _guess_z(nb, m - 1 if causal else m)
    zt = _guess_z(m * bs, K)
    for c in prange(n_chunks):
        _topk_blocks_chunk(c, n_chunks, q, kT, qpos, key_mask, has_mask, causal, K, bs, m, qb, cent, count, c2max,
                           k2max, zt_blocks, zt, idx, valid)


_TOPK_BLOCKS = _variants(_topk_blocks_run)


# Scalar math of the kernels. Each function takes ``like``, an array of the compute dtype: for
# float32 work it is a fast approximation written in plain arithmetic (so the loops over pairs
# vectorise; libm's scalar exp and tanh calls would not), accurate well inside float32's
# precision; for float64 work it is the exact libm function, so the float64 kernels agree with
# the torch path to rounding. :func:`float32_math` evaluates the float32 versions for tests.

#: Eigen's fast float tanh (Eigen/src/Core/MathFunctionsImpl.h, generic_fast_tanh_float): inputs
#: clamped to +-TANH_CLAMP, then an odd degree-13 over even degree-6 rational function, in float32
#: arithmetic. Maximum error 2.6e-7 against ``math.tanh`` over [-12, 12] (measured; float32's
#: spacing near 1 is 6e-8).
TANH_CLAMP = 7.99881172180175781
_n0, _n1, _n2, _n3, _n4, _n5, _n6 = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                                     5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                                     4.89352455891786e-03)  # x^13 ... x^1
_d0, _d1, _d2, _d3 = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                      4.89352518554385e-03)  # x^6 ... x^0


_f32 = np.float32
_c32, _m0, _m1, _m2, _m3, _m4, _m5, _m6, _e0, _e1, _e2, _e3 = (
    _f32(c) for c in (TANH_CLAMP, _n0, _n1, _n2, _n3, _n4, _n5, _n6, _d0, _d1, _d2, _d3))


@_jit
def _tanh_f32(x):  # pragma: no cover - compiled
    """In float32 arithmetic, as Eigen computes it (twice the vector lanes of float64)."""
    y = _f32(x)
    y = min(max(y, -_c32), _c32)
    y2 = y * y
    p = (((((_m0 * y2 + _m1) * y2 + _m2) * y2 + _m3) * y2 + _m4) * y2 + _m5) * y2 + _m6
    q = ((_e0 * y2 + _e1) * y2 + _e2) * y2 + _e3
    return y * p / q


@_jit
def _exp_f32(x):  # pragma: no cover - compiled
    """exp(x) = (exp(x / 1024)) ** 1024: a degree-7 Taylor polynomial on |x / 1024| <= 0.1, then ten
    squarings, in float64 arithmetic (relative error about 1e-10 over [-100, 88])."""
    y = min(max(x, -100.0), 88.0) * (1.0 / 1024.0)
    p = 1.0 + y * (1.0 + y * (0.5 + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (
        1.0 / 720.0 + y * (1.0 / 5040.0)))))))
    for _ in range(10):
        p = p * p
    return p


@_jit
def _expm1_f32(x):  # pragma: no cover - compiled
    """exp(x) - 1 without cancellation near 0: a degree-9 Taylor polynomial for |x| < 0.5."""
    if abs(x) < 0.5:
        return x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0 + x * (
            1.0 / 720.0 + x * (1.0 / 5040.0 + x * (1.0 / 40320.0 + x * (1.0 / 362880.0)))))))))
    return _exp_f32(x) - 1.0


@_jit
def _log1p_unit(u):  # pragma: no cover - compiled
    """log(1 + u) for u in [0, 1]: 2 atanh(z) with z = u / (2 + u) <= 1/3, ten terms of its series."""
    z = u / (2.0 + u)
    z2 = z * z
    s = 1.0 / 21.0
    for k in range(9, -1, -1):
        s = s * z2 + 1.0 / (2 * k + 1)
    return 2.0 * z * s


def _tanh(x, like):
    """tanh (float32: :func:`_tanh_f32`)."""
    return math.tanh(x)


def _exp(x, like):
    """exp (float32: :func:`_exp_f32`)."""
    return math.exp(x)


def _expm1(x, like):
    """exp(x) - 1 (float32: :func:`_expm1_f32`)."""
    return math.expm1(x)


def _sigmoid(x, like):
    """1 / (1 + exp(-x)), without overflow."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _softplus(x, like):
    """torch.nn.functional.softplus with beta 1 and threshold 20: x above 20, else log(1 + exp(x))."""
    if x > 20.0:
        return x
    return math.log1p(math.exp(x))


if numba is not None:
    from numba import types as _types
    from numba.extending import overload as _overload

    def _is_f32(like):
        return isinstance(like, _types.Array) and like.dtype == _types.float32

    def _register(stub, fast):
        exact = _jit(stub)

        @_overload(stub, jit_options=dict(cache=True, error_model="numpy", fastmath=_FASTMATH))
        def _choose(x, like):  # pragma: no cover - compiled
            return fast if _is_f32(like) else (lambda x, like: exact(x, like))

    @_jit
    def _sigmoid_f32(x, like):  # pragma: no cover - compiled
        return 1.0 / (1.0 + _exp_f32(-x))

    @_jit
    def _softplus_f32(x, like):  # pragma: no cover - compiled
        if x > 20.0:
            return x
        return max(x, 0.0) + _log1p_unit(_exp_f32(-abs(x)))

    _register(_tanh, lambda x, like: _tanh_f32(x))
    _register(_exp, lambda x, like: _exp_f32(x))
    _register(_expm1, lambda x, like: _expm1_f32(x))
    _register(_sigmoid, lambda x, like: _sigmoid_f32(x, like))
    _register(_softplus, lambda x, like: _softplus_f32(x, like))


@_jit
def _float32_math_kernel(x, out):  # pragma: no cover - compiled
    like = np.empty(1, np.float32)
    for i in range(x.shape[0]):
        out[0, i] = _tanh(x[i], like)
        out[1, i] = _exp(x[i], like)
        out[2, i] = _expm1(x[i], like)
        out[3, i] = _sigmoid(x[i], like)
        out[4, i] = _softplus(x[i], like)


def float32_math(x: np.ndarray) -> dict[str, np.ndarray]:
    """The kernels' float32 scalar functions on x (N,) float32: tanh, exp, expm1, sigmoid and
    softplus, each (N,) float64 (for tests against the exact functions)."""
    out = np.empty((5, len(x)))
    _float32_math_kernel(np.ascontiguousarray(x, dtype=np.float32), out)
    return dict(zip(("tanh", "exp", "expm1", "sigmoid", "softplus"), out))


#: queries per tile: a tile holds their TILE_QUERIES * K pairs, over which the loops vectorise
TILE_QUERIES = 32


@_jit
def _sparse_linear(x, W, bias, y, n, nzk, nzw):  # pragma: no cover - compiled
    """y[:, :n] = bias + W^T x[:, :n] for x (N_in, P), pairs innermost (the loops vectorise); exact
    zeros of W (masked-out weights) are skipped. Each output's nonzero inputs (listed in the work
    arrays nzk (>= N_in,) int64 and nzw (>= N_in,) of W's dtype, from :func:`_nz_work`) are added
    four at a time: a quarter of the loads and stores of y that one input a pass made (command
    layer, 256 pairs: 1.04 -> 0.67 us)."""
    n_in, n_out = W.shape
    for c in range(n_out):
        nz = 0
        for k in range(n_in):
            if W[k, c] != 0:
                nzk[nz] = k
                nzw[nz] = W[k, c]
                nz += 1
        bc = bias[c]
        for p in range(n):
            y[c, p] = bc
        j = 0
        while j + 4 <= nz:
            k0, k1, k2, k3 = nzk[j], nzk[j + 1], nzk[j + 2], nzk[j + 3]
            w0, w1, w2, w3 = nzw[j], nzw[j + 1], nzw[j + 2], nzw[j + 3]
            for p in range(n):
                y[c, p] += w0 * x[k0, p] + w1 * x[k1, p] + w2 * x[k2, p] + w3 * x[k3, p]
            j += 4
        while j < nz:
            k0 = nzk[j]
            w0 = nzw[j]
            for p in range(n):
                y[c, p] += w0 * x[k0, p]
            j += 1


@_jit
def _nz_work(Wc, Wm, Wh):  # pragma: no cover - compiled
    """The work arrays of :func:`_sparse_linear` for the backbone's three maps: (nzk int64, nzw of
    the weights' dtype), each as long as the widest input."""
    n = max(Wc.shape[0], Wm.shape[0], Wh.shape[0])
    return np.empty(n, np.int64), np.empty(n, Wc.dtype)


@_jit
def _dense_tanh(x, W, bias, y, n, nzk, nzw):  # pragma: no cover - compiled
    """y[:, :n] = tanh(bias + W^T x[:, :n]): one sparse layer for n pairs at once (:func:`_sparse_linear`)."""
    _sparse_linear(x, W, bias, y, n, nzk, nzw)
    for c in range(W.shape[1]):
        for p in range(n):
            y[c, p] = _tanh(y[c, p], y)


@_jit
def _dense_backward(x, W, g, dW, db, dx, n):  # pragma: no cover - compiled
    """Backward of y = tanh(bias + W^T x) over n pairs, where x (N_in, P) is itself a tanh output:
    given g (N_out, P), the gradient at y's pre-activation, accumulate dW += x g^T and db += the
    sum of g over the pairs, and write dx (N_in, P), the gradient at x's pre-activation,
    (W g) * (1 - x^2)."""
    n_in, n_out = W.shape
    for c in range(n_out):
        acc = 0.0
        for p in range(n):
            acc += g[c, p]
        db[c] += acc
    for k in range(n_in):
        for p in range(n):
            dx[k, p] = 0.0
        for c in range(n_out):
            acc = 0.0
            for p in range(n):
                acc += x[k, p] * g[c, p]
            dW[k, c] += acc
            w = W[k, c]
            if w != 0:
                for p in range(n):
                    dx[k, p] += w * g[c, p]
        for p in range(n):
            xs = x[k, p]
            dx[k, p] *= 1.0 - xs * xs


@_jit
def _tile_forward(r0, nq, q2, k2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                  mode, delta_t, eps, n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw,
                  phi, omega, tg, age, logit):  # pragma: no cover - compiled
    """Forward of the pairs of query rows r0 .. r0 + nq - 1 (rows of q2, (B H Tq, F)); pair p is
    slot p % K of row r0 + p // K. Fills krow (P,) (the key's row of k2), pre (F, P) = the first
    layer's pre-activations [inter ; alpha ; beta], inter (N_i, P), command (N_c, P), motor
    (N_m, P), gates (2, P) = [a_phi ; a_omega], and phi, omega, t_gate, age, logit (P,). Invalid
    slots are computed too (on whatever key their index names) and left to the caller to ignore."""
    K = idx2.shape[1]
    F = q2.shape[1]
    n = nq * K
    for p in range(n):  # gather: query half + key half of every pair (rows read whole)
        r = r0 + p // K
        kr = (r // Tq) * Tk + idx2[r, p % K]
        krow[p] = kr
        for f in range(F):  # indexed in place, no row views (a view per pair costs more than its sum)
            pre[f, p] = q2[r, f] + k2[kr, f]
    _tile_backbone(r0, nq, K, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t, mode, delta_t, eps,
                   n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw, phi, omega, tg, age, logit)


@_jit
def _tile_backbone(r0, nq, K, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t, mode, delta_t, eps,
                   n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw, phi, omega, tg, age,
                   logit):  # pragma: no cover - compiled
    """The pairs of a tile from their first layer's pre-activations pre (F, P) (filled by the
    caller, with krow (P,), each pair's key row) on: the rest of :func:`_tile_forward`."""
    Ni = Wc.shape[0]
    n = nq * K
    for f in range(Ni):
        for p in range(n):
            inter[f, p] = _tanh(pre[f, p], pre)
    _dense_tanh(inter, Wc, bc, command, n, nzk, nzw)
    _dense_tanh(command, Wm, bm, motor, n, nzk, nzw)
    _sparse_linear(motor, Wh, bh, gates, n, nzk, nzw)  # the gates [a_phi ; a_omega]
    # phi, omega, the key's age, the time gate and the ODE logit: one loop each, so they vectorise
    for p in range(n):
        phi[p] = _sigmoid(gates[0, p], pre)
        omega[p] = _softplus(gates[1, p], pre) + eps
    if has_t:
        for p in range(n):
            r = r0 + p // K
            bh_ = r // Tq
            # the key's age in the timestamps' own dtype, then cast to the compute dtype (as torch)
            cast[0] = q_times[bh_ // H, r - bh_ * Tq] - k_times[bh_ // H, krow[p] - bh_ * Tk]
            age[p] = cast[0]
    else:
        age[:n] = 1.0
    for p in range(n):
        tg[p] = _sigmoid(pre[Ni, p] * age[p] + pre[Ni + 1, p], pre)
    if mode == 0:
        for p in range(n):
            logit[p] = phi[p] / omega[p]
    elif mode == 1:
        for p in range(n):
            logit[p] = phi[p] / omega[p] * -_expm1(-omega[p] * (delta_t * tg[p]), pre)
    else:
        for p in range(n):
            hstep = delta_t * tg[p] / n_euler
            lg = 0.0
            for _ in range(n_euler):
                lg = lg + hstep * (phi[p] - omega[p] * lg)
            logit[p] = lg


@_jit
def _tile_softmax(r0, nq, valid2, logit, shift, keep, weight, like):  # pragma: no cover - compiled
    """Softmax of each query's logits over its valid slots, for the tile's nq queries: weight (P,)
    (0 on invalid slots; all 0 for a query without any). shift and keep (P,) are work arrays.
    ``like``: an array of the compute dtype (see :func:`_exp`). The exponentials run in one loop
    over the tile's pairs, which vectorises (a loop per query would run them one after another)."""
    K = valid2.shape[1]
    n = nq * K
    for qi in range(nq):
        r = r0 + qi
        p0 = qi * K
        mx = -np.inf
        for s in range(K):  # selects, not branches: on fresh inputs the running maximum's branch
            x = logit[p0 + s] if valid2[r, s] else -np.inf  # was mispredicted on most queries
            mx = x if x > mx else mx
        for s in range(K):
            ok = valid2[r, s]
            keep[p0 + s] = 1.0 if ok else 0.0
            shift[p0 + s] = mx if ok else logit[p0 + s]  # invalid: exp(0) * 0, never inf * 0
    for p in range(n):
        weight[p] = _exp(logit[p] - shift[p], like) * keep[p]
    for qi in range(nq):
        p0 = qi * K
        tot = 0.0
        for p in range(p0, p0 + K):
            tot += weight[p]
        inv = 1.0 / tot if tot > 0 else 0.0
        for p in range(p0, p0 + K):
            weight[p] *= inv


@_jit
def _tile_work(like, P, F, Ni, Nc, Nm):  # pragma: no cover - compiled
    """One tile's per-pair work arrays, reused tile after tile: krow (P,) int64; pre (F, P), the
    first layer's pre-activations; inter (N_i, P), command (N_c, P), motor (N_m, P), gates (2, P)
    in like's dtype; phi, omega, t_gate, age, logit (P,) float64."""
    dt = like.dtype
    return (np.empty(P, np.int64), np.empty((F, P), dt), np.empty((Ni, P), dt), np.empty((Nc, P), dt),
            np.empty((Nm, P), dt), np.empty((2, P), dt), np.empty(P), np.empty(P), np.empty(P), np.empty(P),
            np.empty(P))


@_jit
def _forward_chunk(c, n_chunks, q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times,
                   has_t, mode, delta_t, eps, n_euler, out):  # pragma: no cover - compiled
    """Chunk c of n_chunks of :func:`_forward_run`: the tiles c, c + n_chunks, ... (a tile: TILE_QUERIES
    rows of q2), with one set of one-tile work arrays (nothing is kept for the backward, which
    computes each tile's activations again: :func:`_backward_chunk`)."""
    R, F = q2.shape
    K = idx2.shape[1]
    d = v2.shape[1]
    P = TILE_QUERIES * K
    weight, shift, keep = np.empty(P), np.empty(P), np.empty(P)
    cast = np.empty(1, dtype=q2.dtype)
    nzk, nzw = _nz_work(Wc, Wm, Wh)
    acc = np.empty(d)
    krow, pre, inter, command, motor, gates, phi, omega, tg, age, logit = _tile_work(q2, P, F, Wc.shape[0],
                                                                                     Wc.shape[1], Wm.shape[1])
    for t_ in range(c, (R + TILE_QUERIES - 1) // TILE_QUERIES, n_chunks):
        r0 = t_ * TILE_QUERIES
        nq = min(TILE_QUERIES, R - r0)
        _tile_forward(r0, nq, q2, k2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                      mode, delta_t, eps, n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw,
                      phi, omega, tg, age, logit)
        _tile_softmax(r0, nq, valid2, logit, shift, keep, weight, q2)
        for qi in range(nq):
            r = r0 + qi
            p0 = qi * K
            acc[:] = 0.0
            for p in range(p0, p0 + K):
                if weight[p] != 0.0:
                    g = weight[p] * tg[p]
                    for e in range(d):
                        acc[e] += g * v2[krow[p], e]
            bh_ = r // Tq
            for e in range(d):
                out[bh_ // H, r - bh_ * Tq, bh_ % H, e] = acc[e]


def _forward_run(q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                 mode, delta_t, eps, n_euler, out, n_chunks):  # pragma: no cover - compiled
    """out (B, Tq, H, d) = per head, the sum over kept keys of softmax(logit) * t_gate * v_j.
    q2 (B H Tq, F), k2 (B H Tk, F), v2 (B H Tk, d), idx2 and valid2 (B H Tq, K). The tiles are
    independent (each writes its own rows of out): n_chunks chunks of them (:func:`_forward_chunk`),
    which ``prange`` may run on threads."""
    for c in prange(n_chunks):
        _forward_chunk(c, n_chunks, q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times,
                       has_t, mode, delta_t, eps, n_euler, out)


_FORWARD = _variants(_forward_run)


@_jit
def _head_groups(R, Tq):  # pragma: no cover - compiled
    """The backward's units of work for R query rows, Tq a head: (heads per group, groups). A group
    is one head, or as many whole heads as one tile's TILE_QUERIES rows hold (Tq = 4, as a policy's
    window: eight heads), so a tile never holds fewer pairs than the forward's."""
    if Tq <= 0:
        return 1, 0
    n_heads = R // Tq
    per_group = max(1, TILE_QUERIES // Tq)
    return per_group, (n_heads + per_group - 1) // per_group


@_jit
def _backward_chunk(c, n_chunks, grad_out, q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times,
                    k_times, has_t, mode, delta_t, eps, n_euler, pWc, pbc, pWm, pbm, pWh, pbh, d_q2, d_k2,
                    d_v2):  # pragma: no cover - compiled
    """The backward of the groups of whole heads (rows of B H; :func:`_head_groups`) c, c + n_chunks,
    ... (chunk c of n_chunks), each on its own, a tile of up to TILE_QUERIES of its query rows at a
    time, in order.

    A tile's activations are computed again here (:func:`_tile_forward`, the forward's own function
    on the same inputs) into one tile's work arrays, and its pairs' gradients are added into the
    query rows (d_q2 (B H Tq, F), the tile's own), the key rows (d_k2 (B H Tk, F)) and the values
    (d_v2 (B H Tk, d)) at once: no per-pair array outlives its tile. Kept for the backward, the
    forward's activations were about 95 MB at B = 8, T = 256 and the pairs' gradients another
    43 MB, written to memory and read back; on the 2-core development CPU that traffic, not the
    arithmetic, set the backward's time (2 threads gained 1.1x over one). This is FlashAttention's
    recomputation and its parallelism over batch and heads in the backward (Dao et al. 2022,
    "FlashAttention: Fast and Memory-Efficient Exact Attention with IO-Awareness", Section 3.1).
    Only a head's own query rows select its keys, so heads never share a row: every element gets
    its terms query row after query row and slot after slot, the serial kernel's order, on any
    number of threads. The group's sums of the backbone's weight gradients go to pWc[g] .. pbh[g]
    (zeroed, float64), added over the groups by :func:`_sum_tiles` after."""
    R = q2.shape[0]
    K = valid2.shape[1]
    d = v2.shape[1]
    Ni, Nc = Wc.shape
    Nm = Wm.shape[1]
    P = TILE_QUERIES * K
    dt = q2.dtype
    krow, pre, inter, command, motor, gates, phi, omega, tg, age, logit = _tile_work(q2, P, q2.shape[1], Ni, Nc, Nm)
    cast = np.empty(1, dtype=dt)
    nzk, nzw = _nz_work(Wc, Wm, Wh)
    d_pc, d_pm = np.empty((Nc, P), dt), np.empty((Nm, P), dt)
    d_pre = np.empty((Ni, P), dt)
    d_alpha, d_beta, gv = np.empty(P), np.empty(P), np.empty(P)
    row_ok = np.empty(TILE_QUERIES, np.bool_)
    d_w, d_tg, d_aphi, d_aom = np.empty(P), np.empty(P), np.empty(P), np.empty(P)
    weight, shift, keep = np.empty(P), np.empty(P), np.empty(P)
    wdw_all = np.empty(P)
    euler_a = np.empty(max(n_euler, 1))
    per_group, n_groups = _head_groups(R, Tq)
    rows_g = per_group * Tq  # a group's query rows (the last group may have fewer)
    for grp in range(c, n_groups, n_chunks):  # the chunk's groups, each a tile at a time, in order
        for r0 in range(grp * rows_g, min(R, (grp + 1) * rows_g), TILE_QUERIES):
            nq = min(TILE_QUERIES, min(R, (grp + 1) * rows_g) - r0)
            n = nq * K
            _tile_forward(r0, nq, q2, k2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                          mode, delta_t, eps, n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw,
                          phi, omega, tg, age, logit)
            _tile_softmax(r0, nq, valid2, logit, shift, keep, weight, q2)
            for qi in range(nq):
                r = r0 + qi
                p0 = qi * K
                wsum = 0.0
                for p in range(p0, p0 + K):
                    d_w[p] = 0.0
                    d_tg[p] = 0.0
                    wdw_all[p] = 0.0
                    wsum += weight[p]
                row_ok[qi] = wsum != 0.0
                if wsum == 0.0:  # no valid key
                    continue
                bh_ = r // Tq
                b_, t_, h_ = bh_ // H, r - bh_ * Tq, bh_ % H  # grad_out's row (d,)
                # o_r = sum_p w_p tg_p v_j: gradients of w_p and tg_p here; v_j's (g * grad_out) is added
                # at the end of the tile (indexed in place: a row view per pair cost more than its d
                # multiply-adds)
                wdw = 0.0
                for p in range(p0, p0 + K):
                    if not valid2[r, p - p0]:
                        continue
                    dg = 0.0
                    g = weight[p] * tg[p]
                    kr = krow[p]
                    for e in range(d):
                        go = grad_out[b_, t_, h_, e]
                        dg += go * v2[kr, e]
                    gv[p] = g
                    d_w[p] = dg * tg[p]
                    d_tg[p] = dg * weight[p]
                    wdw += weight[p] * d_w[p]
                for p in range(p0, p0 + K):
                    wdw_all[p] = wdw
            # the ODE logit's backward, per pair (invalid pairs have weight 0, so every gradient below is
            # 0); one loop per mode, so the steady and exact ones vectorise
            if mode == 0:
                for p in range(n):
                    dl = weight[p] * (d_w[p] - wdw_all[p])  # softmax backward
                    w = omega[p]
                    d_aphi[p] = dl / w
                    d_aom[p] = -dl * phi[p] / (w * w)
                    d_alpha[p] = 0.0  # d tau
            elif mode == 1:
                for p in range(n):
                    dl = weight[p] * (d_w[p] - wdw_all[p])
                    pp, w = phi[p], omega[p]
                    tau = delta_t * tg[p]
                    em1 = _expm1(-w * tau, q2)
                    d_aphi[p] = dl * -em1 / w
                    d_aom[p] = dl * (pp / (w * w) * em1 + pp / w * tau * (em1 + 1.0))
                    d_alpha[p] = dl * pp * (em1 + 1.0)
            else:
                for p in range(n):
                    dl = weight[p] * (d_w[p] - wdw_all[p])
                    pp, w = phi[p], omega[p]
                    tau = delta_t * tg[p]
                    hstep = tau / n_euler
                    a = 0.0
                    for k in range(n_euler):
                        euler_a[k] = a
                        a = a + hstep * (pp - w * a)
                    da = dl
                    dp = 0.0
                    dom = 0.0
                    dhs = 0.0
                    for k in range(n_euler - 1, -1, -1):
                        a = euler_a[k]
                        dp += da * hstep
                        dom -= da * hstep * a
                        dhs += da * (pp - w * a)
                        da = da * (1.0 - hstep * w)
                    d_aphi[p] = dp
                    d_aom[p] = dom
                    d_alpha[p] = dhs / n_euler
            # d_aphi, d_aom, d_alpha hold d phi, d omega, d tau: on to the pre-activations
            for p in range(n):
                pp, t_g = phi[p], tg[p]
                d_pre_t = (d_tg[p] + d_alpha[p] * delta_t) * t_g * (1.0 - t_g)  # the time gate's sigmoid
                d_alpha[p] = d_pre_t * age[p]
                d_beta[p] = d_pre_t
                d_aphi[p] = d_aphi[p] * pp * (1.0 - pp)
                d_aom[p] = d_aom[p] * _sigmoid(gates[1, p], q2)  # softplus' derivative
            # the heads, then the backbone, vectorised over the tile's pairs (the tile's own sums)
            a0 = 0.0
            a1 = 0.0
            for p in range(n):
                a0 += d_aphi[p]
                a1 += d_aom[p]
            pbh[grp, 0] += a0
            pbh[grp, 1] += a1
            dWh = pWh[grp]
            for m in range(Nm):
                wh0 = Wh[m, 0]
                wh1 = Wh[m, 1]
                a0 = 0.0
                a1 = 0.0
                for p in range(n):
                    mo = motor[m, p]
                    a0 += mo * d_aphi[p]
                    a1 += mo * d_aom[p]
                    d_pm[m, p] = (d_aphi[p] * wh0 + d_aom[p] * wh1) * (1.0 - mo * mo)
                dWh[m, 0] += a0
                dWh[m, 1] += a1
            _dense_backward(command, Wm, d_pm, pWm[grp], pbm[grp], d_pc, n)
            _dense_backward(inter, Wc, d_pc, pWc[grp], pbc[grp], d_pre, n)
            # the first layer's gradients into the tile's query rows (its own), then into the key rows
            # and the values, query row after query row and slot after slot
            for qi in range(nq):
                r = r0 + qi
                p0 = qi * K
                for f in range(Ni):
                    for p in range(p0, p0 + K):
                        d_q2[r, f] += d_pre[f, p]
                for p in range(p0, p0 + K):
                    d_q2[r, Ni] += d_alpha[p]
                for p in range(p0, p0 + K):
                    d_q2[r, Ni + 1] += d_beta[p]
            for qi in range(nq):
                r = r0 + qi
                bh_ = r // Tq
                b_, h_, t_ = bh_ // H, bh_ % H, r - bh_ * Tq  # grad_out's row
                p0 = qi * K
                for p in range(p0, p0 + K):
                    kr = krow[p]
                    if row_ok[qi] and valid2[r, p - p0]:
                        g = gv[p]
                        for e in range(d):
                            d_v2[kr, e] += g * grad_out[b_, t_, h_, e]
                    for f in range(Ni):
                        d_k2[kr, f] += d_pre[f, p]
                    d_k2[kr, Ni] += d_alpha[p]
                    d_k2[kr, Ni + 1] += d_beta[p]


@_jit
def _sum_tiles(parts, out):  # pragma: no cover - compiled
    """out += parts[0] + parts[1] + ..., element by element in order (the order in which the
    serial kernel added each part's sum): parts (n_parts, *out.shape) float64."""
    n = parts.shape[0]
    if n == 0:
        return
    flat = parts.reshape(n, out.size)
    o = out.reshape(out.size)
    for t in range(n):
        for i in range(out.size):
            o[i] += flat[t, i]


def _backward_run(grad_out, q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t,
                  mode, delta_t, eps, n_euler, d_q2, d_k2, d_v2, dWc, dbc, dWm, dbm, dWh, dbh,
                  n_chunks):  # pragma: no cover - compiled
    """Gradients of sum(grad_out * out) with respect to q2, k2, v2 and the backbone's weights
    (accumulated into the zeroed d_* arrays; float64 accumulators for the weights), from the
    forward's inputs: groups of whole heads (rows of B H; :func:`_head_groups`) in n_chunks chunks
    (:func:`_backward_chunk`, which computes each tile's activations again), which may run on
    threads, then the weights' sums over the groups (:func:`_sum_tiles`, serial and in group
    order). Every sum is added in the order of the serial kernel, so the result does not depend on
    the threads."""
    R = q2.shape[0]
    Ni, Nc = Wc.shape
    Nm = Wm.shape[1]
    n_groups = _head_groups(R, Tq)[1]
    pWc, pbc = np.zeros((n_groups, Ni, Nc)), np.zeros((n_groups, Nc))
    pWm, pbm = np.zeros((n_groups, Nc, Nm)), np.zeros((n_groups, Nm))
    pWh, pbh = np.zeros((n_groups, Nm, 2)), np.zeros((n_groups, 2))
    for c in prange(n_chunks):
        _backward_chunk(c, n_chunks, grad_out, q2, k2, v2, idx2, valid2, Tq, Tk, H, Wc, bc, Wm, bm, Wh, bh, q_times,
                        k_times, has_t, mode, delta_t, eps, n_euler, pWc, pbc, pWm, pbm, pWh, pbh, d_q2, d_k2, d_v2)
    _sum_tiles(pWc, dWc)
    _sum_tiles(pbc, dbc)
    _sum_tiles(pWm, dWm)
    _sum_tiles(pbm, dbm)
    _sum_tiles(pWh, dWh)
    _sum_tiles(pbh, dbh)


_BACKWARD = _variants(_backward_run)


#: positions in :meth:`agent.nn.nac.NAC.fused_weights` of the weights torch's GEMM reads (Wqkv, bqkv,
#: WoutT, bout: torch tensors); the others are NumPy arrays for the compiled kernel
FUSED_TORCH_WEIGHTS = (0, 1, 11, 12)

#: the longest sequence :func:`fused_forward` takes; longer ones keep the layer's chunked path,
#: whose working memory is bounded (see :data:`agent.nn.nac.ATTEND_QUERY_CHUNK`)
FUSED_MAX_T = 1024


@_jit
def _fused_heads(bh_, qkv, wq, bq, wk, T, H, qT, kT, q, v2, qhT, khT):  # pragma: no cover - compiled
    """Step 2 and the first backbone layer's halves of :func:`_fused_forward_run` for one head
    (bh_, a row of (B H)): its queries and keys transposed into qT / kT (B, H, d, T) (rows over
    time, written contiguously), its queries by row into q (B, H, T, d) (the score loop ran 25 %
    slower on a strided view of qT), its values by row of (B H T) into v2, and qhT / khT[bh_]
    (F, T): the query and key halves, once per query and key, transposed (rows over time, so
    these loops and the tiles' gathers run along contiguous memory)."""
    dm = qkv.shape[1] // 3
    d = dm // H
    F = wq.shape[1]
    b = bh_ // H
    h = bh_ - b * H
    for t in range(T):
        r = b * T + t
        for e in range(d):
            v2[bh_ * T + t, e] = qkv[r, 2 * dm + h * d + e]
            q[b, h, t, e] = qkv[r, h * d + e]
    for t0 in range(0, T, 32):  # transposed a block of 32 steps at a time (their rows stay cached)
        t1 = min(t0 + 32, T)
        for e in range(d):
            c = h * d + e
            for t in range(t0, t1):
                qT[b, h, e, t] = qkv[b * T + t, c]
                kT[b, h, e, t] = qkv[b * T + t, dm + c]
    for f in range(F):
        qrow = qhT[bh_, f]
        krow_ = khT[bh_, f]
        qrow[:] = bq[f]
        krow_[:] = 0.0
        e = 0
        while e + 4 <= d:  # four features a pass: a quarter of the loads and stores of the rows
            a0, a1, a2, a3 = wq[e, f], wq[e + 1, f], wq[e + 2, f], wq[e + 3, f]
            c0, c1, c2, c3 = wk[e, f], wk[e + 1, f], wk[e + 2, f], wk[e + 3, f]
            for t in range(T):
                qrow[t] += (a0 * qT[b, h, e, t] + a1 * qT[b, h, e + 1, t] + a2 * qT[b, h, e + 2, t]
                            + a3 * qT[b, h, e + 3, t])
                krow_[t] += (c0 * kT[b, h, e, t] + c1 * kT[b, h, e + 1, t] + c2 * kT[b, h, e + 2, t]
                             + c3 * kT[b, h, e + 3, t])
            e += 4
        while e < d:
            wqe = wq[e, f]
            wke = wk[e, f]
            for t in range(T):
                qrow[t] += wqe * qT[b, h, e, t]
                krow_[t] += wke * kT[b, h, e, t]
            e += 1


@_jit
def _fused_chunk(c, n_chunks, q, kT, qhT, khT, v2, Wc, bc, Wm, bm, Wh, bh, B, T, H, K, bs, n_blocks, causal, key_mask,
                 has_mask, q_times, k_times, has_t, mode, delta_t, eps, n_euler, qb, qpos, cent, count, c2max, k2max,
                 zt_blocks, zt, idx, valid, o):  # pragma: no cover - compiled
    """Chunk c of n_chunks of :func:`_fused_forward_run`: the items (head, block of qb queries, qb a
    multiple of TILE_QUERIES) c, c + n_chunks, ... in :func:`_item`'s order: each one's ranking (the exact selector, or the
    blocks selector when bs > 0), then its pairs a tile at a time, their weights and the weighted
    values into o; one set of work arrays for the chunk."""
    d = v2.shape[1]
    F = qhT.shape[1]
    dt = v2.dtype
    BH = B * H
    Ni, Nc, Nm = Wc.shape[0], Wc.shape[1], Wm.shape[1]
    P = TILE_QUERIES * K
    # the selectors' work arrays (the one not in use gets empty ones)
    bufs, cand, vals, keys, slots, cv, Ls = _topk_exact_work(q, T if bs == 0 else 0, K)
    bbuf, bvals, bkeys, cbuf, cpos, bcand, bvals_k, bkeys_k, bslots, bcv = _topk_blocks_work(
        q, cent.shape[1] if bs > 0 else 0, bs, n_blocks if bs > 0 else 0, K)
    krow, pre, inter, command, motor, gates, phi, omega, tg, age, logit = _tile_work(qhT, P, F, Ni, Nc, Nm)
    weight, shift, keep = np.empty(P), np.empty(P), np.empty(P)
    cast = np.empty(1, dtype=dt)
    nzk, nzw = _nz_work(Wc, Wm, Wh)
    kloc = np.empty(P, np.int64)
    acc = np.empty(d, dt)
    idx2 = idx.reshape(BH * T, K)
    valid2 = valid.reshape(BH * T, K)
    n_qb = (T + qb - 1) // qb
    for it in range(c, BH * n_qb, n_chunks):
        bh_, j = _item(it, n_qb)
        b = bh_ // H
        h = bh_ - b * H
        i0 = j * qb
        i1 = min(T, i0 + qb)
        # 3. the ranking of the block's queries
        if bs > 0:
            _topk_blocks_rows(q, kT, qpos, key_mask, has_mask, causal, K, bs, n_blocks, b, h, i0, i1, cent[bh_],
                              count[bh_], c2max[bh_], k2max[bh_], zt_blocks, zt, bbuf, bvals, bkeys, cbuf, cpos,
                              bcand, bvals_k, bkeys_k, bslots, bcv, idx, valid)
        else:
            _topk_exact_rows(q, kT, qpos, key_mask, has_mask, causal, K, b, h, i0, i1, k2max[bh_], zt, bufs, cand,
                             vals, keys, slots, cv, Ls, idx, valid)
        # 4.-8. the pairs, their weights and the weighted values, a tile of the head's queries at a time
        for t0 in range(i0, i1, TILE_QUERIES):
            nq = min(TILE_QUERIES, i1 - t0)
            r0 = bh_ * T + t0
            n = nq * K
            for qi in range(nq):  # the pairs' keys: local (kloc) and as rows of (B H T) (krow)
                for s in range(K):
                    kloc[qi * K + s] = idx2[r0 + qi, s]
            for p in range(n):
                krow[p] = bh_ * T + kloc[p]
            for f in range(F):  # gather: query half + key half of every pair, feature by feature
                qrow = qhT[bh_, f]
                krow_ = khT[bh_, f]
                pf = pre[f]
                for qi in range(nq):
                    qv = qrow[t0 + qi]
                    for s in range(K):
                        pf[qi * K + s] = qv + krow_[kloc[qi * K + s]]
            _tile_backbone(r0, nq, K, T, T, H, Wc, bc, Wm, bm, Wh, bh, q_times, k_times, has_t, mode, delta_t,
                           eps, n_euler, krow, pre, inter, command, motor, gates, cast, nzk, nzw, phi, omega, tg,
                           age, logit)
            _tile_softmax(r0, nq, valid2, logit, shift, keep, weight, qhT)
            for qi in range(nq):  # the weighted values, summed in the compute dtype
                acc[:] = 0.0
                for p in range(qi * K, qi * K + K):
                    if weight[p] != 0.0:  # invalid slots (weight 0) never touch the output
                        cast[0] = weight[p] * tg[p]
                        g = cast[0]
                        kr = krow[p]
                        for e in range(d):  # indexed in place: a row view per pair cost 4x this loop
                            acc[e] += g * v2[kr, e]
                for e in range(d):
                    o[b, t0 + qi, h, e] = acc[e]


def _fused_forward_run(qkv, wq, bq, wk, Wc, bc, Wm, bm, Wh, bh, B, T, H, K, bs, n_blocks, causal, key_mask,
                       has_mask, q_times, k_times, has_t, mode, delta_t, eps, n_euler, qb, o,
                       n_chunks):  # pragma: no cover - compiled
    """Steps 2-8 of the no-grad forward of the layer in one call: the heads, the ranking (exact,
    or the blocks selector with bs keys a block and n_blocks blocks kept when bs > 0), the first
    backbone layer's halves, the pairs, their weights and the weighted values.

    qkv (B T, 3 d_model): the three sensory gates side by side (computed by the caller); wq (d, F),
    bq (F,), wk (d, F): the first backbone layer's query and key halves; Wc, bc, Wm, bm, Wh, bh: the
    rest of the backbone (as :class:`PairAttention`). Writes o (B, T, H, d), the heads' outputs
    before the output map. Two loops whose iterations are independent (``prange`` may run them on
    threads): the heads (:func:`_fused_heads`, and each head's key norms or block centroids), then
    n_chunks chunks of (head, query block) items (:func:`_fused_chunk`)."""
    dm = qkv.shape[1] // 3
    d = dm // H
    F = wq.shape[1]
    dt = qkv.dtype
    BH = B * H
    qT = np.empty((B, H, d, T), dt)
    kT = np.empty((B, H, d, T), dt)
    q = np.empty((B, H, T, d), dt)
    v2 = np.empty((BH * T, d), dt)
    qhT = np.empty((BH, F, T), dt)
    khT = np.empty((BH, F, T), dt)
    nb = (T + bs - 1) // bs if bs > 0 else 0
    cent = np.empty((BH, nb, d), dt)
    count = np.empty((BH, nb), np.int64)
    c2max = np.empty(BH)
    k2max = np.empty(BH)
    for i in prange(BH):
        _fused_heads(i, qkv, wq, bq, wk, T, H, qT, kT, q, v2, qhT, khT)
        if bs > 0:
            cm, km = _block_centroids(kT[i // H, i % H], key_mask, has_mask, i // H, bs, cent[i], count[i])
            c2max[i] = cm
            k2max[i] = km
        else:
            k2max[i] = _key_norms_max(kT[i // H, i % H], q)
    if bs > 0:
        zt_blocks = _guess_z(nb, n_blocks - 1 if causal else n_blocks)
        zt = _guess_z(n_blocks * bs, K)
    else:
        zt_blocks = _guess_z(0, K)
        zt = _guess_z(T, K)
    qpos = np.arange(T)
    idx = np.empty((B, H, T, K), np.int64)
    valid = np.empty((B, H, T, K), np.bool_)
    for c in prange(n_chunks):
        _fused_chunk(c, n_chunks, q, kT, qhT, khT, v2, Wc, bc, Wm, bm, Wh, bh, B, T, H, K, bs, n_blocks, causal,
                     key_mask, has_mask, q_times, k_times, has_t, mode, delta_t, eps, n_euler, qb, qpos, cent, count,
                     c2max, k2max, zt_blocks, zt, idx, valid, o)


_FUSED = _variants(_fused_forward_run)


# --------------------------------------------------------------------------------------------
# Torch-facing functions
# --------------------------------------------------------------------------------------------


def topk_exact(q: Tensor, k: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None,
               causal: bool) -> tuple[Tensor, Tensor]:
    """The exact selector's ranking in one kernel: scores q . k and the K highest allowed per query.

    The scores are computed a query at a time (no (B, H, Tq, Tk) matrix; memory O(Tk)) and ranked
    without the 1/sqrt(d) factor, which does not change their order.

    Args:
        q: (B, H, Tq, d), k: (B, H, Tk, d), float32/float64 on the CPU.
        K: keys kept per query, at most Tk.
        qpos: (Tq,) int64, each query's key position (keys after it are not allowed when causal).
        key_mask: (B, Tk) bool, True = a key that may be attended, or None (all may).
        causal: whether keys after qpos are excluded.

    Returns:
        indices (B, H, Tq, K) int64 (highest score first; invalid slots hold 0) and valid
        (B, H, Tq, K) bool (False where fewer than K keys are allowed). The same keys as
        ``torch.topk`` on the masked score matrix, ties going to the earlier key.
    """
    B, H, Tq, _ = q.shape
    idx = np.empty((B, H, Tq, K), dtype=np.int64)
    valid = np.empty((B, H, Tq, K), dtype=np.bool_)
    mask = _np(key_mask.to(torch.bool)) if key_mask is not None else np.ones((1, 1), dtype=np.bool_)
    Tk = k.shape[2]
    n = _threads(B * H * Tq * Tk, PARALLEL_MIN_SCORES)
    qb = _query_block(B * H, Tq, n, 4)  # blocks of whole groups of four queries (the score loop's)
    _call(_TOPK_EXACT, n, B * H * -(-Tq // qb), _np(q), _np(k.transpose(-1, -2)), _np(qpos.to(torch.int64)), mask,
          key_mask is not None, bool(causal), int(K), qb, idx, valid)
    return torch.from_numpy(idx), torch.from_numpy(valid)


def topk_blocks(q: Tensor, k: Tensor, K: int, qpos: Tensor, key_mask: Tensor | None, causal: bool,
                block_size: int, n_blocks: int) -> tuple[Tensor, Tensor]:
    """The blocks selector (paper Section 2.3, Algorithm 2) in one kernel, a query at a time.

    The same selection as :func:`agent.nn.nac.select_topk_blocks`: keys in blocks of
    ``block_size``; each query scores the block centroids (means of the valid keys), keeps
    ``n_blocks`` blocks (when causal: its own block, plus the best ``n_blocks - 1`` among the
    blocks that end before it) and takes the exact top-K keys inside them. Working memory is
    O(Tk d) for the centroids plus O(n_blocks block_size) per query.

    Args:
        q: (B, H, Tq, d), k: (B, H, Tk, d), float32/float64 on the CPU.
        K: keys kept per query, at most Tk.
        qpos, key_mask, causal: as :func:`topk_exact`.
        block_size: keys per block (>= 1); n_blocks: blocks kept per query (>= 1, <= the number
            of blocks).

    Returns:
        indices (B, H, Tq, K) int64 (highest score first; invalid slots hold 0) and valid
        (B, H, Tq, K) bool; ties go to the earlier block and key.
    """
    B, H, Tq, _ = q.shape
    idx = np.empty((B, H, Tq, K), dtype=np.int64)
    valid = np.empty((B, H, Tq, K), dtype=np.bool_)
    mask = _np(key_mask.to(torch.bool)) if key_mask is not None else np.ones((1, 1), dtype=np.bool_)
    Tk = k.shape[2]
    n = _threads(B * H * Tq * Tk, PARALLEL_MIN_SCORES)
    qb = _query_block(B * H, Tq, n, 1)
    _call(_TOPK_BLOCKS, n, B * H * -(-Tq // qb), _np(q), _np(k.transpose(-1, -2)), _np(qpos.to(torch.int64)), mask,
          key_mask is not None, bool(causal), int(K), int(block_size), int(n_blocks), qb, idx, valid)
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
        B, H, Tq, F = q_half.shape
        Tk, d = v.shape[2], v.shape[3]
        dtype = q_half.dtype
        qt, kt, has_t = _times(q_times, k_times)
        q2, k2, v2 = _np(q_half).reshape(B * H * Tq, F), _np(k_half.to(dtype)).reshape(B * H * Tk, F), \
            _np(v.to(dtype)).reshape(B * H * Tk, d)
        ix, ok = _np(idx).reshape(B * H * Tq, -1), _np(valid).reshape(B * H * Tq, -1)
        weights = [_np(a.to(dtype)) for a in (Wc, bc, Wm, bm, Wh, bh)]
        out = np.empty((B, Tq, H, d), dtype=q2.dtype)
        args = (MODE_IDS[mode], float(delta_t), float(eps), int(euler_steps))
        # nothing per pair is kept for the backward: it computes each tile's activations again
        tiles = -(-(B * H * Tq) // TILE_QUERIES)
        _call(_FORWARD, _threads(ix.size, PARALLEL_MIN_PAIRS), tiles, q2, k2, v2, ix, ok, Tq, Tk, H, *weights, qt,
              kt, has_t, *args, out)
        ctx.save_for_backward(q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh)
        ctx.kernel = (qt, kt, has_t, args)
        return torch.from_numpy(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q_half, k_half, v, idx, valid, Wc, bc, Wm, bm, Wh, bh = ctx.saved_tensors
        qt, kt, has_t, args = ctx.kernel
        B, H, Tq, F = q_half.shape
        Tk, d = v.shape[2], v.shape[3]
        dtype = q_half.dtype
        q2, k2, v2 = _np(q_half).reshape(B * H * Tq, F), _np(k_half.to(dtype)).reshape(B * H * Tk, F), \
            _np(v.to(dtype)).reshape(B * H * Tk, d)
        weights = [_np(a.to(dtype)) for a in (Wc, bc, Wm, bm, Wh, bh)]
        d_in = [np.zeros(a.shape, dtype=a.dtype) for a in (q2, k2, v2)]
        d_w = [np.zeros(a.shape, dtype=np.float64) for a in weights]  # float64 sums
        ix = _np(idx).reshape(B * H * Tq, -1)
        _call(_BACKWARD, _threads(ix.size, PARALLEL_MIN_PAIRS), _head_groups(B * H * Tq, Tq)[1],
              _np(grad_out.to(dtype)), q2, k2, v2, ix, _np(valid).reshape(B * H * Tq, -1), Tq, Tk, H, *weights, qt,
              kt, has_t, *args, *d_in, *d_w)
        shapes = (q_half.shape, k_half.shape, v.shape)
        grads = [torch.from_numpy(g).view(shape) for g, shape in zip(d_in, shapes)] + [None, None]
        grads += [torch.from_numpy(g).to(dtype) for g in d_w]
        return (*grads, None, None, None, None, None, None)


def pair_attention(q_half: Tensor, k_half: Tensor, v: Tensor, idx: Tensor, valid: Tensor,
                   backbone: tuple[Tensor, ...], q_times: Tensor | None, k_times: Tensor | None,
                   mode: str, delta_t: float, eps: float, euler_steps: int) -> Tensor:
    """:class:`PairAttention` (see there for shapes); ``backbone`` = (Wc, bc, Wm, bm, Wh, bh)."""
    return PairAttention.apply(q_half, k_half, v, idx, valid, *backbone, q_times, k_times, mode, delta_t, eps,
                               euler_steps)


def fused_forward(weights: tuple[np.ndarray, ...], x: Tensor, t: Tensor | None, mask: Tensor | None, num_heads: int,
                  K: int, causal: bool, mode: str, delta_t: float, eps: float, euler_steps: int,
                  blocks: tuple[int, int] | None = None) -> Tensor:
    """The NAC layer's forward without gradients in one kernel call.

    The same function as the layer's other paths (sensory gates, heads, top-K, steps 4-8
    and the output map; tests/test_nn_nac_kernels.py compares them), with one Python-to-machine-code
    call (steps 2-8) between two ``torch.addmm`` (the sensory gates and the output map) instead of
    about fifteen torch operations and three kernel calls: at short sequences (T = 16) that
    overhead was most of the layer's time. torch's GEMM does the two dense maps 2-4x faster than
    the compiled row loop that did them before (T=256: the layer 1.40 -> 1.15 ms, one thread).

    Args:
        weights: (Wqkv (D_in, 3 d_model), bqkv, Wq (d, F), bq (F,), Wk (d, F), Wc, bc, Wm, bm, Wh, bh,
            WoutT (d_model, d_model), bout), contiguous, of x's dtype: Wqkv, bqkv, WoutT and bout
            torch tensors, the rest NumPy arrays (:meth:`agent.nn.nac.NAC.fused_weights`).
        x: (B, T, D_in) float32/float64 CPU tensor, T <= :data:`FUSED_MAX_T`.
        t: (B, T) timestamps in seconds, or None (age 1). mask: (B, T) bool, True = valid, or None.
        num_heads: H. K: keys kept per query, at most T. The rest: as :class:`PairAttention`.
        blocks: None for the exact selector, or (block_size, n_blocks) for the blocks selector
            (:func:`topk_blocks`; :func:`agent.nn.nac.blocks_layout` gives the layer's).

    Returns:
        y (B, T, d_model), a new tensor (no autograd history).

    Raises:
        ValueError: T above :data:`FUSED_MAX_T`, K above T, or blocks that do not fit T.
    """
    B, T, D = x.shape
    if T > FUSED_MAX_T or not 1 <= K <= T:
        raise ValueError(f"fused_forward takes 1 <= K <= T <= {FUSED_MAX_T}, got T={T}, K={K}")
    bs, n_blocks = blocks if blocks is not None else (0, 0)
    if blocks is not None and not (bs >= 1 and 1 <= n_blocks <= -(-T // bs)):
        raise ValueError(f"blocks (block_size, n_blocks) = {blocks} do not fit T={T}: block_size >= 1 and "
                         f"1 <= n_blocks <= ceil(T / block_size)")
    wqkv, bqkv, WoutT, bout = (weights[i] for i in FUSED_TORCH_WEIGHTS)
    # the two dense maps by torch (its GEMM is 2-4x faster than a compiled row loop; same function)
    qkv = torch.addmm(bqkv, x.reshape(B * T, D), wqkv).numpy()  # 1. the sensory gates
    dm = qkv.shape[1] // 3
    o = np.empty((B, T, int(num_heads), dm // int(num_heads)), dtype=qkv.dtype)
    qt, kt, has_t = _times(t, t)
    m = _np(mask.to(torch.bool)) if mask is not None else np.ones((1, 1), dtype=np.bool_)
    H = int(num_heads)
    n = max(_threads(B * H * T * K, PARALLEL_MIN_PAIRS), _threads(B * H * T * T, PARALLEL_MIN_SCORES))
    qb = _query_block(B * H, T, n, TILE_QUERIES)  # blocks of whole tiles
    _call(_FUSED, n, B * H * -(-T // qb), qkv, *weights[2:11], B, T, H, int(K), int(bs), int(n_blocks), bool(causal),
          m, mask is not None, qt, kt, has_t, MODE_IDS[mode], float(delta_t), float(eps), int(euler_steps), qb, o)
    # the heads concatenated, then the output map
    return torch.addmm(bout, torch.from_numpy(o).view(B * T, dm), WoutT).view(B, T, dm)


__all__ = ["FUSED_MAX_T", "FUSED_TORCH_WEIGHTS", "ITEMS_PER_THREAD", "MODE_IDS", "PARALLEL_MIN_PAIRS",
           "PARALLEL_MIN_SCORES", "PairAttention", "applies", "available", "float32_math", "fused_forward",
           "pair_attention", "set_enabled", "topk_blocks", "topk_exact", "use_kernels"]
