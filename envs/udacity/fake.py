"""A stand-in for the Udacity simulator that speaks its exact wire protocol (tests and benchmarks).

:class:`FakeSimulator` is a raw websocket client (``websocket-client``, not a socket.io client,
which would hide protocol mismatches) that behaves as the simulator's ``CommandServer`` does
(docs/design.md section 5):

- it opens ``ws://HOST:PORT/socket.io/?EIO=4&transport=websocket`` and reads the engine.io OPEN
  packet ``0{"sid": ..., "pingInterval": ...}``; it never sends the socket.io CONNECT ``40``
  (the server's own ``40``, if any, is only counted);
- it sends engine.io PINGs ``2`` itself every ``pingInterval`` and counts the PONGs ``3``;
- it sends ``42["telemetry",{...}]`` with string fields ``steering_angle`` (degrees),
  ``throttle``, ``speed`` (mph) and ``image`` (base64 JPEG, 320x160), or ``{}`` while a person
  drives, and receives ``42["steer",{...}]`` and ``42["manual",{}]``.

With ``autoreply=True`` it acts like the simulator in Autonomous mode: one telemetry on
connecting and one in reply to each ``steer`` or ``manual``, from a small car model and a cycle of
synthetic road frames. The time from sending each telemetry to receiving its reply is kept in
:attr:`FakeSimulator.round_trips_ms` (the bridge's latency, :mod:`agent.bench.bridge`).
"""

from __future__ import annotations

import base64
import collections
import json
import threading
import time
from typing import Any

import cv2
import numpy as np
import websocket

FRAME_H, FRAME_W = 160, 320


def synthetic_road_frame(i: int = 0, curve: float = 0.0) -> np.ndarray:
    """A (160, 320, 3) uint8 RGB picture of a road ahead: sky, grass, grey road with lane lines.

    ``i`` shifts the dashes (motion) and ``curve`` (-1..1) bends the road; deterministic.
    """
    img = np.empty((FRAME_H, FRAME_W, 3), np.uint8)
    horizon = 60
    img[:horizon] = np.linspace((150, 190, 235), (200, 220, 240), horizon).astype(np.uint8)[:, None, :]
    img[horizon:] = (70, 120, 50)
    rows = np.arange(horizon, FRAME_H)
    depth = (rows - horizon + 1) / (FRAME_H - horizon)  # 0 far .. 1 near
    centre = FRAME_W / 2 + curve * 120 * (1 - depth) ** 2
    half = 15 + 150 * depth
    cols = np.arange(FRAME_W)[None, :]
    road = np.abs(cols - centre[:, None]) < half[:, None]
    img[horizon:][road] = (95, 95, 100)
    edge = np.abs(np.abs(cols - centre[:, None]) - half[:, None]) < 1 + 2 * depth[:, None]
    img[horizon:][edge] = (230, 230, 230)
    on_dash = (np.log(depth * 20 + 1) * 8 + i * 0.7) % 2 < 1
    dash = on_dash[:, None] & (np.abs(cols - centre[:, None]) < 1 + 2 * depth[:, None])
    img[horizon:][dash] = (240, 220, 60)
    noise = np.random.default_rng(i).integers(0, 12, img.shape, dtype=np.uint8)
    return cv2.add(img, noise)


