"""Contract tests of the temporal cores (agent.nn.cores): shapes, streaming == full window,
causality, reset_rows, and a small memory task every core with memory must learn."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agent.nn.cores import CORES, count_parameters, make_core

NAMES = [n for n in CORES if n != "torch-nac"]
D, d, W, DT = 5, 8, 4, 0.05


def timespan_cases(names=None):
    """(name, with_t) params: every core with and without timestamps."""
    out = []
    for n in names or NAMES:
        for with_t in (True, False):
            out.append(pytest.param(n, with_t, id=f"{n}-{'t' if with_t else 'no-t'}"))
    return out


def small_kwargs(name: str) -> dict:
    if name.startswith("nac"):
        return dict(num_heads=2, topk=8)
    if name == "mha":
        return dict(num_heads=2)
    if name == "cfc":
        return dict(backbone_units=16)
    if name == "ltc":
        return dict(input_units=8, ode_unfolds=2)
    return {}


def build(name: str, input_dim: int = D, output_dim: int = d, window: int = W, frame_dt: float = DT, seed: int = 0,
          **kw):
    torch.manual_seed(seed)
    core = make_core(name, input_dim, output_dim, window, frame_dt, **{**small_kwargs(name), **kw})
    return core.eval()


def random_times(g: torch.Generator, B: int, T: int) -> torch.Tensor:
    """Increasing float64 timestamps (seconds) with irregular gaps around DT, from a large clock offset."""
    gaps = DT * (0.5 + torch.rand(B, T, generator=g, dtype=torch.float64))
    return 1000.0 + 10 * torch.rand(B, 1, generator=g, dtype=torch.float64) + gaps.cumsum(1)


# --------------------------------------------------------------------------------------------
# 1. shapes and errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_shapes(name):
    core = build(name)
    B, T = 3, 6
    x = torch.randn(B, T, D)
    assert core(x).shape == (B, T, d)
    t = random_times(torch.Generator().manual_seed(0), B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :2] = False
    assert core(x, t, mask).shape == (B, T, d)
    y, state = core.step(x[:, 0], None)
    assert y.shape == (B, d)
    y, state = core.step(x[:, 1], state)
    assert y.shape == (B, d)
    assert torch.isfinite(core(x, t, mask)).all()


@pytest.mark.parametrize("name", NAMES)
def test_bad_shapes_raise(name):
    core = build(name)
    B, T = 2, 3
    with pytest.raises(ValueError):
        core(torch.randn(B, T, D + 1))
    with pytest.raises(ValueError):
        core(torch.randn(B, D))
    with pytest.raises(ValueError):
        core(torch.randn(B, T, D), t=torch.zeros(B, T + 1))
    with pytest.raises(ValueError):
        core(torch.randn(B, T, D), mask=torch.ones(B + 1, T, dtype=torch.bool))
    with pytest.raises(ValueError):
        core.step(torch.randn(B, T, D))
    with pytest.raises(ValueError):
        core.step(torch.randn(B, D + 1))
    with pytest.raises(ValueError):
        core.step(torch.randn(B, D), None, t=torch.zeros(B + 1))


def test_unknown_core_lists_names():
    with pytest.raises(ValueError) as exc:
        make_core("no-such-core", D, d, W, DT)
    msg = str(exc.value)
    assert "no-such-core" in msg
    for name in CORES:
        assert name in msg


def test_bad_sizes_raise():
    for args in ((0, d, W, DT), (D, 0, W, DT), (D, d, 0, DT), (D, d, W, 0.0)):
        with pytest.raises(ValueError):
            make_core("gru", *args)


def test_torch_nac_needs_peers_extra():
    pytest.importorskip("torch")
    try:
        import torch_nac  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - only where the optional package is installed
        pytest.skip("torch-nac is installed")
    with pytest.raises(ImportError, match=r"\.\[peers\]"):
        make_core("torch-nac", D, d, W, DT)


@pytest.mark.parametrize("name", NAMES)
def test_count_parameters(name):
    core = build(name)
    expected = sum(p.numel() for p in core.parameters() if p.requires_grad)
    assert expected > 0
    assert count_parameters(core) == expected
    next(iter(core.parameters())).requires_grad_(False)
    assert count_parameters(core) < expected


# --------------------------------------------------------------------------------------------
# 2. streaming equals the full window
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("with_t", [True, False], ids=["t", "no-t"])
@pytest.mark.parametrize("name", NAMES)
def test_step_equals_forward_window(name, with_t):
    core = build(name)
    g = torch.Generator().manual_seed(1)
    B, T = 3, 3 * W
    x = torch.randn(B, T, D, generator=g)
    t = random_times(g, B, T) if with_t else None
    state = None
    with torch.no_grad():
        for i in range(T):
            y, state = core.step(x[:, i], state, t=None if t is None else t[:, i])
            lo = max(0, i - W + 1)
            ref = core(x[:, lo:i + 1], None if t is None else t[:, lo:i + 1])[:, -1]
            assert torch.allclose(y, ref, atol=1e-5, rtol=1e-4), (name, i, (y - ref).abs().max().item())


@pytest.mark.parametrize("name,with_t", timespan_cases())
def test_left_padded_window_equals_real_frames(name, with_t):
    """Padding (mask False) before an episode's first frame changes nothing at the real positions,
    whatever the padded frames hold (here: garbage features and arbitrary earlier timestamps)."""
    core = build(name)
    g = torch.Generator().manual_seed(2)
    B, n_pad = 3, 2
    x = torch.randn(B, W, D, generator=g)
    t = random_times(g, B, W) if with_t else None
    if t is not None:  # padding timestamps: far earlier than the episode (e.g. zeros of an empty buffer)
        t[:, :n_pad] = torch.arange(n_pad, dtype=torch.float64) * 0.001
    mask = torch.ones(B, W, dtype=torch.bool)
    mask[:, :n_pad] = False
    with torch.no_grad():
        padded = core(x, t, mask)[:, -1]
        real = core(x[:, n_pad:], None if t is None else t[:, n_pad:])[:, -1]
    assert torch.allclose(padded, real, atol=1e-5, rtol=1e-4), (padded - real).abs().max().item()


# --------------------------------------------------------------------------------------------
# 3. causality
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in NAMES if make_core(n, D, d, W, DT, **small_kwargs(n)).causal])
def test_causal(name):
    core = build(name)
    g = torch.Generator().manual_seed(3)
    B, T = 2, W + 2
    x = torch.randn(B, T, D, generator=g)
    t = random_times(g, B, T)
    for i in (0, T // 2, T - 2):
        x2, t2 = x.clone(), t.clone()
        x2[:, i + 1:] = torch.randn(B, T - i - 1, D, generator=g) * 3
        t2[:, i + 1:] = t2[:, i + 1:] + 0.5 * torch.rand(B, T - i - 1, generator=g, dtype=torch.float64).cumsum(1)
        with torch.no_grad():
            y, y2 = core(x, t), core(x2, t2)
        assert torch.allclose(y[:, :i + 1], y2[:, :i + 1], atol=1e-6), (name, i)
        assert not torch.allclose(y[:, i + 1:], y2[:, i + 1:], atol=1e-4) or name == "none", (name, i)


# --------------------------------------------------------------------------------------------
# 4. reset_rows
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,with_t", timespan_cases())
def test_reset_rows(name, with_t):
    core = build(name)
    g = torch.Generator().manual_seed(4)
    B, n = 3, W + 1
    x = torch.randn(B, n + 1, D, generator=g)
    t = random_times(g, B, n + 1) if with_t else None
    ti = (lambda i: None) if t is None else (lambda i: t[:, i])
    rows = torch.tensor([False, True, False])
    assert core.reset_rows(None, rows) is None
    with torch.no_grad():
        state = None
        for i in range(n):
            _, state = core.step(x[:, i], state, t=ti(i))
        y_keep, _ = core.step(x[:, n], state, t=ti(n))
        y_reset, _ = core.step(x[:, n], core.reset_rows(state, rows), t=ti(n))
        y_fresh, _ = core.step(x[:, n], None, t=ti(n))
    assert torch.allclose(y_reset[rows], y_fresh[rows], atol=1e-5, rtol=1e-4), \
        (y_reset[rows] - y_fresh[rows]).abs().max().item()
    assert torch.allclose(y_reset[~rows], y_keep[~rows], atol=1e-6)
    if name != "none" or W > 1:  # the reset row really forgot something
        assert not torch.allclose(y_keep[rows], y_fresh[rows], atol=1e-4)


@pytest.mark.parametrize("name", [pytest.param(n)
                                  for n in NAMES])
def test_reset_then_stream_equals_new_episode(name):
    """After a reset, the row's following steps equal a fresh episode's (its old frames stay forgotten
    while they slide out of the window)."""
    core = build(name)
    g = torch.Generator().manual_seed(5)
    B, n, m = 2, W + 1, W + 1
    x = torch.randn(B, n + m, D, generator=g)
    t = random_times(g, B, n + m)
    rows = torch.tensor([True, False])
    with torch.no_grad():
        state = None
        for i in range(n):
            _, state = core.step(x[:, i], state, t=t[:, i])
        state = core.reset_rows(state, rows)
        fresh = None
        for i in range(n, n + m):
            y, state = core.step(x[:, i], state, t=t[:, i])
            y_new, fresh = core.step(x[:, i], fresh, t=t[:, i])
            assert torch.allclose(y[0], y_new[0], atol=1e-5, rtol=1e-4), (name, i, (y[0] - y_new[0]).abs().max().item())


# --------------------------------------------------------------------------------------------
# 5. memory task: output the token of 3 frames ago
# --------------------------------------------------------------------------------------------

MEM_T, MEM_LAG, MEM_SYM, MEM_D, MEM_STEPS, MEM_BATCH, MEM_SEED = 6, 3, 4, 16, 400, 64, 0
MEM_THRESHOLD = 0.65  # chance is 0.25; NAC reached only 0.71-0.74 on some seeds
CHANCE_CEILING = 0.4


def _mem_batch(g: torch.Generator, B: int):
    tok = torch.randint(0, MEM_SYM, (B, MEM_T), generator=g)
    x = nn.functional.one_hot(tok, MEM_SYM).float() + 0.05 * torch.randn(B, MEM_T, MEM_SYM, generator=g)
    return x, tok


def _mem_kwargs(name):
    if name.startswith("nac"):
        return dict(num_heads=4)
    if name == "mha":
        return dict(num_heads=8)
    if name == "ltc":
        return dict(input_units=16)  # the default ode_unfolds (1): with ncps's 6 the cell stays at chance here
    return {}


def memory_accuracy(name: str, window: int = MEM_T, seed: int = MEM_SEED, steps: int = MEM_STEPS) -> float:
    """Train core + linear readout to output the token of MEM_LAG frames ago; held-out accuracy at
    positions >= MEM_LAG on fresh sequences."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    width = 32 if name == "mha" else MEM_D
    core = make_core(name, MEM_SYM, width, window, 1.0, **_mem_kwargs(name))
    head = nn.Linear(width, MEM_SYM)
    opt = torch.optim.Adam([*core.parameters(), *head.parameters()], lr=1e-2)
    for _ in range(steps):
        x, tok = _mem_batch(g, MEM_BATCH)
        logits = head(core(x))[:, MEM_LAG:]
        loss = nn.functional.cross_entropy(logits.reshape(-1, MEM_SYM), tok[:, :-MEM_LAG].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        x, tok = _mem_batch(g, 1024)
        pred = head(core(x))[:, MEM_LAG:].argmax(-1)
    return (pred == tok[:, :-MEM_LAG]).float().mean().item()


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only add overhead
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "none"])
def test_memory_task(name, one_thread):
    acc = memory_accuracy(name)
    assert acc >= MEM_THRESHOLD, f"{name}: accuracy {acc:.3f} < {MEM_THRESHOLD}"


