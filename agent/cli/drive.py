"""`drive` (also `agent drive`): watch a policy drive; its options are :class:`agent.drive.config.DriveConfig`."""

from __future__ import annotations

from agent.cli.common import CLIError
from agent.drive.config import parse_drive_args
from agent.drive.session import run_drive
from agent.train.config import ConfigError


def main(argv: list[str]) -> int:
    """Run ``drive ARGV``; the exit code."""
    try:
        cfg = parse_drive_args(argv)
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    return run_drive(cfg)
