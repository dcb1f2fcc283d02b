"""What the `agent` commands share: the user-error type, JSON output, parsing a config dataclass with tyro, the
teacher's rule options as typed, and the Udacity data helpers."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import tyro

from agent.data.udacity import find_driving_log, load_recording
from agent.data.udacity_cache import DEFAULT_CACHE_DIR, load_cached
from agent.train.config import ConfigError, TeacherSection
from agent.train.lodo import driver_names


class CLIError(Exception):
    """A user error: printed as one line, exit code 2."""


def write_json(path: str | Path, obj) -> None:
    """``obj`` as indented JSON at ``path`` (its folder is created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=2, default=str) + "\n")


def parse_config(cls, argv: list[str], prog: str, description: str):
    """The checked config ``cls`` (a frozen dataclass) of ``prog ARGV``, parsed by tyro.

    ``--help`` prints the options and exits (code 0); a value a field refuses in ``__post_init__``
    is reported by tyro (exit code 2).

    Raises:
        CLIError: from ``cls.check()``: options that do not go together, a file in the way (one line).
    """
    try:
        return tyro.cli(cls, args=list(argv), prog=prog, description=description).check()
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc


def teacher_rule_options(teacher: TeacherSection) -> list[str]:
    """The ``--teacher.*`` rule options of ``teacher`` that differ from their defaults, as typed."""
    default = TeacherSection()
    return [f"--teacher.{'no-' if getattr(teacher, name) is False else ''}{name.replace('_', '-')}"
            for name in ("start_rule", "creep_speed", "brake_floor", "grass_rule")
            if getattr(teacher, name) != getattr(default, name)]


def check_udacity_folders(data: list[str]) -> None:
    """Each of ``data`` is a Udacity recording: a ``driving_log.csv``, its folder, or a folder with one
    recording below it (:func:`agent.data.udacity.find_driving_log`).

    Raises:
        CLIError: one that is not, with what was found.
    """
    for d in data:
        if Path(d).is_file() and Path(d).suffix != ".csv":
            raise CLIError(f"{d} is not a Udacity recording (give its folder or its driving_log.csv)")
        try:
            find_driving_log(d)
        except FileNotFoundError:
            raise CLIError(f"{d} is not a Udacity recording (no driving_log.csv in it)") from None
        except ValueError as exc:
            raise CLIError(str(exc)) from None


def driver_tracks(tracks: dict[str, str], data: list[str], option: str = "lodo.tracks") -> dict[str, str]:
    """The {driver: track} table of recordings ("*": every driver not named), checked against the
    drivers of ``data``; ``option`` names it in the error (a leave-one-driver-out run's ``lodo.tracks``).

    Raises:
        CLIError: a driver that is not one of the recordings.
    """
    unknown = sorted(set(tracks) - set(driver_names(data)) - {"*"})
    if unknown:
        raise CLIError(f"{option} names unknown driver(s) {', '.join(unknown)}; the drivers are "
                       f"{', '.join(driver_names(data))}")
    return dict(tracks)


def udacity_loader(crop_cache: str, on_bad_row: str, n_recordings: int):
    """``load(path)`` for Udacity recordings (train and evaluate): ``crop_cache`` "auto" caches the
    66x200 crops (:mod:`agent.data.udacity_cache`) when several recordings are read, "" reads into
    memory, a folder always caches there; ``on_bad_row`` as :func:`agent.data.udacity.load_recording`."""
    if crop_cache == "auto":
        crop_cache = str(DEFAULT_CACHE_DIR) if n_recordings > 1 else ""
    if crop_cache:
        return partial(load_cached, cache_dir=crop_cache, on_bad_row=on_bad_row)
    return partial(load_recording, on_bad_row=on_bad_row)
