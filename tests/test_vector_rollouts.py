"""Vectorised rollouts (agent.actors.vector, --envs N) give the episodes of the one-env path.

Each comparison runs the same tracks through agent.actors.rollout.rollout (one env, episodes one after
another) and through AsyncVectorEnv slots (episodes starting as slots free up), and compares
every recorded array: actions, labels, rewards, terminations, truncations, speeds, off-road flags
and frames, and the metrics derived from them. Episodes are short (max_steps) to keep this cheap.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from agent.cli import main
from agent.actors.loading import load_policy, make_actor, make_carracing_for
from agent.actors.rollout import Decision, Episode, rollout
from agent.actors.vector import (BatchExpertActor, BatchPolicyActor, CarRacingEnvs, batch_actor_for, cpu_cores, envs_for,
                          run_episodes, split_infos, threads_beside_envs, vector_rollouts)

SEEDS = [11, 12, 13]  # 3 episodes on 2 envs: the third starts in a freed slot while the other idles


def assert_same_episode(a: Episode, b: Episode, frames: bool = True) -> None:
    assert a.seed == b.seed
    np.testing.assert_array_equal(a.actions, b.actions)
    assert a.actions.dtype == b.actions.dtype
    for name in ("rewards", "terminations", "truncations"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.speeds, b.speeds)
    if a.off_road is None:
        assert b.off_road is None
    else:
        np.testing.assert_array_equal(a.off_road, b.off_road)
    if a.labels is None:
        assert b.labels is None
    else:
        np.testing.assert_array_equal(a.labels, b.labels)
    if frames and a.observations is not None:
        np.testing.assert_array_equal(a.observations, b.observations)
    assert (a.episode_return, a.steps, a.longest_standstill, a.off_road_steps, a.tiles_missed, a.edge_steps) == \
        (b.episode_return, b.steps, b.longest_standstill, b.off_road_steps, b.tiles_missed, b.edge_steps)
    np.testing.assert_array_equal(a.wheels_off, b.wheels_off)
    np.testing.assert_array_equal(a.wrong_way, b.wrong_way)


@pytest.fixture(scope="module")
def expert():
    return load_policy("carracing-expert-discrete-margin.zip").use_start_rule(True)


@pytest.fixture(scope="module")
def student():
    return load_policy("nac.pt")


def test_expert_matches_the_one_env_path(expert):
    """The expert (start rule on: it fires at the standing start) from info's privileged state."""
    env = make_carracing_for(expert, render_pixels=False)
    seq = [rollout(env, make_actor(expert), s, max_steps=80, keep_frames=False) for s in SEEDS]
    env.close()
    vec = run_episodes(envs_for(expert, 2), batch_actor_for(expert), SEEDS, max_steps=80, keep_frames=False)
    assert [ep.seed for ep in vec] == SEEDS
    assert len({ep.episode_return for ep in vec}) == 3  # different tracks
    for a, b in zip(seq, vec):
        assert_same_episode(a, b)
    assert seq[0].truncations[-1] and seq[0].steps == 80


def test_student_matches_the_one_env_path(student):
    """The NAC student on rendered frames, its streaming cache reset per slot (reset_rows)."""
    env = make_carracing_for(student)
    seq = [rollout(env, make_actor(student), s, max_steps=40) for s in SEEDS]
    env.close()
    vec = run_episodes(envs_for(student, 2), batch_actor_for(student), SEEDS, max_steps=40)
    for a, b in zip(seq, vec):
        assert_same_episode(a, b)
    assert vec[0].observations.shape == (41, 96, 96, 3)


def test_threads_beside_envs_leaves_a_cpu_to_each_env_and_restores_the_count():
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, before))
        start = torch.get_num_threads()
        with threads_beside_envs(cpu_cores()) as n:  # as many envs as CPUs: one thread
            assert n == 1 and torch.get_num_threads() == 1
        assert torch.get_num_threads() == start
        with threads_beside_envs(0) as n:  # no env: the count stays (never raised above it)
            assert n == start and torch.get_num_threads() == start
        with pytest.raises(RuntimeError):
            with threads_beside_envs(cpu_cores()):
                raise RuntimeError("boom")
        assert torch.get_num_threads() == start  # restored on an error too
    finally:
        torch.set_num_threads(before)


