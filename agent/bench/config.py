"""The options of ``agent bench nac|drive|bridge|rollouts|soak|train``: one frozen dataclass per benchmark,
parsed by tyro as subcommands (:data:`BENCHES`).

Every value is checked once: each field in ``__post_init__`` (tyro reports a bad one and exits with
code 2), the rules between fields and an existing ``--json`` file in ``check()``; both raise
:class:`agent.train.config.ConfigError` with one line that names the option.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.train.config import ConfigError, check_device
from envs.tracks import EVAL_SEED_BASE


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _check_json(json: str | None, overwrite: bool) -> None:
    _need(json is None or overwrite or not Path(json).exists(),
          f"--json {json} already exists; choose another path or pass --overwrite")


@dataclass(frozen=True)
class BenchNac:
    """NAC layer: time and memory against torch MHA, LSTM and torch-nac.

    Our NAC layer side by side with torch.nn.MultiheadAttention (causal, same width and heads),
    torch.nn.LSTM and torch-nac 0.0.2 (the authors' PyTorch port, installed on demand into a private
    folder): forward time and peak memory (B=1, input and d_model 64, 4 heads, top-k 8, exact mode),
    forward+backward (B=8), streaming step p50/p99, with ratios and issue 12's layer targets; and ours
    against MHA in one process at 1 thread and at torch's default thread count (--thread-counts), with
    issue 42's CPU targets judged at the most threads (forward <= 1.5x MHA at T >= 256 below 16
    threads, 2x at 16 or more; forward+backward <= 2x). --device cuda:
    ours (Triton kernels and/or torch path) against MHA and SDPA on the GPU at B 8 and 64, with the targets
    (forward and forward+backward <= 2x, peak memory <= 1.5x, streaming p99 <= 1 ms) marked pass/FAIL.
    """

    sizes: tuple[int, ...] = (16, 256, 1024)
    """T for both layers"""
    block_sizes: tuple[int, ...] = (4096, 16384)
    """extra T for our blocks selector (none: give the option without values)"""
    repeats: int = 3
    """timed forwards per size (median)"""
    peer: bool = True
    """run torch-nac beside ours (--no-peer: skip it)"""
    peer_max_T: int = 1024
    """run torch-nac only up to this T"""
    peer_repeats: int | None = None
    """timed forwards for torch-nac (default: repeats below T=256, else 1)"""
    baselines: bool = True
    """run torch's MultiheadAttention and LSTM beside ours (--no-baselines: skip them)"""
    train_T: int = 256
    """T of the forward+backward rows (B=8); 0 skips them"""
    step_window: int = 16
    """cached frames of the streaming-step rows; 0 skips them"""
    threads: int = 1
    """torch CPU threads per measurement (0: torch's default)"""
    paired: bool = True
    """also ours and MHA interleaved in one process at each of --thread-counts (default: 1 thread and torch's
    default count), with ratios at each (--no-paired: skip)"""
    clock: Literal["wall", "cpu"] = "wall"
    """wall time, or the measuring thread's CPU time (with --threads 1; steadier on a busy CPU)"""
    thread_counts: tuple[int, ...] = (1, 0)
    """torch thread counts of the paired rows (0: torch's default), e.g. 1 2 16 for the CPU's scaling"""
    paired_only: bool = False
    """only the paired rows (at --thread-counts), e.g. for a machine's CPU scaling"""
    device: Literal["cpu", "cuda"] = "cpu"
    """cpu: the rows above; cuda: ours against MHA and SDPA on the GPU at --cuda-cells (forward, forward+backward,
    peak MB, ratios with the targets), and the streaming step of the layer and of --policy (the CPU-only options
    --sizes, --block-sizes, --repeats, --peer*, --baselines, --train-T, --threads, --paired, --thread-counts are
    not used)"""
    nac_path: Literal["triton", "torch", "both"] = "triton"
    """--device cuda: which NAC path to time: the Triton kernels (NAC_TRITON=auto, the default on CUDA), the torch
    path (NAC_TRITON=off), or both"""
    cuda_cells: tuple[str, ...] = ("8x16", "8x256", "8x1024", "8x4096", "64x256", "64x1024", "64x4096")
    """--device cuda: the (B, T) cells, as BxT"""
    cuda_repeats: int = 20
    """--device cuda: timed calls per model and cell (median)"""
    cuda_timeout_s: float = 300.0
    """--device cuda: time limit per NAC path (the cells finished before it are kept)"""
    selector_sweep: bool = False
    """--device cuda: also time the exact selector's Triton kernel alone under each of its tunables (key block,
    warps, precheck) at 8x1024, 64x1024, 64x4096, and check each gives the default's selection"""
    cuda_profile: bool = False
    """--device cuda: also profile one NAC forward and forward + backward per cell (torch.profiler): the longest
    kernels, the launch count, GPU time against wall time"""
    step_count: int = 300
    """timed streaming steps (p50, p99)"""
    policy: str = "nac.pt"
    """--device cuda: the whole policy of the streaming row ('' skips it)"""
    json: str | None = None
    """also write the rows as JSON here"""
    overwrite: bool = False
    """replace an existing --json file"""

    def __post_init__(self):
        for cell in self.cuda_cells:
            parts = cell.lower().split("x")
            _need(len(parts) == 2 and all(p.isdigit() and int(p) >= 1 for p in parts),
                  f"--cuda-cells takes BxT with B, T >= 1 (e.g. 8x256), got {cell!r}")
        _need(bool(self.cuda_cells), "--cuda-cells: give at least one BxT")
        _need(self.cuda_repeats >= 1 and self.step_count >= 1 and self.cuda_timeout_s > 0,
              f"--cuda-repeats and --step-count must be >= 1 and --cuda-timeout-s > 0, got {self.cuda_repeats}, "
              f"{self.step_count} and {self.cuda_timeout_s}")
        _need(bool(self.thread_counts) and min(self.thread_counts) >= 0,
              f"--thread-counts must be counts >= 0 (0: torch's default), got {list(self.thread_counts)}")
        _need(bool(self.sizes) and min(self.sizes) >= 1 and all(t >= 1 for t in self.block_sizes),
              f"--sizes and --block-sizes must be T >= 1 (and --sizes not empty), got {list(self.sizes)} and "
              f"{list(self.block_sizes)}")
        _need(self.repeats >= 1, f"--repeats must be >= 1, got {self.repeats}")
        _need(self.peer_repeats is None or self.peer_repeats >= 1,
              f"--peer-repeats must be >= 1, got {self.peer_repeats}")
        _need(self.peer_max_T >= 1, f"--peer-max-T must be >= 1, got {self.peer_max_T}")
        _need(self.train_T >= 0 and self.step_window >= 0,
              f"--train-T and --step-window must be >= 0 (0 skips their rows), got {self.train_T} and "
              f"{self.step_window}")
        _need(self.threads >= 0, f"--threads must be >= 0, got {self.threads}")

    def check(self) -> "BenchNac":
        """The rules between options and an existing ``--json``; returns self."""
        _need(self.clock == "wall" or self.threads == 1, "--clock cpu measures one thread's CPU time: add --threads 1")
        _need(not self.paired_only or (self.paired and self.baselines),
              "--paired-only needs the paired rows: drop --no-paired and --no-baselines")
        if self.device == "cuda":
            _need(self.clock == "wall", "--clock cpu is for the CPU rows; --device cuda times by CUDA events")
            from agent.bench.nac_cuda import cuda_problem

            problem = cuda_problem()
            _need(problem is None, problem or "")
        _check_json(self.json, self.overwrite)
        return self