def encode_frame_b64(frame_rgb: np.ndarray, quality: int = 75) -> str:
    """JPEG-encode an RGB frame and base64 it, as the simulator's ``image`` field."""
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(frame_rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return base64.b64encode(buf.tobytes()).decode("ascii")


def event_frame(name: str, data: Any) -> str:
    """The websocket text frame of a socket.io event as the simulator sends it: ``42[name,data]``."""
    return "42" + json.dumps([name, data], separators=(",", ":"))


class FakeSimulator:
    """A wire-level fake of the Udacity simulator (see the module docstring).

    Args:
        port: the bridge's port; host: its address.
        autoreply: behave like the simulator in Autonomous mode (telemetry on connect and in reply
            to each ``steer``/``manual``); otherwise send only what the caller asks for.
        frames: RGB frames to cycle through (default: 8 synthetic road frames); their JPEGs are
            encoded once, up front.
        ping_interval: seconds between engine.io PINGs; None uses the server's ``pingInterval``.
        timeout: seconds to wait for the connection and the OPEN packet.
        history: events kept per name for :meth:`next_event` (older ones are forgotten).
    """

    def __init__(self, port: int, host: str = "127.0.0.1", *, autoreply: bool = False,
                 frames: list[np.ndarray] | None = None, ping_interval: float | None = None,
                 timeout: float = 5.0, history: int = 10_000):
        self.host, self.port = host, int(port)
        self.autoreply = autoreply
        self.frames = frames if frames is not None else [synthetic_road_frame(i, np.sin(i / 3)) for i in range(8)]
        self.frames_b64 = [encode_frame_b64(f) for f in self.frames]
        self.ping_interval = ping_interval
        self.timeout = timeout
        #: Set True to act as if a person held W/S: telemetry is then ``{}``.
        self.manual_driving = False
        #: Counts of what arrived: event names ("steer", "manual", ...), "pong", "connect_ack" ("40"), "other".
        self.counts: collections.Counter[str] = collections.Counter()
        #: Round trips in ms (telemetry sent -> its reply received), in autoreply mode.
        self.round_trips_ms: list[float] = []
        #: The last telemetry values sent: steering_angle (deg), throttle, speed (mph), frame index.
        self.sent: dict[str, Any] = {}
        self.sid: str | None = None
        self.open_packet: dict | None = None
        self.speed_mph = 0.0
        self.steering = 0.0
        self.throttle_in = 0.0
        self._frame_i = 0
        self._ws: websocket.WebSocket | None = None
        self._cond = threading.Condition()
        self._history: dict[str, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=history))
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._t_sent: float | None = None
        self.closed_by_server = False

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/socket.io/?EIO=4&transport=websocket"

    # -- connection ---------------------------------------------------------------------------

    def connect(self) -> FakeSimulator:
        """Open the websocket, read the OPEN packet, start the reader and pinger threads."""
        self._ws = websocket.create_connection(self.url, timeout=self.timeout, enable_multithread=True)
        first = self._ws.recv()
        if not isinstance(first, str) or not first.startswith("0"):
            raise ConnectionError(f"expected an engine.io OPEN packet, got {first!r}")
        self.open_packet = json.loads(first[1:])
        self.sid = self.open_packet["sid"]
        if self.ping_interval is None:
            self.ping_interval = self.open_packet.get("pingInterval", 25000) / 1000.0
        self._ws.settimeout(None)
        for target in (self._reader, self._pinger):
            t = threading.Thread(target=target, daemon=True, name=f"fake-sim-{target.__name__}")
            t.start()
            self._threads.append(t)
        if self.autoreply:  # the simulator's OnOpen emits telemetry once
            self.send_next()
        return self

    def close(self) -> None:
        """Close the connection (as the simulator does when it quits) and stop the threads."""
        self._stop.set()
        if self._ws is not None:
            try:
                self._ws.close(timeout=1.0)
            except Exception:  # noqa: BLE001 - already closed
                pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(2.0)

    def __enter__(self) -> FakeSimulator:
        return self.connect() if self._ws is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._ws is not None and self._ws.connected and not self.closed_by_server

    # -- sending ------------------------------------------------------------------------------

    def send_raw(self, text: str) -> None:
        """Send one websocket text frame as is."""
        self._ws.send(text)

    def send_binary(self, data: bytes) -> None:
        """Send one websocket binary frame (the simulator never does)."""
        self._ws.send_binary(data)

    def send_event(self, name: str, data: Any) -> None:
        self.send_raw(event_frame(name, data))

    def ping(self) -> None:
        """An engine.io PING ("2"); the server answers with a PONG ("3")."""
        self.send_raw("2")

    def send_telemetry(self, steering_angle: float = 0.0, throttle: float = 0.0, speed: float = 0.0,
                       image: str | None = None, frame_index: int | None = None) -> float:
        """Send an autonomous-mode telemetry (numbers formatted like C#'s ``N4``); returns the send time."""
        if image is None:
            frame_index = self._frame_i if frame_index is None else frame_index
            image = self.frames_b64[frame_index % len(self.frames_b64)]
        data = {"steering_angle": f"{steering_angle:.4f}", "throttle": f"{throttle:.4f}",
                "speed": f"{speed:.4f}", "image": image}
        self.sent = {"steering_angle": steering_angle, "throttle": throttle, "speed": speed,
                     "frame_index": frame_index}
        frame = event_frame("telemetry", data)
        t = time.perf_counter()
        self._t_sent = t
        self.send_raw(frame)
        return t

    def send_manual(self) -> float:
        """The empty telemetry the simulator sends while a person drives."""
        t = time.perf_counter()
        self._t_sent = t
        self.send_event("telemetry", {})
        return t

    def send_next(self) -> None:
        """What the simulator sends next in autoreply mode (on connecting and after each reply): the
        toy car's telemetry on the next frame of the cycle, or ``{}`` while :attr:`manual_driving`.
        A subclass that plays other frames (:class:`envs.udacity.replay.ReplaySimulator`) overrides it."""
        if self.manual_driving:
            time.sleep(0.002)  # the simulator answers once per rendered frame
            self.send_manual()
            return
        i = self._frame_i
        self._frame_i += 1
        self.send_telemetry(self.steering * 25.0, self.throttle_in, self.speed_mph, frame_index=i)

    # -- receiving ----------------------------------------------------------------------------

    def next_event(self, name: str, timeout: float = 5.0) -> Any:
        """The oldest not yet taken ``name`` event's data; raises TimeoutError if none arrives."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._history[name]:
                remaining = deadline - time.monotonic()
                if (remaining <= 0 or not self._cond.wait(remaining)) and not self._history[name]:
                    raise TimeoutError(f"no {name!r} event within {timeout:g} s (counts: {dict(self.counts)})")
            return self._history[name].popleft()

    def wait_for(self, predicate, timeout: float = 5.0) -> bool:
        """Wait until ``predicate(counts)`` holds; returns whether it did."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.counts), timeout)

    def _reader(self) -> None:
        ws = self._ws
        while not self._stop.is_set():
            try:
                opcode, data = ws.recv_data()
            except Exception:  # noqa: BLE001 - connection closed
                break
            if opcode == websocket.ABNF.OPCODE_CLOSE:
                break
            text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            t = time.perf_counter()
            if text.startswith("42"):
                try:
                    name, *args = json.loads(text[2:])
                except (ValueError, TypeError):
                    name, args = "other", [text]
                payload = args[0] if args else None
                if self.autoreply and name in ("steer", "manual") and self._t_sent is not None:
                    self.round_trips_ms.append((t - self._t_sent) * 1e3)
                    self._t_sent = None
                with self._cond:
                    self.counts[name] += 1
                    self._history[name].append(payload)
                    self._cond.notify_all()
                if self.autoreply and name in ("steer", "manual"):
                    try:
                        self.answer(name, payload)
                    except Exception:  # noqa: BLE001 - closed meanwhile
                        break
            else:
                key = "connect_ack" if text == "40" else {"3": "pong", "6": "noop", "1": "close"}.get(text[:1], "other")
                with self._cond:
                    self.counts[key] += 1
                    self._history[key].append(text)
                    self._cond.notify_all()
        if not self._stop.is_set():
            self.closed_by_server = True
        with self._cond:
            self.counts["disconnected"] += 1
            self._cond.notify_all()

    def answer(self, name: str, payload: Any) -> None:
        """Autoreply mode, in the reader thread: the bridge replied ``name`` ("steer" or "manual") with
        ``payload`` to the last telemetry. The simulator drives the toy car on ``steer``, then sends its
        next telemetry (:meth:`send_next`); a subclass may override it (an error ends the reader)."""
        if name == "steer":
            self._drive(payload)
        self.send_next()

    def _drive(self, payload: Any) -> None:
        """A toy car: the steer command sets the wheel; throttle accelerates, negative brakes."""
        try:
            self.steering = float(payload["steering_angle"])
            throttle = float(payload["throttle"])
        except (TypeError, KeyError, ValueError):
            return
        self.throttle_in = throttle
        self.speed_mph = min(max(self.speed_mph + 1.5 * throttle - 0.02 * self.speed_mph, 0.0), 30.0)

    def _pinger(self) -> None:
        while not self._stop.wait(self.ping_interval):
            try:
                self.ping()
                with self._cond:
                    self.counts["ping_sent"] += 1
            except Exception:  # noqa: BLE001 - connection closed
                break


__all__ = ["FRAME_H", "FRAME_W", "FakeSimulator", "encode_frame_b64", "event_frame", "synthetic_road_frame"]
