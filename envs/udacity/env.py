"""The Udacity simulator in autonomous mode as a ``gymnasium.Env`` (:class:`UdacityEnv`, ``agent/Udacity-v0``).

The protocol is lock-step (:mod:`envs.udacity.protocol`): every autonomous ``step`` sends one
``steer`` in reply to the last frame and waits for the next frame. :class:`UdacityEnv` does that
over the websocket server of :mod:`envs.udacity.bridge`, with the throttle of
:mod:`envs.udacity.throttle`. When several simulators are connected, the env drives the newest
one that has sent telemetry. It logs to the ``envs.udacity.bridge`` logger, as the bridge does.
"""

from __future__ import annotations

import collections
import math
import time
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np

from envs.udacity.bridge import DEFAULT_HOST, LOGGER, UdacityBridge
from envs.udacity.protocol import DEFAULT_PORT, FRAME_SHAPE, MAX_MESSAGE_BYTES, Telemetry, _format_number
from envs.udacity.throttle import ThrottleController

if TYPE_CHECKING:
    from envs.udacity.bridge import _Event

ENV_ID = "agent/Udacity-v0"
#: While reset() waits, a connected simulator silent for this long (seconds) is asked for a frame.
SOLICIT_AFTER_S = 1.0


class UdacityEnv(gym.Env):
    """The Udacity simulator in autonomous mode as a gymnasium env (docs/design.md section 5).

    Observation: the centre camera, (160, 320, 3) uint8 RGB. Action: normalised steering,
    shape (1,), clamped to [-1, 1] (1.0 = 25 degrees right). The throttle is not the policy's:
    a :class:`ThrottleController` holds ``target_speed`` mph.

    ``reset()`` starts the server if needed and waits up to ``connect_timeout`` seconds for a
    simulator to connect and send a frame (the simulator has no reset command: a later reset
    continues from wherever the car is). ``step(action)`` sends ``steer`` in reply to the last
    frame and returns the next one with reward 0.0 and ``terminated`` False; ``truncated`` is
    True when the simulator disconnected (the next ``reset()`` waits for it to reconnect),
    a newer simulator connected and sent a frame, or no message came within ``step_timeout``
    seconds.

    While a person drives (the simulator sends empty telemetry), the bridge answers ``manual``
    by itself and ``step`` returns at once with the last autonomous frame and
    ``info["manual"] = True`` without sending anything, so a live window stays responsive;
    the next ``step`` waits for the next message. ``step`` sends ``steer`` only in reply to a
    frame, which keeps exactly one message in flight as the simulator expects.

    ``info``: ``speed_mph``, ``steering_angle_deg`` (degrees) and ``throttle`` as the simulator
    reported them with the last autonomous frame; ``time_s`` (the message's arrival,
    ``time.perf_counter()`` seconds, for irregular-time models); ``manual`` (bool);
    ``steering_command`` and ``throttle_command`` (what the last ``steer`` sent, None before the
    first); ``truncated_reason`` ("disconnected", "new_connection" or "timeout") when truncated.

    Args:
        host: interface to listen on; 127.0.0.1 so nobody on the network can steer the car.
        port: TCP port the simulator connects to (4567, hard-coded in the simulator); 0 picks a
            free port (tests), readable from :attr:`port` after :meth:`start` or ``reset``.
        target_speed: cruise speed in mph for the throttle controller (the simulator tops at 30).
        connect_timeout: seconds ``reset`` waits for a simulator frame before TimeoutError.
        step_timeout: seconds ``step`` waits for the next message before truncating.
        throttle_controller: a custom controller (any ``callable(speed_mph, dt_s) -> throttle``
            with ``reset()``); by default ``ThrottleController(target_speed)``.
        max_message_bytes: the largest websocket frame accepted from the simulator.
        render_mode: None or "rgb_array" (``render()`` returns the last frame).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}  # nominal; the simulator sets the pace

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, target_speed: float = 15.0,
                 connect_timeout: float = 60.0, step_timeout: float = 10.0,
                 throttle_controller: ThrottleController | None = None,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, render_mode: str | None = None):
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if connect_timeout <= 0 or step_timeout <= 0:
            raise ValueError("connect_timeout and step_timeout must be > 0 seconds")
        self.observation_space = gym.spaces.Box(0, 255, FRAME_SHAPE, np.uint8)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.render_mode = render_mode
        self.connect_timeout = float(connect_timeout)
        self.step_timeout = float(step_timeout)
        self.throttle = throttle_controller or ThrottleController(target_speed)
        self.bridge = UdacityBridge(host, port, max_message_bytes)
        self._sid: str | None = None  # the simulator this episode drives
        self._pending: Telemetry | None = None  # the frame the simulator waits for a reply to
        self._last: Telemetry | None = None  # the last autonomous frame
        self._held: _Event | None = None  # an event of a new connection, kept for the next reset
        self._prev_time: float | None = None
        self._command: tuple[float | None, float | None] = (None, None)

    @property
    def host(self) -> str:
        return self.bridge.host

    @property
    def port(self) -> int:
        """The TCP port; the bound one once started (useful with port 0)."""
        return self.bridge.port

    @property
    def url(self) -> str:
        return self.bridge.url

    def start(self) -> int:
        """Start the bridge's server if it is not running; returns the bound port."""
        return self.bridge.start()

    # -- gymnasium API -------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.start()
        self.throttle.reset()
        self._prev_time = None
        pending = self._pending
        if (pending is not None and self._held is None and self.bridge.is_connected(pending.sid)
                and not self.bridge.superseded(pending.sid)):
            return pending.frame, self._info(pending.time_s, manual=False)  # the simulator awaits our reply
        self._pending = self._sid = None
        deadline = time.monotonic() + self.connect_timeout
        seen: collections.Counter[str] = collections.Counter()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(self._timeout_message(seen))
            if self._held is not None:  # kept by step() when a new simulator connected
                event, self._held = self._held, None
            else:
                event = self.bridge.events.get(min(remaining, SOLICIT_AFTER_S))
            if event is None:
                sid = self.bridge.newest_sid()
                if sid is not None:  # connected but silent: it may wait for a reply we never sent
                    LOGGER.info("simulator %s is silent, asking it for a frame", sid)
                    self.bridge.send(sid, "manual", {})
                continue
            seen[event.kind] += 1
            if (event.kind == "telemetry" and self.bridge.is_connected(event.sid)
                    and not self.bridge.superseded(event.sid)):
                self._bind(event.telemetry)
                return event.telemetry.frame, self._info(event.time_s, manual=False)

    def step(self, action):
        if self._sid is None:
            raise RuntimeError("UdacityEnv.step() before reset() (or after a truncation): call reset()")
        steering = self._steering(action)
        pending = self._pending
        if pending is not None:
            dt = 0.0 if self._prev_time is None else min(max(pending.time_s - self._prev_time, 0.0), 0.5)
            self._prev_time = pending.time_s
            throttle = self.throttle(pending.speed_mph, dt)
            self.bridge.send(pending.sid, "steer", {"steering_angle": _format_number(steering),
                                                    "throttle": _format_number(throttle)})
            self._command = (steering, throttle)
            self._pending = None
        deadline = time.monotonic() + self.step_timeout
        while True:
            remaining = deadline - time.monotonic()
            event = self.bridge.events.get(remaining) if remaining > 0 else None
            if event is None:
                LOGGER.warning("no message from simulator %s within %g s: truncating", self._sid, self.step_timeout)
                return self._truncate("timeout", time.perf_counter())
            if event.sid != self._sid:
                bridge = self.bridge
                if (event.kind == "telemetry" and bridge.is_connected(event.sid) and not bridge.superseded(event.sid)
                        and (bridge.superseded(self._sid) or not bridge.is_connected(self._sid))):
                    LOGGER.info("a newer simulator (%s) replaces %s: truncating", event.sid, self._sid)
                    self._held = event
                    return self._truncate("new_connection", event.time_s)
                continue  # an older or a silent connection, or leftovers of an older session: ignored
            if event.kind == "telemetry":
                self._pending = self._last = event.telemetry
                return event.telemetry.frame, 0.0, False, False, self._info(event.time_s, manual=False)
            if event.kind == "manual":
                return self._last.frame, 0.0, False, False, self._info(event.time_s, manual=True)
            if event.kind == "disconnect":
                return self._truncate("disconnected", event.time_s)

    def render(self):
        if self.render_mode == "rgb_array":
            return None if self._last is None else self._last.frame.copy()
        return None

    def close(self) -> None:
        """Stop the server and its thread (idempotent); the env can be reset again afterwards."""
        self.bridge.stop()
        self._sid = self._pending = self._held = None

    # -- helpers -------------------------------------------------------------------------------

    def _bind(self, telemetry: Telemetry) -> None:
        self._sid = telemetry.sid
        self._pending = self._last = telemetry

    def _truncate(self, reason: str, time_s: float):
        self._sid = self._pending = None
        info = self._info(time_s, manual=False)
        info["truncated_reason"] = reason
        return self._last.frame, 0.0, False, True, info

    def _info(self, time_s: float, manual: bool) -> dict:
        last = self._last
        return {
            "speed_mph": last.speed_mph if last else math.nan,
            "steering_angle_deg": last.steering_angle_deg if last else math.nan,
            "throttle": last.throttle if last else math.nan,
            "time_s": time_s,
            "manual": manual,
            "steering_command": self._command[0],
            "throttle_command": self._command[1],
        }

    @staticmethod
    def _steering(action) -> float:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.size != 1:
            raise ValueError(f"action must be one normalised steering value, got shape {np.shape(action)}")
        steering = float(a[0])
        if not math.isfinite(steering):
            LOGGER.warning("non-finite steering %r replaced by 0.0", steering)
            return 0.0
        return min(max(steering, -1.0), 1.0)

    def _timeout_message(self, seen: collections.Counter) -> str:
        base = f"within {self.connect_timeout:g} s"
        if self.bridge.newest_sid() is None and not seen["connect"]:
            return (f"no Udacity simulator connected to {self.url} {base}: start the simulator and choose "
                    f"Autonomous mode")
        if seen["manual"]:
            return (f"the Udacity simulator on {self.url} sent only manual-driving telemetry {base}: "
                    f"release the W/S keys so it drives autonomously")
        return f"the Udacity simulator connected to {self.url} but sent no usable frame {base}"


__all__ = ["ENV_ID", "SOLICIT_AFTER_S", "UdacityEnv"]