@dataclass(frozen=True)
class BenchDrive:
    """Runner FPS and step latency with and without the overlays.

    Runner speed in four configurations (policy only, + NAC traces, + saliency, all on), every
    frame composed as the window shows it: FPS, p50/p99 of the loop step and of the
    observation-to-action latency, and CPU ms per step. Headless by default; --window shows every
    frame in a real window (DISPLAY, or a private Xvfb started for the run when DISPLAY is unset:
    apt-get install -y xvfb). The target is CarRacing's own 50 FPS with everything on.
    """

    policy: str = "nac.pt"
    """policy file (a bare name is looked up in policies/)"""
    steps: int = 600
    """timed steps per configuration and round"""
    rounds: int = 1
    """interleaved repetitions of all configurations (pooled)"""
    window: bool = False
    """show every frame in a real pygame window (the path `drive` takes with a display)"""
    record: bool = False
    """add a configuration: all on while writing the mp4 (drive --record), with ffmpeg's CPU"""
    fps_limit: float = 0.0
    """the window's frame-rate cap, FPS; 0 = none, to see what the loop can do"""
    saliency_variants: tuple[str, ...] = ()
    """extra 'all on' rows, one per live CAM as METHOD@LAYER (e.g. gradcam@last layercam@auto hirescam@conv3), to
    compare their cost with the default's side by side"""
    json: str | None = None
    """also write the rows as JSON here"""
    overwrite: bool = False
    """replace an existing --json file"""

    def __post_init__(self):
        for v in self.saliency_variants:
            _need("@" in v and v.split("@", 1)[1] != "", f"--saliency-variants takes METHOD@LAYER (e.g. gradcam@last), "
                                                         f"got {v!r}")
        _need(10 <= self.steps <= 19_975, f"--steps must be in 10..19975 (a drive session keeps the timings of "
                                          f"20,000 steps, 25 of them warm-up; use more --rounds), got {self.steps}")
        _need(self.rounds >= 1, f"--rounds must be >= 1, got {self.rounds}")
        _need(self.fps_limit >= 0, f"--fps-limit must be >= 0, got {self.fps_limit}")

    def check(self) -> "BenchDrive":
        """An existing ``--json``; returns self."""
        _check_json(self.json, self.overwrite)
        return self


