"""`agent drive` (also the `drive` command): watch a policy drive; its options are :mod:`agent.drive.args`'."""

from __future__ import annotations

from agent.cli.common import FMT, argparse_main
from agent.drive.args import add_drive_arguments
from agent.drive.session import run_drive


def add_parser(sub) -> None:
    p = sub.add_parser("drive", help="watch a policy drive (also the `drive` command)", formatter_class=FMT,
                       description="Run a policy in the simulator with a live window (frame, action, speed, "
                                   "return, FPS). Without a display, or with --headless, it runs without a "
                                   "window; --record writes an mp4.")
    add_drive_arguments(p)


def run(args) -> int:
    return run_drive(args)


main = argparse_main("drive", add_parser, run)
