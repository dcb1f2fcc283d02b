"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the project writes whole (JSON results, markdown tables, model cards, checkpoints,
npz caches, resolved configs) goes through :func:`write_atomic`: the content is written to a
uniquely named hidden temporary file in the target's folder, flushed and synced to disk
(``fsync``), then renamed over the target with ``os.replace``, which POSIX makes atomic within
one file system. A kill, a Ctrl-C, a reboot or a full disk at any moment therefore leaves the
previous file as it was (issue "Nothing lost, nothing trusted": a kill must lose nothing that was
already written), and the temporary file is removed on any error.

The temporary name is unique per call (the process id and a random token, created with
``O_EXCL``), so two processes writing the same target do not trample each other's half-written
file; the last rename wins. The file gets the usual permissions (``0o666`` less the umask), as
``open`` would give it (``tempfile.mkstemp`` would make it readable by its owner only).

This is a utility module: it imports nothing else of :mod:`agent` (an import-linter contract in
``pyproject.toml`` holds it), so every layer may use it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

Writer = Callable[[IO[bytes]], Any]


def fsync_path(path: str | Path) -> None:
    """Flush ``path`` (a file or, on POSIX, a folder) to disk; a file system that cannot is let be.

    Syncing a folder makes a rename inside it durable across a power cut.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, content: bytes | str | Writer, *, what: str = "file",
                 sync_folder: bool = False) -> Path:
    """Write ``content`` to ``path`` atomically (a synced temporary file renamed over it).

    Args:
        path: the file to write; its folder is made.
        content: the bytes, a ``str`` (written as UTF-8), or a function that writes into the open
            binary temporary file (``np.savez``, ``torch.save``, ...).
        what: the file's role, for the error message ("checkpoint", "model card", ...).
        sync_folder: also sync the folder after the rename, so the rename itself survives a power
            cut (recordings and checkpoints want this; a results table does not need it).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: the write failed (a full disk, a permission): the message names ``what``, the
            file, and whether a previous file was kept; ``path`` is as it was and the temporary
            file is removed. Any other exception (from ``content``'s writer, or a Ctrl-C) is
            re-raised as it is, after the temporary file is removed.
        TypeError: ``content`` is none of bytes, str or a callable.
    """
    path = Path(path)
    if isinstance(content, str):
        content = content.encode("utf-8")
    if not isinstance(content, (bytes, bytearray, memoryview)) and not callable(content):
        raise TypeError(f"write_atomic({path}): content must be bytes, str or a function that writes into a "
                        f"binary file, not {type(content).__name__}")
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        name = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        tmp = str(name)
        with os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        kept = "the previous one is kept" if path.exists() else "nothing was written"
        raise OSError(exc.errno, f"cannot write the {what} ({exc.strerror or exc}); {kept}", str(path)) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    if sync_folder:
        fsync_path(path.parent)
    return path


def write_json_atomic(path: str | Path, obj: Any, *, what: str = "JSON file", indent: int | None = 2) -> Path:
    """``json.dumps(obj)`` (values JSON does not know are written with ``str``) into ``path``,
    atomically, with a final newline; see :func:`write_atomic`.

    Raises:
        OSError: as :func:`write_atomic`.
        ValueError: ``obj`` holds a circular reference.
    """
    return write_atomic(path, json.dumps(obj, indent=indent, default=str) + "\n", what=what)


def save_figure(fig: Any, path: str | Path, *, dpi: float | None = None, what: str = "figure") -> Path:
    """Save a matplotlib figure to ``path`` atomically (see :func:`write_atomic`), then close it.

    The format is the file's suffix (``.png``, ``.svg``, ``.pdf``, ...; no suffix: PNG). The figure
    is closed whether or not the write succeeds, so a loop of plots never piles figures up in pyplot.

    Args:
        fig: a :class:`matplotlib.figure.Figure`.
        path: the image file; its folder is made.
        dpi: dots per inch (``None``: the figure's own).
        what: the file's role, for the error message.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        OSError: as :func:`write_atomic`; ``path`` is as it was.
        ValueError: matplotlib cannot write the suffix's format.
    """
    path = Path(path)
    fmt = path.suffix[1:].lower() or "png"
    try:
        return write_atomic(path, lambda fh: fig.savefig(fh, format=fmt, dpi=dpi if dpi is not None else "figure"),
                            what=what)
    finally:
        import matplotlib.pyplot as plt  # here: the module stays importable without matplotlib

        plt.close(fig)


__all__ = ["fsync_path", "save_figure", "write_atomic", "write_json_atomic"]
