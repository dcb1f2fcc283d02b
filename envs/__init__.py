"""Simulator integrations, each a ``gymnasium.Env``.

- :mod:`envs.carracing`: gymnasium CarRacing-v3 (discrete), seeded tracks, privileged-state view.
"""

from envs.carracing import (
    ACTION_NAMES,
    EVAL_SEED_BASE,
    CarRacingEnv,
    OffTrackTermination,
    PrivilegedObservation,
    make_carracing,
)

__all__ = [
    "ACTION_NAMES", "EVAL_SEED_BASE", "CarRacingEnv", "OffTrackTermination", "PrivilegedObservation",
    "make_carracing",
]
