"""The configuration tree of ``agent train``: one validated dataclass per section, loaded from a
TOML file (a recipe in ``recipes/``), overridden from the command line, and written back resolved
beside every run.

Sections (TOML tables; on the command line ``--SECTION.FIELD``, e.g. ``--dagger.rounds 2``):

- top level: ``env``, ``data`` (the recordings), ``out``, ``seed`` (the weights' seed), ``init``,
  ``save_bc``, ``overwrite``, ``run_dir``, ``json``, ``resume`` (continue a run folder's
  checkpoint, :mod:`agent.train.checkpoint`), and where it runs: ``device`` (auto: CUDA when
  there is one), ``threads``, ``workers``;
- ``[policy]``: the architecture (:class:`PolicySection`);
- ``[train]``: behaviour cloning (:class:`TrainSection`);
- ``[teacher]``: the PPO expert and its rules, one set of names in every command that drives a
  teacher (:class:`TeacherSection`);
- ``[collect]``: teacher episodes recorded before training, so a recipe starts from the teacher
  alone (:class:`CollectSection`);
- ``[dagger]``: the DAgger rounds (:class:`DaggerSection`, Ross et al. 2011);
- ``[udacity]``: Udacity recordings' preprocessing (:class:`UdacitySection`);
- ``[lodo]``: the leave-one-driver-out evaluation (:class:`LodoSection`);

Every value is checked once, in the sections' ``__post_init__`` and :meth:`TrainRun.check`,
before any data loads; a bad value raises :class:`ConfigError` with one line that names the field
(``dagger.rounds``) and what it accepts. Defaults marked "per env" are ``None`` here and resolved
by :meth:`TrainRun.resolved` from :data:`agent.train.bc.TRAIN_DEFAULTS` and
:func:`agent.nn.policy.default_config`, so the resolved config written beside a run holds every
value the run used. The pattern follows LeRobot's configs (validated once, saved with the run).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Literal

import dacite

from agent.experts.rules import TeacherRules
from agent.nn.cores import CORES
from agent.nn.policy import default_config, default_core_kwargs
from agent.train.batches import BATCH_PATHS
from agent.train.bc import SCHEDULES, TRAIN_DEFAULTS
from envs.tracks import DAGGER_SEED_BASE, EVAL_SEED_BASE

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: CarRacing's dashboard modes (see :class:`agent.nn.features.CarRacingCNN`)
DASHBOARDS = ("visible", "speed", "hidden", "speedometer", "speed-input")
#: the DAgger disturbances (see :mod:`agent.actors.perturb`)
DISTURBANCES = ("off-road", "stop", "ditch", "speed")


class ConfigError(ValueError):
    """A configuration value that is out of range, of the wrong type, or for the other simulator.

    The message is one line: the field (``section.name``), what was given and what is accepted.
    """


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@dataclass(frozen=True)
class PolicySection:
    """The policy's architecture: features extractor options, temporal core and window.

    ``None`` means the simulator's default (:func:`agent.nn.policy.default_config`). With
    ``init`` the policy file's own architecture is kept; only ``dashboard`` may change it then.
    """

    core: str | None = None
    """temporal core (per env: nac-steady for carracing, nac-exact for udacity); one of agent.nn.cores.CORES"""
    window: int | None = None
    """T, frames the core sees (per env: 4; 8)"""
    d_model: int | None = None
    """core width d (per env: 64; 100)"""
    dashboard: Literal["visible", "speed", "hidden", "speedometer", "speed-input"] | None = None
    """carracing: what the CNN sees of the dashboard strip (default speed; speed-input: the strip blanked and the speed
    given as a number, as conditional imitation learning's measured speed)"""
    motion: bool | None = None
    """carracing: the CNN also reads each frame's difference from the previous one (default on)"""
    core_options: dict[str, bool | int | float | str] = field(default_factory=dict)
    """core options over the env's defaults, e.g. {topk = 4, sparsity = 0.9} (see agent.nn.cores)"""

    def __post_init__(self):
        _need(self.core is None or self.core in CORES,
              f"policy.core: unknown core {self.core!r}; choose one of {', '.join(CORES)}")
        _need(self.window is None or self.window >= 1, f"policy.window must be >= 1 frame, got {self.window}")
        _need(self.d_model is None or self.d_model >= 1, f"policy.d_model must be >= 1, got {self.d_model}")
        # "true"/"false" typed on the command line are booleans, as in TOML
        object.__setattr__(self, "core_options", {k: {"true": True, "false": False}.get(v.lower(), v)
                                                  if isinstance(v, str) else v for k, v in self.core_options.items()})
        _need(self.dashboard is None or self.dashboard in DASHBOARDS,
              f"policy.dashboard: choose one of {', '.join(DASHBOARDS)}, got {self.dashboard!r}")


@dataclass(frozen=True)
class TrainSection:
    """Behaviour cloning: cross-entropy (discrete actions) or MSE (continuous) on frame windows.

    ``None`` means the simulator's default (:data:`agent.train.bc.TRAIN_DEFAULTS`).
    """

    epochs: int | None = None
    """behaviour-cloning epochs (per env: 8; 40); 0 skips BC (needs init)"""
    batch_frames: int | None = None
    """frames per batch; windows per batch = this // window (per env: 256; 64)"""
    lr: float | None = None
    """peak learning rate, AdamW (per env: 1e-3; 3e-4)"""
    weight_decay: float | None = None
    """AdamW weight decay (per env: 1e-4; 0)"""
    schedule: Literal["onecycle", "cosine"] | None = None
    """learning-rate schedule (per env: onecycle; cosine to lr/20)"""
    val_fraction: float | None = None
    """share held out for validation: episodes (carracing, 0.1) or each recording's last rows (udacity, 0.15)"""
    class_weights: tuple[float, ...] | None = None
    """discrete actions: loss weight per target action in the head's order, e.g. (1, 1, 1, 1, 4); none: all 1"""
    concordance: float = 0.0
    """continuous actions: loss = MSE + this x (1 - Lin's concordance correlation) over each batch, a term that does
    not reward steering shrunk toward 0 (0: MSE alone)"""
    skip_stalls: bool = False
    """carracing: leave the expert's stalls (scene unmoved, label not gas) out of the loss"""
    standstills: float = 0.0
    """carracing: share of training windows replaced by synthetic standstills labelled go"""
    time_limit_min: float | None = None
    """stop after the epoch that crosses this many minutes"""
    tensorboard: str = "runs/train"
    """TensorBoard root folder ('' for none)"""
    batches: Literal["auto", "device", "loader"] | None = None
    """where training batches are built: device (carracing: the uint8 frames and labels copied to the GPU once, each
    batch gathered and masked there), loader (a DataLoader with --workers; pinned and prefetched on cuda) or auto
    (default: device on cuda when the data fit in device_share of the free GPU memory, else loader; loader on cpu);
    the same batches either way"""
    device_share: float | None = None
    """share of the free GPU memory that batches auto lets the training data take, in (0, 1] (default 0.5)"""

    def __post_init__(self):
        _need(self.batches is None or self.batches in BATCH_PATHS,
              f"train.batches: choose one of {', '.join(BATCH_PATHS)}, got {self.batches!r}")
        _need(self.device_share is None or (_finite(self.device_share) and 0.0 < self.device_share <= 1.0),
              f"train.device_share must be a share in (0, 1], got {self.device_share}")
        _need(self.epochs is None or self.epochs >= 0, f"train.epochs must be >= 0, got {self.epochs}")
        _need(self.batch_frames is None or self.batch_frames >= 1,
              f"train.batch_frames must be >= 1, got {self.batch_frames}")
        _need(self.lr is None or (_finite(self.lr) and self.lr > 0), f"train.lr must be > 0, got {self.lr}")
        _need(self.weight_decay is None or (_finite(self.weight_decay) and self.weight_decay >= 0),
              f"train.weight_decay must be >= 0, got {self.weight_decay}")
        _need(self.schedule is None or self.schedule in SCHEDULES,
              f"train.schedule: choose one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        _need(self.val_fraction is None or 0.0 <= self.val_fraction < 1.0,
              f"train.val_fraction must be in [0, 1), got {self.val_fraction}")
        cw = self.class_weights
        _need(cw is None or (len(cw) > 0 and all(_finite(w) and w >= 0 for w in cw) and any(w > 0 for w in cw)),
              f"train.class_weights must be finite weights >= 0, one per action, not all 0; got {cw}")
        _need(_finite(self.concordance) and self.concordance >= 0,
              f"train.concordance must be a finite weight >= 0, got {self.concordance}")
        _need(0.0 <= self.standstills < 1.0, f"train.standstills must be a share in [0, 1), got {self.standstills}")
        _need(self.time_limit_min is None or self.time_limit_min > 0,
              f"train.time_limit_min must be > 0 minutes, got {self.time_limit_min}")


@dataclass(frozen=True)
class TeacherSection:
    """The PPO expert that labels states, and its rules; the same names in every command.

    The rules change the expert's labels where its network is known to teach a student badly
    (see docs/guide.md, "The teacher's rules"): the start rule (gas from a standstill), the creep
    rule (discrete: every label gas below ``creep_speed``), the brake floor (no brake below
    ``brake_floor``) and the grass rule (discrete: no brake with all four wheels on the grass).
    In ``agent train`` they relabel the recordings too (from their recorded speeds and pixels).
    """

    expert: str | None = None
    """the PPO expert .zip that drives or labels (a bare name is looked up in policies/; DAgger's: the recordings' action kind)"""
    start_rule: bool = False
    """from a standstill (< 1 unit/s) the teacher's label is go; brakes below the brake floor become gas"""
    creep_speed: float = 0.0
    """discrete: below this speed (units/s) every label is gas; 0: off"""
    brake_floor: float | None = None
    """the start rule's brake floor (units/s): below it a brake label becomes gas; none: 10 in DAgger, recordings kept"""
    grass_rule: bool = False
    """discrete: with the car on the grass a brake label becomes gas"""

    def __post_init__(self):
        try:
            self.rules  # noqa: B018 - TeacherRules validates the rules
        except ValueError as exc:
            raise ConfigError(f"teacher.{exc}") from exc

    @property
    def rules(self) -> TeacherRules:
        """The rules alone (:class:`agent.experts.rules.TeacherRules`), which apply them to an expert."""
        return TeacherRules(start_rule=self.start_rule, creep_speed=self.creep_speed, brake_floor=self.brake_floor,
                            grass_rule=self.grass_rule)


@dataclass(frozen=True)
class CollectSection:
    """Teacher episodes recorded before training (CarRacing): the recipe starts from the teacher alone.

    The ``[teacher]`` section drives (the expert with its rules, as in DAgger), on tracks
    ``track_seed`` onwards, into recordings of ``chunk`` episodes each
    (:func:`agent.train.collect.teacher_recordings`), which join ``data``. A recording that holds
    all its episodes is kept on a rerun (a killed recipe resumes there); one cut short is
    recorded again.
    """

    episodes: int = 0
    """teacher episodes recorded before training, added to data (0: none, train on data alone)"""
    track_seed: int = 0
    """the first track: episode i drives track track_seed + i"""
    chunk: int = 10
    """episodes per recording: a finished recording is kept on a rerun, one cut short is recorded again"""
    out: str | None = None
    """the recordings' prefix: OUT-<first track>-<last track>-v0 (default: recordings/nac-drive/<teacher>-<rules>)"""
    envs: int = 1
    """CarRacing envs stepped at once while recording, each in its own process"""
    max_steps: int | None = None
    """cap on an episode's length (None: the env's 1000)"""

    def __post_init__(self):
        _need(self.episodes >= 0 and self.chunk >= 1 and self.envs >= 1,
              f"collect.episodes >= 0, collect.chunk >= 1 and collect.envs >= 1, got {self.episodes}, {self.chunk} "
              f"and {self.envs}")
        _need(self.track_seed >= 0 and self.track_seed + self.episodes <= DAGGER_SEED_BASE,
              f"collect.track_seed: teacher tracks {self.track_seed}..{self.track_seed + self.episodes - 1} must lie in "
              f"0..{DAGGER_SEED_BASE - 1} (DAgger's tracks start at {DAGGER_SEED_BASE:,}, the evaluation tracks at "
              f"{EVAL_SEED_BASE:,})")
        _need(self.max_steps is None or self.max_steps >= 1, f"collect.max_steps must be >= 1, got {self.max_steps}")


@dataclass(frozen=True)
class DaggerSection:
    """DAgger (Ross, Gordon and Bagnell, AISTATS 2011): the student drives, the teacher relabels the
    states it visits, the data is aggregated and the student retrained; CarRacing only."""

    rounds: int = 0
    """DAgger rounds after behaviour cloning (0: none)"""
    episodes: int = 8
    """student episodes per round"""
    epochs: int = 3
    """epochs on the aggregate after each round"""
    beta: float = 0.5
    """probability that the teacher's action is executed in round 1's rollouts (Ross et al.'s mixture)"""
    beta_decay: float = 0.5
    """beta of round r = beta * beta_decay^(r-1)"""
    disturb: float = 0.0
    """disturbances per 1000 steps in the rollouts (DART-like; 0: none)"""
    disturb_kinds: tuple[Literal["off-road", "stop", "ditch", "speed"], ...] = ("off-road", "stop")
    """the disturbances drawn: off-road, stop, ditch (off the road, then stopped), speed (steering as the
    driver's, but full gas instead of coasting or braking)"""
    track_seed: int = DAGGER_SEED_BASE
    """first track of round 1; round r drives track_seed + (r-1) * episodes onwards"""
    max_steps: int | None = None
    """cap on a rollout's length"""
    edge_weight: float = 1.0
    """loss weight of relabelled frames on or near the road's edge (1: no weighting)"""
    edge_horizon: int = 10
    """steps ahead that make a frame 'near the edge' for edge_weight"""
    wrong_way_weight: float = 1.0
    """loss weight of relabelled frames taken while the car drove the wrong way round the lap (0: left out, 1: no weighting)"""
    save_rounds: str | None = None
    """also write each round's relabelled episodes as Minari datasets SAVE_ROUNDS-r<round>-v0"""
    envs: int = 1
    """envs stepped at once in the rollouts (subprocesses)"""

    def __post_init__(self):
        _need(self.rounds >= 0 and self.episodes >= 1 and self.epochs >= 0,
              f"dagger.rounds >= 0, dagger.episodes >= 1 and dagger.epochs >= 0, got {self.rounds}, {self.episodes} "
              f"and {self.epochs}")
        _need(0.0 <= self.beta <= 1.0 and 0.0 <= self.beta_decay <= 1.0,
              f"dagger.beta and dagger.beta_decay must be in [0, 1], got {self.beta} and {self.beta_decay}")
        _need(_finite(self.disturb) and self.disturb >= 0,
              f"dagger.disturb must be >= 0 disturbances per 1000 steps, got {self.disturb}")
        bad = [k for k in self.disturb_kinds if k not in DISTURBANCES]
        _need(bool(self.disturb_kinds) and not bad,
              f"dagger.disturb_kinds: choose a non-empty subset of {', '.join(DISTURBANCES)}, got "
              f"{list(self.disturb_kinds)}")
        last = self.track_seed + max(self.rounds, 1) * self.episodes
        _need(self.track_seed >= 0 and last <= EVAL_SEED_BASE,
              f"dagger.track_seed: DAgger tracks {self.track_seed}..{last - 1} must lie in 0..{EVAL_SEED_BASE - 1} "
              f"(tracks from {EVAL_SEED_BASE:,} on are the evaluation tracks)")
        _need(self.max_steps is None or self.max_steps >= 1, f"dagger.max_steps must be >= 1, got {self.max_steps}")
        _need(_finite(self.edge_weight) and self.edge_weight >= 0 and self.edge_horizon >= 0,
              f"dagger.edge_weight must be a finite weight >= 0 and dagger.edge_horizon >= 0 steps, got "
              f"{self.edge_weight} and {self.edge_horizon}")
        _need(_finite(self.wrong_way_weight) and self.wrong_way_weight >= 0,
              f"dagger.wrong_way_weight must be a finite weight >= 0, got {self.wrong_way_weight}")
        _need(self.envs >= 1, f"dagger.envs must be >= 1, got {self.envs}")


@dataclass(frozen=True)
class UdacitySection:
    """Udacity recordings: bad rows, augmentation, label smoothing, the crop cache and the budget."""

    on_bad_row: Literal["skip", "error"] = "skip"
    """skip unusable CSV rows with a warning, or stop with an error listing them"""
    augment_prob: float = 0.6
    """probability that a training window is augmented (0: none)"""
    camera_correction: float | Literal["measured"] = 0.2
    """steering added for the left camera's views and subtracted for the right one's, or measured: the cameras'
    offset measured in the training frames, in the shift augmentation's steering per pixel (about 0.08)"""
    smooth_labels: int = 1
    """train on a moving average of the steering over this many frames (1: the raw labels)"""
    smooth_mode: Literal["centred", "causal"] = "centred"
    """smooth_labels averages frames i-k..i+k (centred, odd counts) or the last N frames (causal)"""
    straight_keep: float = 1.0
    """share of the straight-driving frames (|label| < 0.001) that the loss counts; 1: all"""
    min_speed: float = 0.0
    """frames recorded slower than this (mph) are left out of the loss: a stopped car's steering moves nothing; 0: all"""
    skip_reversing: bool = False
    """leave the frames where the car drives backwards (multi-point turns at full lock) out of the loss"""
    consensus_k: int = 0
    """label each driver's frames with the vote of this many of the OTHER drivers' most alike frames (0: own labels)"""
    crop_cache: str = "auto"
    """where recordings are cached as 66x200 YUV crops: auto (a cache for several recordings), '' (memory) or a folder"""
    subsample: float = 1.0
    """share of each training recording used, as random blocks of `block` frames"""
    block: int = 32
    """frames per block of subsample (>= the window)"""

    def __post_init__(self):
        _need(0.0 <= self.augment_prob <= 1.0, f"udacity.augment_prob must be in [0, 1], got {self.augment_prob}")
        _need(self.camera_correction == "measured" or (_finite(self.camera_correction) and
                                                       0.0 <= self.camera_correction <= 1.0),
              f"udacity.camera_correction must be a steering in [0, 1] or 'measured', got {self.camera_correction!r}")
        _need(self.smooth_labels >= 1 and (self.smooth_labels % 2 == 1 or self.smooth_mode == "causal"),
              f"udacity.smooth_labels must be an odd number of frames >= 1 (any >= 1 with smooth_mode causal), got "
              f"{self.smooth_labels}")
        _need(0.0 < self.straight_keep <= 1.0, f"udacity.straight_keep must be in (0, 1], got {self.straight_keep}")
        _need(_finite(self.min_speed) and self.min_speed >= 0.0,
              f"udacity.min_speed must be a speed in mph >= 0, got {self.min_speed}")
        _need(self.consensus_k >= 0, f"udacity.consensus_k must be a number of neighbours >= 0 (0: off), got "
              f"{self.consensus_k}")
        _need(0.0 < self.subsample <= 1.0 and self.block >= 1,
              f"udacity.subsample must be in (0, 1] and udacity.block >= 1, got {self.subsample} and {self.block}")


@dataclass(frozen=True)
class LodoSection:
    """Leave-one-driver-out (Udacity): one policy per held-out driver, trained on the others."""

    out: str | None = None
    """run the leave-one-driver-out evaluation into this folder (writes no policy file)"""
    tracks: dict[str, str] = field(default_factory=dict)
    """the track of each driver for the means per track, e.g. {"*" = "lake", "b-sh" = "jungle"}"""
    reference: str | None = None
    """also score this fixed Udacity policy on each held-out driver"""
    folds: tuple[str, ...] | None = None
    """run only these folds"""
    seeds: tuple[int, ...] | None = None
    """train every fold once per seed, into OUT/s<seed>, and write the table over the seeds (OUT/seeds.md, seeds.json)
    against the targets of issue "Udacity steering that turns"; None: the run's seed, into OUT"""


def check_device(device: str, threads: int = 0, workers: int = 0) -> None:
    """Validate the compute options every command shares (``--device``, ``--threads``, ``--workers``).

    Raises:
        ConfigError: a device that is not auto, cpu, cuda, cuda:N or mps; negative threads or workers.
    """
    _need(device in ("auto", "cpu", "cuda", "mps") or (device.startswith("cuda:") and device[5:].isdigit()),
          f"device must be auto, cpu, cuda, cuda:N or mps, got {device!r}")
    _need(threads >= 0 and workers >= 0, f"threads and workers must be >= 0, got {threads} and {workers}")


def torch_device(device: str) -> str:
    """``device`` with ``auto`` resolved: ``cuda`` when torch sees a GPU, else ``cpu``.

    Raises:
        ConfigError: ``cuda`` / ``cuda:N`` asked for where torch sees no such GPU (a CPU build of
            torch, or no device), or ``mps`` where torch has none; the message says to use
            ``--device cpu`` or ``auto``.
    """
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        index = int(device[5:]) if device.startswith("cuda:") else 0
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        _need(index < n, f"--device {device}: torch {torch.__version__} sees "
              f"{'no CUDA GPU' if n == 0 else f'{n} CUDA GPU(s)'} on this machine; use --device cpu (or auto)")
    if device == "mps":
        _need(torch.backends.mps.is_available(), f"--device mps: torch {torch.__version__} sees no MPS device on "
              "this machine; use --device cpu (or auto)")
    return device


@dataclass(frozen=True)
class TrainRun:
    """``agent train``: behaviour cloning (and DAgger) of a driving policy, either simulator.

    Raises:
        ConfigError: from :meth:`check`, one line naming the field.
    """

    data: tuple[str, ...] = ()
    """recordings: Minari datasets of `agent collect` (carracing) or Udacity folders with driving_log.csv"""
    env: Literal["carracing", "udacity"] = "carracing"
    """simulator"""
    out: str | None = None
    """policy file to write (default: runs/train/<env>-policy.pt)"""
    overwrite: bool = False
    """replace out (and the run folder's files) if they exist"""
    seed: int = 0
    """seed of the weights, split, batches and augmentation"""
    init: str | None = None
    """start from this policy file (its architecture kept); with train.epochs 0 BC is skipped"""
    save_bc: str | None = None
    """also save the policy after BC, before DAgger, here"""
    run_dir: str | None = None
    """the run folder: the resolved config, the report and checkpoints (default: runs/train/<out's name>)"""
    json: str | None = None
    """also write the training report as JSON here"""
    resume: str | None = None
    """continue the run in this run folder from its last checkpoint (RUN_DIR/checkpoint.pt, written after every epoch
    and DAgger round), with the config stored there; give no options that change it. The result is the one the run
    would have given without the interruption"""
    policy: PolicySection = PolicySection()
    train: TrainSection = TrainSection()
    teacher: TeacherSection = TeacherSection()
    collect: CollectSection = CollectSection()
    dagger: DaggerSection = DaggerSection()
    udacity: UdacitySection = UdacitySection()
    lodo: LodoSection = LodoSection()
    device: str = "auto"
    """torch device: auto (cuda when there is one), cpu, cuda, cuda:N"""
    threads: int = 0
    """torch CPU threads (0: torch's default; under torchrun: cores / processes per machine)"""
    workers: int = 0
    """DataLoader worker processes (augmentation runs there)"""

    def __post_init__(self):
        check_device(self.device, self.threads, self.workers)

    def check(self) -> "TrainRun":
        """Cross-section checks (each section checks itself when built); returns self.

        Raises:
            ConfigError: no recordings, options of the other simulator, DAgger without a teacher,
                a brake floor without the start rule in DAgger, LODO options without ``lodo.out``,
                ``init`` with architecture options, ``train.epochs 0`` without ``init``, an
                existing ``json`` or ``save_bc`` file without ``overwrite``, ``resume`` (it is
                handled before: ``agent train --resume RUN_DIR`` takes the config stored there).
        """
        _need(self.resume is None, "resume: --resume RUN_DIR continues a run with the config stored in RUN_DIR; give "
              "it without --config")
        _need(bool(self.data) or self.collect.episodes > 0, "data: give the recordings to train on (data = [...] in "
              "the config, or --data A B), or record teacher episodes first (collect.episodes with teacher.expert)")
        _need(self.json is None or self.overwrite or not Path(self.json).exists(),
              f"json: {self.json} already exists; choose another path or pass --overwrite")
        _need(self.save_bc is None or self.overwrite or not Path(self.save_bc).exists(),
              f"save_bc: {self.save_bc} already exists; choose another path or pass --overwrite")
        if self.env == "carracing":
            wrong = _changed(self.udacity, UdacitySection()) + _changed(self.lodo, LodoSection(), "lodo")
        else:
            wrong = _changed(self.dagger, DaggerSection()) + _changed(self.teacher, TeacherSection(), "teacher")
            wrong += _changed(self.collect, CollectSection(), "collect")
            wrong += [f"train.{k}" for k in ("skip_stalls", "standstills", "class_weights")
                      if getattr(self.train, k) != getattr(TrainSection(), k) and k != "class_weights"]
            wrong += [f"policy.{k}" for k in ("dashboard", "motion") if getattr(self.policy, k) is not None]
        _need(self.env == "carracing" or self.train.batches != "device",
              "train.batches device holds CarRacing frames on the device; Udacity windows are augmented per window on "
              "the host: use train.batches auto or loader")
        other = "udacity" if self.env == "carracing" else "carracing"
        _need(not wrong, f"{', '.join(wrong)} only apply to env {other!r}, and env is {self.env!r}")
        d = self.dagger
        _need(not d.rounds or bool(self.teacher.expert),
              "dagger.rounds needs teacher.expert (the PPO expert that relabels the student's states)")
        _need(d.edge_weight == 1.0 or d.rounds > 0, "dagger.edge_weight weighs DAgger's relabelled frames: it needs "
              "dagger.rounds")
        _need(d.wrong_way_weight == 1.0 or d.rounds > 0, "dagger.wrong_way_weight weighs DAgger's relabelled frames: "
              "it needs dagger.rounds")
        _need(d.envs == 1 or d.rounds > 0, "dagger.envs steps the DAgger rollouts: it needs dagger.rounds")
        c = self.collect
        _need(not c.episodes or bool(self.teacher.expert),
              "collect.episodes needs teacher.expert (the PPO expert that drives the recorded episodes)")
        _need(not c.episodes or self.teacher.brake_floor is None or self.teacher.start_rule,
              "teacher.brake_floor is the start rule's floor: add teacher.start_rule")
        if not c.episodes:
            extra = [k for k in _changed(c, CollectSection(), "collect")]
            _need(not extra, f"{', '.join(extra)} only apply with collect.episodes (teacher episodes to record)")
        _need(not (d.rounds and self.teacher.brake_floor is not None and not self.teacher.start_rule),
              "teacher.brake_floor is the start rule's floor: DAgger's teacher uses it only with teacher.start_rule")
        if self.lodo.out is None:
            lodo_only = _changed(self.lodo, LodoSection(), "lodo")
            _need(not lodo_only, f"{', '.join(lodo_only)} only apply with lodo.out (the leave-one-driver-out folder)")
        else:
            _need(self.lodo.seeds is None or (len(self.lodo.seeds) >= 1 and
                                              len(set(self.lodo.seeds)) == len(self.lodo.seeds)),
                  f"lodo.seeds must be distinct seeds, e.g. 0 1; got {self.lodo.seeds}")
            _need(self.init is None and self.out is None and self.save_bc is None,
                  "lodo.out trains one policy per fold from scratch and writes no policy file: drop init, out and "
                  "save_bc")
        if self.init is not None:
            clash = [f"policy.{k}" for k in ("core", "window", "d_model", "motion") if getattr(self.policy, k) is not None]
            _need(not clash, f"init keeps the policy file's own {', '.join(clash)}: drop those options")
        else:
            _need(self.train.epochs != 0, "train.epochs 0 (no behaviour cloning) needs init (a policy file to start from)")
        window = self.policy.window or default_config(self.env).window
        _need(self.udacity.subsample == 1.0 or self.udacity.block >= window,
              f"udacity.block ({self.udacity.block}) must be at least the window ({window} frames)")
        return self

    @property
    def out_path(self) -> Path:
        """The policy file this run writes (default: runs/train/<env>-policy.pt, never a shipped file)."""
        return Path(self.out or f"runs/train/{self.env}-policy.pt")

    @property
    def run_path(self) -> Path:
        """The run folder (``run_dir``, or runs/train/<out's name without its suffix>)."""
        return Path(self.run_dir) if self.run_dir else Path("runs/train") / self.out_path.stem

    def resolved(self) -> "TrainRun":
        """This config with every per-env default filled in (what the run really uses)."""
        base = TRAIN_DEFAULTS[self.env]
        train = replace(self.train, **{k: base[k] for k in base if getattr(self.train, k) is None})
        if self.init is not None:
            return replace(self, train=train)
        pdef = default_config(self.env, self.policy.core)
        fk = pdef.features_kwargs
        core_options = {**default_core_kwargs(self.env, pdef.core), **self.policy.core_options}
        policy = replace(self.policy, core=pdef.core, window=self.policy.window or pdef.window,
                         d_model=self.policy.d_model or pdef.d_model,
                         dashboard=self.policy.dashboard or fk.get("dashboard"),
                         motion=fk.get("motion") if self.policy.motion is None else self.policy.motion,
                         core_options=core_options)
        return replace(self, train=train, policy=policy)


@dataclass(frozen=True)
class PPOSection:
    """The PPO expert's training (stable-baselines3 PPO on CarRacing's privileged state; Schulman et al. 2017)."""

    timesteps: int = 3_000_000
    """PPO agent steps"""
    lr: float = 3e-4
    """PPO learning rate (lower it, e.g. 1e-4, when fine-tuning from init)"""
    ent_coef: float | None = None
    """entropy bonus (default 0.003; 0.0 for the continuous configuration)"""
    action_repeat: int = 1
    """repeat each expert action this many frames"""
    continuous: bool = False
    """the continuous configuration: (steering, throttle) actions and a Gaussian policy instead of five actions"""
    disturbed_starts: float = 0.0
    """share of training episodes that start off the road or at a standstill, so the expert learns to recover"""
    offtrack_patience: int = 50
    """steps with all wheels off the road before a training episode is cut"""
    wheel_off_penalty: float = 0.0
    """reward shaping: subtracted per wheel off the road per step (evaluation scores the env's own reward)"""
    keep: Literal["best", "last"] = "best"
    """the checkpoint written to out: best mean return on held-out tracks, or the last"""

    def __post_init__(self):
        _need(self.timesteps >= 1, f"ppo.timesteps must be >= 1, got {self.timesteps}")
        _need(_finite(self.lr) and self.lr > 0, f"ppo.lr must be > 0, got {self.lr}")
        _need(self.ent_coef is None or (_finite(self.ent_coef) and self.ent_coef >= 0),
              f"ppo.ent_coef must be >= 0, got {self.ent_coef}")
        _need(self.action_repeat >= 1, f"ppo.action_repeat must be >= 1, got {self.action_repeat}")
        _need(0.0 <= self.disturbed_starts <= 1.0, f"ppo.disturbed_starts must be in [0, 1], got {self.disturbed_starts}")
        _need(self.offtrack_patience >= 1, f"ppo.offtrack_patience must be >= 1 step, got {self.offtrack_patience}")
        _need(_finite(self.wheel_off_penalty) and self.wheel_off_penalty >= 0,
              f"ppo.wheel_off_penalty must be >= 0, got {self.wheel_off_penalty}")


@dataclass(frozen=True)
class ExpertRun:
    """``agent expert train``: the PPO expert on CarRacing's privileged state (pixels skipped)."""

    env: Literal["carracing"] = "carracing"
    """simulator"""
    out: str = "runs/expert/carracing-expert.zip"
    """where to write the expert"""
    overwrite: bool = False
    """replace out if it exists"""
    seed: int = 0
    """seed of PPO's weights and of the training tracks"""
    envs: int = 8
    """parallel envs in the PPO rollout"""
    init: str | None = None
    """fine-tune: start from this expert .zip's weights"""
    tensorboard: str = "runs/expert"
    """TensorBoard log folder ('' for none)"""
    run_dir: str | None = None
    """the run folder: the resolved config (default: runs/expert/<out's name>)"""
    ppo: PPOSection = PPOSection()
    device: str = "auto"
    """torch device for the PPO updates: auto (cuda when there is one), cpu, cuda, cuda:N"""
    threads: int = 0
    """torch CPU threads (0: torch's default)"""

    def __post_init__(self):
        check_device(self.device, self.threads)
        _need(self.envs >= 1, f"envs must be >= 1, got {self.envs}")
        _need(self.out.endswith(".zip"), f"out must be a .zip (stable-baselines3's format), got {self.out!r}")

    def check(self) -> "ExpertRun":
        """Nothing beyond the sections' own checks; returns self (the same interface as :class:`TrainRun`)."""
        return self

    @property
    def out_path(self) -> Path:
        """The expert file this run writes."""
        return Path(self.out)

    @property
    def run_path(self) -> Path:
        """The run folder (``run_dir``, or runs/expert/<out's name without .zip>)."""
        return Path(self.run_dir) if self.run_dir else Path("runs/expert") / self.out_path.stem

    def resolved(self) -> "ExpertRun":
        """This config with the entropy bonus's default filled in."""
        if self.ppo.ent_coef is not None:
            return self
        return replace(self, ppo=replace(self.ppo, ent_coef=0.0 if self.ppo.continuous else 0.003))


def _changed(section, default, prefix: str | None = None) -> list[str]:
    """The fields of ``section`` that differ from ``default``, as ``prefix.name``."""
    name = prefix or type(section).__name__.replace("Section", "").lower()
    return [f"{name}.{f.name}" for f in fields(section) if getattr(section, f.name) != getattr(default, f.name)]


_DACITE = dacite.Config(strict=True, cast=[tuple])


def from_dict(cls, values: dict, source: str = "the config"):
    """Build the dataclass ``cls`` (e.g. :class:`TrainRun`) from nested dicts, strictly.

    Raises:
        ConfigError: an unknown key, a value of the wrong type, or one a section refuses; the
            message names ``source`` and the field.
    """
    try:
        return dacite.from_dict(cls, values, config=_DACITE)
    except dacite.UnexpectedDataError as exc:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(exc.keys))}; see `agent train --help` for the "
                          "fields") from exc
    except dacite.DaciteError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def config_from_text(text: str, source: str, cls=None):
    """A config from TOML text (a resolved config stored in a checkpoint) into ``cls`` (default :class:`TrainRun`).

    Raises:
        ConfigError: invalid TOML or an invalid value; the message names ``source``.
    """
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: the stored config is not valid TOML: {exc}") from exc
    return from_dict(cls or TrainRun, values, source)


