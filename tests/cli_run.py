"""Run an ``agent`` command in a test and read its error as one line, whichever layer refused it.

``agent train`` (and the other commands built on a config tree) refuses a bad value in two ways:
``agent train: error: <one line>`` with exit code 2 (printed by :func:`agent.cli.main`), or tyro's
parser, which raises ``SystemExit(2)`` and prints the message in a box wrapped to the terminal's
width. :func:`run_cli` turns both into ``(exit code, stderr as one line)``.
"""
from __future__ import annotations

import re

from agent.cli import main

_BOX = re.compile(r"[│╭╮╰╯─]")


def unbox(text: str) -> str:
    """``text`` with rich's box drawing removed and all whitespace (the wrapping) collapsed to single spaces."""
    return " ".join(_BOX.sub(" ", text).split())


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``agent ARGV``'s exit code (``SystemExit``'s code included) and its stderr, unboxed, as one line."""
    capsys.readouterr()  # only this command's output
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, unbox(capsys.readouterr().err)
