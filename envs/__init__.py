"""Simulator integrations, each a ``gymnasium.Env``.

- :mod:`envs.carracing`: gymnasium CarRacing-v3 (discrete), seeded tracks, privileged-state view.
- :mod:`envs.udacity`: the Udacity self-driving-car simulator over socket.io (``agent/Udacity-v0``,
  :mod:`envs.udacity.env`); imported on first use (it loads aiohttp), e.g. ``envs.UdacityEnv``.
"""

import gymnasium as gym

from envs.carracing import (
    ACTION_NAMES,
    EVAL_SEED_BASE,
    CarRacingEnv,
    OffTrackTermination,
    PrivilegedObservation,
    make_carracing,
)

UDACITY_ENV_ID = "agent/Udacity-v0"  # = envs.udacity.env.ENV_ID
if UDACITY_ENV_ID not in gym.registry:
    gym.register(id=UDACITY_ENV_ID, entry_point="envs.udacity.env:UdacityEnv")

_LAZY = {"UdacityEnv": "envs.udacity.env", "ThrottleController": "envs.udacity.throttle"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")


__all__ = [
    "ACTION_NAMES", "EVAL_SEED_BASE", "CarRacingEnv", "OffTrackTermination", "PrivilegedObservation",
    "ThrottleController", "UDACITY_ENV_ID", "UdacityEnv", "make_carracing",
]
