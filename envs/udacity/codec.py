"""The engine.io 3 / socket.io 2 text packets the Udacity simulator exchanges: pure encode/decode functions.

The simulator's client (socket.io 2 for Unity) speaks two layered protocols over one websocket;
this module is the project's own codec for the few packets they use, without any transport
(:mod:`envs.udacity.bridge` carries them over aiohttp's websocket server).

engine.io protocol, revision 3 (engine.io 3.x, the transport under socket.io 2.x;
https://github.com/socketio/engine.io-protocol/tree/v3, "Encoding" and "Timeouts"):

- each websocket text frame is one packet, ``<type digit><data>``, with the types of
  :class:`EngineIOType`: 0 open, 1 close, 2 ping, 3 pong, 4 message, 5 upgrade, 6 noop;
- the server's first packet is OPEN with a JSON object ``{"sid", "upgrades", "pingInterval",
  "pingTimeout"}`` (milliseconds) (:func:`encode_open`);
- in revision 3 the *client* sends ``2[data]`` every ``pingInterval`` and the server answers
  ``3[data]`` with the same data (``2probe`` -> ``3probe``); the client gives the server up after
  ``pingTimeout`` without a pong, the server gives the client up after ``pingInterval +
  pingTimeout`` without a packet (engine.io 3's server resets that timer on any packet);
- the length-prefixed payloads and the ``b``-prefixed base64 binary packets of revision 3 exist
  only for HTTP long-polling, which the bridge refuses; they are rejected here.

socket.io protocol, revision 4 (socket.io 2.x, its parser socket.io-parser 3.x;
https://github.com/socketio/socket.io-protocol/tree/v4, "Packet format" and "Packet encoding"):

- a socket.io packet travels as the data of an engine.io MESSAGE, encoded as
  ``<type digit>[<attachments>-][<namespace>,][<ack id>][<JSON data>]`` with the types of
  :class:`SocketIOType`; the namespace is ``/`` when absent;
- the JSON data must be an array, except for ERROR packets (socket.io-parser 3.3 rejects any
  other payload as "invalid payload"); an EVENT's array is ``[name, arg, ...]`` with a string name;
- so an event on the default namespace is the websocket text frame ``42["name",{...}]``, and the
  server's namespace CONNECT is ``40``.

Every decoder raises :class:`PacketError` (a ``ValueError``) with the reason on anything
malformed, and never anything else: the input comes from the network. JSON is parsed strictly:
``NaN`` and ``Infinity`` are refused (as JavaScript's ``JSON.parse`` does), and so are numbers
beyond a double (which JavaScript would read as infinite) and nesting too deep to parse.
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass
from typing import Any

#: The longest acknowledgement id accepted (digits): JavaScript numbers are exact up to 2**53.
MAX_ACK_ID_DIGITS = 15
#: The most binary attachments a BINARY_EVENT / BINARY_ACK header may announce.
MAX_ATTACHMENTS = 1000


class PacketError(ValueError):
    """A websocket frame or socket.io packet that is not a valid packet (the reason is the message)."""


class EngineIOType(enum.IntEnum):
    """engine.io revision 3 packet types (the first character of every packet)."""

    OPEN = 0
    CLOSE = 1
    PING = 2
    PONG = 3
    MESSAGE = 4
    UPGRADE = 5
    NOOP = 6


class SocketIOType(enum.IntEnum):
    """socket.io revision 4 packet types (the first character of an engine.io MESSAGE's data)."""

    CONNECT = 0
    DISCONNECT = 1
    EVENT = 2
    ACK = 3
    ERROR = 4
    BINARY_EVENT = 5
    BINARY_ACK = 6


@dataclass(frozen=True)
class EngineIOPacket:
    """One engine.io packet: its type and its data (the text after the type digit, possibly empty)."""

    type: EngineIOType
    data: str = ""


@dataclass(frozen=True)
class SocketIOPacket:
    """One socket.io packet.

    Attributes:
        type: the packet type.
        namespace: ``"/"`` (the default namespace) unless the packet names another.
        id: the acknowledgement id, or None when the sender wants no acknowledgement.
        data: the decoded JSON data (a list except for ERROR packets), or None when absent.
        attachments: the number of binary attachments (BINARY_EVENT / BINARY_ACK only), else None.
    """

    type: SocketIOType
    namespace: str = "/"
    id: int | None = None
    data: Any = None
    attachments: int | None = None


def _preview(text: Any, limit: int = 60) -> str:
    r = repr(text)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(text) if isinstance(text, (str, bytes)) else '?'} chars)"


