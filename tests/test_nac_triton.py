"""The NAC layer's Triton kernels (agent/nn/nac_triton.py) against its torch path.

On the CPU they run in Triton's interpreter (``TRITON_INTERPRET=1``, set below before triton is first
imported when no GPU is there) at small sizes: outputs and the gradients w.r.t. the input and every
parameter are compared in float32 for each ODE mode and selector, with and without timestamps and
key masks, causal and not, at T = 1, T not a multiple of the query block, K not a power of two and a
query without any valid key; both selectors' kernels are compared with the torch selectors (the
sets of kept keys); the streaming step, the dispatch switch and the errors are tested too. A
subprocess without the interpreter builds the kernels to sm_90 machine code (no GPU needed). The
``cuda`` suite (``pytest -m cuda``) runs the same comparisons with the compiled kernels on a GPU,
and is skipped without one. Without triton installed only the import/fallback tests run.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import torch

if not torch.cuda.is_available():  # the CPU runs the kernels only in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from agent.nn import nac as nac_module, nac_kernels, nac_triton  # noqa: E402
from agent.nn.nac import NAC, blocks_layout, select_topk_blocks, select_topk_exact  # noqa: E402

MODES = ("steady", "exact", "euler")
SELECTORS = ("exact", "blocks")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_triton = pytest.mark.skipif(not nac_triton.installed(),
                                  reason=f"triton is not installed ({nac_triton.INSTALL_HINT})")


def _interpreter_reason() -> str | None:
    if not nac_triton.installed():
        return f"triton is not installed ({nac_triton.INSTALL_HINT})"
    if not nac_triton.interpreted():
        return ("Triton's interpreter is off (TRITON_INTERPRET was not 1 when triton was first imported, as on a "
                "machine with CUDA): the CPU tests need it; `pytest -m cuda` runs the compiled kernels")
    return None


_INTERP_SKIP = _interpreter_reason()
needs_interpreter = pytest.mark.skipif(_INTERP_SKIP is not None, reason=_INTERP_SKIP or "")


def _layer(device, seed=0, **kw) -> NAC:
    torch.manual_seed(seed)
    cfg = dict(input_dim=12, d_model=16, num_heads=2, topk=4, mode="exact", seed=3)
    cfg.update(kw)
    return NAC(**cfg).to(device)


def _inputs(device, B=2, T=19, seed=1, with_t=True, with_mask=True, first_masked=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, 12, generator=g)
    t = torch.cumsum(0.02 + 0.1 * torch.rand(B, T, generator=g, dtype=torch.float64), 1) if with_t else None
    mask = None
    if with_mask:
        mask = torch.rand(B, T, generator=g) > 0.25
        mask[:, 0] = not first_masked  # first_masked: the first query of each row has no valid key
    mv = lambda a: None if a is None else a.to(device)  # noqa: E731
    return x.to(device), mv(t), mv(mask)


class _Spy:
    """Counts the calls of nac_triton.pair_attention (``calls``) and of its selectors (``selects``),
    which agent.nn.nac looks up at each call."""

    def __init__(self, monkeypatch):
        self.calls = self.selects = 0
        for name in ("pair_attention", "topk_exact", "topk_blocks"):
            monkeypatch.setattr(nac_triton, name, self._counted(name, getattr(nac_triton, name)))

    def _counted(self, name, real):
        def spy(*a, **kw):
            if name == "pair_attention":
                self.calls += 1
            else:
                self.selects += 1
            return real(*a, **kw)

        return spy


def _run(m: NAC, x, t, mask, triton: bool):
    """Output and the gradients of a fixed scalar of it w.r.t. x and every parameter."""
    m.zero_grad()
    x = x.clone().requires_grad_()
    with nac_triton.use_triton("on" if triton else "off"), nac_kernels.use_kernels(False):
        y = m(x, t, mask)
    w = torch.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).view_as(y)
    (y * w).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in m.named_parameters()}


def _compare(m, x, t, mask, monkeypatch):
    spy = _Spy(monkeypatch)
    y_k, gx_k, gp_k = _run(m, x, t, mask, triton=True)
    assert spy.calls > 0 and spy.selects == spy.calls  # the Triton kernels ran, the selector's too
    calls = spy.calls
    y_t, gx_t, gp_t = _run(m, x, t, mask, triton=False)
    assert spy.calls == calls and spy.selects == calls  # ... and the reference did not use them
    torch.testing.assert_close(y_k, y_t, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx_k, gx_t, atol=1e-5, rtol=1e-4)
    assert gp_k.keys() == gp_t.keys()
    for name in gp_t:
        torch.testing.assert_close(gp_k[name], gp_t[name], atol=1e-5, rtol=1e-4, msg=name)
    # the comparison is not trivial: the gradients are not all zero (with one key per query the
    # softmax weight is 1 whatever the logit, so only the time gate's path then has gradients)
    names = ["time_affine.weight", "sensory.v.weight"]
    if x.shape[1] > 1:
        names += ["to_command.weight", "to_motor.weight", "head_phi.weight", "head_omega.weight"]
    for name in names:
        assert gp_k[name].abs().max() > 0, name
    return y_k


# ------------------------------------------------------------------ without triton


def test_layer_imports_and_runs_without_triton():
    """With triton hidden: agent.nn.nac_triton imports, the layer keeps its torch path in "auto" mode,
    and asking for the Triton path fails with the install hint."""
    code = """
