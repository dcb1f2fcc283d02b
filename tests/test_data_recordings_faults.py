"""Recordings survive any interruption, and damaged ones are refused (issue 38, items 1 and 4).

Fault injection: a forked writer records synthetic 5-step episodes the way `agent collect` does
(:class:`RecordingWriter` inside :class:`StopRequest`) and reports each finished episode through a
pipe; it is killed at fixed points (inside Minari's metadata write, between the HDF5 append and the
metadata move, after it, while the dataset is created) by wrapping the project's own methods in the
child, and at timed points by SIGKILL, SIGINT and SIGTERM from the parent. After every kill the
dataset must load with :func:`load_demonstrations` and :func:`minari.load_dataset` and hold every
episode reported finished (and at most the one being written). The real `agent collect` is then
interrupted by each signal, and run out of disk space.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

import agent.data.recordings as recordings
from agent.actors.record import StopRequest
from agent.actors.rollout import Episode
from agent.cli import main
from agent.data.recordings import (METADATA_BACKUP, RecordingError, RecordingWriter, deferred_interrupts,
                                   load_demonstrations, recover_metadata)
from envs.carracing import make_carracing
from tmpfs import unshare_works

REPO = Path(__file__).resolve().parent.parent
EXPERT = "carracing-expert-discrete-margin.zip"
#: episodes each forked writer records when left alone
EPISODES = 12
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="the writer is forked to be killed")


def episode(seed: int, n: int = 5) -> Episode:
    """A synthetic episode of ``n`` steps whose frames are a function of ``seed`` (so they can be checked)."""
    rng = np.random.default_rng(seed)
    return Episode(seed, rng.integers(0, 256, (n + 1, 96, 96, 3), dtype=np.uint8), rng.integers(0, 5, n), None,
                   rng.normal(size=n).astype(np.float32), np.zeros(n, bool), np.r_[np.zeros(n - 1, bool), True],
                   rng.random(n + 1).astype(np.float32))


@pytest.fixture(scope="module")
def env():
    e = make_carracing()
    yield e
    e.close()


def _child(out: Path, env, links: bool, hook, report: int) -> None:
    """The forked writer: ``agent collect``'s loop on synthetic episodes; never returns."""
    code = 3
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        RecordingWriter.use_links = links
        if hook is not None:
            hook()
        writer = RecordingWriter(out, env, "fault-test")
        with StopRequest() as stop:
            try:
                for e in range(EPISODES):
                    stop.check()
                    writer.add(episode(e))
                    os.write(report, f"finished {writer.episodes}\n".encode())
                stop.check()
                os.write(report, b"done\n")
                code = 0
            except KeyboardInterrupt:
                os.write(report, f"interrupted {writer.episodes}\n".encode())
                code = 130
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
        os.write(report, f"error {type(exc).__name__}: {exc}\n".encode())
    finally:
        os._exit(code)