def test_no_memory_core_stays_at_chance(one_thread):
    acc = memory_accuracy("none", window=1)
    assert acc <= CHANCE_CEILING, f"none (1-frame window): accuracy {acc:.3f} > {CHANCE_CEILING}"


@pytest.mark.parametrize("name", NAMES)
def test_right_padding_with_zero_times_gives_finite_gradients(name):
    """The windows dataset pads a short window after its real frames with t = 0 and mask False (an
    episode's last frames). No core may produce NaN there: the LTC cell divides by the time span, and
    the padding's span was 0, so its first comparison cell trained on NaN. Also two real frames with
    the same timestamp (span 0)."""
    core = build(name).train()
    g = torch.Generator().manual_seed(3)
    B, T = 3, W
    x = torch.randn(B, T, D, generator=g, requires_grad=True)
    t = random_times(g, B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    t[0, 2:], mask[0, 2:] = 0.0, False  # two real frames, then padding at t = 0
    t[1, 2] = t[1, 1]  # a repeated timestamp
    y = core(x, t, mask)
    assert torch.isfinite(y).all()
    (y * mask[..., None]).sum().backward()
    assert torch.isfinite(x.grad).all()
    grads = [p.grad for p in core.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(gr).all() for gr in grads)


@pytest.mark.parametrize("mode", ["steady", "exact"])
def test_nac_input_norm_makes_the_core_blind_to_the_feature_scale(mode):
    """input_norm=True puts a LayerNorm(D) before the NAC layer: features 10x smaller (PilotNet's
    are about 30x smaller than unit scale at initialisation) give the same output; without it
    they do not. Streaming still equals the full window."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, W, D, generator=g)
    with torch.no_grad():
        normed = build(f"nac-{mode}", input_norm=True)
        assert torch.allclose(normed(x), normed(x / 10), atol=1e-3)
        plain = build(f"nac-{mode}")
        assert not torch.allclose(plain(x), plain(x / 10), atol=1e-3)
        assert "norm.weight" in dict(normed.named_parameters()) and plain.norm is None
        state = None
        for i in range(W):
            y, state = normed.step(x[:, i], state)
        assert torch.allclose(y, normed(x)[:, -1], atol=1e-5)
