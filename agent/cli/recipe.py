"""Config files and recipes on the command line: ``--config FILE`` then ``--SECTION.FIELD`` overrides.

A command whose options are a config dataclass (``agent train``: :class:`agent.train.config.TrainRun`;
``agent expert train``: :class:`agent.train.config.ExpertRun`) is parsed here: the recipe's stages
are read (:func:`agent.train.config.load_recipe`), the command line is applied to each stage by
tyro, and the stages are chained (each starts from the previous stage's output). A stage whose
output exists beside a run folder holding the same resolved config is finished: a rerun skips it,
so a recipe killed in its third stage resumes there. A stage that finished under another output
name (the recipe's last stage before a stage was added after it, or a renamed ``--out``) is not
trained again either: its policy is copied to the new name (:func:`finished_as`).
"""
from __future__ import annotations

import resource
import shutil
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Callable

import tyro

from agent.atomic import write_atomic
from agent.cli.common import CLIError
from agent.log import get_logger
from agent.train.config import ConfigError, from_dict, load_recipe, to_toml

log = get_logger("agent.recipe")

#: the comment line that opens every resolved config a run writes
RESOLVED_HEADER = "# the resolved config of this run: `--config` this file remakes it\n"


def split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """``(--config value, the other arguments)``.

    Raises:
        CLIError: ``--config`` without a file, or given twice.
    """
    argv, path, rest = list(argv), None, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" or a.startswith("--config="):
            if path is not None:
                raise CLIError("--config is given twice; give one recipe")
            if a == "--config":
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise CLIError("--config needs a TOML file, e.g. --config recipes/nac.toml")
                path, i = argv[i + 1], i + 2
                continue
            path = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return path, rest


def parse_stages(cls, argv: list[str], prog: str, description: str) -> list[tuple[str, object]]:
    """The validated stages of ``prog ARGV``: the recipe of ``--config`` (or the defaults), each
    stage overridden by the other options, chained, and checked.

    Stages after the first start from the previous stage's output (``init``) unless they name one,
    and keep its architecture: the ``policy`` options they share with the first stage (a top-level
    ``[policy]``, or ``--policy.core gru`` on the command line) are dropped from them; every stage
    but the last writes into the recipe's run folder (``RUN_DIR/<stage>/``; ``RUN_DIR`` is the last
    stage's ``run_dir``, by default ``runs/recipes/<out's name>-s<seed>``, or ``runs/recipes/<out's
    name>`` when that name ends in ``-s<seed>`` already).

    Raises:
        CLIError: an unreadable recipe or an invalid value, in one line.
    """
    path, rest = split_config(argv)
    try:
        stages = load_recipe(path, cls) if path else [("", cls())]
        parsed = [(name, tyro.cli(cls, args=rest, default=cfg, prog=prog, description=description))
                  for name, cfg in stages]
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    if len(parsed) > 1:
        last = parsed[-1][1]
        stem = Path(last.out).stem if getattr(last, "out", None) else Path(path).stem
        seed = f"-s{last.seed}"  # the out's name when it names the seed already (nac-s1.pt), else with the seed
        root = Path(getattr(last, "run_dir", None) or
                    Path("runs/recipes") / (stem if stem.endswith(seed) else stem + seed))
        chained, previous = [], None
        for i, (name, cfg) in enumerate(parsed):
            last = i == len(parsed) - 1
            changes = {"init": cfg.init or previous}
            if not last:
                changes["out"] = str(root / name / f"{name}{Path(cfg.out_path).suffix}")
                changes["overwrite"] = False
            if hasattr(cfg, "run_dir"):
                changes["run_dir"] = str(root / name)
            if i == 0:
                changes["init"] = cfg.init
            elif cfg.init is None and hasattr(cfg, "policy"):  # starts from the previous stage's policy: the
                # architecture options it shares with the first stage (top-level [policy], --policy.core ...) are that
                # policy's own, not options of this stage
                first = parsed[0][1].policy
                arch = ("core", "window", "d_model", "motion")
                changes["policy"] = replace(cfg.policy, **{k: None for k in arch
                                                           if getattr(cfg.policy, k) == getattr(first, k)})
                if cfg.policy.core_options == first.core_options:
                    changes["policy"] = replace(changes["policy"], core_options={})
            cfg = replace(cfg, **changes)
            chained.append((name, cfg))
            previous = changes.get("out", cfg.out)
        parsed = chained
    try:
        return [(name, cfg.check()) for name, cfg in parsed]
    except ConfigError as exc:
        raise CLIError(f"{path} [stage {name}]: {exc}" if path and len(parsed) > 1 else str(exc)) from exc


def resolved_text(cfg) -> str:
    """The resolved config as the TOML a run writes (and that a finished stage is recognised by)."""
    return RESOLVED_HEADER + to_toml(cfg.resolved())