def run_writer(out: Path, env, links: bool = True, hook=None, kill: tuple[int, float] | None = None):
    """Fork a writer into ``out``; with ``kill=(signal, delay)``, send it that signal ``delay`` s after
    its first finished episode. Returns (the lines it reported, its wait status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(out, env, links, hook, w)
    os.close(w)
    data, killed = b"", kill is None
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
        if not killed and b"\n" in data:
            time.sleep(kill[1])
            os.kill(pid, kill[0])
            killed = True
    os.close(r)
    _, status = os.waitpid(pid, 0)
    return data.decode().splitlines(), status


def at_episode(method: str, n: int, action):
    """A hook for :func:`run_writer`: wrap ``RecordingWriter.<method>`` so that ``action(args)`` runs
    when it is called for episode ``n`` (its ``episodes`` argument, or the writer's count + 1)."""
    def install():
        original = getattr(RecordingWriter, method)

        def wrapped(self, *args, **kwargs):
            count = args[1] if method == "_check_metadata" else self.episodes + 1
            if count == n:
                action(self, *args)
            result = original(self, *args, **kwargs)
            if count == n and method == "_commit" and action is _kill_after:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        setattr(RecordingWriter, method, wrapped)
    return install


def _kill_inside_metadata_write(self, path, *args):
    """The state a kill inside Minari's truncate-then-write leaves: the file it writes is empty."""
    open(path, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)


def _kill(self, *args):
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_after(self, *args):
    pass  # at_episode kills after the wrapped method returns


def _send(signum):
    def action(self, *args):
        os.kill(os.getpid(), signum)
    return action


def check(out: Path, lines: list[str], links: bool, monkeypatch) -> int:
    """The dataset at ``out`` loads with every episode the writer reported finished; returns how many it holds."""
    assert not [line for line in lines if line.startswith("error")], lines
    reported = max([int(line.split()[1]) for line in lines if line.startswith("finished")], default=0)
    if not (out / "data").exists():
        assert reported == 0, f"{reported} episode(s) reported finished, but {out} is missing"
        assert not out.exists(), "a half-made dataset is visible"
        with pytest.raises(RecordingError, match="does not exist"):
            load_demonstrations(out)
        return 0
    if links:  # the live metadata is never written in place: nothing to repair, Minari reads it as it is
        assert recover_metadata(out) is False
    demos = load_demonstrations(out)  # in place: restores an emptied metadata.json from its last good copy
    n = len(demos.actions)
    assert reported <= n <= reported + 1, f"{n} episodes on disk, {reported} reported finished"
    for line in lines:
        if line.startswith("interrupted"):
            assert n == int(line.split()[1]), "the writer's count after Ctrl-C is not what is on disk"
    assert demos.seeds == list(range(n))
    for e in range(n):
        np.testing.assert_array_equal(demos.frames[e], episode(e).observations[:5])
        np.testing.assert_array_equal(demos.actions[e], episode(e).actions)
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(out.parent.parent))
    ds = minari.load_dataset(f"{out.parent.name}/{out.name}")
    assert ds.total_episodes == n and ds.total_steps == 5 * n
    return n


@needs_fork
@pytest.mark.parametrize("links", [True, False], ids=["links", "in-place"])
def test_sigkill_inside_minaris_metadata_write(links, env, tmp_path, monkeypatch):
    """Killed while Minari rewrites metadata.json (the file truncated): the three finished episodes load."""
    out = tmp_path / "ns" / "x-v0"
    lines, status = run_writer(out, env, links, at_episode("_check_metadata", 4, _kill_inside_metadata_write))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    live = out / "data" / "metadata.json"
    if links:  # Minari wrote a copy; the live file still counts the three episodes
        assert json.loads(live.read_text())["total_episodes"] == 3
        assert (out / ".append").exists()  # the kill left the append folder behind; harmless
    else:  # Minari wrote the live file: empty, as the issue found it; its last good copy is kept
        assert live.stat().st_size == 0 and (out / METADATA_BACKUP).is_file()
    assert check(out, lines, links, monkeypatch) == 3


@needs_fork
@pytest.mark.parametrize("point, action, expected", [
    ("_commit", _kill, 3),  # the HDF5 file holds a 4th episode that metadata.json does not count
    ("_commit", _kill_after, 4),  # the 4th episode counted, not yet reported
    ("_check_metadata", _kill, 3),  # Minari's metadata written and complete, not moved into place
], ids=["before-metadata-move", "after-metadata-move", "after-minari-write"])
def test_sigkill_around_the_commit(point, action, expected, env, tmp_path, monkeypatch):
    out = tmp_path / "ns" / "x-v0"
    lines, status = run_writer(out, env, True, at_episode(point, 4, action))
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert check(out, lines, True, monkeypatch) == expected


@needs_fork
def test_sigkill_while_the_dataset_is_made(env, tmp_path, monkeypatch):
    """Killed inside the first episode's write: no dataset, and nothing half-made is visible."""
    out = tmp_path / "ns" / "x-v0"
    lines, status = run_writer(out, env, True, at_episode("_check_metadata", 1, _kill_inside_metadata_write))
    assert os.WIFSIGNALED(status)
    assert check(out, lines, True, monkeypatch) == 0
    assert all(p.name.startswith(".") for p in tmp_path.iterdir())  # only a hidden staging folder