def load_config(path: str | Path, cls=None):
    """Read a TOML config file (a recipe) into ``cls`` (default :class:`TrainRun`).

    Raises:
        ConfigError: a missing or unreadable file, invalid TOML, or an invalid value (one line).
    """
    cls = cls or TrainRun
    path = Path(path)
    values = _read_toml(path)
    if "stages" in values:
        raise ConfigError(f"{path} is a recipe of several stages; run it with `agent train --config {path}`")
    return from_dict(cls, values, str(path))


def _read_toml(path: Path) -> dict:
    if path.suffix.lower() != ".toml":
        raise ConfigError(f"{path}: config files are TOML (.toml), e.g. recipes/nac.toml")
    try:
        values = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return values


def _merge(base: dict, over: dict) -> dict:
    """``base`` with ``over`` merged in, table by table (a stage changes only the fields it names)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_recipe(path: str | Path, cls=None) -> list[tuple[str, object]]:
    """A recipe: one config, or a chain of stages that each start from the one before.

    A recipe file is a config file (:func:`load_config`), optionally with ``[[stages]]`` tables:
    each names a stage (``name = "bc"``) and the fields it changes over the file's top level,
    e.g. ``train = { epochs = 0 }``. Stages run in order; the runner gives each stage after the
    first the previous stage's policy as ``init`` unless it names one.

    Returns:
        ``[(stage name, config)]``: one entry named ``""`` for a file without stages.

    Raises:
        ConfigError: as :func:`load_config`, a stage without a unique name, or an invalid stage
            (named ``FILE [stage NAME]``).
    """
    cls = cls or TrainRun
    path = Path(path)
    values = _read_toml(path)
    stages = values.pop("stages", None)
    if stages is None:
        return [("", from_dict(cls, values, str(path)))]
    if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) for s in stages):
        raise ConfigError(f"{path}: stages must be [[stages]] tables, each with a name")
    names = [s.get("name") for s in stages]
    if not all(isinstance(n, str) and n.strip() for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"{path}: every [[stages]] table needs a unique name (name = \"bc\"), got {names}")
    out = []
    for stage in stages:
        name = stage["name"]
        body = {k: v for k, v in stage.items() if k != "name"}
        out.append((name, from_dict(cls, _merge(values, body), f"{path} [stage {name}]")))
    return out


def to_dict(cfg) -> dict:
    """The config as nested plain dicts (tuples as lists, ``None`` values dropped: TOML has no null)."""
    def clean(x):
        if is_dataclass(x):
            return {f.name: clean(getattr(x, f.name)) for f in fields(x) if getattr(x, f.name) is not None}
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if v is not None}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return clean(cfg)


def to_toml(cfg) -> str:
    """The config as TOML text (scalars first, then one table per section)."""
    import tomli_w

    return tomli_w.dumps(to_dict(cfg))


__all__ = ["ConfigError", "DASHBOARDS", "DaggerSection", "ExpertRun", "LodoSection", "PPOSection", "PolicySection",
           "TeacherSection", "TrainRun", "TrainSection", "UdacitySection", "check_device", "config_from_text",
           "from_dict", "load_config",
           "load_recipe", "to_dict", "to_toml", "torch_device"]