def same_config(old_text: str, cfg, ignore: tuple[str, ...] = ()) -> bool:
    """Whether ``old_text``, a resolved config a run wrote (its run folder's config.toml or its
    checkpoint), describes the same run as ``cfg``: the same text, or the same values once the
    fields added to the project since that run are given their defaults (a new option's default
    keeps the old behaviour), the top-level keys in ``ignore`` left out of the comparison."""
    new_text = resolved_text(cfg)
    if old_text == new_text and not ignore:
        return True
    try:
        old = tomllib.loads(old_text)
        new = tomllib.loads(new_text)
        for d in (old, new):
            for k in ignore:
                d.pop(k, None)
        if old == new:
            return True
        filled = tomllib.loads(resolved_text(from_dict(type(cfg), old, "the run folder's config")))
    except (ConfigError, tomllib.TOMLDecodeError, TypeError, ValueError):
        return False
    for k in ignore:
        filled.pop(k, None)
    return filled == new


def stage_done(cfg, config_file: Path) -> bool:
    """Whether a stage already ran to the end with this config: its output exists and
    ``config_file`` (written at the start of that run) holds the same resolved config
    (:func:`same_config`)."""
    return cfg.out_path.exists() and config_file.is_file() and same_config(config_file.read_text(), cfg)


def finished_as(cfg, config_file: Path) -> Path | None:
    """Where an earlier, finished run of this stage wrote its policy under another name, or None.

    That is: ``cfg``'s output does not exist; ``config_file`` (the stage's run folder) holds a
    resolved config equal to ``cfg``'s but for ``out`` and ``overwrite``; the policy file that run
    named exists, and its card says it was written by that run (the same ``out`` and ``run_dir``).
    Then training again would only remake that file. Loading the card never runs code from it.
    """
    if cfg.out_path.exists() or not config_file.is_file():
        return None
    try:
        text = config_file.read_text()
        old = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
        return None
    old_out = old.get("out")
    if not old_out or not same_config(text, cfg, ignore=("out", "overwrite")) or not Path(old_out).is_file():
        return None
    from agent.actors.loading import load_policy

    try:
        card = load_policy(old_out).metadata.get("config") or {}
    except Exception:  # noqa: BLE001 - any file that does not load as that run's policy is simply not adopted
        return None
    if card.get("out") != old_out or card.get("run_dir") != old.get("run_dir"):
        return None
    return Path(old_out)


def _adopt(cfg, earlier: Path, config_file: Path) -> None:
    """Copy ``earlier`` to ``cfg``'s output (atomically) and record ``cfg`` as the run folder's config."""
    out = cfg.out_path
    with open(earlier, "rb") as src:
        write_atomic(out, lambda fh: shutil.copyfileobj(src, fh), what="policy file")
    write_atomic(config_file, resolved_text(cfg), what="resolved config")


def write_resolved(cfg, config_file: Path) -> None:
    """Write the resolved config to ``config_file`` (atomically; its folder is made).

    Raises:
        CLIError: a different config is already there and ``overwrite`` is off.
    """
    text = resolved_text(cfg)
    if config_file.is_file() and not same_config(config_file.read_text(), cfg) and not cfg.overwrite:
        raise CLIError(f"{config_file} holds another run's config; choose another run folder or pass --overwrite")
    write_atomic(config_file, text, what="resolved config")


def peak_rss_gb() -> tuple[float, float]:
    """The peak resident set size so far, in GB (10**9 bytes): this process's, and its largest child's.

    Read from ``getrusage`` (``ru_maxrss``: KiB on Linux, bytes on macOS); the child figure is the
    largest of the child processes that were waited for (rollout workers, data-loader workers), 0 if
    none ran. A recipe's peak memory is the larger of the two plus what ran beside it at that time.
    """
    scale = 1 if sys.platform == "darwin" else 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale / 1e9
    return own, child


def run_stages(stages: list[tuple[str, object]], run_one: Callable[[object], int],
               config_file: Callable[[object], Path]) -> int:
    """Run each stage with ``run_one(cfg)`` (0: success) in order, skipping finished ones.

    A stage that runs ends with one log line giving its wall time and the peak resident memory of
    this process and of its largest child so far (:func:`peak_rss_gb`), the figures a recipe's cost
    is reported with.

    Returns:
        the first non-zero exit code, or 0.
    """
    for i, (name, cfg) in enumerate(stages):
        label = f"stage {i + 1}/{len(stages)} {name}" if name else ""
        if name and stage_done(cfg, config_file(cfg)):
            log.info("%s: finished earlier (%s); skipped", label, cfg.out_path)
            continue
        earlier = finished_as(cfg, config_file(cfg)) if name else None
        if earlier is not None:
            _adopt(cfg, earlier, config_file(cfg))
            log.info("%s: finished earlier as %s; copied to %s, not trained again", label, earlier, cfg.out_path)
            continue
        if label:
            log.info("%s -> %s", label, cfg.out_path)
        t0 = time.monotonic()
        rc = run_one(cfg)
        if rc:
            return rc
        own, child = peak_rss_gb()
        log.info("%s finished in %.1f min; peak RSS so far %.2f GB (this process), %.2f GB (largest child)",
                 label or "run", (time.monotonic() - t0) / 60, own, child)
    return 0


__all__ = ["RESOLVED_HEADER", "finished_as", "parse_stages", "peak_rss_gb", "resolved_text", "run_stages",
           "same_config", "split_config", "stage_done", "write_resolved"]
