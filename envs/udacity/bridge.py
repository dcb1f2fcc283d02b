"""The socket.io server the Udacity simulator connects to (:class:`UdacityBridge`): the transport.

The simulator speaks the old socket.io protocol (:mod:`envs.udacity.protocol`); python-socketio 5
servers ignore its events. We serve it with python-socketio 4.6 and python-engineio 3.13 (3.14
and later reject the ``EIO=4`` query with HTTP 400), in a background thread running an asyncio
loop with aiohttp, so nothing is monkey-patched. :class:`envs.udacity.env.UdacityEnv` drives it.

Nothing here trusts the simulator's bytes: every malformed message (bad base64, truncated or
non-JPEG images, wrong sizes, missing or non-numeric fields, garbage frames, unknown events) is
logged to the ``envs.udacity.bridge`` logger, then answered with ``manual`` (telemetry: it asks
for a fresh frame, so the simulator never stalls) or dropped (anything else); all queues are
bounded and websocket frames are limited to ``max_message_bytes``.

Security: the server listens on 127.0.0.1 by default, so only programs on this machine can
connect; on another interface anybody who can reach the port could steer the car and read the
camera. Web pages cannot connect: engine.io refuses foreign origins and, on loopback, the bridge
refuses a Host header that is not a loopback name (DNS rebinding). Long-polling (which the
simulator never uses) is refused, and at most ``MAX_CONNECTIONS`` connections are served.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

import socketio
from aiohttp import WSMsgType, web
from socketio import packet as sio_packet

from envs.udacity.protocol import (DEFAULT_PORT, MAX_MESSAGE_BYTES, Telemetry, TelemetryError, _preview,
                                   decode_telemetry)

LOGGER = logging.getLogger("envs.udacity.bridge")
#: python-socketio and python-engineio log every packet at INFO; they get this quieter child logger.
_LIB_LOGGER = logging.getLogger("envs.udacity.socketio")
if _LIB_LOGGER.level == logging.NOTSET:
    _LIB_LOGGER.setLevel(logging.WARNING)

DEFAULT_HOST = "127.0.0.1"
#: Events (frames, manual-driving notices, connects) waiting for the env; the oldest are dropped beyond.
EVENT_CAPACITY = 64
#: Replies waiting to be written to one simulator; further replies are dropped (with a log line).
MAX_PENDING_REPLIES = 64
#: Simultaneous connections accepted (the simulator opens one; a restarted one may overlap briefly).
MAX_CONNECTIONS = 4
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})

_ENGINEIO_TYPES_FROM_SIM = frozenset("124")  # CLOSE, PING, MESSAGE: all the simulator sends


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


__all__ = ["DEFAULT_HOST", "EVENT_CAPACITY", "LOGGER", "MAX_CONNECTIONS", "MAX_PENDING_REPLIES", "UdacityBridge"]
