"""The Udacity self-driving-car simulator as a ``gymnasium.Env`` (a socket.io bridge).

The simulator (udacity/self-driving-car-sim, "Autonomous mode") is the socket.io *client*: it
opens ``ws://127.0.0.1:4567/socket.io/?EIO=4&transport=websocket`` and we are the server. Facts
from its source (DESIGN.md section 5):

- It speaks the old protocol despite the ``EIO=4`` in its URL: it sends engine.io PINGs ("2")
  itself and expects PONGs ("3"), and it never sends the socket.io namespace CONNECT ("40").
  python-socketio 5 servers ignore its events. We serve it with python-socketio 4.6 and
  python-engineio 3.13 (3.14 and later reject the ``EIO=4`` query with HTTP 400).
- Sim -> us: event ``telemetry`` with string fields ``steering_angle`` (degrees, about +-25),
  ``throttle`` (0..1), ``speed`` (mph, 0..30) and ``image`` (base64 JPEG, 320x160 RGB). It sends
  one on connecting, then exactly one in reply to each ``steer`` or ``manual`` of ours. While a
  person drives (W/S held) it sends an empty ``{}``, which we answer with ``manual`` ``{}``.
- Us -> sim: event ``steer`` with ``steering_angle`` (a string, normalised to [-1, 1]; the
  simulator multiplies it by its 25 degree maximum) and ``throttle`` (a string, -1..1; negative
  brakes while the car moves forward faster than about 5 mph and reverses below that).

So the protocol is lock-step: every autonomous ``step`` sends one ``steer`` in reply to the last
frame and waits for the next frame. :class:`UdacityEnv` does that; :class:`UdacityBridge` is the
socket.io server it runs in a background thread (an asyncio loop with aiohttp, so nothing is
monkey-patched). Nothing here trusts the simulator's bytes: every malformed message (bad base64,
truncated or non-JPEG images, wrong sizes, missing or non-numeric fields, garbage frames, unknown
events) is logged to the ``envs.udacity.bridge`` logger, then answered with ``manual`` (telemetry: it asks
for a fresh frame, so the simulator never stalls) or dropped (anything else); all queues are
bounded and websocket frames are limited to ``max_message_bytes``. One limit: a JPEG that is
structurally complete but has corrupted entropy data decodes to a damaged picture (libjpeg
reports that only as a warning); truncated, foreign-format or wrongly sized images are refused.

Security: the server listens on 127.0.0.1 by default, so only programs on this machine can
connect; on another interface anybody who can reach the port could steer the car and read the
camera. Web pages cannot connect: engine.io refuses foreign origins and, on loopback, the bridge
refuses a Host header that is not a loopback name (DNS rebinding). Long-polling (which the
simulator never uses) is refused, and at most ``MAX_CONNECTIONS`` connections are served.
When several simulators are connected, the env drives the newest one that has sent telemetry.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import io
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import socketio
from aiohttp import WSMsgType, web
from PIL import Image
from socketio import packet as sio_packet

LOGGER = logging.getLogger("envs.udacity.bridge")
#: python-socketio and python-engineio log every packet at INFO; they get this quieter child logger.
_LIB_LOGGER = logging.getLogger("envs.udacity.socketio")
if _LIB_LOGGER.level == logging.NOTSET:
    _LIB_LOGGER.setLevel(logging.WARNING)

ENV_ID = "agent/Udacity-v0"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4567
#: The camera frame the simulator sends: 160 rows x 320 columns, RGB.
FRAME_SHAPE = (160, 320, 3)
#: The simulator's steering limit in degrees; a normalised steering of 1.0 means this angle.
MAX_STEERING_DEG = 25.0
#: The largest websocket frame accepted (bytes). A real frame is 10-30 kB of base64 JPEG.
MAX_MESSAGE_BYTES = 1 << 20
#: Events (frames, manual-driving notices, connects) waiting for the env; the oldest are dropped beyond.
EVENT_CAPACITY = 64
#: Replies waiting to be written to one simulator; further replies are dropped (with a log line).
MAX_PENDING_REPLIES = 64
#: While reset() waits, a connected simulator silent for this long (seconds) is asked for a frame.
SOLICIT_AFTER_S = 1.0
#: Simultaneous connections accepted (the simulator opens one; a restarted one may overlap briefly).
MAX_CONNECTIONS = 4
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

_ENGINEIO_TYPES_FROM_SIM = frozenset("124")  # CLOSE, PING, MESSAGE: all the simulator sends
_JPEG_SOI, _JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
_NUMBER_MAX_CHARS = 32


def _preview(value: Any, limit: int = 80) -> str:
    """A short repr for log lines (payloads may be megabytes)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class TelemetryError(ValueError):
    """A ``telemetry`` message from the simulator that cannot be used (the reason is the message)."""