import sys
sys.modules["triton"] = None  # as if it were not installed
import torch
from agent.nn import nac_triton
from agent.nn.nac import NAC
assert not nac_triton.installed()
m = NAC(input_dim=6, d_model=8, num_heads=2, topk=2, seed=3)
x = torch.randn(1, 5, 6, requires_grad=True)
m(x).sum().backward()
assert x.grad is not None
with nac_triton.use_triton("on"):
    try:
        m(x)
    except ImportError as e:
        assert "pip install -e .[triton]" in str(e), e
    else:
        raise SystemExit("no ImportError")
try:
    nac_triton.kernels()
except ImportError as e:
    assert "pip install -e .[triton]" in str(e), e
else:
    raise SystemExit("no ImportError")
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NAC_TRITON": "auto"})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_mode_switch_rejects_unknown_values():
    with pytest.raises(ValueError, match="NAC Triton mode"):
        nac_triton.set_mode("sometimes")
    assert nac_triton.mode() in nac_triton.BACKEND_MODES


# ------------------------------------------------------------------ interpreter (CPU)


@needs_interpreter
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("selector", SELECTORS)
def test_triton_equals_the_torch_path(mode, selector, monkeypatch):
    """T = 19: two blocks of 16 queries, the second partial; timestamps and a key mask."""
    m = _layer("cpu", mode=mode, selector=selector)
    _compare(m, *_inputs("cpu", T=19), monkeypatch)


@needs_interpreter
def test_the_triton_path_takes_every_query_in_one_call(monkeypatch):
    """The torch path splits more than ATTEND_QUERY_CHUNK queries into chunks; the Triton path,
    which holds no per-pair tensor, selects and attends once (fewer launches), with the same result."""
    monkeypatch.setattr(nac_module, "ATTEND_QUERY_CHUNK", 7)
    spy = _Spy(monkeypatch)
    m = _layer("cpu", mode="exact", selector="exact")
    x, t, mask = _inputs("cpu", T=19)
    y = _compare(m, x, t, mask, monkeypatch)
    assert y.shape[1] == 19 and spy.calls == spy.selects == 1