@dataclass(frozen=True)
class BenchBridge:
    """Udacity bridge round trip (telemetry in -> steer out), with and without the policy and overlays.

    A wire-level fake simulator sends telemetry over loopback and times the steer reply: the bridge
    alone, with the Udacity policy's step, and with the policy plus Grad-CAM, NAC traces and the
    composed view. p50/p90/p99/max in ms.
    """

    policy: str = "udacity-nac.pt"
    """Udacity policy ('' to time the bridge only)"""
    n: int = 1000
    """timed round trips per row"""
    warmup: int = 50
    """untimed round trips first"""
    json: str | None = None
    """also write the rows as JSON here"""
    overwrite: bool = False
    """replace an existing --json file"""

    def __post_init__(self):
        _need(self.n >= 10 and self.warmup >= 0, f"--n must be >= 10 and --warmup >= 0, got {self.n} and "
                                                 f"{self.warmup}")

    def check(self) -> "BenchBridge":
        """An existing ``--json``; returns self."""
        _check_json(self.json, self.overwrite)
        return self


@dataclass(frozen=True)
class BenchRollouts:
    """Env steps/s with N envs at once (--envs), expert and student.

    The same episodes with 1, 2, 4, ... CarRacing envs stepped at once: N = 1 through the one-env
    path, N > 1 through AsyncVectorEnv subprocesses with the policy acting on the batch (agent
    collect/evaluate/train --envs N). The expert runs without pixels (its privileged state comes
    through info), the student on rendered frames. Prints env steps/s, the ratio against N = 1 and
    whether the returns equal N = 1's, with the load average (figures, not a test).
    """

    policies: tuple[str, ...] = ("carracing-expert-discrete-margin.zip", "nac.pt")
    """policy files (a bare name is looked up in policies/); the default expert is nac.pt's teacher"""
    envs: tuple[int, ...] = (1, 2, 4)
    """the N to time (ratios against the first)"""
    episodes: int = 4
    """tracks per configuration"""
    max_steps: int = 250
    """steps per episode"""
    track_seed: int = EVAL_SEED_BASE
    """the first track (CarRacing seed): episode i drives track track_seed+i"""
    json: str | None = None
    """also write the rows as JSON here"""
    overwrite: bool = False
    """replace an existing --json file"""

    def __post_init__(self):
        _need(bool(self.policies), "--policies: give at least one policy file")
        _need(self.episodes >= 1 and self.max_steps >= 1 and bool(self.envs) and min(self.envs) >= 1,
              f"--episodes, --max-steps and every --envs must be >= 1, got {self.episodes}, {self.max_steps} and "
              f"{list(self.envs)}")

    def check(self) -> "BenchRollouts":
        """An existing ``--json``; returns self."""
        _check_json(self.json, self.overwrite)
        return self