def _refuse_constant(name: str) -> Any:
    raise PacketError(f"{name} is not JSON (JavaScript's parser refuses it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise PacketError(f"the number {_preview(text)} does not fit a double")
    return value


def _loads(text: str, what: str) -> Any:
    """JSON as JavaScript's ``JSON.parse`` reads it; PacketError instead of any parser error."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except PacketError as e:
        raise PacketError(f"{what}: {e}") from None
    except RecursionError:
        raise PacketError(f"{what} is nested too deeply to parse") from None
    except ValueError as e:  # json.JSONDecodeError, and int() limits on huge integers
        raise PacketError(f"{what} is not valid JSON ({e}): {_preview(text)}") from None


def _dumps(data: Any) -> str:
    """Compact JSON (as socket.io's encoders write it); ValueError on NaN/inf, TypeError on other objects."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


# -- engine.io (revision 3) -------------------------------------------------------------------------

def encode_engineio(packet_type: EngineIOType | int, data: str = "") -> str:
    """The websocket text frame of one engine.io revision 3 packet: ``<type digit><data>``.

    Spec: engine.io-protocol v3, "Encoding / Packet".

    Raises:
        ValueError: ``packet_type`` is not an engine.io type, or ``data`` is not a string.
    """
    kind = EngineIOType(packet_type)
    if not isinstance(data, str):
        raise ValueError(f"engine.io packet data must be a string, got {type(data).__name__}")
    return f"{int(kind)}{data}"


def decode_engineio(frame: Any) -> EngineIOPacket:
    """Read one websocket text frame as an engine.io revision 3 packet.

    Spec: engine.io-protocol v3, "Encoding / Packet" (over a websocket a frame holds exactly one
    packet, so there is no payload framing).

    Raises:
        PacketError: not a string, empty, or not starting with a type digit 0-6 (this includes the
            ``b``-prefixed base64 binary packets, which belong to long-polling).
    """
    if not isinstance(frame, str):
        raise PacketError(f"an engine.io text packet must be a string, got {type(frame).__name__}")
    if not frame:
        raise PacketError("empty frame (no engine.io packet type)")
    head = frame[0]
    if not ("0" <= head <= "6"):
        raise PacketError(f"unknown engine.io packet type {head!r} in {_preview(frame)}")
    return EngineIOPacket(EngineIOType(int(head)), frame[1:])


def encode_open(sid: str, ping_interval_ms: int, ping_timeout_ms: int, upgrades: tuple[str, ...] = ()) -> str:
    """The engine.io OPEN packet a server sends first: ``0{"sid":...,"upgrades":[],"pingInterval":...,
    "pingTimeout":...}`` (times in milliseconds).

    Spec: engine.io-protocol v3, "Anatomy of an Engine.IO session" (the handshake data).

    Raises:
        ValueError: an empty ``sid``, or times that are not positive integers.
    """
    if not isinstance(sid, str) or not sid:
        raise ValueError("the engine.io session id must be a non-empty string")
    for name, value in (("ping_interval_ms", ping_interval_ms), ("ping_timeout_ms", ping_timeout_ms)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer (milliseconds), got {value!r}")
    handshake = {"sid": sid, "upgrades": list(upgrades), "pingInterval": ping_interval_ms,
                 "pingTimeout": ping_timeout_ms}
    return encode_engineio(EngineIOType.OPEN, _dumps(handshake))


def decode_open(frame: Any) -> dict[str, Any]:
    """The handshake data of an engine.io OPEN packet (the inverse of :func:`encode_open`).

    Spec: engine.io-protocol v3, "Anatomy of an Engine.IO session".

    Returns:
        ``{"sid": str, "upgrades": list[str], "pingInterval": int, "pingTimeout": int}``.

    Raises:
        PacketError: not an OPEN packet, not a JSON object, or a field missing or of the wrong type.
    """
    packet = decode_engineio(frame)
    if packet.type != EngineIOType.OPEN:
        raise PacketError(f"expected an engine.io OPEN packet, got {packet.type.name}")
    handshake = _loads(packet.data, "the OPEN packet's handshake")
    if not isinstance(handshake, dict):
        raise PacketError(f"the OPEN packet's handshake is a {type(handshake).__name__}, not an object")
    if not isinstance(handshake.get("sid"), str) or not handshake["sid"]:
        raise PacketError("the OPEN packet has no session id ('sid')")
    upgrades = handshake.get("upgrades")
    if not isinstance(upgrades, list) or not all(isinstance(u, str) for u in upgrades):
        raise PacketError(f"the OPEN packet's 'upgrades' is {_preview(upgrades)}, not a list of strings")
    for key in ("pingInterval", "pingTimeout"):
        value = handshake.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise PacketError(f"the OPEN packet's {key!r} is {_preview(value)}, not a positive integer")
    return handshake


# -- socket.io (revision 4) -------------------------------------------------------------------------

def encode_socketio(packet: SocketIOPacket) -> str:
    """The text of one socket.io revision 4 packet (the data of an engine.io MESSAGE).

    ``<type>[<attachments>-][<namespace>,][<id>][<JSON data>]``; the default namespace ``/`` is
    left out, as socket.io-parser does. The data of an ERROR packet may be a bare number, which
    would read as an ack id: it gets a leading space (JSON allows it), so every packet that
    :func:`decode_socketio` returns encodes back to one that decodes the same. Spec:
    socket.io-protocol v4, "Packet encoding".

    Raises:
        ValueError: a namespace that does not start with ``/`` or holds a ``,``; a negative id;
            attachments on a non-binary type; data that is not a list for a non-ERROR packet;
            NaN or infinite numbers in the data.
        TypeError: data that JSON cannot represent.
    """
    kind = SocketIOType(packet.type)
    text = str(int(kind))
    if kind in (SocketIOType.BINARY_EVENT, SocketIOType.BINARY_ACK):
        if packet.attachments is None or packet.attachments < 0:
            raise ValueError(f"a {kind.name} packet needs a number of attachments >= 0")
        text += f"{int(packet.attachments)}-"
    elif packet.attachments is not None:
        raise ValueError(f"a {kind.name} packet has no attachments")
    namespace = packet.namespace or "/"
    if not namespace.startswith("/") or "," in namespace:
        raise ValueError(f"a socket.io namespace starts with '/' and holds no ',', got {namespace!r}")
    if namespace != "/":
        text += namespace + ","
    if packet.id is not None:
        if isinstance(packet.id, bool) or not isinstance(packet.id, int) or packet.id < 0:
            raise ValueError(f"a socket.io ack id is an integer >= 0, got {packet.id!r}")
        text += str(packet.id)
    if packet.data is not None:
        if kind != SocketIOType.ERROR and not isinstance(packet.data, (list, tuple)):
            raise ValueError(f"the data of a {kind.name} packet must be a list, got {type(packet.data).__name__}")
        data = _dumps(list(packet.data) if isinstance(packet.data, tuple) else packet.data)
        # an ERROR's bare number would read as (more of) the ack id: JSON allows a leading space
        text += " " + data if data[0].isdigit() else data
    return text


def decode_socketio(text: Any) -> SocketIOPacket:
    """Read the data of an engine.io MESSAGE as one socket.io revision 4 packet.

    Follows socket.io-parser 3.x's ``decodeString``: the type digit; for binary types the
    attachment count and ``-``; a namespace from ``/`` up to ``,``; an ack id of digits; then JSON
    data, which must be an array unless the packet is an ERROR. Spec: socket.io-protocol v4,
    "Packet encoding".

    Raises:
        PacketError: not a string, empty, an unknown type, a bad attachment count, an ack id
            longer than :data:`MAX_ACK_ID_DIGITS`, invalid JSON, or data that is not an array.
    """
    if not isinstance(text, str):
        raise PacketError(f"a socket.io packet must be a string, got {type(text).__name__}")
    if not text:
        raise PacketError("empty socket.io packet (no type)")
    if not ("0" <= text[0] <= "6"):
        raise PacketError(f"unknown socket.io packet type {text[0]!r} in {_preview(text)}")
    kind = SocketIOType(int(text[0]))
    i = 1
    attachments = None
    if kind in (SocketIOType.BINARY_EVENT, SocketIOType.BINARY_ACK):
        dash = text.find("-", i)
        count = text[i:dash] if dash >= 0 else ""
        if not count.isascii() or not count.isdigit() or len(count) > len(str(MAX_ATTACHMENTS)):
            raise PacketError(f"a {kind.name} packet needs '<attachments>-' after its type: {_preview(text)}")
        attachments = int(count)
        if attachments > MAX_ATTACHMENTS:
            raise PacketError(f"a {kind.name} packet announces {attachments} attachments (at most {MAX_ATTACHMENTS})")
        i = dash + 1
    namespace = "/"
    if text.startswith("/", i):
        comma = text.find(",", i)
        end = comma if comma >= 0 else len(text)
        namespace = text[i:end]
        i = end + 1 if comma >= 0 else end
    j = i
    while j < len(text) and "0" <= text[j] <= "9":
        j += 1
    ack_id = None
    if j > i:
        if j - i > MAX_ACK_ID_DIGITS:
            raise PacketError(f"ack id of {j - i} digits (at most {MAX_ACK_ID_DIGITS}): {_preview(text)}")
        ack_id = int(text[i:j])
    data = None
    if j < len(text):
        data = _loads(text[j:], f"the data of a socket.io {kind.name} packet")
        if kind != SocketIOType.ERROR and not isinstance(data, list):
            raise PacketError(f"the data of a socket.io {kind.name} packet must be an array, got "
                              f"{type(data).__name__}: {_preview(text)}")
    return SocketIOPacket(kind, namespace, ack_id, data, attachments)


def encode_event(name: str, *args: Any, namespace: str = "/") -> str:
    """The websocket text frame of a socket.io event: engine.io MESSAGE + socket.io EVENT,
    ``42["name",arg,...]`` on the default namespace.

    Spec: engine.io-protocol v3 ("4 message") and socket.io-protocol v4 ("2 - EVENT").

    Raises:
        ValueError: an empty or non-string name, a bad namespace, or NaN/infinite numbers in ``args``.
        TypeError: arguments that JSON cannot represent.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a socket.io event name is a non-empty string, got {name!r}")
    packet = SocketIOPacket(SocketIOType.EVENT, namespace, None, [name, *args])
    return encode_engineio(EngineIOType.MESSAGE, encode_socketio(packet))


def event_of(packet: SocketIOPacket) -> tuple[str, list[Any]]:
    """The name and arguments of a socket.io EVENT packet (``[name, arg, ...]``).

    Spec: socket.io-protocol v4, "2 - EVENT" (the name is the first element of the array).

    Raises:
        PacketError: not an EVENT, or data that is not a non-empty array starting with a string.
    """
    if packet.type != SocketIOType.EVENT:
        raise PacketError(f"a socket.io {packet.type.name} packet is not an EVENT")
    data = packet.data
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise PacketError(f"an EVENT's data must be [name, args...], got {_preview(data)}")
    return data[0], data[1:]


__all__ = [
    "MAX_ACK_ID_DIGITS", "MAX_ATTACHMENTS", "EngineIOPacket", "EngineIOType", "PacketError", "SocketIOPacket",
    "SocketIOType", "decode_engineio", "decode_open", "decode_socketio", "encode_engineio", "encode_event",
    "encode_open", "encode_socketio", "event_of",
]
