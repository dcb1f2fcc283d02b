"""The websocket server the Udacity simulator connects to (:class:`UdacityBridge`): the transport.

The simulator is a socket.io 2 client: engine.io revision 3 framing behind an ``EIO=4`` URL,
no socket.io namespace CONNECT, client-sent pings (:mod:`envs.udacity.protocol`). The bridge
serves exactly that on aiohttp's public websocket server API (``web.Application``,
``web.WebSocketResponse``, ``web.AppRunner``, ``web.TCPSite``), with the project's own codec for
the few packets involved (:mod:`envs.udacity.codec`), in a background thread running an asyncio
loop. One session, as the simulator sees it::

    GET /socket.io/?EIO=4&transport=websocket      (websocket upgrade)
    <- 0{"sid":"...","upgrades":[],"pingInterval":25000,"pingTimeout":60000}   engine.io OPEN
    <- 40                                           socket.io CONNECT of the default namespace
    -> 42["telemetry",{...}]   <- 42["steer",{...}] or 42["manual",{}]   (one reply per frame)
    -> 2                       <- 3                 engine.io PING / PONG, every pingInterval
    -> 1 or a websocket close                       the end; so is pingInterval + pingTimeout of silence

Nothing here trusts the simulator's bytes: every malformed message (frames that are not engine.io
packets, binary frames, socket.io packets that are not EVENTs on ``/``, bad JSON, unknown events,
bad base64, truncated or non-JPEG images, wrong sizes, missing or non-numeric fields) is logged
to the ``envs.udacity.bridge`` logger, then answered with ``manual`` (telemetry: it asks for a
fresh frame, so the simulator never stalls) or dropped (anything else); the event queue and each
connection's reply queue are bounded and websocket frames are limited to ``max_message_bytes``
(a larger one ends that connection).

Security: the server listens on 127.0.0.1 by default, so only programs on this machine can
connect; on another interface anybody who can reach the port could steer the car and read the
camera. Web pages cannot connect: as engine.io does, the bridge refuses an ``Origin`` header
other than the server's own ``http://<Host>``, and on loopback it refuses a Host header that is
not a loopback name (DNS rebinding). Long-polling (which the simulator never uses) is refused,
and at most ``MAX_CONNECTIONS`` connections are served.

Trust model: any local process may drive (it is the simulator's own protocol, with no secret to
present), but none can hold the bridge. A connection that has sent no telemetry for
``idle_timeout_s`` seconds (:data:`IDLE_TIMEOUT_S`; pings do not count) is idle: when a new
connection finds every slot taken, the stalest idle one is closed to make room. A connection that
is sending telemetry is never evicted; when all of them are, the newcomer is refused (503).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import WSMsgType, web

from envs.udacity.codec import (EngineIOType, PacketError, SocketIOPacket, SocketIOType, decode_engineio,
                                decode_socketio, encode_engineio, encode_event, encode_open, encode_socketio,
                                event_of)
from envs.udacity.protocol import DEFAULT_PORT, MAX_MESSAGE_BYTES, Telemetry, TelemetryError, _preview, decode_telemetry

LOGGER = logging.getLogger("envs.udacity.bridge")

DEFAULT_HOST = "127.0.0.1"
#: Events (frames, manual-driving notices, connects) waiting for the env; the oldest are dropped beyond.
EVENT_CAPACITY = 64
#: Replies (and pongs) waiting to be written to one simulator; further ones are dropped (with a log line).
MAX_PENDING_REPLIES = 64
#: Simultaneous connections accepted (the simulator opens one; a restarted one may overlap briefly).
MAX_CONNECTIONS = 4
#: engine.io handshake times (milliseconds), engine.io 3's defaults: the simulator pings every
#: PING_INTERVAL_MS; a connection silent for PING_INTERVAL_MS + PING_TIMEOUT_MS is closed.
PING_INTERVAL_MS = 25_000
PING_TIMEOUT_MS = 60_000
#: Seconds without telemetry after which a connection is idle and gives its slot to a new one when all
#: :data:`MAX_CONNECTIONS` are taken (pings keep an engine.io session alive but do not keep a slot).
#: The simulator sends telemetry at its frame rate (about 15-60 Hz) while it is in a driving mode.
IDLE_TIMEOUT_S = 3.0
#: The path the simulator connects to (engine.io's default, as socket.io clients use it).
SOCKETIO_PATH = "/socket.io/"
#: The ``EIO`` query values served: the simulator sends 4 but speaks revision 3 (see the module docstring).
_EIO_VERSIONS = frozenset({"3", "4"})
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
#: The server's socket.io CONNECT of the default namespace, ``40``, sent after the OPEN packet.
_CONNECT_DEFAULT_NAMESPACE = encode_engineio(EngineIOType.MESSAGE,
                                             encode_socketio(SocketIOPacket(SocketIOType.CONNECT)))


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


class _Connection:
    """One simulator's websocket: its engine.io session id, its bounded reply queue and writer task.

    Lives in the server thread only. Replies go through the queue so that a simulator that stops
    reading holds at most :data:`MAX_PENDING_REPLIES` of them and never blocks the reader.
    """

    def __init__(self, sid: str, ws: web.WebSocketResponse, peer: str):
        self.sid = sid
        self.ws = ws
        self.peer = peer
        #: ``time.monotonic()`` of the last well-formed telemetry (autonomous or manual), else of the connect.
        self.last_telemetry = time.monotonic()
        self.replies: asyncio.Queue[str] = asyncio.Queue(MAX_PENDING_REPLIES)
        self.writer: asyncio.Task | None = None
        self.closing = False

    async def write_replies(self) -> None:
        """Write queued frames in order until the connection ends (the writer task)."""
        while True:
            text = await self.replies.get()
            if self.closing or self.ws.closed:
                return
            try:
                await self.ws.send_str(text)
            except Exception as e:  # noqa: BLE001 - the socket closed meanwhile (ConnectionResetError, ...)
                LOGGER.debug("writing to simulator %s failed, it is going away: %r", self.sid, e)
                return


class UdacityBridge:
    """The websocket server the simulator connects to, run by an asyncio loop in a daemon thread.

    The env talks to it from its own thread: frames arrive through a bounded event queue and
    commands leave through :meth:`send`. Manual-driving notices and malformed telemetry are
    answered here, in the server thread, so the simulator keeps running even when nobody steps.

    Args:
        host: interface to listen on (loopback by default; see the module docstring).
        port: TCP port; 0 picks a free one, readable from :attr:`port` after :meth:`start`.
        max_message_bytes: the largest websocket frame accepted; a larger one ends that connection.
        event_capacity: frames and notices kept for the env before the oldest are dropped.
        idle_timeout_s: seconds without telemetry after which a connection loses its slot to a new
            one when all :data:`MAX_CONNECTIONS` are taken (see the module docstring's trust model).

    Raises:
        ValueError: ``idle_timeout_s`` is not a positive finite number.
    """

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, event_capacity: int = EVENT_CAPACITY,
                 idle_timeout_s: float = IDLE_TIMEOUT_S):
        idle_timeout_s = float(idle_timeout_s)
        if not (math.isfinite(idle_timeout_s) and idle_timeout_s > 0):
            raise ValueError(f"idle_timeout_s={idle_timeout_s!r}: give a positive number of seconds "
                             f"(default {IDLE_TIMEOUT_S:g})")
        self.host = host
        self.port = int(port)
        self.max_message_bytes = int(max_message_bytes)
        self.idle_timeout_s = idle_timeout_s
        self.events = _EventQueue(event_capacity)
        #: Counters: messages, telemetry, manual, malformed, dropped, replies, connects, disconnects, ...
        self.stats: collections.Counter[str] = collections.Counter()
        self._connected: dict[str, float] = {}  # sid -> connect time; newest last
        self._talked: set[str] = set()  # connected sids that have sent telemetry (real simulators)
        self._connections: dict[str, _Connection] = {}  # sid -> its websocket (server thread only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None

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

    def pending_replies(self, sid: str) -> int:
        """Replies and pongs queued for simulator ``sid`` and not yet written (0 when it is gone).

        At most :data:`MAX_PENDING_REPLIES`; more than a few means the simulator is not reading.
        """
        connection = self._connections.get(sid)
        return 0 if connection is None else connection.replies.qsize()

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
        app = web.Application(client_max_size=self.max_message_bytes, middlewares=[self._guard])
        app.router.add_get(SOCKETIO_PATH, self._handle_websocket)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def _refuse(self, request: web.Request, reason: str, status: int) -> web.Response:
        self.stats["refused"] += 1
        LOGGER.warning("refused a connection from %s: %s", request.remote, reason)
        return web.Response(status=status, text=reason + "\n")

    @web.middleware
    async def _guard(self, request: web.Request, handler):
        """Refuse what the simulator never does: plain HTTP (long-polling), a foreign Host or Origin.

        The Origin check is engine.io's same-origin rule (a browser always sends ``Origin``; the
        simulator sends none or its own); the Host check stops DNS rebinding (a web page whose name
        resolves to 127.0.0.1 would pass the Origin check) while the bridge listens on loopback.
        """
        origin = request.headers.get("Origin")
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return self._refuse(request, "not a websocket request (the simulator does not use long-polling)", 400)
        if self.host in _LOOPBACK_NAMES and (request.url.host or "").strip("[]") not in _LOOPBACK_NAMES:
            return self._refuse(request, f"Host {request.host!r} is not a loopback name", 403)
        if origin is not None and origin != f"{request.scheme}://{request.host}":
            return self._refuse(request, f"Origin {origin!r} is not this server's (a web page?)", 400)
        return await handler(request)

    async def _handle_websocket(self, request: web.Request) -> web.StreamResponse:
        """One simulator connection, from the websocket handshake to its end."""
        query = request.query
        if query.get("transport") != "websocket":
            return self._refuse(request, f"transport {query.get('transport')!r} is not 'websocket' "
                                         f"(the simulator does not use long-polling)", 400)
        if query.get("EIO", "3") not in _EIO_VERSIONS:
            return self._refuse(request, f"EIO={query.get('EIO')!r} is not an engine.io version served (3, or "
                                         f"the simulator's 4)", 400)
        if "sid" in query:
            return self._refuse(request, "a 'sid' to upgrade: this server has websocket-only sessions", 400)
        if len(self._connections) >= MAX_CONNECTIONS and not self._evict_idle():
            return self._refuse(request, f"already {len(self._connections)} connections, each sent telemetry "
                                         f"within the last {self.idle_timeout_s:g} s", 503)
        ws = web.WebSocketResponse(timeout=1.0, compress=False, max_msg_size=self.max_message_bytes)
        if not ws.can_prepare(request).ok:
            return self._refuse(request, "not a valid websocket handshake", 400)
        sid = secrets.token_hex(16)
        connection = _Connection(sid, ws, request.remote or "?")
        self._connections[sid] = connection  # before the first await: MAX_CONNECTIONS holds under races
        try:
            await ws.prepare(request)
            await ws.send_str(encode_open(sid, PING_INTERVAL_MS, PING_TIMEOUT_MS))
            await ws.send_str(_CONNECT_DEFAULT_NAMESPACE)
        except Exception as e:  # noqa: BLE001 - the client went away during the handshake
            self._connections.pop(sid, None)
            LOGGER.info("simulator handshake from %s failed: %r", connection.peer, e)
            return ws
        connection.writer = asyncio.ensure_future(connection.write_replies())
        self._on_connect(connection)
        try:
            await self._read(connection)
        finally:
            connection.closing = True
            connection.writer.cancel()
            self._connections.pop(sid, None)
            self._on_disconnect(sid)
            if not ws.closed:
                try:
                    await asyncio.wait_for(ws.close(), 1.0)
                except Exception as e:  # noqa: BLE001 - best effort; the peer may be gone
                    LOGGER.debug("closing simulator %s: %r", sid, e)
        return ws

    def _evict_idle(self) -> bool:
        """Free a slot for a new connection: close the stalest connection idle for ``idle_timeout_s``.

        A connection is idle when its last well-formed telemetry (or its connect, if it sent none)
        is at least ``idle_timeout_s`` old; pings and malformed frames do not count. The evicted
        connection leaves the slot table at once (its handler then ends and reports the disconnect);
        its websocket is closed with code 1008 and a reason. Returns False when no connection is idle.
        """
        now = time.monotonic()
        idle = [c for c in self._connections.values()
                if not c.closing and now - c.last_telemetry >= self.idle_timeout_s]
        if not idle:
            return False
        stalest = min(idle, key=lambda c: c.last_telemetry)
        stalest.closing = True
        self._connections.pop(stalest.sid, None)
        self.stats["evicted"] += 1
        LOGGER.warning("closed connection %s from %s: no telemetry for %.1f s and a new connection needs its slot",
                       stalest.sid, stalest.peer, now - stalest.last_telemetry)
        close = asyncio.ensure_future(stalest.ws.close(
            code=1008, message=f"no telemetry for {self.idle_timeout_s:g} s: slot given to a new connection".encode()))
        close.add_done_callback(_log_close_failure)
        return True

    async def _read(self, connection: _Connection) -> None:
        """Read and handle one connection's frames in order until it ends."""
        ws, sid = connection.ws, connection.sid
        silence_s = (PING_INTERVAL_MS + PING_TIMEOUT_MS) / 1000.0
        while True:
            try:
                msg = await ws.receive(timeout=silence_s)
            except asyncio.TimeoutError:
                self.stats["timeouts"] += 1
                LOGGER.warning("simulator %s sent nothing for %g s (engine.io pingInterval + pingTimeout), "
                               "closing its connection", sid, silence_s)
                return
            if msg.type == WSMsgType.TEXT:
                try:
                    keep = await self._on_frame(connection, msg.data)
                except Exception:  # noqa: BLE001 - a bug of ours must not end the simulator's session
                    self.stats["dropped"] += 1
                    LOGGER.exception("handling a frame from simulator %s failed; it is dropped: %s", sid,
                                     _preview(msg.data))
                    keep = True
                if not keep:
                    return
            elif msg.type == WSMsgType.BINARY:
                self._drop("websocket binary frame", sid, f"{len(msg.data)} bytes (the simulator sends text)")
            elif msg.type == WSMsgType.ERROR:  # aiohttp has closed the connection (e.g. a frame over max_msg_size)
                self.stats["websocket_errors"] += 1
                LOGGER.warning("websocket error from simulator %s, closing its connection: %s", sid, msg.data)
                return
            else:  # CLOSE, CLOSING, CLOSED: the simulator went away
                return

    async def _on_frame(self, connection: _Connection, text: str) -> bool:
        """Handle one engine.io packet; returns False when the connection is to end (CLOSE)."""
        sid = connection.sid
        try:
            packet = decode_engineio(text)
        except PacketError as e:
            self._drop("websocket text frame", sid, f"not an engine.io packet: {e}")
            return True
        if packet.type == EngineIOType.PING:  # revision 3: the client pings, we answer with the same data
            self._enqueue(connection, encode_engineio(EngineIOType.PONG, packet.data), "pong")
            return True
        if packet.type == EngineIOType.MESSAGE:
            self.stats["messages"] += 1
            await self._on_message(connection, packet.data)
            return True
        if packet.type == EngineIOType.CLOSE:
            LOGGER.info("simulator %s sent engine.io CLOSE", sid)
            return False
        self._drop("engine.io packet", sid, f"{packet.type.name} is not a packet the simulator sends "
                                            f"(PING, MESSAGE, CLOSE): {_preview(text)}")
        return True

    async def _on_message(self, connection: _Connection, data: str) -> None:
        """Handle the socket.io packet in an engine.io MESSAGE: only ``telemetry`` events on ``/`` are used."""
        sid = connection.sid
        try:
            packet = decode_socketio(data)
        except PacketError as e:
            self._drop("socket.io packet", sid, str(e))
            return
        if packet.type != SocketIOType.EVENT:
            self._drop("socket.io packet", sid, f"type {packet.type.name} is not EVENT: {_preview(data)}")
            return
        if packet.namespace != "/":
            self._drop("socket.io event", sid, f"namespace {_preview(packet.namespace)} is not '/'")
            return
        try:
            name, args = event_of(packet)
        except PacketError as e:
            self._drop("socket.io event", sid, str(e))
            return
        if name != "telemetry":
            self._drop("socket.io event", sid, f"unknown event {_preview(name)}")
            return
        await self._on_telemetry(connection, args[0] if args else None)

    async def _shutdown(self) -> None:
        for connection in list(self._connections.values()):
            connection.closing = True
            try:
                await asyncio.wait_for(connection.ws.close(code=1001, message=b"server shutting down"), 1.0)
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

    def _on_connect(self, connection: _Connection) -> None:
        self._connected[connection.sid] = time.perf_counter()
        self.stats["connects"] += 1
        LOGGER.info("Udacity simulator connected from %s (session %s)", connection.peer, connection.sid)
        self.events.put(_Event("connect", connection.sid, time.perf_counter()))

    def _on_disconnect(self, sid: str) -> None:
        self._connected.pop(sid, None)
        self._talked.discard(sid)
        self.stats["disconnects"] += 1
        LOGGER.info("Udacity simulator disconnected (session %s)", sid)
        self.events.put(_Event("disconnect", sid, time.perf_counter()))

    async def _on_telemetry(self, connection: _Connection, data: Any) -> None:
        sid = connection.sid
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
        connection.last_telemetry = time.monotonic()  # a simulator that talks keeps its slot
        if telemetry is None:  # a person is driving: acknowledge so the simulator keeps talking
            self.stats["manual"] += 1
            await self._emit(sid, "manual", {})
            self.events.put(_Event("manual", sid, t))
        else:
            self.events.put(_Event("telemetry", sid, t, telemetry))

    def _drop(self, what: str, sid: str | None, reason: str) -> None:
        self.stats["dropped"] += 1
        LOGGER.warning("dropped a %s from simulator %s: %s", what, sid or "?", reason)

    def _enqueue(self, connection: _Connection, text: str, what: str) -> bool:
        """Queue one frame for ``connection``'s writer; drops it (with a log line) when the queue is full."""
        if connection.replies.full():
            self.stats["replies_dropped"] += 1
            LOGGER.warning("simulator %s is not reading (%d replies queued): dropped %s", connection.sid,
                           connection.replies.qsize(), what)
            return False
        connection.replies.put_nowait(text)
        return True

    async def _emit(self, sid: str, event: str, data: dict) -> bool:
        connection = self._connections.get(sid)
        if connection is None or connection.closing or connection.ws.closed:
            LOGGER.debug("simulator %s is gone: %s not sent", sid, event)
            return False
        if not self._enqueue(connection, encode_event(event, data), event):
            return False
        self.stats["replies"] += 1
        await asyncio.sleep(0)  # let the writer task send it before the next frame is read (fairness)
        return True


def _log_close_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        LOGGER.debug("closing an idle connection: %r", future.exception())


def _log_failure(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        LOGGER.warning("sending to the simulator failed: %r", future.exception())


__all__ = ["DEFAULT_HOST", "EVENT_CAPACITY", "IDLE_TIMEOUT_S", "LOGGER", "MAX_CONNECTIONS", "MAX_PENDING_REPLIES", "UdacityBridge"]
