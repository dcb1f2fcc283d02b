"""`agent compare`: every temporal core trained and driven alike, and its report; its options are
:class:`agent.compare.config.CompareConfig`."""

from __future__ import annotations

import tyro

from agent.cli.common import CLIError, write_json
from agent.compare.cells import run_comparison
from agent.compare.config import DESCRIPTION, CompareConfig
from agent.compare.report import write_report
from agent.train.config import ConfigError, torch_device


def main(argv: list[str]) -> int:
    """Run ``agent compare ARGV``; the exit code (1 when a cell failed)."""
    try:
        cfg = tyro.cli(CompareConfig, args=list(argv), prog="agent compare", description=DESCRIPTION).check()
        if cfg.runs:
            return _runs(cfg)
        if cfg.report_only:
            return _report(cfg)
        variants, seeds, protocol = cfg.variants, list(cfg.seed_list), cfg.protocol()
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    results = run_comparison(variants, seeds, protocol, cfg.out, workers=cfg.workers, threads=cfg.cell_threads,
                             device=torch_device(cfg.device))
    for r in results:
        if r.status == "failed":
            print(f"cell {r.name}: FAILED: {r.error}")
        else:
            c = r.cell["closed_loop"]
            print(f"cell {r.name} ({r.status}): return {c['mean']:.1f} ± {c['std']:.1f}, held-out accuracy "
                  f"{r.cell['heldout_accuracy']:.3f}")
    _report(cfg)
    return 1 if any(r.status == "failed" for r in results) else 0


def _runs(cfg: CompareConfig) -> int:
    """Compare recipe runs from their evaluation files; print the tables and write OUT/runs.md and runs.json."""
    from agent.compare.runs import write_runs_report

    try:
        rep = write_runs_report(cfg.runs, cfg.out)
    except ValueError as exc:
        raise CLIError(str(exc)) from exc
    print(rep["markdown"])
    print("wrote " + ", ".join(rep["paths"]))
    return 0


def _report(cfg: CompareConfig) -> int:
    """Write the comparison's report (and ``--json``) and print its table."""
    rep = write_report(cfg.out)
    print(rep["markdown"])
    paths = list(rep["paths"])
    if cfg.json:
        write_json(cfg.json, rep["summary"])
        paths.append(cfg.json)
    print("wrote " + ", ".join(map(str, paths)))
    return 0
