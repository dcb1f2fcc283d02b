"""The teacher's episodes a recipe starts from: recorded in chunks before training, kept on a rerun.

``agent train`` with ``collect.episodes N`` (:class:`agent.train.config.CollectSection`) first has the
teacher (``[teacher]``: the PPO expert with its rules, the same that relabels DAgger's states) drive
tracks ``track_seed .. track_seed + N - 1`` and records them as Minari datasets of ``chunk``
episodes each, ``OUT-<first>-<last>-v0`` (:func:`chunk_paths`), with the recorder of ``agent
collect`` (:func:`agent.actors.record.collect`, or :func:`agent.actors.vector.collect` with
``envs`` > 1). Behaviour cloning then trains on them (with ``data``, if any).

Resuming. Every finished episode is on disk at once (:class:`agent.data.recordings.RecordingWriter`).
A chunk that holds all its episodes, recorded by the same teacher with the same rules, is kept;
one cut short by a kill is recorded again from its first track (at most ``chunk`` episodes are
driven twice); a chunk recorded by another teacher or with other rules is an error, never
overwritten. What made a chunk is written beside its ``data/`` folder as ``collect.json``
(:data:`STAMP_NAME`): the teacher's file and its sha256, the rules, the tracks and the step cap.
While a chunk is recorded the same record lies beside its folder as ``<folder>.collecting.json``
(:data:`PENDING_SUFFIX`), which marks the folder as this run's own to record again.

The idea is the usual first step of behaviour cloning and of DAgger (Ross, Gordon and Bagnell 2011,
round 0: the expert's own demonstrations).
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from agent.atomic import write_json_atomic
from agent.log import get_logger

log = get_logger("agent.train.collect")

#: the file beside a chunk's ``data/`` that says what recorded it
STAMP_NAME = "collect.json"
#: beside a chunk's folder while it is recorded: ``<folder><PENDING_SUFFIX>``
PENDING_SUFFIX = ".collecting.json"
#: the namespace of the default recordings' folder (``recordings/<namespace>/...``)
DEFAULT_ROOT = Path("recordings/nac-drive")


def rules_tag(teacher) -> str:
    """A short name for a teacher's rules, for default folder names: ``start-creep10-floor20-grass``
    (``norules`` when none is on). ``teacher`` is a :class:`agent.train.config.TeacherSection`."""
    parts = []
    if teacher.start_rule:
        parts.append("start")
    if teacher.creep_speed:
        parts.append(f"creep{teacher.creep_speed:g}")
    if teacher.brake_floor is not None:
        parts.append(f"floor{teacher.brake_floor:g}")
    if teacher.grass_rule:
        parts.append("grass")
    return "-".join(parts).replace(".", "p") or "norules"


def default_prefix(teacher) -> Path:
    """``recordings/nac-drive/<teacher's file stem>-<rules_tag>``: runs with the same teacher and rules
    share their recordings (the two seeds and the three cores of a recipe record once)."""
    stem = Path(teacher.expert).stem if teacher.expert else "teacher"
    return DEFAULT_ROOT / f"{stem}-{rules_tag(teacher)}"


def chunk_paths(collect, teacher) -> list[tuple[Path, int, int]]:
    """The chunks of a :class:`agent.train.config.CollectSection`: ``(folder, first track, episodes)``.

    Folder ``PREFIX-<first>-<last>-v0`` with ``PREFIX`` = ``collect.out`` or :func:`default_prefix`.
    """
    prefix = Path(collect.out) if collect.out else default_prefix(teacher)
    out = []
    for first in range(collect.track_seed, collect.track_seed + collect.episodes, collect.chunk):
        n = min(collect.chunk, collect.track_seed + collect.episodes - first)
        out.append((prefix.parent / f"{prefix.name}-{first}-{first + n - 1}-v0", first, n))
    return out


def _stamp(teacher, expert_path: Path, expert_sha: str, first: int, n: int, max_steps: int | None) -> dict:
    return {"teacher": expert_path.name, "teacher_sha256": expert_sha,
            "rules": {"start_rule": teacher.start_rule, "creep_speed": teacher.creep_speed,
                      "brake_floor": teacher.brake_floor, "grass_rule": teacher.grass_rule},
            "tracks": [first, first + n - 1], "max_steps": max_steps}


def _pending(folder: Path) -> Path:
    return folder.with_name(folder.name + PENDING_SUFFIX)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); move the recording beside it away to record it again") from exc


def _write_json(path: Path, value: dict) -> None:
    write_json_atomic(path, value, what="collection manifest", indent=1)


def _episodes_in(folder: Path) -> int:
    """Episodes a recording holds by its metadata (0: none readable)."""
    try:
        meta = json.loads((folder / "data" / "metadata.json").read_text())
        return int(meta.get("total_episodes", 0))
    except (OSError, ValueError, TypeError):
        return 0


def teacher_recordings(collect, teacher, device: str = "cpu") -> list[str]:
    """Record the teacher's episodes of ``collect`` that are not on disk yet; every chunk's folder.

    Args:
        collect: a :class:`agent.train.config.CollectSection` with ``episodes`` > 0.
        teacher: a :class:`agent.train.config.TeacherSection` naming the expert and its rules.
        device: torch device of the expert.

    Returns:
        the chunk folders in track order (``data`` entries for :func:`agent.data.recordings.load_demonstrations`).

    Raises:
        ValueError: the expert is not a PPO expert (:class:`agent.experts.policy.ExpertPolicy`), or a
            rule does not suit it (:class:`agent.experts.rules.RuleError`); a chunk folder on disk
            that was recorded by another teacher, with other rules or without a ``collect.json``
            (the message names it and says what to do).
        OSError: a write failed (a full disk); the finished episodes stay on disk.
        KeyboardInterrupt: Ctrl-C or SIGTERM while recording (the finished chunks are kept).
    """
    from agent.actors.loading import load_policy, make_actor, make_carracing_for, resolve_policy_path
    from agent.actors.record import collect as collect_one
    from agent.actors.vector import BatchExpertActor, collect as collect_vector, envs_for
    from agent.eval.card import file_sha256
    from agent.experts.policy import ExpertPolicy

    chunks = chunk_paths(collect, teacher)
    expert_path = resolve_policy_path(teacher.expert)
    expert_sha = file_sha256(expert_path)
    todo = []
    for folder, first, n in chunks:
        want = _stamp(teacher, expert_path, expert_sha, first, n, collect.max_steps)
        stamp, pending = folder / STAMP_NAME, _pending(folder)
        if not folder.exists():
            todo.append((folder, first, n, want))
            continue
        if not stamp.is_file() and not pending.is_file():
            raise ValueError(f"{folder} exists but was not recorded by `agent train` (no {STAMP_NAME}): move it away, "
                             "or choose another collect.out")
        have = _read_json(stamp if stamp.is_file() else pending)
        if have != want:
            diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
            raise ValueError(f"{folder} was recorded with other settings ({', '.join(diff)} differ: {have} on disk, "
                             f"{want} asked); choose another collect.out, or move it away to record it again")
        got = _episodes_in(folder) if stamp.is_file() else 0
        if got < n:
            log.warning("collect: %s holds %d of its %d episodes (a run cut short): recording it again", folder, got, n)
            shutil.rmtree(folder)
            todo.append((folder, first, n, want))
    total = sum(n for _, _, n in chunks)
    left = sum(n for _, _, n, _ in todo)
    log.info("collect: %d teacher episodes in %d recordings of %d (%s-...); %d on disk, %d to record",
             total, len(chunks), collect.chunk, chunks[0][0].name.rsplit("-", 3)[0] if chunks else "",
             total - left, left)
    if not todo:
        return [str(f) for f, _, _ in chunks]
    expert = load_policy(teacher.expert, device=device)
    if not isinstance(expert, ExpertPolicy):
        raise ValueError(f"teacher.expert takes the PPO expert's .zip (`agent expert train`); {teacher.expert} is a "
                         "student policy")
    expert = teacher.rules.apply(expert, strict=True)  # RuleError (a ValueError) names the rule
    t0 = time.time()
    for k, (folder, first, n, want) in enumerate(todo, start=1):
        folder.parent.mkdir(parents=True, exist_ok=True)
        _write_json(_pending(folder), want)
        if collect.envs > 1:
            envs = envs_for(expert, collect.envs, render_pixels=True)
            writer = collect_vector(envs, BatchExpertActor(expert), n, first, folder, "ppo-expert",
                                    max_steps=collect.max_steps)
        else:
            env = make_carracing_for(expert)
            try:
                writer = collect_one(env, make_actor(expert), n, first, folder, "ppo-expert",
                                     max_steps=collect.max_steps)
            finally:
                env.close()
        if writer.interrupted or writer.episodes < n:
            raise KeyboardInterrupt(f"collect: stopped in {folder} after {writer.episodes} of {n} episodes")
        _write_json(folder / STAMP_NAME, want)
        _pending(folder).unlink()
        log.info("collect: %s (%d of %d recordings to make, %d steps) in %.0f s so far", folder, k, len(todo),
                 writer.steps, time.time() - t0)
    return [str(f) for f, _, _ in chunks]


__all__ = ["PENDING_SUFFIX", "STAMP_NAME", "chunk_paths", "default_prefix", "rules_tag", "teacher_recordings"]
