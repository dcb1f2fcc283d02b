"""The options of ``agent compare``: one frozen dataclass, :class:`CompareConfig`, parsed by tyro.

Sections: ``teacher`` (:class:`agent.train.config.TeacherSection`, the PPO expert that labels the
DAgger rollouts of every cell, and its rules; the same names as in every command that drives a
teacher) and ``dagger`` (:class:`CompareDagger`, the DAgger rounds every cell runs alike). The
config maps onto the comparison's :class:`agent.compare.cells.Protocol` (:meth:`CompareConfig.protocol`),
whose field names are the ones ``plan.json`` keeps. Every value is checked once: each field in
``__post_init__`` (tyro reports a bad one and exits with code 2), the variants, the seeds, the
recordings and an existing ``--json`` in :meth:`CompareConfig.check`; both raise
:class:`agent.train.config.ConfigError` with one line that names the option.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agent.compare.cells import DEFAULT_CORES, Protocol, Variant, parse_variants
from agent.train.config import ConfigError, TeacherSection, check_device
from envs.tracks import EVAL_SEED_BASE

#: the protocol's defaults (:class:`agent.compare.cells.Protocol`), which the options keep
_P = {f.name: f.default for f in fields(Protocol)}
#: the expert recordings every cell learns from by default
DEFAULT_DATA = ("recordings/nac-drive/rule-0-19-v0", "recordings/nac-drive/rule-20-39-v0")
#: compare's teacher: the expert that taught the shipped nac.pt (a file that keeps shipping), with the
#: start rule ON, unlike TeacherSection's default: every cell's DAgger relabels the states of a student
#: that may stand still, and without the rule the expert labels a standstill "stay" (README, "The
#: expert's stalls"); ``--teacher.no-start-rule`` turns it off.
COMPARE_TEACHER = TeacherSection(expert=_P["expert"], start_rule=_P["start_rule"])

DESCRIPTION = """Closed-loop comparison of temporal cores (NAC, LSTM, GRU, CfC, ...).