@needs_fork
@pytest.mark.parametrize("links", [True, False], ids=["links", "in-place"])
@pytest.mark.parametrize("signum, point, n", [
    (signal.SIGINT, "_check_metadata", 4),  # inside the append, after Minari's write
    (signal.SIGTERM, "_check_metadata", 4),
    (signal.SIGINT, "_create", 1),  # before the dataset is made
], ids=["sigint-in-append", "sigterm-in-append", "sigint-in-create"])
def test_a_signal_inside_a_write_is_delivered_after_it(signum, point, n, links, env, tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM during a write: the episode is finished, then the loop stops (never swallowed)."""
    out = tmp_path / "ns" / "x-v0"
    lines, status = run_writer(out, env, links, at_episode(point, n, _send(signum)))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130, lines
    assert lines[-1] == f"interrupted {n}" and "done" not in lines
    assert check(out, lines, links, monkeypatch) == n


#: (signal, seconds after the first finished episode, links): the timed kills; an append takes ~40 ms
TIMED = [(signal.SIGKILL, 0.0, True), (signal.SIGINT, 0.004, True), (signal.SIGKILL, 0.011, True),
         (signal.SIGTERM, 0.017, True), (signal.SIGKILL, 0.026, True), (signal.SIGINT, 0.038, True),
         (signal.SIGKILL, 0.052, True), (signal.SIGKILL, 0.071, True), (signal.SIGINT, 0.093, True),
         (signal.SIGKILL, 0.12, True), (signal.SIGKILL, 0.16, True), (signal.SIGINT, 0.21, True),
         (signal.SIGKILL, 0.008, False), (signal.SIGINT, 0.03, False), (signal.SIGKILL, 0.065, False),
         (signal.SIGKILL, 0.13, False)]


@needs_fork
@pytest.mark.parametrize("signum, delay, links", TIMED,
                         ids=[f"{signal.Signals(s).name}-{d * 1000:.0f}ms-{'links' if k else 'in-place'}"
                              for s, d, k in TIMED])
def test_timed_kills(signum, delay, links, env, tmp_path, monkeypatch):
    out = tmp_path / "ns" / "x-v0"
    lines, status = run_writer(out, env, links, kill=(signum, delay))
    n = check(out, lines, links, monkeypatch)
    if signum != signal.SIGKILL and "done" not in lines:  # Ctrl-C and SIGTERM stop the loop at once
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130 and lines[-1] == f"interrupted {n}"


def test_deferred_interrupts_deliver_after_the_block():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with deferred_interrupts():
            signal.raise_signal(signal.SIGINT)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the old handler is back


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed Ctrl-C itself
def test_a_ctrl_c_swallowed_by_a_finaliser_still_stops_the_loop():
    """Python prints a KeyboardInterrupt raised in __del__ as "Exception ignored" and goes on; the
    collect loop's StopRequest raises it again at its next check."""
    class Finaliser:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)

    with StopRequest() as stop:
        Finaliser()  # the KeyboardInterrupt is raised inside __del__ and lost
        with pytest.raises(KeyboardInterrupt):
            stop.check()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _few_bytes_after(episodes: int):
    """A stand-in for the free-space reading: room for ``episodes`` episodes, then 100 KB."""
    calls = []

    def free(folder):
        calls.append(folder)
        return 1 << 40 if len(calls) <= episodes else 100_000
    return free


def test_a_full_disk_stops_the_writer_with_one_clear_error(env, tmp_path, monkeypatch):
    monkeypatch.setattr(recordings, "_free_bytes", _few_bytes_after(2))
    out = tmp_path / "ns" / "x-v0"
    writer = RecordingWriter(out, env, "test")
    writer.add(episode(0))
    writer.add(episode(1))
    with pytest.raises(OSError) as err:
        writer.add(episode(2))
    message = str(err.value)
    assert err.value.errno == 28 and err.value.filename == str(out / "data" / "main_data.hdf5")
    assert "disk full while writing episode 3" in message and "kept the 2 finished episode(s)" in message
    assert "\n" not in message
    with pytest.raises(RecordingError, match="nothing more is written"):
        writer.add(episode(3))
    assert writer.episodes == 2 and load_demonstrations(out).seeds == [0, 1]


