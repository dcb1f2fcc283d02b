"""A stand-in for the PPO expert's network, for tests of the teacher's rules (no training needed)."""

import numpy as np


class ConstantNet:
    """Stands in for SB3's ActorCriticPolicy inside :class:`agent.experts.policy.ExpertPolicy`:
    always the same action, a discrete index (0..4) or a (steering, throttle) tuple."""

    def __init__(self, action):
        import gymnasium as gym

        self.action = action
        self.action_space = (gym.spaces.Box(-1.0, 1.0, (2,), np.float32) if isinstance(action, tuple)
                             else gym.spaces.Discrete(5))

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        n = np.shape(obs)[:-1]
        if isinstance(self.action, tuple):
            return np.broadcast_to(np.float32(self.action), n + (2,)).copy(), None
        return np.full(n, self.action, dtype=np.int64), None


def small_demos(actions, speeds=None, continuous=False):
    """Two-episode :class:`agent.data.recordings.Demonstrations` of random 8x8 frames (4 and 3
    frames) with the given discrete labels (two lists), or zero continuous actions."""
    from agent.data.recordings import Demonstrations

    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (4, 8, 8, 3), dtype=np.uint8), rng.integers(0, 255, (3, 8, 8, 3), dtype=np.uint8)]
    if continuous:
        actions = [np.zeros((4, 2), np.float32), np.zeros((3, 2), np.float32)]
    else:
        actions = [np.asarray(a, dtype=np.int64) for a in actions]
    return Demonstrations(frames, actions, [0, 1], [0.0, 0.0], speeds=speeds)
