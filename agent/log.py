"""Progress messages and progress bars shared by the project's commands.

Two streams, kept apart:

* results a command prints (a mean return, "wrote FILE") go to stdout with ``print()``;
* progress messages go to stderr through the standard :mod:`logging` module, formatted by
  ``rich.logging.RichHandler`` (:func:`get_logger`, :func:`setup_logging`), and progress bars
  through :func:`progress`, a ``tqdm.auto.tqdm`` that stays silent when stderr is not a terminal
  (CI, a log file), where every redraw would otherwise become a line of the log.

Environment:
    NAC_PROGRESS: "1" forces progress bars on even when stderr is not a terminal; "0" forces them off.
"""

from __future__ import annotations

import logging
import os
import sys

#: loggers of the project's packages; :func:`setup_logging` installs its handler on these
PROJECT_LOGGERS = ("agent", "envs")
_HANDLER_FLAG = "_nac_drive_handler"


def _installed(logger: logging.Logger) -> logging.Handler | None:
    return next((h for h in logger.handlers if getattr(h, _HANDLER_FLAG, False)), None)


def setup_logging(verbose: bool = False) -> None:
    """Send the project's log messages to stderr through a ``rich`` handler, INFO level (DEBUG if ``verbose``).

    Idempotent: the handler is installed once on each of :data:`PROJECT_LOGGERS`; a later call only
    changes the level. Messages still propagate to the root logger, so pytest's ``caplog`` sees them.
    """
    from rich.console import Console
    from rich.logging import RichHandler

    level = logging.DEBUG if verbose else logging.INFO
    for name in PROJECT_LOGGERS:
        logger = logging.getLogger(name)
        if _installed(logger) is None:
            # Console(stderr=True) looks sys.stderr up at each write, so redirected stderr is honoured
            handler = RichHandler(console=Console(stderr=True), show_path=False, rich_tracebacks=False,
                                  log_time_format="[%X]")
            setattr(handler, _HANDLER_FLAG, True)
            logger.addHandler(handler)
        logger.setLevel(level)


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, with the project's stderr handler installed if it is not yet.

    Pass ``__name__``: modules of the ``agent`` and ``envs`` packages log through the handler that
    :func:`setup_logging` installs (INFO and above unless ``setup_logging(verbose=True)``).
    """
    if _installed(logging.getLogger(PROJECT_LOGGERS[0])) is None:
        setup_logging()
    return logging.getLogger(name)


def progress_enabled() -> bool:
    """Whether progress bars should draw: ``NAC_PROGRESS`` if set to "1"/"0", else ``sys.stderr.isatty()``."""
    forced = os.environ.get("NAC_PROGRESS", "").strip()
    if forced in ("1", "0"):
        return forced == "1"
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stderr
        return False


def progress(iterable=None, **tqdm_kwargs):
    """A ``tqdm.auto.tqdm`` progress bar on stderr that draws only where someone watches it.

    Disabled when stderr is not a terminal unless ``NAC_PROGRESS=1`` (see :func:`progress_enabled`),
    and when the caller passes ``disable=True``. When it draws, it redraws at most every 0.5 s
    (``mininterval=0.5`` unless given). Use it like tqdm: ``for x in progress(xs, desc="epochs")``
    or ``bar = progress(total=n); bar.update(1); bar.close()``.
    """
    from tqdm.auto import tqdm

    disable = bool(tqdm_kwargs.pop("disable", False)) or not progress_enabled()
    if not disable:
        tqdm_kwargs.setdefault("mininterval", 0.5)
    return tqdm(iterable, disable=disable, **tqdm_kwargs)


__all__ = ["get_logger", "progress", "progress_enabled", "setup_logging"]