@needs_interpreter
@pytest.mark.parametrize("mode,selector,T,topk,with_t,with_mask,causal,first_masked", [
    ("exact", "exact", 1, 4, True, False, True, False),  # one frame: one key, K = 1
    ("euler", "blocks", 1, 4, False, True, True, False),
    ("steady", "exact", 6, 3, False, True, True, True),  # K = 3 (padded to 4); a query with no valid key
    ("euler", "exact", 10, 3, True, True, False, False),  # not causal
    ("exact", "blocks", 10, 8, False, False, True, False),  # K > most queries' causal keys
])
def test_triton_edge_cases_equal_the_torch_path(mode, selector, T, topk, with_t, with_mask, causal, first_masked,
                                                monkeypatch):
    monkeypatch.setattr(nac_triton, "BLOCK_Q", 8)  # T = 10: two query blocks, the second partial
    m = _layer("cpu", mode=mode, selector=selector, topk=topk, causal=causal, euler_steps=3)
    y = _compare(m, *_inputs("cpu", T=T, with_t=with_t, with_mask=with_mask, first_masked=first_masked),
                 monkeypatch)
    if first_masked:  # no valid key: the attention is 0 and the output the output map's bias
        torch.testing.assert_close(y[:, 0], m.out.bias.detach().expand(y.shape[0], -1))


def _slot_sets(idx, valid):
    """Each query's set of valid keys (the selectors' slot order differs between paths)."""
    K = idx.shape[-1]
    return [sorted(i for i, ok in zip(r.tolist(), v.tolist()) if ok)
            for r, v in zip(idx.reshape(-1, K).cpu(), valid.reshape(-1, K).cpu())]


