"""`agent bench nac|drive|bridge|rollouts|soak|train`: benchmarks that print figures.

Each benchmark's options are a dataclass of :mod:`agent.bench.config`, a tyro subcommand.
"""

from __future__ import annotations

import tyro

from agent.bench import nac as bench
from agent.bench.bridge import bench_bridge, bench_bridge_policy, print_bridge_table
from agent.bench.config import BENCHES, BenchBridge, BenchDrive, BenchNac, BenchRollouts, BenchSoak, BenchTrain
from agent.bench.drive import DisplayUnavailable, bench_drive, print_drive_table
from agent.bench.nac_cuda import CudaUnavailable, bench_nac_cuda, print_cuda_table, print_sweep_table, sweep_selector
from agent.bench.rollouts import bench_rollouts, print_rollouts_table
from agent.bench.soak import bench_soak, print_soak_report
from agent.bench.train import bench_train, print_train_table
from agent.cli.common import CLIError, write_json
from agent.train.config import ConfigError, torch_device

DESCRIPTION = ("Benchmarks that print figures: the NAC layer, the live runner, the Udacity bridge, rollouts, the "
               "memory of a long drive (soak) and the trainer's throughput (train).")


def main(argv: list[str]) -> int:
    """Run ``agent bench NAME ARGV``; the exit code."""
    cfg = tyro.extras.subcommand_cli_from_dict(BENCHES, args=list(argv), prog="agent bench", description=DESCRIPTION)
    try:
        cfg = cfg.check()
    except ConfigError as exc:
        raise CLIError(str(exc)) from exc
    rows = RUN[type(cfg)](cfg)
    if cfg.json:
        write_json(cfg.json, rows)
    return 0


def _bridge(cfg: BenchBridge) -> list[dict]:
    rows = bench_bridge_policy(cfg.policy, cfg.n, cfg.warmup) if cfg.policy else [bench_bridge(cfg.n, None, cfg.warmup)]
    print_bridge_table(rows)
    return rows


def _drive(cfg: BenchDrive) -> list[dict]:
    try:
        rows = bench_drive(cfg.policy, cfg.steps, rounds=cfg.rounds, window=cfg.window, record=cfg.record,
                           fps_limit=cfg.fps_limit, saliency_variants=cfg.saliency_variants)
    except DisplayUnavailable as exc:
        raise CLIError(f"--window: {exc}") from exc
    print_drive_table(rows)
    return rows


def _rollouts(cfg: BenchRollouts) -> list[dict]:
    rows = bench_rollouts(cfg.policies, cfg.envs, cfg.episodes, cfg.max_steps, cfg.track_seed)
    print_rollouts_table(rows)
    return rows


def _nac(cfg: BenchNac) -> list[dict]:
    if cfg.device == "cuda":
        try:
            rows = bench_nac_cuda(cells=cfg.cuda_cells, repeats=cfg.cuda_repeats,
                                  nac_paths=("triton", "torch") if cfg.nac_path == "both" else (cfg.nac_path,),
                                  step_window=cfg.step_window or None, step_count=cfg.step_count,
                                  policy=cfg.policy or None, timeout_s=cfg.cuda_timeout_s, profile=cfg.cuda_profile)
            if cfg.selector_sweep:
                sweep = sweep_selector()
        except CudaUnavailable as exc:
            raise CLIError(str(exc)) from exc
        print_cuda_table(rows)
        if cfg.selector_sweep:
            print_sweep_table(sweep)
            rows += sweep
        return rows
    rows = bench.bench_nac(sizes=cfg.sizes, block_sizes=cfg.block_sizes, repeats=cfg.repeats, peer=cfg.peer,
                           peer_max_T=cfg.peer_max_T, peer_repeats=cfg.peer_repeats, threads=cfg.threads,
                           clock=cfg.clock, baselines=("mha", "lstm") if cfg.baselines else (),
                           train_T=cfg.train_T or None, step_window=cfg.step_window or None,
                           step_count=cfg.step_count, paired_threads=cfg.thread_counts if cfg.paired else (),
                           paired_only=cfg.paired_only)
    bench.print_table(rows)
    return rows


def _soak(cfg: BenchSoak) -> dict:
    try:
        report = bench_soak(cfg.policy, cfg.steps, cfg.track_seed, cfg.out, cfg.overwrite, cfg.device, cfg.env_worker)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise CLIError(str(exc)) from exc
    print_soak_report(report)
    return report


def _train(cfg: BenchTrain) -> list[dict]:
    rows = bench_train(torch_device(cfg.device), cfg.frames, cfg.steps, cfg.warmup, cfg.threads, cfg.batch_frames,
                       cfg.data, cfg.workers, cfg.core, cfg.seed)
    print_train_table(rows)
    return rows


#: each benchmark's run: prints its table and returns its rows (soak: its report)
RUN = {BenchNac: _nac, BenchDrive: _drive, BenchBridge: _bridge, BenchRollouts: _rollouts, BenchSoak: _soak,
       BenchTrain: _train}
