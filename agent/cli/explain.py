"""``agent explain``: what CarRacing policies look at and what their NAC traces encode, as one report;
its options are :class:`agent.drive.explain_report.ExplainConfig`."""

from __future__ import annotations

import tyro

from agent.cli.common import CLIError
from agent.drive.explain_report import DESCRIPTION, ExplainConfig, write_explain_report
from agent.train.config import ConfigError


def main(argv: list[str]) -> int:
    """Run ``agent explain ARGV``; returns the exit code."""
    try:
        cfg = tyro.cli(ExplainConfig, args=list(argv), prog="agent explain", description=DESCRIPTION).check()
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    write_explain_report(cfg)
    return 0


__all__ = ["main"]
