"""The small commands: `agent plot-traces`, `agent wiring`, `agent convert-policy`, `agent average-policies`.

Each command's options are one frozen dataclass parsed by tyro (:class:`PlotTraces`, :class:`Wiring`,
:class:`ConvertPolicy`, :class:`AveragePolicies`); the module exposes one function per command
(``plot_traces(argv)`` ...), registered in :data:`agent.cli.COMMANDS`. Every file they write
refuses an existing path unless --overwrite is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agent.actors.loading import load_policy
from agent.cli.common import CLIError, parse_config
from agent.drive.traces import plot_traces as plot_trace_file  # the name plot_traces is this command's main
from agent.drive.wiring import draw_wiring, wiring_summary
from agent.nn.legacy import convert_policy_file
from agent.train.config import ConfigError
from agent.train.soup import average_policies as average_policy_files  # average_policies: the command's main

PLOT_TRACES_DESCRIPTION = """Plot NAC traces dumped by drive --dump-traces (the paper's Figure 4).

Read a trace file written by `drive --dump-traces` and draw omega, the logits, phi and the
attention weights (mean over the kept keys) over the run, each step coloured by the action taken,
with their distribution per action beside them, as in the paper's Figure 4 (arXiv 2512.10282)."""

WIRING_DESCRIPTION = """Draw a policy's NCP wiring (the NAC backbone) as a PNG.

Draw the AutoNCP wiring of the policy's NAC backbone with ncps (networkx + matplotlib): the
pair-input sensory neurons, inter, command and motor neurons, excitatory (green) and
inhibitory (red) synapses."""

CONVERT_POLICY_DESCRIPTION = """Convert a format-1 policy file to the current format.

Policy files written before the policy classes were unified (format 1: kinds 'nac-drive-policy'
and 'nac-udacity-policy') are rewritten as the one DrivingPolicy format (2). The weights are
unchanged, so the converted policy acts identically. (load_policy also converts format-1 files in
memory.)"""

AVERAGE_POLICIES_DESCRIPTION = """Average the weights of policies trained from one start (a model soup).

Writes one policy whose weights are the (weighted) mean of the given policy files' (a
uniform 'model soup', Wortsman et al. 2022). Meant for DAgger runs that started from the same
behaviour-cloning checkpoint with different seeds: the result is one network of the same size and
speed. Every file must have the same configuration. Evaluate the result closed loop (agent
evaluate) before trusting it: runs that drifted apart average into a worse policy."""


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _free(path: str, overwrite: bool, option: str) -> None:
    """Refuse an existing ``path`` (given as ``option``) unless ``overwrite``."""
    _need(overwrite or not Path(path).exists(), f"{path} already exists; choose another {option} or pass --overwrite")


@dataclass(frozen=True)
class PlotTraces:
    """``agent plot-traces TRACES --out PNG``: Figure-4-style plots of drive's traces."""

    traces: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="TRACES")]
    """the .h5 or .npz written by drive --dump-traces"""
    out: str
    """the PNG to write"""
    head: int | None = None
    """plot this head (0-based) instead of the mean over heads"""
    size: tuple[int, int] = (1600, 1000)
    """PNG size in pixels: W H"""
    overwrite: bool = False
    """replace --out if it exists"""

    def __post_init__(self):
        _need(min(self.size) >= 200, f"--size must be at least 200 x 200 pixels, got {self.size[0]} x {self.size[1]}")
        _need(self.head is None or self.head >= 0, f"--head must be >= 0 (0-based), got {self.head}")

    def check(self) -> "PlotTraces":
        _free(self.out, self.overwrite, "--out")
        return self


@dataclass(frozen=True)
class Wiring:
    """``agent wiring --out PNG``: a picture of the policy's NCP wiring."""

    out: str
    """the PNG to write"""
    policy: str = "nac.pt"
    """policy file (a bare name is looked up in policies/)"""
    layout: Literal["shell", "circular", "kamada", "spring", "spectral", "spiral"] = "shell"
    """networkx layout"""
    overwrite: bool = False
    """replace --out if it exists"""

    def check(self) -> "Wiring":
        _free(self.out, self.overwrite, "--out")
        return self