Train every core alike and drive it on the same unseen tracks: the same CNN, the same expert
recordings, the same behaviour cloning and DAgger protocol (each core on its own rollouts), the
same window T. Each (core, seed) cell writes its own folder OUT/<core>__s<seed>/ (policy,
cell.json), so a comparison resumes after an interruption, can be spread over sessions or
machines, and runs cells in parallel (--workers). Non-NAC cores get the width whose parameter
count is closest to NAC-Steady's. `agent compare --out OUT --report-only` builds the table, as
report.md and report.json, and the figure compare.png from the cells that exist and names the
missing ones; a run writes them at its end too."""

TEACHER_HELP = ("the PPO expert that labels every cell's DAgger rollouts, and its rules (the recordings keep their "
                "labels). The start rule is on by default here (gas at a standstill, no brake below the brake floor, "
                "10 units/s), as DAgger needs it; --teacher.no-start-rule turns it off")


def _need(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"{option} must be comma-separated integers, got {text!r}") from None
    _need(bool(out), f"{option} is empty")
    return out


@dataclass(frozen=True)
class CompareDagger:
    """DAgger (Ross et al. 2011) after behaviour cloning, the same for every cell (each on its own rollouts)."""

    rounds: int = _P["dagger_rounds"]
    """DAgger rounds (0: BC alone)"""
    episodes: int = _P["dagger_episodes"]
    """student episodes per round"""
    epochs: int = _P["dagger_epochs"]
    """epochs on the aggregate per round"""
    beta: float = _P["dagger_beta"]
    """the teacher's share of the executed actions in round 1's rollouts"""
    beta_decay: float = _P["dagger_beta_decay"]
    """beta of round r = beta * beta_decay^(r-1)"""
    disturb: float = _P["dagger_disturb"]
    """disturbances per 1000 steps in the rollouts"""
    track_seed: int = _P["dagger_seed"]
    """first DAgger track (training tracks: below 1,000,000)"""
    max_steps: int | None = None
    """cap on DAgger episode length"""

    def __post_init__(self):
        _need(self.rounds >= 0 and self.episodes >= 1 and self.epochs >= 0,
              f"--dagger.rounds >= 0, --dagger.episodes >= 1 and --dagger.epochs >= 0, got {self.rounds}, "
              f"{self.episodes} and {self.epochs}")
        _need(0.0 <= self.beta <= 1.0 and 0.0 <= self.beta_decay <= 1.0,
              f"--dagger.beta and --dagger.beta-decay must be in [0, 1], got {self.beta} and {self.beta_decay}")
        _need(self.disturb >= 0, f"--dagger.disturb must be >= 0 disturbances per 1000 steps, got {self.disturb}")
        _need(0 <= self.track_seed < EVAL_SEED_BASE,
              f"--dagger.track-seed must be a training track, 0..{EVAL_SEED_BASE - 1}, got {self.track_seed}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--dagger.max-steps must be >= 1, got {self.max_steps}")


@dataclass(frozen=True)
class CompareConfig:
    """Closed-loop comparison of temporal cores: the options of ``agent compare``.

    Raises:
        ConfigError: a value out of range (when built), or from :meth:`check`, a bad variant or
            seed list, a missing recording, DAgger without a teacher, or an existing ``--json``.
    """

    env: Literal["carracing"] = "carracing"
    """simulator (closed loop: CarRacing)"""
    cores: str = ",".join(DEFAULT_CORES)
    """comma-separated variants core@key=value@...: keys T (window), width (d), sparsity, topk, wiring (ncp, or fc: NAC-FC)"""
    windows: str | None = None
    """comma-separated window sizes T: each core without its own @T= runs once per T (a sweep)"""
    seeds: str = "0,1"
    """comma-separated training seeds (weights, split, batches, DAgger's draws)"""
    out: str = "runs/compare-carracing"
    """the comparison folder: one folder per cell, plan.json, and the report (a rerun resumes it)"""
    runs: tuple[str, ...] = ()
    """compare whole recipe runs instead of training cells: CORE:SEED=EVAL.json[,EVAL.json] per run (agent evaluate --json files, e.g. one per unseen set); the first core named is the reference; writes OUT/runs.md and runs.json"""
    report_only: bool = False
    """train nothing: only (re)build the report (report.md, report.json, compare.png) of --out from its finished cells"""
    json: str | None = None
    """also write the report's summary (every row, the protocol, the missing cells) as JSON here"""
    overwrite: bool = False
    """replace an existing --json file, or with --runs an existing OUT/runs.md and runs.json (the comparison folder of
    trained cells is resumed, never replaced)"""
    data: tuple[str, ...] = DEFAULT_DATA
    """the expert recordings every cell learns from"""
    window: int = _P["window"]
    """frames per window T (a variant's @T= overrides)"""
    epochs: int = _P["epochs"]
    """behaviour-cloning epochs"""
    episodes: int = _P["episodes"]
    """closed-loop tracks per cell"""
    track_seed: int = _P["eval_seed"]
    """the first closed-loop track (CarRacing seed), the same for every cell: episode i drives track_seed+i"""
    max_steps: int | None = None
    """cap on closed-loop episode length (None: the env's 1000 steps)"""
    eval_bc: bool = _P["eval_bc"]
    """also drive the BC policy (the offline-only view: accuracy against return)"""
    latency_steps: int = _P["latency_steps"]
    """streaming steps timed for the latency"""
    workers: int = 1
    """cells run in parallel processes"""
    threads: int | None = None
    """torch CPU threads per cell (None: 1 with --workers > 1, else torch's default; 0: torch's default)"""
    device: str = "auto"
    """torch device that trains the cells: auto (cuda when there is one), cpu, cuda, cuda:N"""
    teacher: Annotated[TeacherSection, tyro.conf.arg(help=TEACHER_HELP)] = COMPARE_TEACHER
    dagger: CompareDagger = CompareDagger()

    def __post_init__(self):
        check_device(self.device, self.threads or 0)
        _need(self.workers >= 1, f"--workers must be >= 1, got {self.workers}")
        _need(bool(self.data), "--data: give the expert recordings every cell learns from")
        _need(self.window >= 1 and self.epochs >= 1 and self.episodes >= 1,
              f"--window, --epochs and --episodes must be >= 1, got {self.window}, {self.epochs} and {self.episodes}")
        _need(self.track_seed >= EVAL_SEED_BASE, f"--track-seed {self.track_seed} is a training track; closed-loop "
                                                 f"tracks start at {EVAL_SEED_BASE}")
        _need(self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}")
        _need(self.latency_steps >= 10, f"--latency-steps must be >= 10, got {self.latency_steps}")

    def check(self) -> "CompareConfig":
        """The variants and seeds, the recordings, the teacher and an existing ``--json``; returns self.

        With ``report_only`` only ``--json`` is checked (nothing is trained).
        """
        _need(self.json is None or self.overwrite or not Path(self.json).exists(),
              f"--json {self.json} already exists; choose another path or pass --overwrite")
        if self.runs:
            from agent.compare.runs import parse_run_spec

            for text in self.runs:
                try:
                    parse_run_spec(text)
                except ValueError as exc:
                    raise ConfigError(str(exc)) from None
            existing = [str(Path(self.out) / n) for n in ("runs.md", "runs.json") if (Path(self.out) / n).exists()]
            _need(self.overwrite or not existing, f"{', '.join(existing)} already exist(s); choose another --out or pass "
                                                  "--overwrite")
        if self.report_only or self.runs:
            return self
        self.variants  # noqa: B018 - parses --cores and --windows
        self.seed_list  # noqa: B018
        for d in self.data:
            _need(Path(d).exists(), f"recording {d} not found; record the demonstrations first, e.g. agent collect "
                                    f"--env carracing --teacher.expert carracing-expert-discrete-margin.zip --episodes 20 "
                                    f"--track-seed 0 --out {d}")
        t = self.teacher
        if self.dagger.rounds:
            _need(bool(t.expert), "--dagger.rounds needs --teacher.expert (the PPO expert that labels the rollouts)")
            _need(t.brake_floor is None or t.start_rule, "--teacher.brake-floor is the start rule's floor: drop "
                                                         "--teacher.no-start-rule or the floor")
        return self

    @property
    def variants(self) -> list[Variant]:
        """The variants of ``--cores``, expanded over ``--windows``.

        Raises:
            ConfigError: an unknown core or option (:meth:`agent.compare.cells.Variant.parse`).
        """
        windows = _int_list(self.windows, "--windows") if self.windows else None
        try:
            return parse_variants(self.cores, windows)
        except ValueError as exc:
            raise ConfigError(f"--cores: {exc}") from exc

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The training seeds of ``--seeds``."""
        return _int_list(self.seeds, "--seeds")

    @property
    def cell_threads(self) -> int:
        """Torch threads per cell: ``threads``, or 1 with several workers and else torch's default (0)."""
        return self.threads if self.threads is not None else (1 if self.workers > 1 else 0)

    def protocol(self) -> Protocol:
        """The :class:`agent.compare.cells.Protocol` every cell of this comparison shares."""
        d, t = self.dagger, self.teacher
        return Protocol(data=list(self.data), expert=t.expert, window=self.window, epochs=self.epochs,
                        dagger_rounds=d.rounds, dagger_episodes=d.episodes, dagger_epochs=d.epochs,
                        dagger_beta=d.beta, dagger_beta_decay=d.beta_decay, dagger_disturb=d.disturb,
                        dagger_seed=d.track_seed, dagger_max_steps=d.max_steps, start_rule=t.start_rule,
                        creep_speed=t.creep_speed, brake_floor=t.brake_floor, grass_rule=t.grass_rule,
                        episodes=self.episodes, eval_seed=self.track_seed, max_steps=self.max_steps,
                        eval_bc=self.eval_bc, latency_steps=self.latency_steps)


__all__ = ["COMPARE_TEACHER", "CompareConfig", "CompareDagger", "DEFAULT_DATA", "DESCRIPTION"]
