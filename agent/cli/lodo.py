"""`agent lodo-table`, `agent lodo-compare` and `agent lodo-consensus`: leave-one-driver-out without training.

`agent train --lodo.out OUT` trains one Udacity policy per held-out driver and writes the tables as it
goes (agent.train.lodo). These two commands read the finished folds only: ``lodo-table`` prints (and with
``--write`` rewrites) the tables of one setting, ``lodo-compare`` sets two settings side by side, fold by
fold, with intervals that know how much a training seed alone moves a fold.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from agent.cli.common import CLIError, check_udacity_folders, driver_tracks, udacity_loader
from agent.eval.consensus import ConsensusConfig
from agent.train.lodo import (compare_settings, driver_names, lodo_table, run_consensus_lodo, runs_of, seed_folders,
                              seeds_table, write_table)

TABLE_DESCRIPTION = """Print the leave-one-driver-out tables of a finished (or partly finished) run.

FOLDER is what `agent train --lodo.out FOLDER` wrote: one LODO folder (folds/*.json), or, with
--lodo.seeds, a folder of seed folders s0/, s1/ ... Prints each seed's table (lodo.md) and, for
several seeds, the table over the seeds against the targets (seeds.md). Nothing is trained and no
recording is read. --write rewrites lodo.md/lodo.json (and seeds.md/seeds.json) there from the
finished folds: they are derived files, which training rewrites after every fold too."""

COMPARE_DESCRIPTION = """Compare two leave-one-driver-out settings fold by fold, with seed-aware intervals.

BASE and NEW are folders `agent train --lodo.out` wrote (a LODO folder, or a folder of seed folders
s0/, s1/ ...). On the held-out drivers every seed of both finished, each fold's smoothed ratio,
correlation r, raw-label ratio and curve amplitude are averaged over each setting's seeds, and the
difference NEW - BASE is given per fold and as a mean per track with a 95 % interval. The interval
comes from one fold's seed-to-seed standard deviation, pooled over every fold with two or more seeds
in either folder: with one seed a setting there is no interval. Example, a screen against the
min-speed setting:

  agent lodo-compare results/udacity-lodo/minspeed5 results/udacity-lodo/screen/NAME --out results/udacity-lodo/screen/NAME"""


CONSENSUS_DESCRIPTION = """Score the other drivers' consensus on each held-out driver: no training.

For every held-out driver and every one of its frames, the K frames of the OTHER drivers whose
center-camera views look most alike (the crop's luma at 16x50, standardised, in its first DIMS
principal components; only their frames driven forwards at --min-speed mph or faster) vote: the
prediction is the mean of their steering smoothed over +-0.5 s. It is scored exactly as a trained
fold is, into a folder `agent lodo-table` and `agent lodo-compare` read like a trained setting's.
Where it scores better than a trained setting, that setting is not at what the other drivers'
steering allows; where both sit far from a driver, that driver steers unlike the others. About 3
minutes for the fourteen public drivers (crops cached as by `agent train`). Example:

  agent lodo-consensus --data $RECS --out results/udacity-lodo/consensus \\
      --tracks '*' lake b-sh+CarND-Behavioral-Cloning-P3 jungle
  agent lodo-compare results/udacity-lodo/minspeed5 results/udacity-lodo/consensus"""


@dataclass(frozen=True)
class LodoConsensus:
    """``agent lodo-consensus --data REC ... --out OUT``"""

    data: tuple[str, ...]
    """the recordings, one driver each (folders holding a driving_log.csv)"""
    out: str
    """the LODO folder to write (folds/*.json, *.npz, lodo.md); a rerun skips the folds written"""
    k: int = 20
    """neighbours averaged per frame"""
    dims: int = 64
    """principal components of the view feature kept"""
    min_speed: float = 5.0
    """mph: the other drivers' frames slower than this (or reversing) are not neighbours"""
    tracks: dict[str, str] = dataclasses.field(default_factory=dict)
    """driver -> track for the means per track ('*' for every driver not named)"""
    folds: tuple[str, ...] = ()
    """only these held-out drivers (default: all)"""
    crop_cache: str = "auto"
    """where the 66x200 crops are cached ('auto': the default cache folder; '': read into memory)"""


@dataclass(frozen=True)
class LodoTable:
    """``agent lodo-table FOLDER``"""

    folder: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="FOLDER")]
    """what `agent train --lodo.out` wrote"""
    write: bool = False
    """rewrite the derived tables (lodo.md/json, seeds.md/json) there from the finished folds"""


@dataclass(frozen=True)
class LodoCompare:
    """``agent lodo-compare BASE NEW``"""

    base: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="BASE")]
    """the setting compared against (its LODO folder)"""
    new: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="NEW")]
    """the setting screened (its LODO folder)"""
    out: str | None = None
    """a folder to write compare.md, compare.json and the figure compare.png into"""
    json: bool = False
    """print the comparison as JSON instead of Markdown"""
    overwrite: bool = False
    """replace compare.md, compare.json and compare.png in --out"""


def _runs(folder: str) -> dict:
    if not Path(folder).is_dir():
        raise CLIError(f"{folder} is not a folder: give one that `agent train --lodo.out` wrote")
    try:
        return runs_of(folder)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc


def table_main(argv: list[str]) -> int:
    """Run ``agent lodo-table ARGV``; returns the exit code."""
    args = tyro.cli(LodoTable, args=list(argv), prog="agent lodo-table", description=TABLE_DESCRIPTION)
    runs = _runs(args.folder)
    for seed, folder in runs.items():
        md = Path(folder) / "lodo.md"
        if args.write:
            text = write_table(folder)["markdown"]
        else:
            text = md.read_text() if md.is_file() else (f"(no lodo.md yet: {len(lodo_table(folder)['drivers'])} "
                                                        "finished folds; --write writes it)")
        print(f"## seed {seed}: {folder}\n")
        print(text)
    if len(runs) > 1 or seed_folders(args.folder):
        try:
            over = seeds_table(runs, args.folder if args.write else None)
        except ValueError as exc:
            raise CLIError(str(exc)) from exc
        print(over["markdown"])
    if args.write:
        print(f"rewrote the tables in {args.folder}")
    return 0


def compare_main(argv: list[str]) -> int:
    """Run ``agent lodo-compare ARGV``; returns the exit code."""
    args = tyro.cli(LodoCompare, args=list(argv), prog="agent lodo-compare", description=COMPARE_DESCRIPTION)
    base, new = _runs(args.base), _runs(args.new)
    if args.out is not None and not args.overwrite:
        there = [p for p in (Path(args.out) / f"compare.{x}" for x in ("md", "json", "png")) if p.exists()]
        if there:
            raise CLIError(f"{there[0]} already exists; choose another --out or pass --overwrite")
    try:
        result = compare_settings(base, new, args.out)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "markdown"}, indent=2))
    else:
        print(result["markdown"])
    if args.out is not None:
        print(f"wrote {Path(args.out) / 'compare.md'}, compare.json and compare.png")
    return 0


def consensus_main(argv: list[str]) -> int:
    """Run ``agent lodo-consensus ARGV``; returns the exit code."""
    args = tyro.cli(LodoConsensus, args=list(argv), prog="agent lodo-consensus", description=CONSENSUS_DESCRIPTION)
    data = list(args.data)
    if len(data) < 2:
        raise CLIError(f"--data needs at least 2 recordings (one driver each), got {len(data)}")
    check_udacity_folders(data)
    try:
        cfg = ConsensusConfig(k=args.k, dims=args.dims, min_speed=args.min_speed)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    unknown = sorted(set(args.folds) - set(driver_names(data)))
    if unknown:
        raise CLIError(f"--folds names unknown driver(s) {', '.join(unknown)}; the drivers are "
                       f"{', '.join(driver_names(data))}")
    load = udacity_loader(args.crop_cache, "skip", len(data))
    try:
        table = run_consensus_lodo(data, args.out, load, cfg, tracks=driver_tracks(args.tracks, data, "tracks"),
                                   folds=list(args.folds) or None)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    print(table["markdown"])
    print(f"wrote {Path(args.out) / 'lodo.md'} and lodo.json")
    return 0


__all__ = ["COMPARE_DESCRIPTION", "CONSENSUS_DESCRIPTION", "TABLE_DESCRIPTION", "compare_main", "consensus_main",
           "table_main"]