@dataclass(frozen=True)
class ConvertPolicy:
    """``agent convert-policy SRC DST``: a format-1 policy file in the current format."""

    src: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SRC")]
    """the format-1 policy file"""
    dst: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="DST")]
    """where to write the converted file (SRC itself with --overwrite)"""
    overwrite: bool = False
    """replace DST if it exists"""

    def check(self) -> "ConvertPolicy":
        _free(self.dst, self.overwrite, "DST")
        return self


@dataclass(frozen=True)
class AveragePolicies:
    """``agent average-policies P1 P2 ... --out SOUP``: the weight average of policies of one start."""

    policies: Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="POLICY [POLICY ...]")]
    """two or more .pt policy files (names in policies/ work too)"""
    out: str
    """the averaged policy file to write"""
    weights: tuple[float, ...] | None = None
    """one non-negative weight per policy (normalised to sum 1; default uniform)"""
    overwrite: bool = False
    """replace --out if it exists"""

    def check(self) -> "AveragePolicies":
        _need(len(self.policies) >= 2, f"give two or more policy files to average, got {len(self.policies)}")
        _need(self.weights is None or len(self.weights) == len(self.policies),
              f"--weights takes one weight per policy: {len(self.policies)} policies, {len(self.weights or ())} weights")
        _free(self.out, self.overwrite, "--out")
        return self


def plot_traces(argv: list[str]) -> int:
    """Run ``agent plot-traces ARGV``; the exit code."""
    cfg = parse_config(PlotTraces, argv, prog="agent plot-traces", description=PLOT_TRACES_DESCRIPTION)
    out = plot_trace_file(cfg.traces, cfg.out, head=cfg.head, size=tuple(cfg.size))
    print(f"wrote {out}")
    return 0


def wiring(argv: list[str]) -> int:
    """Run ``agent wiring ARGV``; the exit code."""
    cfg = parse_config(Wiring, argv, prog="agent wiring", description=WIRING_DESCRIPTION)
    policy = load_policy(cfg.policy)
    if getattr(policy, "nac", None) is None:
        raise CLIError(f"{cfg.policy} has no NAC core (its core: {getattr(policy.config, 'core', 'none')}); "
                       "only nac-* cores have an NCP wiring to draw")
    out = draw_wiring(policy, cfg.out, layout=cfg.layout)
    counts = wiring_summary(policy.nac.wiring)
    print(f"wrote {out}: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def convert_policy(argv: list[str]) -> int:
    """Run ``agent convert-policy ARGV``; the exit code."""
    cfg = parse_config(ConvertPolicy, argv, prog="agent convert-policy", description=CONVERT_POLICY_DESCRIPTION)
    policy = convert_policy_file(cfg.src, cfg.dst)
    print(f"converted {cfg.src} -> {cfg.dst}: {policy.config.env}, {policy.config.features} + {policy.config.core} "
          f"(window {policy.config.window}) + {policy.head.kind} head")
    return 0


def average_policies(argv: list[str]) -> int:
    """Run ``agent average-policies ARGV``; the exit code."""
    cfg = parse_config(AveragePolicies, argv, prog="agent average-policies", description=AVERAGE_POLICIES_DESCRIPTION)
    weights = list(cfg.weights) if cfg.weights is not None else None
    soup = average_policy_files(list(cfg.policies), weights)
    soup.save(cfg.out, metadata={"stage": "weight average (model soup)", "averaged": [str(p) for p in cfg.policies],
                                 "weights": weights})
    print(f"averaged {len(cfg.policies)} policies -> {cfg.out} ({soup.config.core}, window {soup.config.window}, "
          f"{sum(p.numel() for p in soup.parameters())} parameters)")
    return 0


__all__ = ["AveragePolicies", "ConvertPolicy", "PlotTraces", "Wiring", "average_policies", "convert_policy",
           "plot_traces", "wiring"]