@dataclass(frozen=True)
class Telemetry:
    """One autonomous-mode frame from the simulator.

    Attributes:
        frame: the centre camera, (160, 320, 3) uint8 RGB.
        steering_angle_deg: the car's current steering angle in degrees (about -25..25).
        throttle: the car's current throttle (acceleration input), about -1..1.
        speed_mph: the car's speed in miles per hour (0..30).
        time_s: when the message arrived, in ``time.perf_counter()`` seconds.
        sid: the engine.io session of the simulator that sent it.
    """

    frame: np.ndarray
    steering_angle_deg: float
    throttle: float
    speed_mph: float
    time_s: float
    sid: str = ""


def parse_number(value: Any, name: str) -> float:
    """A finite float from a telemetry field: a string as the simulator sends, or a JSON number.

    The simulator formats numbers with C#'s ``ToString("N4")``, which follows the machine's
    locale: "1,234.5678" (thousands separator) or "12,3456" (decimal comma) are both accepted.

    Raises:
        TelemetryError: missing, of another type, not a number, not finite, or absurdly long.
    """
    if isinstance(value, bool) or value is None:
        raise TelemetryError(f"field {name!r} is {_preview(value)}, not a number")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip()
        if not text or len(text) > _NUMBER_MAX_CHARS:
            raise TelemetryError(f"field {name!r} is {_preview(value)}, not a number")
        if "," in text:
            text = text.replace(",", "") if "." in text else text.replace(",", ".")
        try:
            number = float(text)
        except ValueError:
            raise TelemetryError(f"field {name!r} is {_preview(value)}, not a number") from None
    else:
        raise TelemetryError(f"field {name!r} is a {type(value).__name__}, not a number string")
    if not math.isfinite(number):
        raise TelemetryError(f"field {name!r} is {_preview(value)}, not finite")
    return number