def test_vector_rollouts_act_at_the_lowered_thread_count(expert):
    """While the env processes run, the policy acts with a CPU left to each env; afterwards torch's
    count is what it was."""
    import torch

    class Counting:
        def __init__(self, inner):
            self.inner, self.seen = inner, set()

        def reset_rows(self, rows, seeds):
            self.inner.reset_rows(rows, seeds)

        def act(self, obs, infos):
            self.seen.add(torch.get_num_threads())
            return self.inner.act(obs, infos)

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(max(2, before))
        start = torch.get_num_threads()
        actor = Counting(batch_actor_for(expert))
        run_episodes(envs_for(expert, 2), actor, SEEDS[:2], max_steps=5, keep_frames=False)
        assert actor.seen == {max(1, min(start, cpu_cores() - 2))}
        assert torch.get_num_threads() == start
    finally:
        torch.set_num_threads(before)


def test_sampled_actions_repeat_the_one_env_draws(student):
    """--sample: the one-env path seeds torch with the track before each episode; each slot's
    generator is seeded with its track, so the draws are the same."""
    import torch

    env = make_carracing_for(student)
    seq = []
    for s in SEEDS[:2]:
        torch.manual_seed(s)
        seq.append(rollout(env, make_actor(student, deterministic=False), s, max_steps=30, keep_frames=False))
    env.close()
    vec = run_episodes(envs_for(student, 2), BatchPolicyActor(student, deterministic=False), SEEDS[:2],
                       max_steps=30, keep_frames=False)
    for a, b in zip(seq, vec):
        assert_same_episode(a, b)


def test_dagger_round_matches_with_beta_zero(expert, student):
    """DAgger with beta 0 (the student drives, deterministic): the same frames, labels and returns."""
    from agent.train.dagger import dagger_round

    envs = envs_for(expert, 2, render_pixels=True)
    env = make_carracing_for(expert)
    d1, r1, e1 = dagger_round(student, expert, env, SEEDS, 0.0, 30, np.random.default_rng(0))
    d2, r2, e2 = dagger_round(student, expert, envs, SEEDS, 0.0, 30, np.random.default_rng(0))
    env.close()
    assert r1 == r2 and d1.seeds == d2.seeds == SEEDS
    for a, b in zip(e1, e2):
        assert_same_episode(a, b)
    for f1, f2, l1, l2 in zip(d1.frames, d2.frames, d1.actions, d2.actions):  # actions: the expert's labels
        np.testing.assert_array_equal(f1, f2)
        np.testing.assert_array_equal(l1, l2)


def test_dagger_mixture_does_not_depend_on_the_number_of_envs(expert, student):
    """With beta > 0 and disturbances each episode draws from its own generator: 2 or 3 envs, same episodes."""
    from agent.train.dagger import dagger_round

    runs = [dagger_round(student, expert, envs_for(expert, n, render_pixels=True), SEEDS, 0.7, 60,
                         np.random.default_rng(5), disturb=200.0)[2] for n in (2, 3)]
    for a, b in zip(*runs):
        assert_same_episode(a, b)
    executed_expert = sum(int(np.count_nonzero(ep.actions == ep.labels)) for ep in runs[0])
    assert executed_expert > 0  # the mixture did execute expert actions


def test_privileged_state_is_computed_once_per_state():
    """Asking twice about the same state gives the same vector (the labeler and the mixture ask twice)."""
    from envs.carracing import make_carracing

    env = make_carracing(render_pixels=False, state_info=True, privileged_info=True)
    _, info = env.reset(seed=3)
    np.testing.assert_array_equal(info["privileged_state"], env.unwrapped.privileged_observation())
    assert info["speed"] == 0.0 and info["off_road"] is False
    for _ in range(5):
        _, _, _, _, info = env.step(3)
    again = env.unwrapped.privileged_observation()
    np.testing.assert_array_equal(info["privileged_state"], again)
    assert info["speed"] == env.unwrapped.speed > 0
    env.close()
    with pytest.raises(ValueError, match="state_info"):
        make_carracing(privileged_info=True)


