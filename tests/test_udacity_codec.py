"""The engine.io 3 / socket.io 2 codec of the Udacity bridge (envs/udacity/codec.py), without any socket.

Known encodings come from the protocol documents (engine.io-protocol v3, socket.io-protocol v4)
and from the wire-level fake simulator's own encoder (envs/udacity/fake.py), which is independent
of the codec.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from envs.udacity.codec import (MAX_ACK_ID_DIGITS, EngineIOPacket, EngineIOType, PacketError, SocketIOPacket,
                                SocketIOType, decode_engineio, decode_open, decode_socketio, encode_engineio,
                                encode_event, encode_open, encode_socketio, event_of)
from envs.udacity.fake import event_frame

# -- engine.io ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(EngineIOType))
@pytest.mark.parametrize("data", ["", "probe", '2["telemetry",{}]', "é€😀", "0123", " "])
def test_engineio_round_trip(kind, data):
    frame = encode_engineio(kind, data)
    assert frame == f"{int(kind)}{data}"
    assert decode_engineio(frame) == EngineIOPacket(kind, data)


def test_engineio_known_frames():
    assert decode_engineio("2") == EngineIOPacket(EngineIOType.PING, "")
    assert decode_engineio("2probe") == EngineIOPacket(EngineIOType.PING, "probe")
    assert encode_engineio(EngineIOType.PONG, "probe") == "3probe"
    assert decode_engineio("1") == EngineIOPacket(EngineIOType.CLOSE, "")
    assert decode_engineio('42["telemetry",{}]') == EngineIOPacket(EngineIOType.MESSAGE, '2["telemetry",{}]')
    assert decode_engineio("6").type is EngineIOType.NOOP


@pytest.mark.parametrize("frame, reason", [
    ("", "empty frame"),
    ("7", "unknown engine.io packet type '7'"),
    ("9x", "unknown"),
    ("b4aGVsbG8=", "unknown engine.io packet type 'b'"),  # base64 binary: long-polling only
    ("x2", "unknown"),
    (" 2", "unknown"),
    ("\u0664", "unknown"),  # ARABIC-INDIC DIGIT FOUR: a digit, but not the ASCII 4
    ("{}", "unknown"),
    ("-1", "unknown"),
    ("😀", "unknown"),
    (b"42[]", "must be a string, got bytes"),
    (None, "must be a string, got NoneType"),
    (4, "must be a string, got int"),
])
def test_engineio_malformed_frames_raise_packet_error(frame, reason):
    with pytest.raises(PacketError, match=reason):
        decode_engineio(frame)


def test_engineio_encode_refuses_what_is_not_a_packet():
    with pytest.raises(ValueError):
        encode_engineio(7)
    with pytest.raises(ValueError, match="must be a string"):
        encode_engineio(EngineIOType.MESSAGE, b"bytes")
    with pytest.raises(ValueError, match="must be a string"):
        encode_engineio(EngineIOType.MESSAGE, None)


def test_open_packet_exact_text_and_round_trip():
    frame = encode_open("abc123", 25000, 60000)
    assert frame == '0{"sid":"abc123","upgrades":[],"pingInterval":25000,"pingTimeout":60000}'
    assert decode_open(frame) == {"sid": "abc123", "upgrades": [], "pingInterval": 25000, "pingTimeout": 60000}
    assert decode_open(encode_open("s", 1, 2, ("websocket",)))["upgrades"] == ["websocket"]
    # what a python-engineio 3 server sent (other key order, same data)
    assert decode_open('0{"sid":"x","upgrades":[],"pingTimeout":60000,"pingInterval":25000}')["pingTimeout"] == 60000


@pytest.mark.parametrize("args, reason", [
    (("", 1, 1), "session id"),
    ((None, 1, 1), "session id"),
    (("s", 0, 1), "ping_interval_ms"),
    (("s", 1, -5), "ping_timeout_ms"),
    (("s", 1.5, 1), "ping_interval_ms"),
    (("s", True, 1), "ping_interval_ms"),
])
def test_open_packet_encode_refuses_bad_fields(args, reason):
    with pytest.raises(ValueError, match=reason):
        encode_open(*args)


@pytest.mark.parametrize("frame, reason", [
    ("40", "expected an engine.io OPEN packet, got MESSAGE"),
    ("0", "not valid JSON"),
    ("0{", "not valid JSON"),
    ("0[]", "is a list, not an object"),
    ('0{"upgrades":[],"pingInterval":1,"pingTimeout":1}', "no session id"),
    ('0{"sid":"","upgrades":[],"pingInterval":1,"pingTimeout":1}', "no session id"),
    ('0{"sid":5,"upgrades":[],"pingInterval":1,"pingTimeout":1}', "no session id"),
    ('0{"sid":"s","upgrades":"websocket","pingInterval":1,"pingTimeout":1}', "'upgrades'"),
    ('0{"sid":"s","upgrades":[1],"pingInterval":1,"pingTimeout":1}', "'upgrades'"),
    ('0{"sid":"s","upgrades":[],"pingTimeout":1}', "'pingInterval'"),
    ('0{"sid":"s","upgrades":[],"pingInterval":"25000","pingTimeout":1}', "'pingInterval'"),
    ('0{"sid":"s","upgrades":[],"pingInterval":true,"pingTimeout":1}', "'pingInterval'"),
    ('0{"sid":"s","upgrades":[],"pingInterval":1,"pingTimeout":0}', "'pingTimeout'"),
    ('0{"sid":"s","upgrades":[],"pingInterval":1,"pingTimeout":NaN}', "NaN is not JSON"),
])
def test_open_packet_decode_refuses_malformed_handshakes(frame, reason):
    with pytest.raises(PacketError, match=reason):
        decode_open(frame)


# -- socket.io ------------------------------------------------------------------------------------

SPEC_EXAMPLES = [  # socket.io-protocol v4 "Packet encoding" forms, and their meaning
    ("0", SocketIOPacket(SocketIOType.CONNECT)),
    ("0/admin", SocketIOPacket(SocketIOType.CONNECT, "/admin")),
    ("1/admin,", SocketIOPacket(SocketIOType.DISCONNECT, "/admin")),
    ('2["hello",1]', SocketIOPacket(SocketIOType.EVENT, data=["hello", 1])),
    ('2/admin,456["project:delete",123]', SocketIOPacket(SocketIOType.EVENT, "/admin", 456, ["project:delete", 123])),
    ("3/admin,456[]", SocketIOPacket(SocketIOType.ACK, "/admin", 456, [])),
    ('4"Not authorized"', SocketIOPacket(SocketIOType.ERROR, data="Not authorized")),
    ('4/admin,{"message":"no"}', SocketIOPacket(SocketIOType.ERROR, "/admin", data={"message": "no"})),
    ('51-["hello",{"_placeholder":true,"num":0}]',
     SocketIOPacket(SocketIOType.BINARY_EVENT, data=["hello", {"_placeholder": True, "num": 0}], attachments=1)),
    ('61-/admin,456[{"_placeholder":true,"num":0}]',
     SocketIOPacket(SocketIOType.BINARY_ACK, "/admin", 456, [{"_placeholder": True, "num": 0}], attachments=1)),
    ("212", SocketIOPacket(SocketIOType.EVENT, id=12)),
    ('20["a"]', SocketIOPacket(SocketIOType.EVENT, id=0, data=["a"])),
]


@pytest.mark.parametrize("text, packet", SPEC_EXAMPLES)
def test_socketio_spec_examples_decode_and_encode_back(text, packet):
    assert decode_socketio(text) == packet
    assert decode_socketio(encode_socketio(packet)) == packet
    if not text.startswith("0/admin"):  # "0/admin" is the short form of "0/admin,"
        assert encode_socketio(packet) == text


def test_socketio_round_trips_over_every_field_combination():
    datas = {SocketIOType.ERROR: [None, "err", {"message": "x"}, [1]]}
    n = 0
    for kind in SocketIOType:
        for namespace in ("/", "/admin", "/a/b?x=1"):
            for ack_id in (None, 0, 7, 10 ** (MAX_ACK_ID_DIGITS - 1)):
                for data in datas.get(kind, [None, [], ["ev", {"k": "v"}, 1.5, None, True, "é"]]):
                    attachments = 2 if kind in (SocketIOType.BINARY_EVENT, SocketIOType.BINARY_ACK) else None
                    packet = SocketIOPacket(kind, namespace, ack_id, data, attachments)
                    text = encode_socketio(packet)
                    assert text[0] == str(int(kind))
                    assert decode_socketio(text) == packet, text
                    n += 1
    assert n == 7 * 3 * 4 * 3 + 3 * 4 * 1  # every type: 3 data values, ERROR: 4


@pytest.mark.parametrize("text, reason", [
    ("", "empty socket.io packet"),
    ("7", "unknown socket.io packet type '7'"),
    ("x", "unknown socket.io packet type 'x'"),
    ("[1,2]", "unknown socket.io packet type"),
    ('"x"', "unknown socket.io packet type"),
    ("null", "unknown"),
    ("-1", "unknown"),
    ("\u0662[]", "unknown"),  # ARABIC-INDIC DIGIT TWO
    ("2[", "not valid JSON"),
    ('2["telemetry",{', "not valid JSON"),
    ('2["telemetry",{"a":}]', "not valid JSON"),
    ("2['x']", "not valid JSON"),
    ('2["telemetry"', "not valid JSON"),
    ('2["a"]x', "not valid JSON"),  # trailing garbage
    ("2[NaN]", "NaN is not JSON"),
    ('2["x",{"speed":Infinity}]', "Infinity is not JSON"),
    ("2[-Infinity]", "-Infinity is not JSON"),
    ("2[1e400]", "does not fit a double"),
    ("2[" + "9" * 5000 + "]", "not valid JSON"),  # Python's integer-string limit
    ("2" + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('2{"a":1}', "must be an array, got dict"),
    ('2"telemetry"', "must be an array, got str"),
    ("2null", "must be an array, got NoneType"),
    ("0{}", "must be an array"),
    ("1.5", "not valid JSON"),
    ("2" + "1" * (MAX_ACK_ID_DIGITS + 1) + "[]", "ack id of 16 digits"),
    ('5["hello"]', "needs '<attachments>-'"),
    ('5-["hello"]', "needs '<attachments>-'"),
    ('5a-["hello"]', "needs '<attachments>-'"),
    ("51", "needs '<attachments>-'"),
    ('5\u0661-["hello"]', "needs '<attachments>-'"),  # a non-ASCII digit
    ('599999-["hello"]', "needs '<attachments>-'"),  # more digits than MAX_ATTACHMENTS has
    ('51001-["hello"]', "announces 1001 attachments"),
    (b"2[]", "must be a string, got bytes"),
    (None, "must be a string, got NoneType"),
    ([1, 2], "must be a string, got list"),
])
def test_socketio_malformed_packets_raise_packet_error(text, reason):
    with pytest.raises(PacketError, match=reason.replace("[", r"\[").replace("(", r"\(")):
        decode_socketio(text)


@pytest.mark.parametrize("packet, error", [
    (SocketIOPacket(SocketIOType.EVENT, data={"a": 1}), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, data="x"), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, namespace="admin"), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, namespace="/a,b"), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, id=-1), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, id=True), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, attachments=1), ValueError),
    (SocketIOPacket(SocketIOType.BINARY_EVENT, data=[]), ValueError),  # no attachment count
    (SocketIOPacket(SocketIOType.EVENT, data=[float("nan")]), ValueError),
    (SocketIOPacket(SocketIOType.EVENT, data=[object()]), TypeError),
])
def test_socketio_encode_refuses_what_it_cannot_write(packet, error):
    with pytest.raises(error):
        encode_socketio(packet)


# -- events (what the bridge and the simulator exchange) ------------------------------------------

def test_event_frames_match_the_simulators_and_decode_back():
    steer = {"steering_angle": "0.250000", "throttle": "-0.100000"}
    assert encode_event("steer", steer) == '42["steer",{"steering_angle":"0.250000","throttle":"-0.100000"}]'
    assert encode_event("manual", {}) == '42["manual",{}]'
    telemetry = {"steering_angle": "-3.5000", "throttle": "0.2500", "speed": "12,3456", "image": "/9j/4AAQ+=="}
    assert encode_event("telemetry", telemetry) == event_frame("telemetry", telemetry)  # the fake's own encoder
    for name, args in [("steer", [steer]), ("manual", [{}]), ("telemetry", []), ("x", [None, 1, "é€"])]:
        engine = decode_engineio(encode_event(name, *args))
        assert engine.type is EngineIOType.MESSAGE
        packet = decode_socketio(engine.data)
        assert (packet.type, packet.namespace, packet.id) == (SocketIOType.EVENT, "/", None)
        assert event_of(packet) == (name, args)
    assert encode_event("é", "€").isascii()  # JSON escapes: the frame is ASCII
    assert event_of(decode_socketio(decode_engineio(encode_event("é", "€")).data)) == ("é", ["€"])
    admin = decode_socketio(decode_engineio(encode_event("a", 1, namespace="/admin")).data)
    assert admin.namespace == "/admin" and event_of(admin) == ("a", [1])
    assert encode_socketio(SocketIOPacket(SocketIOType.CONNECT)) == "0"  # the server's "40", without the engine.io 4


@pytest.mark.parametrize("name, args, error", [
    ("", (), ValueError),
    (None, (), ValueError),
    (5, (), ValueError),
    ("steer", ({"x": float("inf")},), ValueError),
    ("steer", ({"x": b"bytes"},), TypeError),
])
def test_encode_event_refuses_bad_names_and_arguments(name, args, error):
    with pytest.raises(error):
        encode_event(name, *args)


@pytest.mark.parametrize("text, reason", [
    ('3["telemetry"]', "ACK packet is not an EVENT"),
    ('0', "CONNECT packet is not an EVENT"),
    ('51-["telemetry",{}]', "BINARY_EVENT packet is not an EVENT"),
    ("2[]", r"must be \[name, args...\]"),
    ("2[1,2]", r"must be \[name, args...\]"),
    ("2[null]", r"must be \[name, args...\]"),
    ("2", r"must be \[name, args...\]"),
    ("21", r"must be \[name, args...\]"),
])
def test_event_of_refuses_what_is_not_an_event(text, reason):
    with pytest.raises(PacketError, match=reason):
        event_of(decode_socketio(text))


def test_random_frames_only_ever_decode_or_raise_packet_error():
    """Any text the network may deliver: a packet, or PacketError, never another exception;
    every socket.io packet decoded re-encodes to one that decodes the same."""
    rng = np.random.default_rng(0)
    alphabet = list('0123456789-/,[]{}":.eEa x\\nNIul+') + ["é", "😀", "\u0663"]
    prefixes = ["", "42", "4", "2", "5", "43", "451-", "42/x,", "421", '42["', '42["telemetry",', "42[1,", "44"]
    endings = ["", "]", '"]', '"}]', "}]", "{}]", '",{}]']
    decoded = {"engineio": 0, "socketio": 0, "event": 0}
    refused = {"engineio": 0, "socketio": 0, "event": 0}
    for _ in range(20_000):
        text = (str(rng.choice(prefixes)) + "".join(rng.choice(alphabet, size=int(rng.integers(0, 12))))
                + str(rng.choice(endings)))
        try:
            engine = decode_engineio(text)
        except PacketError:
            refused["engineio"] += 1
            continue
        decoded["engineio"] += 1
        assert encode_engineio(engine.type, engine.data) == text
        try:
            packet = decode_socketio(engine.data)
        except PacketError:
            refused["socketio"] += 1
            continue
        decoded["socketio"] += 1
        assert decode_socketio(encode_socketio(packet)) == packet, text
        try:
            name, args = event_of(packet)
        except PacketError:
            refused["event"] += 1
            continue
        decoded["event"] += 1
        assert isinstance(name, str) and isinstance(args, list)
    assert min(decoded.values()) > 100 and min(refused.values()) > 100, (decoded, refused)


def test_event_data_round_trips_any_json_value():
    rng = np.random.default_rng(1)

    def value(depth=0):
        makers = [lambda: None, lambda: bool(rng.integers(2)), lambda: int(rng.integers(-10**12, 10**12)),
                  lambda: "s" + str(rng.integers(99)), lambda: float(rng.normal()),
                  lambda: [value(depth + 1) for _ in range(int(rng.integers(3)))],
                  lambda: {str(i): value(depth + 1) for i in range(int(rng.integers(3)))}]
        return makers[int(rng.integers(7 if depth < 3 else 5))]()

    for _ in range(500):
        args = [value() for _ in range(int(rng.integers(4)))]
        frame = encode_event("telemetry", *args)
        name, decoded = event_of(decode_socketio(decode_engineio(frame).data))
        assert name == "telemetry" and decoded == json.loads(json.dumps(args))