def decode_frame(image_b64: Any) -> np.ndarray:
    """Decode the simulator's ``image`` field (base64 JPEG) to a (160, 320, 3) uint8 RGB array.

    The JPEG header is checked (format and 320x160 size) before any pixel is decoded, so a
    forged header cannot make us allocate a huge image; a truncated JPEG is refused rather
    than returned with grey rows.

    Raises:
        TelemetryError: not a string, not base64, not a complete JPEG, or not 320x160.
    """
    if not isinstance(image_b64, str):
        raise TelemetryError(f"field 'image' is a {type(image_b64).__name__}, not a base64 string")
    if not image_b64:
        raise TelemetryError("field 'image' is empty")
    try:
        data = base64.b64decode(image_b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise TelemetryError(f"field 'image' is not valid base64 ({e})") from None
    if not data.startswith(_JPEG_SOI):
        raise TelemetryError(f"field 'image' is not a JPEG (starts with {data[:4]!r})")
    if _JPEG_EOI not in data[-32:]:
        raise TelemetryError(f"field 'image' is a truncated JPEG ({len(data)} bytes, no end marker)")
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
            width, height = img.size
            if (height, width) != FRAME_SHAPE[:2]:
                raise TelemetryError(f"field 'image' is {width}x{height}, expected "
                                     f"{FRAME_SHAPE[1]}x{FRAME_SHAPE[0]}")
            img.load()
            frame = np.asarray(img if img.mode == "RGB" else img.convert("RGB"), dtype=np.uint8)
    except TelemetryError:
        raise
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, ... on corrupt data
        raise TelemetryError(f"field 'image' is not a decodable JPEG ({type(e).__name__}: {e})") from None
    if frame.shape != FRAME_SHAPE:  # e.g. a CMYK JPEG converted oddly
        raise TelemetryError(f"field 'image' decoded to shape {frame.shape}, expected {FRAME_SHAPE}")
    return frame


def decode_telemetry(data: Any, time_s: float = 0.0, sid: str = "") -> Telemetry | None:
    """Validate and decode the payload of one ``telemetry`` event.

    Args:
        data: the event's argument as parsed from JSON.
        time_s: arrival time (``time.perf_counter()`` seconds), stored in the result.
        sid: the simulator's session id, stored in the result.

    Returns:
        A :class:`Telemetry`, or None for the empty ``{}`` (or null) the simulator sends while a
        person drives.

    Raises:
        TelemetryError: anything else that is not a complete autonomous-mode frame.
    """
    if data is None or (isinstance(data, dict) and not data):
        return None
    if not isinstance(data, dict):
        raise TelemetryError(f"payload is a {type(data).__name__} ({_preview(data)}), not an object")
    missing = [k for k in ("steering_angle", "throttle", "speed", "image") if k not in data]
    if missing:
        raise TelemetryError(f"payload lacks {', '.join(missing)} (has {_preview(sorted(map(str, data))[:8])})")
    steering = parse_number(data["steering_angle"], "steering_angle")
    throttle = parse_number(data["throttle"], "throttle")
    speed = parse_number(data["speed"], "speed")
    frame = decode_frame(data["image"])
    return Telemetry(frame, steering, throttle, speed, time_s, sid)


class ThrottleController:
    """A PI speed controller: the throttle command that holds the car at ``target_speed`` mph.

    With the error ``e = target_speed - speed`` (mph) the command is
    ``kp * e + ki * integral(e dt)`` (dt in seconds), clamped to ``[0, max_throttle]`` while the
    car is at most ``brake_margin`` mph above the target (it coasts; a negative throttle at low
    speed would make the simulator reverse) and to ``[-max_brake, max_throttle]`` above that
    (negative throttle is the simulator's foot brake). Anti-windup: the integral only grows
    while the command is not saturated, and stays within ``+-integral_limit`` mph*s.

    Udacity's own ``drive.py`` uses a PI controller too (kp 0.1, ki 0.002 per frame, 9 mph).
    """

    def __init__(self, target_speed: float = 15.0, kp: float = 0.1, ki: float = 0.05,
                 max_throttle: float = 1.0, max_brake: float = 1.0, brake_margin: float = 3.0,
                 integral_limit: float = 20.0):
        if target_speed < 0 or kp < 0 or ki < 0 or brake_margin < 0:
            raise ValueError("target_speed, kp, ki and brake_margin must be >= 0")
        if not (0 < max_throttle <= 1 and 0 <= max_brake <= 1):
            raise ValueError("max_throttle must be in (0, 1] and max_brake in [0, 1]")
        self.target_speed = float(target_speed)
        self.kp, self.ki = float(kp), float(ki)
        self.max_throttle, self.max_brake = float(max_throttle), float(max_brake)
        self.brake_margin = float(brake_margin)
        self.integral_limit = float(integral_limit)
        self.integral = 0.0

    def reset(self) -> None:
        """Forget the accumulated error (call at the start of an episode)."""
        self.integral = 0.0

    def __call__(self, speed_mph: float, dt_s: float = 0.05) -> float:
        """The throttle command (-1..1) for the measured speed (mph), ``dt_s`` seconds after the last call."""
        speed = float(speed_mph)
        error = self.target_speed - speed
        low = -self.max_brake if speed > self.target_speed + self.brake_margin else 0.0
        integral = self.integral + error * max(float(dt_s), 0.0)
        command = self.kp * error + self.ki * integral
        winding_up = (command > self.max_throttle and error > 0) or (command < low and error < 0)
        if not winding_up:  # conditional integration (anti-windup)
            self.integral = min(max(integral, -self.integral_limit), self.integral_limit)
        command = self.kp * error + self.ki * self.integral
        return float(min(max(command, low), self.max_throttle))


@dataclass(frozen=True)
class _Event:
    kind: str  # "connect", "telemetry", "manual" or "disconnect"
    sid: str
    time_s: float
    telemetry: Telemetry | None = None


class _EventQueue:
    """A thread-safe FIFO that keeps at most ``capacity`` events, dropping the oldest."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.dropped = 0
        self._items: collections.deque[_Event] = collections.deque()
        self._cond = threading.Condition()

    def put(self, event: _Event) -> None:
        with self._cond:
            if len(self._items) >= self.capacity:
                old = self._items.popleft()
                self.dropped += 1
                LOGGER.debug("event queue full (the env is not stepping): dropped the oldest %s event", old.kind)
            self._items.append(event)
            self._cond.notify()

    def get(self, timeout: float) -> _Event | None:
        with self._cond:
            if not self._items:
                self._cond.wait_for(lambda: self._items, max(timeout, 0.0))
            return self._items.popleft() if self._items else None

    def clear(self) -> None:
        with self._cond:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class _GuardedWebSocket:
    """engineio 3's aiohttp websocket wrapper, plus a frame-size limit and a garbage filter.

    engineio decodes a frame before its own error handling and ends the connection on anything
    it cannot parse, so frames that are not engine.io packets the simulator sends (CLOSE, PING,
    MESSAGE, as text) are logged and skipped here instead.
    """

    def __init__(self, handler, bridge: UdacityBridge):
        self.handler = handler
        self.bridge = bridge
        self.sid = getattr(getattr(handler, "__self__", None), "sid", None)  # the engine.io socket's
        self._sock: web.WebSocketResponse | None = None

    async def __call__(self, environ):
        request = environ["aiohttp.request"]
        self._sock = web.WebSocketResponse(max_msg_size=self.bridge.max_message_bytes, compress=False)
        await self._sock.prepare(request)
        self.bridge._open_websockets.add(self)
        try:
            await self.handler(self)
        finally:
            self.bridge._open_websockets.discard(self)
        return self._sock

    async def close(self):
        await self._sock.close()

    async def send(self, message):
        if isinstance(message, bytes):
            await self._sock.send_bytes(message)
        else:
            await self._sock.send_str(message)

    async def wait(self):
        while True:
            msg = await self._sock.receive()
            if msg.type == WSMsgType.TEXT:
                text = msg.data
                if text and text[0] in _ENGINEIO_TYPES_FROM_SIM:
                    return text
                self.bridge._drop("websocket text frame", self.sid, f"not an engine.io packet the simulator "
                                                                    f"sends: {_preview(text)}")
            elif msg.type == WSMsgType.BINARY:
                self.bridge._drop("websocket binary frame", self.sid, f"{len(msg.data)} bytes (the simulator "
                                                                      f"sends text)")
            elif msg.type == WSMsgType.ERROR:
                # aiohttp ends the connection after this (e.g. a frame over max_message_bytes)
                LOGGER.warning("websocket error from simulator %s, closing its connection: %s", self.sid, msg.data)
                self.bridge.stats["websocket_errors"] += 1
                raise OSError(str(msg.data))
            else:  # CLOSE, CLOSING, CLOSED
                raise OSError("websocket closed")


class _SimulatorServer(socketio.AsyncServer):
    """python-socketio 4's server with its message dispatch replaced by a strict one.

    Only socket.io EVENT packets on the default namespace reach the bridge; everything else
    (malformed JSON, other packet types, binary attachments that would swallow the next
    message, other namespaces) is logged and dropped instead of raising inside engineio.
    """

    def __init__(self, bridge: UdacityBridge, **kwargs):
        super().__init__(**kwargs)
        self._bridge = bridge

    async def _handle_eio_message(self, sid, data):
        bridge = self._bridge
        bridge.stats["messages"] += 1
        if not isinstance(data, str):
            bridge._drop("engine.io message", sid, f"payload {_preview(data)} is not a socket.io packet")
            return
        try:
            pkt = sio_packet.Packet(encoded_packet=data)
        except Exception as e:  # noqa: BLE001 - json errors, bad types
            bridge._drop("socket.io packet", sid, f"{type(e).__name__} ({e}) in {_preview(data)}")
            return
        if pkt.packet_type != sio_packet.EVENT:
            bridge._drop("socket.io packet", sid, f"type {_preview(pkt.packet_type)} is not EVENT: {_preview(data)}")
            return
        if pkt.namespace not in (None, "/"):
            bridge._drop("socket.io event", sid, f"namespace {_preview(pkt.namespace)} is not '/'")
            return
        if not isinstance(pkt.data, list) or not pkt.data or not isinstance(pkt.data[0], str):
            bridge._drop("socket.io event", sid, f"{_preview(pkt.data)} is not [name, args...]")
            return
        if pkt.data[0] != "telemetry":
            bridge._drop("socket.io event", sid, f"unknown event {_preview(pkt.data[0])}")
            return
        await bridge._on_telemetry(sid, pkt.data[1] if len(pkt.data) > 1 else None)


class UdacityBridge:
    """The socket.io server the simulator connects to, run by an asyncio loop in a daemon thread.

    The env talks to it from its own thread: frames arrive through a bounded event queue and
    commands leave through :meth:`send`. Manual-driving notices and malformed telemetry are
    answered here, in the server thread, so the simulator keeps running even when nobody steps.

    Args:
        host: interface to listen on (loopback by default; see the module docstring).
        port: TCP port; 0 picks a free one, readable from :attr:`port` after :meth:`start`.
        max_message_bytes: the largest websocket frame accepted; a larger one ends that connection.
        event_capacity: frames and notices kept for the env before the oldest are dropped.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, event_capacity: int = EVENT_CAPACITY):
        self.host = host
        self.port = int(port)
        self.max_message_bytes = int(max_message_bytes)
        self.events = _EventQueue(event_capacity)
        #: Counters: messages, telemetry, manual, malformed, dropped, replies, connects, disconnects, ...
        self.stats: collections.Counter[str] = collections.Counter()
        self._connected: dict[str, float] = {}  # sid -> connect time; newest last
        self._talked: set[str] = set()  # connected sids that have sent telemetry (real simulators)
        self._open_websockets: set[_GuardedWebSocket] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._sio: _SimulatorServer | None = None

    @property
    def url(self) -> str:
        """The address the simulator connects to."""
        return f"ws://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def is_connected(self, sid: str) -> bool:
        return sid in self._connected

    def superseded(self, sid: str) -> bool:
        """Whether a simulator that connected after ``sid`` has sent telemetry (a restarted one).

        The env drives the newest simulator that talks; a connection that never sends telemetry
        (not a simulator) supersedes nothing.
        """
        connected, talked = dict(self._connected), set(self._talked)  # copies: the server thread mutates
        since = connected.get(sid)
        return since is not None and any(connected.get(other, -math.inf) > since for other in talked)

    def newest_sid(self) -> str | None:
        """The most recently connected simulator that is still connected, if any."""
        sids = list(self._connected)
        return sids[-1] if sids else None

    # -- lifecycle (caller's thread) ------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> int:
        """Start serving (idempotent); returns the bound port.

        Raises:
            OSError: the port is taken (another bridge, or Udacity's drive.py, may be running).
        """
        if self.running:
            return self.port
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), daemon=True,
                                        name=f"udacity-bridge-{self.port}")
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"the Udacity bridge did not start within {timeout:g} s")
        if failure:
            self._thread.join()
            self._thread = None
            raise OSError(f"cannot serve the Udacity simulator on {self.host}:{self.port}: {failure[0]} "
                          f"(is another bridge or drive.py running? choose another port)") from failure[0]
        if self.host not in ("127.0.0.1", "localhost", "::1"):
            LOGGER.warning("Udacity bridge listens on %s: anyone who can reach port %d can steer the car",
                           self.host, self.port)
        LOGGER.info("Udacity bridge listening on %s", self.url)
        return self.port

    def stop(self, timeout: float = 5.0) -> None:
        """Close every connection and stop the server thread (idempotent)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if thread.is_alive():
                LOGGER.warning("the Udacity bridge thread did not stop within %g s", timeout)
        self._thread = None
        self._connected.clear()
        self._talked.clear()
        self.events.clear()

    def send(self, sid: str, event: str, data: dict) -> None:
        """Send ``event`` with ``data`` to simulator ``sid`` (thread-safe, does not wait)."""
        loop = self._loop
        if loop is None or not self.running:
            LOGGER.debug("bridge not running: %s not sent", event)
            return
        future = asyncio.run_coroutine_threadsafe(self._emit(sid, event, data), loop)
        future.add_done_callback(_log_failure)

    # -- the server thread ----------------------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as e:  # noqa: BLE001 - reported to start()
            failure.append(e)
            ready.set()
            loop.run_until_complete(self._shutdown())
            loop.close()
            return
        ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()

    async def _serve(self) -> None:
        sio = _SimulatorServer(self, async_mode="aiohttp", async_handlers=False, logger=_LIB_LOGGER,
                               engineio_logger=_LIB_LOGGER, max_http_buffer_size=self.max_message_bytes)
        # engineio picks its websocket wrapper from the driver table; ours filters and limits frames
        sio.eio._async = dict(sio.eio._async, websocket=lambda handler: _GuardedWebSocket(handler, self))
        sio.on("connect", self._on_connect)
        sio.on("disconnect", self._on_disconnect)
        self._sio = sio
        app = web.Application(client_max_size=self.max_message_bytes, middlewares=[self._guard])
        sio.attach(app)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        """Refuse what the simulator never does: long-polling, a foreign Host, too many connections.

        The Host check stops DNS rebinding (a web page whose name resolves to 127.0.0.1 would
        pass engine.io's same-origin check) while the bridge listens on loopback.
        """
        reason = None
        if request.headers.get("Upgrade", "").lower() != "websocket":
            reason, status = "not a websocket request (the simulator does not use long-polling)", 400
        elif self.host in _LOOPBACK_NAMES and (request.url.host or "").strip("[]") not in _LOOPBACK_NAMES:
            reason, status = f"Host {request.host!r} is not a loopback name", 403
        elif len(self._open_websockets) >= MAX_CONNECTIONS:
            reason, status = f"already {len(self._open_websockets)} connections", 503
        if reason is not None:
            self.stats["refused"] += 1
            LOGGER.warning("refused a connection from %s: %s", request.remote, reason)
            return web.Response(status=status, text=reason + "\n")
        return await handler(request)

    async def _shutdown(self) -> None:
        for ws in list(self._open_websockets):
            try:
                await asyncio.wait_for(ws.close(), 1.0)
            except Exception:  # noqa: BLE001 - best effort; the runner cleans up the rest
                pass
        if self._runner is not None:
            try:
                await asyncio.wait_for(self._runner.cleanup(), 3.0)
            except Exception as e:  # noqa: BLE001
                LOGGER.debug("bridge cleanup: %s", e)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_connect(self, sid: str, environ: dict) -> None:
        request = environ.get("aiohttp.request")
        peer = getattr(request, "remote", None) or "?"
        self._connected[sid] = time.perf_counter()
        self.stats["connects"] += 1
        LOGGER.info("Udacity simulator connected from %s (session %s)", peer, sid)
        self.events.put(_Event("connect", sid, time.perf_counter()))

    async def _on_disconnect(self, sid: str) -> None:
        self._connected.pop(sid, None)
        self._talked.discard(sid)
        self.stats["disconnects"] += 1
        LOGGER.info("Udacity simulator disconnected (session %s)", sid)
        self.events.put(_Event("disconnect", sid, time.perf_counter()))

    async def _on_telemetry(self, sid: str, data: Any) -> None:
        t = time.perf_counter()
        self.stats["telemetry"] += 1
        if sid in self._connected:
            self._talked.add(sid)
        try:
            telemetry = decode_telemetry(data, time_s=t, sid=sid)
        except TelemetryError as e:
            self.stats["malformed"] += 1
            LOGGER.warning("malformed telemetry from simulator %s, answered with 'manual' to ask for another "
                           "frame: %s", sid, str(e))
            await self._emit(sid, "manual", {})
            return
        if telemetry is None:  # a person is driving: acknowledge so the simulator keeps talking
            self.stats["manual"] += 1
            await self._emit(sid, "manual", {})
            self.events.put(_Event("manual", sid, t))
        else:
            self.events.put(_Event("telemetry", sid, t, telemetry))

    def _drop(self, what: str, sid: str | None, reason: str) -> None:
        self.stats["dropped"] += 1
        LOGGER.warning("dropped a %s from simulator %s: %s", what, sid or "?", reason)

    async def _emit(self, sid: str, event: str, data: dict) -> bool:
        sio = self._sio
        sock = sio.eio.sockets.get(sid) if sio is not None else None
        if sock is None or sock.closed or sock.closing:
            LOGGER.debug("simulator %s is gone: %s not sent", sid, event)
            return False
        if sock.queue.qsize() >= MAX_PENDING_REPLIES:
            self.stats["replies_dropped"] += 1
            LOGGER.warning("simulator %s is not reading (%d replies queued): dropped %s", sid,
                           sock.queue.qsize(), event)
            return False
        # socket.io 4's own emit() cannot run on Python >= 3.11 (it passes coroutines to
        # asyncio.wait), so the EVENT packet is encoded here and handed to engine.io directly.
        encoded = sio_packet.Packet(sio_packet.EVENT, data=[event, data]).encode()
        await sio.eio.send(sid, encoded, binary=False)
        self.stats["replies"] += 1
        await asyncio.sleep(0)  # let the writer task send it before the next frame is read (fairness)
        return True


def _log_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        LOGGER.warning("sending to the simulator failed: %r", future.exception())


def _format_number(x: float) -> str:
    return format(x, ".6f")


class UdacityEnv(gym.Env):
    """The Udacity simulator in autonomous mode as a gymnasium env (DESIGN.md section 5).

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
        """Start the socket.io server if it is not running; returns the bound port."""
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


__all__ = [
    "DEFAULT_HOST", "DEFAULT_PORT", "ENV_ID", "FRAME_SHAPE", "MAX_CONNECTIONS", "MAX_MESSAGE_BYTES", "MAX_STEERING_DEG",
    "Telemetry", "TelemetryError", "ThrottleController", "UdacityBridge", "UdacityEnv", "decode_frame",
    "decode_telemetry", "parse_number",
]