# ------------------------------------------------------------------ staggered episode ends (a fake env)
class CountdownEnv(gym.Env):
    """Episodes of 3 + seed % 5 steps; observation = (seed, step); reward = action * step."""

    observation_space = gym.spaces.Box(0, 1000, (2,), np.int64)
    action_space = gym.spaces.Discrete(7)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_, self.t = seed, 0
        return np.array([seed, 0]), {"speed": float(seed)}

    def step(self, action):
        self.t += 1
        obs = np.array([self.seed_, self.t])
        return obs, float(action * self.t), self.t >= 3 + self.seed_ % 5, False, {"speed": float(self.t), "off_road": bool(action % 2)}


class CountingActor:
    """Acts on how many steps it has seen since its reset (a stateful policy)."""

    label, has_probs, traces_reason = "counting", False, None

    def reset(self):
        self.n = 0

    def act(self, obs, env=None, info=None):
        self.n += 1
        return Decision(int(obs[0] + self.n) % 7)


class CountingBatchActor:
    def __init__(self):
        self.n = None

    def reset_rows(self, rows, seeds):
        self.n = np.zeros(len(rows), np.int64) if self.n is None else np.where(rows, 0, self.n)

    def act(self, obs, infos):
        self.n = self.n + 1
        return [int(o[0] + k) % 7 for o, k in zip(obs, self.n)]