@dataclass(frozen=True)
class BenchSoak:
    """Memory of a long drive: RSS over drive --record --dump-traces with every overlay on.

    Drives CarRacing headless with the policy, Grad-CAM, the NAC trace panel, the mp4 (--record) and
    the streamed trace file (--dump-traces) for --steps steps in one session (episodes of up to
    1,000 steps on successive tracks, the last one finished), and prints this process's RSS at the
    start, after every episode and at the end, with the machine, device and versions. The files go to
    a temporary folder, removed afterwards, or to --out (soak.mp4, soak.h5).
    """

    policy: str = "nac.pt"
    """CarRacing NAC policy (a bare name is looked up in policies/)"""
    steps: int = 20_000
    """steps to drive at least (whole episodes)"""
    track_seed: int = EVAL_SEED_BASE
    """the first track (CarRacing seed)"""
    out: str | None = None
    """keep soak.mp4 and soak.h5 in this folder (default: a temporary folder, removed)"""
    device: str = "auto"
    """torch device of the policy: auto (cuda when there is one), cpu, cuda, cuda:N"""
    env_worker: Literal["auto", "on", "off"] = "auto"
    """step CarRacing in a worker process, as drive --env-worker"""
    json: str | None = None
    """also write the report as JSON here"""
    overwrite: bool = False
    """replace an existing --json file, or soak.mp4 and soak.h5 in --out"""

    def __post_init__(self):
        _need(self.steps >= 1, f"--steps must be >= 1, got {self.steps}")

    def check(self) -> "BenchSoak":
        """An existing ``--json``, or soak.mp4/soak.h5 in ``--out``; returns self."""
        _check_json(self.json, self.overwrite)
        if self.out is not None:
            for name in ("soak.mp4", "soak.h5"):
                path = Path(self.out) / name
                _need(self.overwrite or not path.exists(),
                      f"--out: {path} already exists; choose another folder or pass --overwrite")
        return self


@dataclass(frozen=True)
class BenchTrain:
    """Training throughput: frames/s of agent train's loop beside the pure compute rate of its step.

    The CarRacing default policy trains on a synthetic set of --frames random uint8 frames (in memory,
    no files). loop: agent train's own loop (its batch path, --data, and its step) for --steps steps
    after --warmup; compute: the same step (forward, backward, clipping, AdamW) repeated on one batch
    already on the device. Prints both in frames/s, their ratio, the device, torch version, threads and
    batch size; on cuda the device is synchronised before each clock reading.
    """

    device: str = "auto"
    """torch device: auto (cuda when there is one), cpu, cuda, cuda:N"""
    frames: int = 20_000
    """frames in the synthetic training set (27.6 KB each, held in memory, and on the device with --data device)"""
    steps: int = 50
    """timed training steps per measurement"""
    warmup: int = 10
    """untimed steps before each measurement"""
    batch_frames: int = 256
    """frames per batch (agent train's --train.batch-frames; windows per batch = this // T)"""
    threads: tuple[int, ...] = (0, 1)
    """torch CPU thread counts, one set of rows each (0: torch's default count)"""
    data: tuple[Literal["auto", "device", "loader"], ...] = ("auto",)
    """the batch paths to time (agent train's --train.batches): auto, device, loader"""
    workers: int = 0
    """the loader's worker processes (agent train's --workers)"""
    core: str | None = None
    """temporal core (default: CarRacing's, nac-steady)"""
    seed: int = 0
    """seed of the synthetic data, the weights and the shuffle"""
    json: str | None = None
    """also write the rows as JSON here"""
    overwrite: bool = False
    """replace an existing --json file"""

    def __post_init__(self):
        check_device(self.device, workers=self.workers)
        _need(self.frames >= 1 and self.steps >= 1 and self.warmup >= 0 and self.batch_frames >= 1,
              f"--frames, --steps and --batch-frames must be >= 1 and --warmup >= 0, got {self.frames}, {self.steps}, "
              f"{self.batch_frames} and {self.warmup}")
        _need(bool(self.threads) and min(self.threads) >= 0, f"--threads must be counts >= 0 (0: torch's default), "
                                                             f"got {list(self.threads)}")
        _need(bool(self.data), "--data: give at least one of auto, device, loader")

    def check(self) -> "BenchTrain":
        """A CUDA device torch cannot see, an unknown core, a set smaller than one batch, an existing
        ``--json``; returns self."""
        from agent.nn.cores import CORES

        _need(self.core is None or self.core in CORES, f"--core: unknown core {self.core!r}; choose one of "
                                                       f"{', '.join(CORES)}")
        if self.device.startswith("cuda"):
            import torch

            _need(torch.cuda.is_available(), f"--device {self.device}: torch {torch.__version__} sees no CUDA GPU on "
                                             "this machine; use --device cpu")
            index = int(self.device[5:]) if self.device.startswith("cuda:") else 0
            _need(index < torch.cuda.device_count(), f"--device {self.device}: this machine has "
                                                     f"{torch.cuda.device_count()} CUDA device(s)")
        _check_json(self.json, self.overwrite)
        return self


#: the benchmarks, by subcommand name
BENCHES = {"nac": BenchNac, "drive": BenchDrive, "bridge": BenchBridge, "rollouts": BenchRollouts, "soak": BenchSoak,
           "train": BenchTrain}

__all__ = ["BENCHES", "BenchBridge", "BenchDrive", "BenchNac", "BenchRollouts", "BenchSoak", "BenchTrain"]
