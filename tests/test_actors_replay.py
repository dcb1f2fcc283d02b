"""Replaying episodes from their seeds and executed actions (agent.actors.replay), and a DAgger
round whose frames file is gone made again from its index (agent.train.checkpoint.replay_round)."""

import numpy as np
import pytest

from agent.actors.loading import load_policy
from agent.actors.replay import ReplayActor, ReplayError, envs_fields, frame_digest, replay_frames
from agent.actors.vector import CarRacingEnvs, envs_for, run_episodes

SEEDS = [21, 22, 23]  # 3 episodes on 2 envs: the third starts in a freed slot while the other idles


@pytest.fixture(scope="module")
def recorded():
    """Three short episodes of random actions (different lengths), as recorded."""
    rng = np.random.default_rng(7)
    actions = {s: rng.integers(0, 5, 40) for s in SEEDS}
    eps = run_episodes(CarRacingEnvs(2), ReplayActor(actions), SEEDS, max_steps=25)
    return eps


def test_a_replay_gives_the_recorded_frames_bit_for_bit(recorded):
    frames = [ep.observations[:-1] for ep in recorded]
    assert all(len(f) == 25 for f in frames)
    assert len({frame_digest(f) for f in frames}) == 3  # three tracks, three digests
    back = replay_frames(CarRacingEnvs(2), SEEDS, [ep.actions for ep in recorded], max_steps=25,
                         digests=[frame_digest(f) for f in frames])
    for a, b in zip(frames, back):
        np.testing.assert_array_equal(a, b)
    one = replay_frames(CarRacingEnvs(1), SEEDS[2:], [recorded[2].actions], max_steps=25)  # other envs count, same frames
    np.testing.assert_array_equal(one[0], frames[2])


def test_a_replay_that_differs_is_refused(recorded):
    frames = [ep.observations[:-1] for ep in recorded]
    digests = [frame_digest(f) for f in frames]
    actions = [ep.actions.copy() for ep in recorded]
    actions[1][10] = (actions[1][10] + 1) % 5  # another action at step 10: other frames after it
    with pytest.raises(ReplayError, match="track 22: the replayed frames differ"):
        replay_frames(CarRacingEnvs(2), SEEDS, actions, max_steps=25, digests=digests)
    short = [ep.actions[:20] for ep in recorded]  # the recording ended earlier than the replay does
    with pytest.raises(ReplayError, match="ended after 25 steps, the recording after 20"):
        replay_frames(CarRacingEnvs(2), SEEDS, short, max_steps=25)
    with pytest.raises(ValueError, match="distinct seeds"):
        replay_frames(CarRacingEnvs(2), [21, 21], actions[:2])


def test_frame_digest_sees_shape_and_bytes():
    a = np.zeros((2, 4, 4, 3), np.uint8)
    b = a.copy()
    b[1, 2, 3, 0] = 1
    assert frame_digest(a) == frame_digest(a.copy()) != frame_digest(b)
    assert frame_digest(a) != frame_digest(a.reshape(4, 2, 4, 3))


def test_a_dagger_round_without_its_frames_file_is_replayed(tmp_path):
    """The real round: student, expert under beta mixing and disturbances; its .npy deleted, the
    run folder still loads it, frame for frame, and a round kept without replay says what to do."""
    from agent.train.checkpoint import CheckpointError, Checkpointer, RoundReplay, load_round
    from agent.train.dagger import dagger_round

    expert = load_policy("carracing-expert-discrete-margin.zip").use_start_rule(True)
    student = load_policy("nac.pt")
    envs = envs_for(expert, 2, render_pixels=True)
    demos, _, episodes = dagger_round(student, expert, envs, SEEDS, 0.5, 60, np.random.default_rng(1),
                                      disturb=200.0, disturb_kinds=("off-road", "stop", "speed"))
    assert any(not np.array_equal(ep.actions, ep.labels) for ep in episodes)  # executed != labels somewhere
    ck = Checkpointer(tmp_path / "run", "config")
    name = ck.save_round(3, demos, RoundReplay(envs_fields(envs), 60, [ep.actions for ep in episodes]))
    npy = tmp_path / "run" / "dagger-round-3.npy"
    npy.unlink()
    back = load_round(tmp_path / "run", name)
    assert npy.is_file()
    for a, b in zip(demos.frames, back.frames):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(demos.actions, back.actions):  # the labels are the index's, untouched
        np.testing.assert_array_equal(a, b)
    assert back.seeds == SEEDS and sorted(p.name for p in (tmp_path / "run").iterdir()) == \
        ["dagger-round-3.npy", "dagger-round-3.npz"]

    ck.save_round(4, demos)  # no replay kept: the .npy cannot be made again
    (tmp_path / "run" / "dagger-round-4.npy").unlink()
    with pytest.raises(CheckpointError, match="keeps no executed actions"):
        load_round(tmp_path / "run", "dagger-round-4.npz")
    with pytest.raises(ValueError, match="one action per frame"):
        ck.save_round(5, demos, RoundReplay(envs_fields(envs), 60, [ep.actions[:-1] for ep in episodes]))
