"""CarRacing-v3 with the paper's five discrete actions, seeded tracks and a privileged-state view.

The student sees the 96x96x3 pixels that gymnasium renders. The PPO expert sees a short vector
of privileged state read from the Box2D simulation ("learning by cheating", docs/design.md section 4):
car speed in its own frame, yaw rate, wheel states and the next track waypoints in the car's
frame. While the expert trains, the pixel rendering (the costly part of a step) is skipped.

Discrete actions (``continuous=False``, the paper's setting and the default): 0 nothing, 1 steer
right, 2 steer left, 3 gas (0.2), 4 brake (0.8). gymnasium documents 1 as left and 2 as right, but
its code turns the other way (gymnasium issue #1369); :data:`ACTION_NAMES` names what they do. The continuous configuration (``continuous=True``) drives with
two controls in [-1, 1], steering and throttle (:class:`ThrottleAction`): full gas and gas while
steering are possible there, which the five discrete actions do not allow.

``make_carracing(speedometer=True)`` draws a legible speed into each frame's dashboard strip
(:func:`draw_speedometer`), for a student that reads it (``--dashboard speedometer``).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.box2d.car_racing import FPS, STATE_H, STATE_W, CarRacing

ENV_ID = "agent/CarRacing-v3"
#: What each discrete action does. gymnasium's documentation says 1 steers left and 2 right, but its
#: code (``steer(-0.6 * (action == 1) + 0.6 * (action == 2))``, with continuous ``steer(-action[0])``)
#: turns the car right on 1 and left on 2 (gymnasium issue #1369, measured in tests/test_envs.py).
ACTION_NAMES = ("nothing", "right", "left", "gas", "brake")
#: The names gymnasium documents (and policy files made before the swap was found carry).
DOCUMENTED_ACTION_NAMES = ("nothing", "left", "right", "gas", "brake")
EPISODE_STEPS = 1000
from envs.tracks import EVAL_SEED_BASE  # noqa: E402,F401 - re-exported: tracks >= this are never trained on

N_WAYPOINTS = 12  # waypoints ahead of the car in the privileged view
WAYPOINT_STRIDE = 2  # every 2nd track point (track points are ~3.5 m apart)
PRIVILEGED_DIM = 4 + 4 + 4 + 1 + 3 + 2 * N_WAYPOINTS
#: where :meth:`CarRacingEnv.privileged_observation` keeps each wheel's grass flag (1 on grass, 0 on the road)
WHEEL_GRASS = slice(8, 12)
#: The car counts as standing still while its speed is below this, in simulator units per second
#: (:attr:`envs.carracing.CarRacingEnv.speed`, the hull's speed; the car starts at 0 and cruises
#: at roughly 30-90 units/s). Used by :func:`agent.actors.rollout.standstill`, the teacher's start rule and the "no stalls" figures.
STANDSTILL_SPEED = 1.0
#: the car drives "the wrong way" (:attr:`CarRacingEnv.wrong_way`) when it moves at least this fast
#: (simulator units per second) ...
WRONG_WAY_SPEED = 5.0
#: ... and the cosine between its velocity and the track's direction at the nearest track point is
#: below this (more than 120 degrees from the lap's direction)
WRONG_WAY_COSINE = -0.5
#: the share of green pixels around the car at and above which :func:`car_on_grass` says "on the grass"
GRASS_SHARE = 0.95


def car_speed(env: gym.Env) -> float:
    """The car's speed in simulator units per second (:attr:`envs.carracing.CarRacingEnv.speed`);
    NaN for an env without a ``speed`` property (the Udacity env reports mph in ``info`` instead)."""
    return float(getattr(env.unwrapped, "speed", math.nan))


def _grass_ring() -> np.ndarray:
    """(96, 96) bool: a ring of pixels around the car, which gymnasium draws at a fixed place in
    the 96x96 frame (rows 66-76, columns 46-49), the car itself left out."""
    ring = np.zeros((96, 96), bool)
    ring[62:81, 41:55] = True
    ring[65:78, 45:51] = False
    return ring


_GRASS_RING = _grass_ring()


def car_on_grass(frames: np.ndarray, share: float = GRASS_SHARE) -> np.ndarray:
    """Whether the car is on the grass in each frame, from the pixels around it.

    Recordings keep frames and speeds, not the wheels' grass flags (:data:`WHEEL_GRASS`), so a
    rule that needs them is applied to recorded labels through this test: at least ``share`` of
    the pixels in a ring around the car are grass-green (green above red by more than 50), where
    the road is grey. On 1,600 frames of the discrete expert's laps with off-road disturbances
    (tracks 610,000-007), ``share`` 0.95 marked 880 of the 917 frames with all four wheels on the
    grass and none of the 683 others (README, "The brake floor").

    Args:
        frames: (N, 96, 96, 3) or (96, 96, 3) uint8 RGB frames as the env renders them.
        share: the green share, 0..1.

    Returns:
        (N,) bool, or a bool for one frame.

    Raises:
        ValueError: frames of another shape, or ``share`` outside 0..1.
    """
    frames = np.asarray(frames)
    one = frames.ndim == 3
    if one:
        frames = frames[None]
    if frames.ndim != 4 or frames.shape[1:] != (96, 96, 3):
        raise ValueError(f"car_on_grass needs (N, 96, 96, 3) RGB frames as CarRacing renders them, got {frames.shape}")
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in 0..1, got {share}")
    px = frames[:, _GRASS_RING].astype(np.int16)  # (N, P, 3)
    green = (px[..., 1] - px[..., 0]) > 50
    out = green.mean(axis=1) >= share
    return bool(out[0]) if one else out


#: The speedometer (:func:`draw_speedometer`): speed at which its bar fills its width, units/s.
SPEEDOMETER_FULL_SCALE = 100.0


def dashboard_rows(height: int) -> int:
    """Rows of CarRacing's dashboard strip at the bottom of a frame of ``height`` rows: 12 of 96.

    gymnasium's ``CarRacing._render_indicators`` draws it 5/40 of the window high.
    """
    return int(round(height * 5 / 40))


def speed_bar_columns(width: int) -> tuple[int, int]:
    """[first, last + 1) columns of the dashboard's speed bar in a frame ``width`` wide: 12-14 of 96.

    gymnasium draws the speed bar at place 5 of 40 (``vertical_ind(5, ...)``), one place wide.
    """
    return int(np.floor(width * 5 / 40)), int(np.ceil(width * 6 / 40))


def speedometer_region(height: int, width: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the speedometer bar in a ``height`` x ``width`` frame: rows
    86-93 and columns 16-95 of 96x96, inside the dashboard strip, right of the speed bar."""
    strip = dashboard_rows(height)
    top = height - strip + max(1, strip // 6)
    return top, top + max(1, (2 * strip) // 3), speed_bar_columns(width)[1] + 1, width


def draw_speedometer(frames: np.ndarray, speeds) -> np.ndarray:
    """Draw the car's speed into the dashboard strip of CarRacing frames, in place, legibly.

    gymnasium's own speed bar (columns 12-14) is 0.048 rows high per unit/s at 96x96 (2.4 rows x
    0.02 x speed, drawn at window size and scaled down smoothly): from 12 to 30 units/s it is the
    same 6 pixels, whose brightness adds up to one full pixel more per 8-10 units/s (2.4 pixels'
    worth at 16 units/s, 3.3 at 24), in steps of 2-3 units/s. A student has to read a brake floor
    of 20 units/s (README, "The brake floor") from that. This draws a horizontal white bar
    instead, across :func:`speedometer_region` (8 rows x 80 columns of 96): its length is
    ``speed / SPEEDOMETER_FULL_SCALE`` of the width, 0.8 columns per unit/s (6.4 pixels per unit/s,
    about 50 times gymnasium's), its last column grey in proportion to the remainder, so any speed
    up to 100 units/s has its own picture. The region is cleared first (it covers the ABS,
    steering and gyroscope indicators there), so drawing again is idempotent.

    Args:
        frames: (N, H, W, 3) or (H, W, 3) uint8 frames, changed in place.
        speeds: (N,) or a scalar: the car's speed at each frame, units/s (above full scale: full).

    Returns:
        ``frames``.

    Raises:
        ValueError: frames that are not uint8 (N, H, W, 3); a speed count that does not match;
            a speed that is not finite (a recording without speeds cannot be drawn).
    """
    one = frames.ndim == 3
    f = frames[None] if one else frames
    if f.ndim != 4 or f.shape[-1] != 3 or f.dtype != np.uint8:
        raise ValueError(f"draw_speedometer needs uint8 frames (N, H, W, 3), got {frames.dtype} {frames.shape}")
    v = np.asarray(speeds, dtype=np.float64).reshape(-1)
    if len(v) != len(f):
        raise ValueError(f"one speed per frame: {len(v)} speeds for {len(f)} frames")
    if not np.all(np.isfinite(v)):
        raise ValueError("speeds must be finite to draw the speedometer (a recording without speeds, NaN, "
                         "cannot be shown one: record it again with this project's recorder)")
    top, bottom, left, right = speedometer_region(f.shape[1], f.shape[2])
    width = right - left
    fill = np.clip(v / SPEEDOMETER_FULL_SCALE, 0.0, 1.0) * width  # (N,) columns, fractional
    cols = np.arange(width, dtype=np.float64)
    level = np.clip(fill[:, None] - cols[None, :], 0.0, 1.0)  # (N, width): 1 full, the last one partial
    f[:, top:bottom, left:right, :] = np.rint(level * 255.0).astype(np.uint8)[:, None, :, None]
    return frames


class Speedometer(gym.ObservationWrapper):
    """Every frame carries :func:`draw_speedometer`'s bar of the car's current speed (for a
    student whose CNN reads it: ``--dashboard speedometer``, :class:`agent.nn.features.CarRacingCNN`).

    The speed is the one :attr:`CarRacingEnv.speed` reports after ``reset`` or ``step``, the same
    that recordings keep for each frame (``infos["speed"]``), so a recorded frame redrawn from its
    speed is the frame this wrapper would have given.
    """

    def observation(self, observation):
        if observation.ndim != 3:
            raise ValueError("the speedometer draws into pixel observations; the privileged view has none")
        return draw_speedometer(np.array(observation, copy=True), [self.env.unwrapped.speed])


class CarRacingEnv(CarRacing):
    """gymnasium's ``CarRacing`` with an optional skip of the pixel rendering and privileged state.

    Args:
        render_pixels: if False, ``step`` returns an all-zero (96, 96, 3) uint8 frame instead of
            rendering one (about 60x faster); use it only with :class:`PrivilegedObservation`.
        **kwargs: passed to ``CarRacing`` (``continuous`` defaults to False here).
    """

    def __init__(self, render_pixels: bool = True, continuous: bool = False, **kwargs: Any):
        super().__init__(continuous=continuous, **kwargs)
        self.render_pixels = render_pixels
        self._track_xy: np.ndarray | None = None
        self._nearest = 0
        self._state_version = 0  # counts resets and steps: the privileged view is computed once per state
        self._privileged: tuple[int, np.ndarray] | None = None

    def _render(self, mode: str):  # noqa: D401 - gymnasium's private hook
        if mode == "state_pixels" and not self.render_pixels:
            return np.zeros((STATE_H, STATE_W, 3), dtype=np.uint8)
        return super()._render(mode)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        self._track_xy = np.asarray([(p[2], p[3]) for p in self.track], dtype=np.float64)
        self._nearest = 0
        self._state_version += 1
        self._privileged = None
        info["track_seed"] = seed
        return obs, info

    def step(self, action):
        """gymnasium's ``CarRacing.step`` (the state changes, so the privileged view is recomputed)."""
        self._state_version += 1
        return super().step(action)

    @property
    def speed(self) -> float:
        """Speed of the car's hull in simulator units per second (the dashboard's "true speed")."""
        v = self.car.hull.linearVelocity
        return float(math.hypot(v[0], v[1]))

    @property
    def wheels_off_road(self) -> int:
        """How many of the four wheels touch no road tile (0-4): 4 is off the road, 1-3 on its edge."""
        return sum(1 for w in self.car.wheels if not w.tiles)

    @property
    def tiles_missed(self) -> int:
        """Road tiles not visited yet (a tile counts once any wheel has touched it); the lap ends only
        when this reaches 0 (see :func:`agent.actors.rollout.tiles_missed`)."""
        return len(self.track) - self.tile_visited_count

    @property
    def track_direction_cosine(self) -> float:
        """Cosine between the car's velocity and the track's direction at the nearest track point:
        +1 moving along the lap, -1 against it, NaN when the car moves slower than
        :data:`WRONG_WAY_SPEED` (its direction is then noise) or before the first reset.

        The track's direction at point i is from track point i to i + 1 (gymnasium's
        ``CarRacing.track``, in lap order); the nearest point is a full search, so an excursion far
        off the road still finds it.
        """
        if self._track_xy is None or getattr(self, "car", None) is None:
            return float("nan")
        vel = np.asarray(self.car.hull.linearVelocity, dtype=np.float64)
        speed = float(np.hypot(vel[0], vel[1]))
        if speed < WRONG_WAY_SPEED:
            return float("nan")
        pos = np.asarray(self.car.hull.position, dtype=np.float64)
        i = int(np.argmin(np.sum((self._track_xy - pos) ** 2, axis=1)))
        along = self._track_xy[(i + 1) % len(self._track_xy)] - self._track_xy[i]
        return float(vel @ along / (speed * (np.linalg.norm(along) + 1e-9)))

    @property
    def wrong_way(self) -> bool:
        """True when the car drives against the lap's direction: at least :data:`WRONG_WAY_SPEED`
        units/s, more than 120 degrees from the track's direction (:attr:`track_direction_cosine`
        below :data:`WRONG_WAY_COSINE`). A car that comes back onto the road facing backwards
        drives the lap the wrong way round over tiles it has visited and earns nothing more: the
        failure of docs/experiments/2026-12-03-recovery-disturbances.md. From pixels alone the two
        directions look alike (four frames of road do not show which way the lap goes).
        """
        return bool(self.track_direction_cosine < WRONG_WAY_COSINE)

    def privileged_observation(self) -> np.ndarray:
        """The expert's view of the current state, shape (PRIVILEGED_DIM,), float32, roughly in [-1, 1].

        Layout: forward and lateral speed, yaw rate, steering-joint angle (4); the angular
        velocity of each wheel (4); each wheel on grass (1) or road (0) (4); fraction of the track
        visited (1); lateral offset from the centre line, heading error (sin, cos) (3); the next
        ``N_WAYPOINTS`` track points in the car frame, x right and y forward (2 * N_WAYPOINTS).

        Computed once per state (after each reset and step) and returned as a copy on later calls,
        so the expert labelling a state and then acting on it (DAgger), the observation wrapper and
        :class:`StateInfo` all see the same vector: the nearest-track-point search it starts from
        depends on the previous call.
        """
        if self._privileged is not None and self._privileged[0] == self._state_version:
            return self._privileged[1].copy()
        state = self._compute_privileged()
        self._privileged = (self._state_version, state)
        return state.copy()

    def _compute_privileged(self) -> np.ndarray:
        hull = self.car.hull
        pos = np.asarray(hull.position, dtype=np.float64)
        fwd = np.asarray(hull.GetWorldVector((0.0, 1.0)), dtype=np.float64)
        right = np.asarray(hull.GetWorldVector((1.0, 0.0)), dtype=np.float64)
        vel = np.asarray(hull.linearVelocity, dtype=np.float64)
        wheels = self.car.wheels

        # Nearest track point: search a window ahead of the last one (the car moves < 1 point/step),
        # with a full search as a fallback when the car is far from that window.
        n = len(self._track_xy)
        window = (self._nearest + np.arange(-5, 30)) % n
        d = np.sum((self._track_xy[window] - pos) ** 2, axis=1)
        i = int(window[np.argmin(d)])
        if d.min() > 15.0**2:
            i = int(np.argmin(np.sum((self._track_xy - pos) ** 2, axis=1)))
        self._nearest = i

        ahead = self._track_xy[(i + WAYPOINT_STRIDE * np.arange(1, N_WAYPOINTS + 1)) % n] - pos
        wp = np.stack([ahead @ right, ahead @ fwd], axis=1) / 50.0
        nxt = self._track_xy[(i + 1) % n] - self._track_xy[i]
        heading = math.atan2(nxt @ right, nxt @ fwd)  # track direction relative to the car
        offset = (pos - self._track_xy[i]) @ np.array([-nxt[1], nxt[0]]) / (np.linalg.norm(nxt) + 1e-9)

        state = np.concatenate(
            [
                [vel @ fwd / 100.0, vel @ right / 100.0, hull.angularVelocity / 5.0, wheels[0].joint.angle],
                [w.omega / 100.0 for w in wheels],
                [0.0 if w.tiles else 1.0 for w in wheels],
                [self.tile_visited_count / max(len(self.track), 1)],
                [offset / 10.0, math.sin(heading), math.cos(heading)],
                wp.reshape(-1),
            ]
        )
        return np.clip(state, -5.0, 5.0).astype(np.float32)


class PrivilegedObservation(gym.ObservationWrapper):
    """Replace the pixel observation with :meth:`CarRacingEnv.privileged_observation`.

    Raises:
        TypeError: if the wrapped env is not a :class:`CarRacingEnv`.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        if not isinstance(env.unwrapped, CarRacingEnv):
            raise TypeError(f"PrivilegedObservation needs a CarRacingEnv, got {type(env.unwrapped).__name__}")
        self.observation_space = gym.spaces.Box(-5.0, 5.0, (PRIVILEGED_DIM,), np.float32)

    def observation(self, observation):
        return self.env.unwrapped.privileged_observation()


class StateInfo(gym.Wrapper):
    """Add the car's state to the ``info`` of every reset and step, so that it reaches a caller
    that cannot read the env itself (an env in a ``gymnasium.vector.AsyncVectorEnv`` subprocess).

    Keys: ``speed``, the hull's speed in simulator units per second (:attr:`CarRacingEnv.speed`);
    ``off_road``, True when all four wheels are off the road (no wheel touches a road tile, the
    test of :class:`OffTrackTermination`); ``wheels_off_road``, how many of the four wheels touch no
    road tile (0-4); ``tiles_missed``, the road tiles not visited yet (a lap ends only once every
    tile has been visited); ``wrong_way``, the car driving against the lap's direction
    (:attr:`CarRacingEnv.wrong_way`); with ``privileged=True`` also ``privileged_state``, the
    expert's (PRIVILEGED_DIM,) float32 view (:meth:`CarRacingEnv.privileged_observation`).

    Raises:
        TypeError: if the wrapped env is not a :class:`CarRacingEnv`.
    """

    def __init__(self, env: gym.Env, privileged: bool = False):
        super().__init__(env)
        if not isinstance(env.unwrapped, CarRacingEnv):
            raise TypeError(f"StateInfo needs a CarRacingEnv, got {type(env.unwrapped).__name__}")
        self.privileged = privileged

    def _add_state(self, info: dict) -> dict:
        car_env = self.env.unwrapped
        info = dict(info)
        info["speed"] = car_env.speed
        off = car_env.wheels_off_road
        info["off_road"] = off == len(car_env.car.wheels)
        info["wheels_off_road"] = off
        info["tiles_missed"] = car_env.tiles_missed
        info["wrong_way"] = car_env.wrong_way
        if self.privileged:
            info["privileged_state"] = car_env.privileged_observation()
        return info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, self._add_state(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._add_state(info)


class ThrottleAction(gym.ActionWrapper):
    """CarRacing's continuous controls as two numbers: (steering, throttle), each in [-1, 1].

    steering is CarRacing's own (-1 full left, +1 full right); throttle > 0 is gas (its value),
    throttle < 0 is brake (its magnitude), so gas and brake are never pressed together. Two
    signed controls are the usual parameterisation of a continuous CarRacing policy: they keep a
    Gaussian policy (PPO) and a regression head (the student) from asking for gas and brake at once.

    Raises:
        ValueError: if the wrapped env does not have CarRacing's continuous (3,) action space.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (3,):
            raise ValueError(f"ThrottleAction needs CarRacing's continuous (steer, gas, brake) actions, got {space}; "
                             "create the env with continuous=True")
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def action(self, action):
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0)
        return np.array([a[0], max(a[1], 0.0), max(-a[1], 0.0)], dtype=np.float64)


class OffTrackTermination(gym.Wrapper):
    """End an episode early once all four wheels have been off the road for ``patience`` steps.

    Used only while the expert trains (it saves the samples a lost car would waste); evaluation and
    recording use the unmodified episode rules.
    """

    def __init__(self, env: gym.Env, patience: int = 50, penalty: float = -10.0):
        super().__init__(env)
        self.patience, self.penalty, self._off = patience, penalty, 0

    def reset(self, **kwargs):
        self._off = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        on_road = any(w.tiles for w in self.env.unwrapped.car.wheels)
        self._off = 0 if on_road else self._off + 1
        if self._off >= self.patience and not terminated:
            terminated, reward = True, reward + self.penalty
            info["off_track"] = True
        return obs, reward, terminated, truncated, info


def make_carracing(
    render_mode: str | None = None,
    privileged: bool = False,
    render_pixels: bool | None = None,
    max_episode_steps: int = EPISODE_STEPS,
    continuous: bool = False,
    state_info: bool = False,
    privileged_info: bool = False,
    speedometer: bool = False,
) -> gym.Env:
    """Create CarRacing-v3, by default with the paper's five discrete actions; ``reset(seed=s)``
    always gives track s.

    Args:
        render_mode: None, "rgb_array" (600x400 frames) or "human" (gymnasium's own window).
        privileged: observations are the expert's state vector (PRIVILEGED_DIM,) instead of pixels.
        render_pixels: render the 96x96 frame each step; defaults to ``not privileged``.
        max_episode_steps: the time limit, 1000 steps (20 s at 50 FPS) as registered by gymnasium.
        continuous: the continuous configuration: actions are (steering, throttle) in [-1, 1]^2
            (:class:`ThrottleAction`) instead of the five discrete actions.
        state_info: add the car's speed and off-road flag to every ``info`` (:class:`StateInfo`),
            for envs stepped in another process (:mod:`agent.actors.vector`).
        privileged_info: with ``state_info``, also the expert's view, ``info["privileged_state"]``.
        speedometer: draw the car's speed into each frame's dashboard strip (:class:`Speedometer`).

    Returns:
        A ``gymnasium.Env`` whose ``unwrapped`` is a :class:`CarRacingEnv`.

    Raises:
        ValueError: ``privileged_info`` without ``state_info``; ``speedometer`` with ``privileged``.
    """
    if render_pixels is None:
        render_pixels = not privileged
    env = gym.make(ENV_ID, render_mode=render_mode, render_pixels=render_pixels, max_episode_steps=max_episode_steps,
                   continuous=continuous)
    if continuous:
        env = ThrottleAction(env)
    if speedometer:
        if privileged:
            raise ValueError("speedometer=True draws into the pixels; privileged observations have none")
        env = Speedometer(env)
    if privileged:
        env = PrivilegedObservation(env)
    if state_info:
        env = StateInfo(env, privileged=privileged_info)
    elif privileged_info:
        raise ValueError("privileged_info=True needs state_info=True (it adds to the StateInfo keys)")
    return env


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="envs.carracing:CarRacingEnv", max_episode_steps=EPISODE_STEPS, reward_threshold=900)

__all__ = [
    "ACTION_NAMES", "CarRacingEnv", "DOCUMENTED_ACTION_NAMES", "EPISODE_STEPS", "EVAL_SEED_BASE", "FPS", "GRASS_SHARE",
    "OffTrackTermination", "PRIVILEGED_DIM", "PrivilegedObservation", "SPEEDOMETER_FULL_SCALE", "Speedometer",
    "StateInfo", "ThrottleAction", "WHEEL_GRASS", "WRONG_WAY_COSINE", "WRONG_WAY_SPEED", "car_on_grass", "dashboard_rows", "draw_speedometer", "make_carracing",
    "speed_bar_columns", "speedometer_region",
]