def _select_cases(device, T, K, causal, with_mask, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, H, d = 2, 2, 4
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H, T, d, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3 if with_mask else None
    mv = lambda a: None if a is None else a.to(device)  # noqa: E731
    return mv(q), mv(k), min(K, T), torch.arange(T, device=device), mv(mask)


def _check_selectors(device, T, K, causal, with_mask, block_q=None, slots=False):
    q, k, KK, qpos, mask = _select_cases(device, T, K, causal, with_mask)
    with nac_triton.use_triton("off"), nac_kernels.use_kernels(False):
        ref_e = select_topk_exact(q, k, K, qpos, mask, causal)
        ref_b = select_topk_blocks(q, k, K, qpos, mask, causal)
    got_e = nac_triton.topk_exact(q, k, KK, qpos, mask, causal, block_q=block_q)
    got_b = nac_triton.topk_blocks(q, k, KK, qpos, mask, causal, *blocks_layout(T, K), block_q=block_q)
    for (ri, rv), (gi, gv) in ((ref_e, got_e), (ref_b, got_b)):
        assert gi.shape == ri.shape and gi.dtype == torch.int64 and gv.dtype == torch.bool
        assert _slot_sets(gi, gv) == _slot_sets(ri, rv)
    assert any(len(s) > 1 for s in _slot_sets(*got_b)) or T == 1  # not a trivial selection
    if slots:  # the int32 slot table the layer's Triton path reads: the same keys, -1 where none
        tables = (nac_triton.topk_exact(q, k, KK, qpos, mask, causal, block_q=block_q, slots=True),
                  nac_triton.topk_blocks(q, k, KK, qpos, mask, causal, *blocks_layout(T, K), block_q=block_q,
                                         slots=True))
        for table, (gi, gv) in zip(tables, (got_e, got_b)):
            assert table.dtype == torch.int32 and table.shape == gi.shape
            assert torch.equal(table.long(), torch.where(gv, gi, -1))


@needs_interpreter
@pytest.mark.parametrize("T,K,causal,with_mask", [(1, 4, True, False), (10, 3, True, True), (10, 8, False, True),
                                                  (9, 4, False, False)])
def test_triton_selectors_select_what_the_torch_selectors_select(T, K, causal, with_mask):
    """Both selectors, block of 4 queries: T = 9, 10 end in a partial block; K = 3 pads to 4 slots;
    both output forms ((idx, valid) and the int32 slot table)."""
    _check_selectors("cpu", T, K, causal, with_mask, block_q=4, slots=True)


@needs_interpreter
@pytest.mark.parametrize("T,K,causal,with_mask", [(100, 8, True, True), (70, 20, False, True)])
def test_triton_selectors_over_several_key_blocks(T, K, causal, with_mask):
    """The exact selector scores nac_triton.BLOCK_K keys at a time: several blocks, a partial last
    one, and K = 20 (32 slots) more than a block's usual insertions."""
    assert T > 2 * nac_triton.BLOCK_K
    _check_selectors("cpu", T, K, causal, with_mask)


@needs_interpreter
def test_the_exact_selectors_tunables_change_nothing_but_speed():
    q, k, K, qpos, mask = _select_cases("cpu", 70, 8, True, True, seed=3)
    want = _slot_sets(*nac_triton.topk_exact(q, k, K, qpos, mask, True))
    for bk, warps, pre in ((16, 1, True), (64, 2, False), (128, 8, True)):
        got = nac_triton.topk_exact(q, k, K, qpos, mask, True, block_k=bk, num_warps=warps, precheck=pre)
        assert _slot_sets(*got) == want, (bk, warps, pre)
    for bad in (dict(block_k=24), dict(block_k=8), dict(num_warps=3)):
        with pytest.raises(ValueError, match="power of two"):
            nac_triton.topk_exact(q, k, K, qpos, mask, True, **bad)


def _scan_topk(scores: list[float], K: int) -> set[int]:
    """The key-by-key scan the exact selector's docstring promises: keep the K best, a later key
    enters only when strictly above the lowest kept, which leaves (on a tie the latest key)."""
    vals, ids = [float("-inf")] * K, [-1] * K
    for j, s in enumerate(scores):
        at = min(range(K), key=lambda i: (vals[i], -ids[i]))
        if s > vals[at]:
            vals[at], ids[at] = s, j
    return {i for i, v in zip(ids, vals) if v > float("-inf")}


@needs_interpreter
def test_triton_exact_selector_keeps_the_earlier_key_on_ties():
    """Integer scores with many ties across and inside key blocks: the kept set is the scan's."""
    g = torch.Generator().manual_seed(5)
    T, K, d = 80, 6, 2
    q = torch.randint(-2, 3, (1, 1, T, d), generator=g).float()
    k = torch.randint(-2, 3, (1, 1, T, d), generator=g).float()
    idx, valid = nac_triton.topk_exact(q, k, K, torch.arange(T), None, True)
    scores = (q[0, 0] @ k[0, 0].T).tolist()
    for i in range(T):
        want = _scan_topk(scores[i][: i + 1], min(K, i + 1))
        assert {int(j) for j, v in zip(idx[0, 0, i], valid[0, 0, i]) if v} == want, i


@needs_interpreter
def test_triton_selectors_reject_bad_arguments():
    q, k, _, qpos, _ = _select_cases("cpu", 5, 2, True, False)
    with pytest.raises(ValueError, match="K must be"):
        nac_triton.topk_exact(q, k, 6, qpos, None, True)
    with pytest.raises(ValueError, match="block_size, n_blocks"):
        nac_triton.topk_blocks(q, k, 2, qpos, None, True, 2, 4)
    with pytest.raises(TypeError, match="float32"):
        nac_triton.topk_exact(q.double(), k.double(), 2, qpos, None, True)


@needs_interpreter
def test_pair_attention_is_independent_of_the_query_block():
    torch.manual_seed(0)
    B, H, Tq, Tk, K, F, d = 1, 2, 7, 9, 3, 6, 4
    q_half, k_half, v = torch.randn(B, H, Tq, F), torch.randn(B, H, Tk, F), torch.randn(B, H, Tk, d)
    idx = torch.randint(0, Tk, (B, H, Tq, K))
    valid = torch.rand(B, H, Tq, K) > 0.3
    backbone = (torch.randn(4, 5), torch.randn(5), torch.randn(5, 3), torch.randn(3), torch.randn(3, 2),
                torch.randn(2))
    outs = [nac_triton.pair_attention(q_half, k_half, v, idx, valid, backbone, None, None, "exact", 1.0, 1e-2, 6,
                                      block_q=bq) for bq in (4, 8, 16)]
    assert outs[0].shape == (B, Tq, H, d)
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(outs[2], outs[0])
    # the selectors' int32 slot table (-1 = no key) in place of (idx, valid): the same output
    table = torch.where(valid, idx, -1).to(torch.int32)
    assert torch.equal(nac_triton.pair_attention(q_half, k_half, v, table, None, backbone, None, None, "exact", 1.0,
                                                 1e-2, 6), outs[0])
    # the same function as the CPU kernels' pair attention (itself tested against the torch path)
    if nac_kernels.available():
        ref = nac_kernels.pair_attention(q_half, k_half, v, idx, valid, backbone, None, None, "exact", 1.0, 1e-2, 6)
        torch.testing.assert_close(outs[0], ref, atol=1e-5, rtol=1e-5)


@needs_interpreter
def test_streaming_step_through_triton_equals_the_torch_path():
    m = _layer("cpu", mode="euler", selector="blocks")
    x, t, _ = _inputs("cpu", B=1, T=4, with_mask=False)
    outs = {}
    for on in (True, False):
        cache, ys = None, []
        with nac_triton.use_triton("on" if on else "off"), nac_kernels.use_kernels(False), torch.no_grad():
            for i in range(x.shape[1]):
                y, cache = m.step(x[:, i], cache, t[:, i])
                ys.append(y)
        outs[on] = torch.stack(ys, 1)
    torch.testing.assert_close(outs[True], outs[False], atol=1e-5, rtol=1e-5)


@needs_interpreter
def test_dispatch_uses_triton_only_where_asked(monkeypatch):
    m = _layer("cpu", mode="steady")
    x, t, mask = _inputs("cpu", B=1, T=5)
    spy = _Spy(monkeypatch)
    for mode in ("auto", "off"):  # never on the CPU by default
        with nac_triton.use_triton(mode):
            m(x, t, mask)
    assert spy.calls == 0
    with nac_triton.use_triton("on"):
        m.double()(x.double(), t, mask)  # float64: the kernels take float32 only, the layer keeps torch
        assert spy.calls == 0
        m.float()(x, t, mask)
        assert spy.calls == 1
        with torch.no_grad():  # "on" also wins over the CPU kernels' no-grad whole-layer path
            m(x, t, mask)
        assert spy.calls == 2


@needs_interpreter
def test_pair_attention_rejects_bad_inputs():
    q_half, k_half, v = torch.randn(1, 1, 3, 6), torch.randn(1, 1, 4, 6), torch.randn(1, 1, 4, 2)
    idx, valid = torch.zeros(1, 1, 3, 2, dtype=torch.long), torch.ones(1, 1, 3, 2, dtype=torch.bool)
    backbone = (torch.randn(4, 5), torch.randn(5), torch.randn(5, 3), torch.randn(3), torch.randn(3, 2),
                torch.randn(2))
    args = (None, None, "steady", 1.0, 1e-2, 6)
    with pytest.raises(TypeError, match="float32"):
        nac_triton.pair_attention(q_half.double(), k_half, v, idx, valid, backbone, *args)
    with pytest.raises(ValueError, match="idx and valid"):
        nac_triton.pair_attention(q_half, k_half, v, idx[:, :, :2], valid[:, :, :2], backbone, *args)
    with pytest.raises(ValueError, match="int32 slot table"):
        nac_triton.pair_attention(q_half, k_half, v, idx, None, backbone, *args)
    with pytest.raises(ValueError, match="mode"):
        nac_triton.pair_attention(q_half, k_half, v, idx, valid, backbone, None, None, "rk4", 1.0, 1e-2, 6)


@needs_triton
def test_kernels_compile_for_a_gpu_and_cpu_tensors_need_the_interpreter(tmp_path):
    """Without TRITON_INTERPRET: the kernels build down to sm_90 machine code with Triton's bundled
    ptxas (no GPU needed; the forward and backward in Euler mode with timestamps, the largest, and
    both causal selectors, writing (idx, valid) or the int32 slot table), and CPU tensors fail with a
    clear error."""
    code = """
import torch
from agent.nn import nac_triton
from agent.nn.nac import NAC
m = NAC(input_dim=6, d_model=8, num_heads=2, topk=2, seed=3)
with nac_triton.use_triton("on"):
    try:
        m(torch.randn(1, 3, 6))
    except RuntimeError as e:
        assert "TRITON_INTERPRET=1" in str(e), e
    else:
        raise SystemExit("no RuntimeError")
built = nac_triton.compile_kernels(90, modes=("euler",), with_times=(True,), selectors=(True,))
print(len(built), "ok")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "8 ok", r.stdout + r.stderr


# ------------------------------------------------------------------ compiled, on a GPU


def _cuda_skip() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA device"
    if not nac_triton.installed():
        return f"triton is not installed ({nac_triton.INSTALL_HINT})"
    if nac_triton.interpreted():
        return "TRITON_INTERPRET is set: the kernels would be interpreted, not compiled"
    return None


_CUDA_SKIP = _cuda_skip()


@pytest.mark.cuda
@pytest.mark.skipif(_CUDA_SKIP is not None, reason=_CUDA_SKIP or "")
class TestCuda:
    """The compiled kernels on a GPU against the torch path on the same GPU (float32, no TF32)."""

    @pytest.fixture(autouse=True)
    def _no_tf32(self):
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        yield
        torch.backends.cuda.matmul.allow_tf32 = before

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("selector", SELECTORS)
    @pytest.mark.parametrize("T", [1, 19, 67])
    def test_triton_equals_the_torch_path(self, mode, selector, T, monkeypatch):
        m = _layer("cuda", mode=mode, selector=selector, topk=8 if T > 19 else 4)
        _compare(m, *_inputs("cuda", B=3, T=T), monkeypatch)

    @pytest.mark.parametrize("mode", MODES)
    def test_edge_cases(self, mode, monkeypatch):
        monkeypatch.setattr(nac_triton, "BLOCK_Q", 4)
        m = _layer("cuda", mode=mode, topk=3, causal=mode != "exact", euler_steps=3)
        _compare(m, *_inputs("cuda", T=10, with_t=mode != "steady", first_masked=True), monkeypatch)

    @pytest.mark.parametrize("T,K,causal,with_mask", [(1, 4, True, False), (10, 3, True, True),
                                                      (100, 8, True, True), (100, 8, False, False)])
    def test_selectors(self, T, K, causal, with_mask):
        _check_selectors("cuda", T, K, causal, with_mask)

    def test_auto_mode_uses_triton_on_cuda(self, monkeypatch):
        m = _layer("cuda", mode="exact")
        x, t, mask = _inputs("cuda", B=1, T=9)
        spy = _Spy(monkeypatch)
        with nac_triton.use_triton("auto"):
            y = m(x, t, mask)
        assert spy.calls == 1
        with nac_triton.use_triton("off"):
            torch.testing.assert_close(y, m(x, t, mask), atol=1e-5, rtol=1e-5)


@needs_interpreter
def test_the_selector_sweep_times_every_setting_and_checks_its_selection():
    from agent.bench.nac_cuda import print_sweep_table, sweep_selector

    rows = sweep_selector(cells=("1x40",), configs=((16, 1, True), (64, 2, False)), repeats=2, device="cpu")
    assert [(r["block_k"], r["num_warps"], r["precheck"]) for r in rows][0] == (
        nac_triton.SELECT_TUNING["block_k"], nac_triton.SELECT_TUNING["num_warps"], nac_triton.SELECT_TUNING["precheck"])
    assert len(rows) == 3 and sum(r["default"] for r in rows) == 1
    for r in rows:
        assert r["error"] is None and r["same"] is True and len(r["times_ms"]) == 2 and r["ms"] > 0
    buf = io.StringIO()
    print_sweep_table(rows, file=buf)
    out = buf.getvalue()
    assert "| 1 | 40 | 32 (default) | 4 | False |" in out and out.count("| yes |") == 3