def test_staggered_episodes_start_in_freed_slots():
    """Episodes of different lengths on 2 slots: each ends when its env says, the next seed takes the
    slot, a slot with no seed left idles, and every episode equals the one-env one."""
    from agent.actors.rollout import rollout

    seeds = [4, 0, 7, 1, 2]  # lengths 7, 3, 5, 4, 5
    env = CountdownEnv()
    seq = [rollout(env, CountingActor(), s, keep_frames=True) for s in seeds]
    venv = gym.vector.AsyncVectorEnv([CountdownEnv] * 2, autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    order = []
    try:
        got = {}
        for i, ep in vector_rollouts(venv, CountingBatchActor(), seeds):
            order.append(i)
            got[i] = ep
    finally:
        venv.close()
    assert order != sorted(order)  # they finished out of seed order
    assert sorted(order) == list(range(len(seeds)))
    for i, a in enumerate(seq):
        b = got[i]
        assert b.seed == seeds[i] and b.steps == 3 + seeds[i] % 5
        np.testing.assert_array_equal(b.observations[:, 0], seeds[i])
        np.testing.assert_array_equal(b.speeds, np.arange(b.steps + 1, dtype=np.float32) + np.r_[seeds[i], np.zeros(b.steps)])
        np.testing.assert_array_equal(a.actions, b.actions)
        np.testing.assert_array_equal(a.rewards, b.rewards)
        np.testing.assert_array_equal(a.terminations, b.terminations)
        np.testing.assert_array_equal(a.observations, b.observations)
        np.testing.assert_array_equal(b.off_road, b.actions % 2 == 1)


def test_split_infos():
    infos = {"speed": np.array([1.0, 0.0, 3.0]), "_speed": np.array([True, False, True]),
             "x": {"y": np.array([5, 6, 7]), "_y": np.array([False, True, False])}, "_x": np.array([False, True, False])}
    assert split_infos(infos, 3) == [{"speed": 1.0}, {"x": {"y": 6}}, {"speed": 3.0}]


def test_vector_rollouts_refuse_an_autoresetting_env():
    venv = gym.vector.AsyncVectorEnv([CountdownEnv])
    try:
        with pytest.raises(ValueError, match="DISABLED"):
            next(vector_rollouts(venv, CountingBatchActor(), [1]))
    finally:
        venv.close()


# ------------------------------------------------------------------ recordings and the CLI
def test_collect_with_envs_writes_the_same_dataset(tmp_path):
    from agent.data.recordings import load_demonstrations

    common = ["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--episodes", "3", "--max-steps", "6",
              "--track-seed", "21", "--teacher.start-rule"]
    assert main(common + ["--out", str(tmp_path / "ns" / "one-v0")]) == 0
    assert main(common + ["--envs", "2", "--out", str(tmp_path / "ns" / "two-v0")]) == 0
    a, b = load_demonstrations(tmp_path / "ns" / "one-v0"), load_demonstrations(tmp_path / "ns" / "two-v0")
    assert a.seeds == b.seeds == [21, 22, 23]
    for fa, fb, xa, xb in zip(a.frames, b.frames, a.actions, b.actions):
        np.testing.assert_array_equal(fa, fb)
        np.testing.assert_array_equal(xa, xb)


def test_interrupted_vector_collect_keeps_finished_episodes(tmp_path, expert):
    from agent.data.recordings import load_demonstrations
    from agent.actors.vector import collect

    class Interrupting(BatchExpertActor):
        calls = 0

        def act(self, obs, infos):
            Interrupting.calls += 1
            if Interrupting.calls == 8:  # the third episode is under way in slot 0
                raise KeyboardInterrupt
            return super().act(obs, infos)

    envs = CarRacingEnvs(2, privileged_info=True)
    writer = collect(envs, Interrupting(expert), 3, 30, tmp_path / "ns" / "cut-v0", "ppo-expert", max_steps=5,
                     progress=False)
    assert writer.episodes == 2
    assert load_demonstrations(tmp_path / "ns" / "cut-v0").seeds == [30, 31]


@pytest.mark.parametrize("argv, message", [
    (["evaluate", "--policy", "nac.pt", "--envs", "2", "--workers", "2"], "--workers"),
    (["collect", "--keyboard", "--envs", "2", "--out", "x/ns/k-v0"], "--keyboard"),
])
def test_bad_envs_are_refused(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_evaluate_refuses_zero_envs(capsys):
    with pytest.raises(SystemExit) as exc:  # a value the field refuses: tyro's parser reports it
        main(["evaluate", "--policy", "nac.pt", "--envs", "0"])
    assert exc.value.code == 2 and "--envs must be >= 1" in capsys.readouterr().err


def test_evaluate_with_envs_gives_the_one_env_results(tmp_path):
    from agent.eval.closed_loop import evaluate

    one = evaluate("carracing-expert-discrete-margin.zip", 3, 40, max_steps=50, workers=1, progress=False)
    two = evaluate("carracing-expert-discrete-margin.zip", 3, 40, max_steps=50, envs=2, progress=False)
    assert two.envs == 2 and one.envs == 1
    for key in ("seeds", "returns", "steps", "longest_standstill_steps", "off_road_steps", "tiles_missed",
                "edge_steps", "laps_finished", "wrong_way_steps"):
        assert getattr(one, key) == getattr(two, key), key


def test_bench_rollouts_rows_and_table():
    """The benchmark's structure (its figures are printed, not tested): the same episodes for every N."""
    import io

    from agent.bench.rollouts import ROW_KEYS, bench_rollouts, print_rollouts_table

    rows = bench_rollouts(("carracing-expert-discrete-margin.zip",), envs=(1, 2), episodes=3, max_steps=5, seed=50)
    assert [r["envs"] for r in rows] == [1, 2]
    for r in rows:
        assert set(r) == set(ROW_KEYS)
        assert r["steps"] == 15 and r["episodes"] == 3 and r["same_returns"] is True
        assert r["steps_per_s"] > 0 and r["cpu_ms_per_step"] > 0
    assert rows[0]["ratio"] == 1.0 and rows[1]["returns"] == rows[0]["returns"]
    buf = io.StringIO()
    print_rollouts_table(rows, file=buf)
    lines = buf.getvalue().splitlines()
    assert sum(line.startswith("| carracing-expert-discrete-margin.zip") for line in lines) == 2 and "load average" in lines[-1]
    with pytest.raises(ValueError, match=">= 1"):
        bench_rollouts(("carracing-expert-discrete-margin.zip",), envs=(0,), episodes=1)