def test_collect_on_a_full_disk_prints_one_line_and_fails(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(recordings, "_free_bytes", _few_bytes_after(2))
    out = tmp_path / "ns" / "c-v0"
    rc = main(["collect", "--teacher.expert", EXPERT, "--episodes", "4", "--max-steps", "3", "--out", str(out)])
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error" in line]
    assert rc == 1 and "recorded" not in captured.out and "Traceback" not in captured.err  # no claim of success
    assert len(errors) == 1 and errors[0].startswith("agent collect: error: disk full while writing episode 3 (")
    assert f"kept the 2 finished episode(s) in {out}" in errors[0]
    assert errors[0].endswith(f": {out / 'data' / 'main_data.hdf5'}")
    assert [len(a) for a in load_demonstrations(out).actions] == [3, 3]


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare -Urm` to mount a small tmpfs")
def test_collect_fills_a_real_disk_without_a_crash(tmp_path):
    """A 1.5 MB tmpfs fills after a few 10-step episodes: one error line, exit 1, no segfault, episodes kept."""
    disk, kept = tmp_path / "disk", tmp_path / "kept"
    disk.mkdir()
    script = (f"mount -t tmpfs -o size=1500k tmpfs {disk} && {sys.executable} -m agent.cli collect --teacher.expert "
              f"{EXPERT} --episodes 8 --max-steps 10 --out {disk}/ns/full-v0; rc=$?; cp -r {disk}/ns {kept} "
              "2>/dev/null; exit $rc")
    done = subprocess.run(["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "Segmentation" not in done.stderr
    assert len(errors) == 1 and errors[0].startswith("agent collect: error: disk full while writing episode ")
    n = int(errors[0].split("kept the ")[1].split(" finished")[0])
    assert 1 <= n < 8 and errors[0].endswith(f"{disk}/ns/full-v0/data/main_data.hdf5")
    assert [len(a) for a in load_demonstrations(kept / "full-v0").actions] == [10] * n


def _collect(out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent.cli", "collect", "--teacher.expert", EXPERT, "--episodes",
                             "200", "--max-steps", "5", "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name)
def test_agent_collect_interrupted(signum, tmp_path, monkeypatch):
    """The real command, stopped a moment after its first episode: every counted episode loads."""
    out = tmp_path / "ns" / "r-v0"
    proc = _collect(out)
    try:
        for _ in range(600):
            if (out / "data" / "metadata.json").exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        time.sleep(0.2)
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    demos = load_demonstrations(out)
    n = len(demos.actions)
    assert 1 <= n < 200 and demos.seeds == list(range(n))
    if signum == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, stderr[-2000:]
        assert f"interrupted: recorded {n} episode(s), {5 * n} steps" in stdout
        assert "Traceback" not in stderr and "Exception ignored" not in stderr
    import minari

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    assert minari.load_dataset("ns/r-v0").total_episodes == n


# ------------------------------------------------------------------------- item 4: lengths that disagree
@pytest.mark.parametrize("field, length, counts", [
    ("rewards", 4, "6 frames, 5 actions and 4 rewards"),
    ("actions", 4, "6 frames, 4 actions and 5 rewards"),
    ("observations", 5, "5 frames, 5 actions and 5 rewards"),
    ("observations", 9, "9 frames, 5 actions and 5 rewards"),
])
def test_frames_actions_and_rewards_that_disagree_are_refused(field, length, counts, env, tmp_path):
    out = tmp_path / "ns" / "bad-v0"
    writer = RecordingWriter(out, env, "test")
    writer.add(episode(0))
    writer.add(episode(1))
    with h5py.File(out / "data" / "main_data.hdf5", "a") as f:  # craft: episode 1's field cut or grown
        group = f["episode_1"]
        values = np.resize(group[field][()], (length, *group[field].shape[1:]))
        del group[field]
        group.create_dataset(field, data=values)
    with pytest.raises(RecordingError) as err:
        load_demonstrations(out)
    assert str(out) in str(err.value) and "episode 1" in str(err.value) and counts in str(err.value)


def test_the_writer_refuses_an_episode_whose_lengths_disagree(env, tmp_path):
    ep = episode(0)  # an Episode checks its own lengths; the writer takes any object with these fields
    bad = SimpleNamespace(seed=ep.seed, observations=ep.observations, actions=ep.actions, rewards=ep.rewards[:4],
                          terminations=ep.terminations, truncations=ep.truncations, speeds=ep.speeds, steps=5)
    with pytest.raises(RecordingError, match="5 actions needs 6 frames"):
        RecordingWriter(tmp_path / "ns" / "x-v0", env, "test").add(bad)
    assert not (tmp_path / "ns").exists()


def test_an_emptied_metadata_without_a_copy_is_a_clear_error(env, tmp_path):
    out = tmp_path / "ns" / "x-v0"
    RecordingWriter(out, env, "test").add(episode(0))
    (out / "data" / "metadata.json").write_text("")
    with pytest.raises(RecordingError, match="metadata.json is empty .*no last good copy.*record this dataset again"):
        load_demonstrations(out)
