"""The Udacity simulator bridge (envs/udacity/) against a wire-level fake simulator.

The fake (envs/udacity/fake.py) is a raw websocket client that speaks the simulator's old
protocol exactly: EIO=4 in the URL, no socket.io CONNECT, its own engine.io pings, string
fields. Everything goes through a real websocket on loopback, on a free port.
"""

from __future__ import annotations

import base64
import gc
import logging
import math
import os
import socket
import threading
import time

import cv2
import gymnasium as gym
import numpy as np
import pytest
from udacity_fake_sim import FakeSimulator, encode_frame_b64, event_frame, synthetic_road_frame

import envs  # noqa: F401 - registers agent/Udacity-v0
from envs.udacity.bridge import EVENT_CAPACITY, LOGGER
from envs.udacity.env import ENV_ID, UdacityEnv
from envs.udacity.protocol import TelemetryError, decode_frame, decode_telemetry, parse_number
from envs.udacity.throttle import ThrottleController


@pytest.fixture
def env():
    e = UdacityEnv(port=0, connect_timeout=10.0, step_timeout=5.0)
    e.start()
    yield e
    e.close()


class CountingFilter(logging.Filter):
    """Counts the bridge's own WARNING lines and keeps them from every handler.

    (pytest keeps each record it sees, even on non-propagating loggers, which would make the
    memory check below measure pytest. A logger's filter runs before any handler.)
    """

    def __init__(self):
        super().__init__()
        self.count = 0

    def filter(self, record):
        if record.levelno >= logging.WARNING:
            self.count += 1
            return False
        return True


@pytest.fixture
def warnings_counter():
    counter = CountingFilter()
    old_level = LOGGER.level
    LOGGER.addFilter(counter)
    LOGGER.setLevel(logging.WARNING)
    yield counter
    LOGGER.removeFilter(counter)
    LOGGER.setLevel(old_level)


def _jpeg_b64(h: int, w: int) -> str:
    return encode_frame_b64(np.full((h, w, 3), 120, np.uint8))


GOOD_FRAME = synthetic_road_frame(3, 0.4)
GOOD_B64 = encode_frame_b64(GOOD_FRAME)
GOOD = {"steering_angle": "-3.5000", "throttle": "0.2500", "speed": "12.3456", "image": GOOD_B64}


# -- units ----------------------------------------------------------------------------------------

def test_throttle_controller_pi_brakes_only_far_above_target_and_does_not_wind_up():
    c = ThrottleController(target_speed=15.0, kp=0.1, ki=0.05, brake_margin=3.0, max_brake=0.5)
    assert c(0.0) == 1.0  # far below: full throttle
    assert 0.0 < c(14.0, 0.0) < 0.2
    assert c(16.5, 0.0) == 0.0  # above target, within the margin: coast, never reverse
    far = c(25.0, 0.0)
    assert -0.5 <= far < 0.0  # far above: brake (negative throttle), limited by max_brake
    assert c(30.0, 0.0) == -0.5

    # saturated at full throttle for a long time: the integral must not wind up
    c.reset()
    for _ in range(2000):
        assert c(0.0, 0.05) == 1.0
    assert abs(c.integral) <= c.integral_limit
    assert c(15.5, 0.05) < 0.05  # at the target the command drops at once

    # the integral term removes the steady-state error that a P controller leaves on a car with drag
    def settle(controller):
        v = 0.0
        for _ in range(3000):  # 150 s at 20 Hz
            v += (4.0 * controller(v, 0.05) - 0.2 * v) * 0.05
        return v

    assert abs(settle(ThrottleController(15.0, ki=0.05)) - 15.0) < 0.3
    assert abs(settle(ThrottleController(15.0, ki=0.0)) - 15.0) > 2.0
    c.reset()
    assert c.integral == 0.0
    with pytest.raises(ValueError):
        ThrottleController(target_speed=-1)
    with pytest.raises(ValueError):
        ThrottleController(max_throttle=1.5)


def test_decode_telemetry_accepts_the_simulators_format_and_names_what_is_wrong():
    t = decode_telemetry(GOOD, time_s=1.5, sid="abc")
    assert t.frame.shape == (160, 320, 3) and t.frame.dtype == np.uint8
    assert np.abs(t.frame.astype(int) - GOOD_FRAME).mean() < 6  # JPEG is lossy, and the frame noisy
    assert np.abs(t.frame[..., ::-1].astype(int) - GOOD_FRAME).mean() > 15  # RGB, not BGR
    assert (t.steering_angle_deg, t.throttle, t.speed_mph, t.time_s, t.sid) == (-3.5, 0.25, 12.3456, 1.5, "abc")
    assert decode_telemetry({}) is None and decode_telemetry(None) is None  # a person is driving
    assert parse_number("12,3456", "speed") == 12.3456  # C# "N4" with a decimal comma
    assert parse_number("1,234.5000", "speed") == 1234.5  # ... or a thousands separator
    assert parse_number(3, "speed") == 3.0

    jpeg = base64.b64decode(GOOD_B64)
    cases = {
        "not valid base64": dict(GOOD, image="***" + GOOD_B64[3:]),
        "not a JPEG": dict(GOOD, image=base64.b64encode(b"\x89PNG" + bytes(100)).decode()),
        "truncated JPEG": dict(GOOD, image=base64.b64encode(jpeg[: len(jpeg) // 2]).decode()),
        "is 64x32, expected 320x160": dict(GOOD, image=_jpeg_b64(32, 64)),
        "'image' is empty": dict(GOOD, image=""),
        "'image' is a int": dict(GOOD, image=5),
        "lacks speed": {k: v for k, v in GOOD.items() if k != "speed"},
        "'throttle' is 'abc', not a number": dict(GOOD, throttle="abc"),
        "not finite": dict(GOOD, speed="nan"),
        "'steering_angle' is a list": dict(GOOD, steering_angle=[1]),
        "'speed' is True": dict(GOOD, speed=True),
        "payload is a str": "hello",
    }
    for reason, data in cases.items():
        with pytest.raises(TelemetryError, match=reason.replace("(", r"\(")):
            decode_telemetry(data)
    with pytest.raises(TelemetryError, match="truncated"):
        decode_frame(base64.b64encode(jpeg[:-3]).decode())


def test_registered_id_builds_the_env_with_the_documented_spaces():
    assert ENV_ID == "agent/Udacity-v0" and ENV_ID in gym.registry
    e = gym.make(ENV_ID, port=0, connect_timeout=1.0)
    try:
        assert e.observation_space == gym.spaces.Box(0, 255, (160, 320, 3), np.uint8)
        assert e.action_space == gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        assert isinstance(e.unwrapped, UdacityEnv)
    finally:
        e.close()


# -- the protocol, end to end ---------------------------------------------------------------------

def test_round_trip_steer_manual_disconnect_and_reconnect(env):
    assert env.port > 0
    sim = FakeSimulator(env.port, autoreply=True, ping_interval=0.05).connect()
    try:
        assert sim.open_packet == {"sid": sim.sid, "upgrades": [], "pingInterval": 25000,  # the engine.io OPEN
                                   "pingTimeout": 60000}
        assert len(sim.sid) >= 16 and env.bridge.newest_sid() == sim.sid
        obs, info = env.reset()  # the simulator's first telemetry (sent on connect)
        assert obs.shape == (160, 320, 3) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
        assert np.array_equal(obs, decode_frame(sim.frames_b64[0]))  # exactly the frame it sent
        assert info["manual"] is False and info["speed_mph"] == 0.0 and info["steering_command"] is None
        assert isinstance(info["time_s"], float) and abs(info["time_s"] - time.perf_counter()) < 5

        prev_time = info["time_s"]
        for action, expected in [(0.3, 0.3), (np.array([5.0], np.float32), 1.0), ([-7.0], -1.0), (-0.25, -0.25)]:
            obs, reward, terminated, truncated, info = env.step(action)
            steer = sim.next_event("steer")
            assert set(steer) == {"steering_angle", "throttle"}
            assert isinstance(steer["steering_angle"], str) and isinstance(steer["throttle"], str)
            assert float(steer["steering_angle"]) == pytest.approx(expected, abs=1e-6)  # clamped to [-1, 1]
            assert -1.0 <= float(steer["throttle"]) <= 1.0
            assert (reward, terminated, truncated) == (0.0, False, False)
            # the next telemetry is the simulator's reply: its numbers arrive in info
            assert info["steering_angle_deg"] == pytest.approx(sim.sent["steering_angle"], abs=1e-3)
            assert info["speed_mph"] == pytest.approx(sim.sent["speed"], abs=1e-3)
            assert info["throttle"] == pytest.approx(sim.sent["throttle"], abs=1e-3)
            assert info["steering_command"] == pytest.approx(expected, abs=1e-6)
            assert info["time_s"] > prev_time
            prev_time = info["time_s"]
        assert sim.counts["steer"] == 4

        # manual driving: the simulator sends {}, the bridge answers "manual", step reports it
        sim.manual_driving = True
        obs, _, _, truncated, info = env.step(0.0)  # sends steer; the reply is {}
        assert info["manual"] is True and not truncated
        assert sim.next_event("manual") == {}
        sim.manual_driving = False
        for _ in range(50):
            obs, _, _, _, info = env.step(0.0)
            if not info["manual"]:
                break
        assert info["manual"] is False and obs.shape == (160, 320, 3)

        # the simulator's own pings are answered; it never sent "40", the server's "40" came once
        assert sim.wait_for(lambda c: c["pong"] >= 2, 5)
        assert sim.counts["connect_ack"] == 1 and sim.counts["other"] == 0
    finally:
        sim.close()

    # the simulator quits: step truncates, and reset waits for the next connection
    obs, _, terminated, truncated, info = env.step(0.1)
    assert truncated and not terminated and info["truncated_reason"] == "disconnected"
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0.0)
    sim2 = FakeSimulator(env.port, autoreply=True, frames=[synthetic_road_frame(99, -0.8)]).connect()
    try:
        obs, info = env.reset()
        assert np.array_equal(obs, decode_frame(sim2.frames_b64[0]))
        env.step(-0.5)
        assert float(sim2.next_event("steer")["steering_angle"]) == -0.5
        assert sim.counts["steer"] == 5  # the first simulator got nothing more
    finally:
        sim2.close()


def _eventually(predicate, timeout: float = 5.0) -> bool:
    """Whether ``predicate()`` holds within ``timeout`` seconds (polled every 10 ms)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_ping_data_is_echoed_and_an_engineio_close_ends_only_that_session(env):
    with FakeSimulator(env.port, ping_interval=3600) as other:
        sim = FakeSimulator(env.port, ping_interval=3600).connect()
        try:
            # the client reads its OPEN packet before the server's thread records the connection
            assert sim.sid != other.sid
            assert _eventually(lambda: env.bridge.is_connected(sim.sid) and env.bridge.is_connected(other.sid))
            sim.send_raw("2probe")  # engine.io 3: the pong carries the ping's data
            assert sim.next_event("pong") == "3probe"
            sim.ping()
            assert sim.next_event("pong") == "3"
            sim.send_raw("1")  # engine.io CLOSE from the client
            assert sim.wait_for(lambda c: c["disconnected"] >= 1, 5) and sim.closed_by_server
            _eventually(lambda: not env.bridge.is_connected(sim.sid))
            assert not env.bridge.is_connected(sim.sid) and env.bridge.is_connected(other.sid)
            assert env.bridge.pending_replies(sim.sid) == 0
            other.ping()
            assert other.next_event("pong") == "3"  # the other session goes on
        finally:
            sim.close()


def test_live_and_training_decoders_give_identical_tensors(tmp_path, monkeypatch):
    """A JPEG from the simulator and the same JPEG in a recording reach the policy as identical tensors:
    both pipelines decode with envs.udacity.camera.decode_camera_jpeg (counted here)."""
    import torch
    from udacity_fixture import write_recording

    import agent.data.udacity as training
    import envs.udacity.camera as camera
    import envs.udacity.protocol as protocol
    from agent.data.udacity import load_recording, preprocess
    from agent.nn.policy import DrivingPolicy, default_config

    calls = []

    def spy(data):
        calls.append(len(data))
        return decoder(data)

    decoder = camera.decode_camera_jpeg
    monkeypatch.setattr(camera, "decode_camera_jpeg", spy)
    monkeypatch.setattr(protocol, "decode_camera_jpeg", spy)
    assert training.decode_camera_jpeg is decoder  # the training pipeline imports the same function
    monkeypatch.setattr(training, "decode_camera_jpeg", spy)

    root, _ = write_recording(tmp_path / "rec", n=4)
    rec = load_recording(root, on_bad_row="error", progress=False)  # the training pipeline
    assert len(calls) == 4 * 3  # every camera image of every row
    centers = sorted((root / "IMG").glob("center_*.jpg"))  # the names carry the time: row order
    assert len(centers) == len(rec.frames_center) == 4
    features = DrivingPolicy(default_config("udacity", window=2, d_model=20, seed=0,
                                            core_kwargs={"num_heads": 4, "topk": 4})).eval().features
    for i, path in enumerate(centers):
        live = decode_telemetry(dict(GOOD, image=base64.b64encode(path.read_bytes()).decode()))  # the live one
        assert len(calls) == 4 * 3 + i + 1
        assert live.frame.dtype == rec.frames_center.dtype == np.uint8
        assert np.array_equal(live.frame, rec.frames_center[i])
        # the tensors: live frames go to the policy raw, training windows arrive preprocessed (66x200 YUV)
        live_x = features.preprocess(live.frame[None])
        train_x = features.preprocess(preprocess(rec.frames_center[i: i + 1]))
        assert live_x.shape == (1, 3, 66, 200) and torch.equal(live_x, train_x)
    other = features.preprocess(preprocess(rec.frames_center[1:2]))
    assert not torch.equal(features.preprocess(preprocess(rec.frames_center[:1])), other)  # frames do differ


def test_reset_without_simulator_times_out_quickly_with_a_clear_message():
    e = UdacityEnv(port=0, connect_timeout=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"no Udacity simulator connected to ws://127\.0\.0\.1:\d+ within "
                                               r"0\.3 s: start the simulator and choose Autonomous mode"):
            e.reset()
        assert time.monotonic() - t0 < 2.0
    finally:
        e.close()


def test_silent_simulator_truncates_the_step_and_close_frees_the_port():
    e = UdacityEnv(port=0, connect_timeout=5.0, step_timeout=0.3)
    with e:
        port = e.start()
        with FakeSimulator(port) as sim:  # replies to nothing on its own
            sim.send_telemetry(speed=10.0)
            _, info = e.reset()
            assert info["speed_mph"] == 10.0
            _, _, _, truncated, info = e.step(0.0)
            assert truncated and info["truncated_reason"] == "timeout"
            assert sim.next_event("steer")  # the command did go out

            # reset asks a connected but silent simulator for a frame (with 'manual')
            def answer():
                sim.next_event("manual", timeout=5)
                sim.send_telemetry(speed=11.0)

            helper = threading.Thread(target=answer)
            helper.start()
            _, info = e.reset()
            helper.join()
            assert info["speed_mph"] == 11.0
        thread = e.bridge._thread
    assert thread is not None and not thread.is_alive()
    with socket.socket() as s:  # the port is free again
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_a_new_simulator_connection_truncates_and_the_next_reset_drives_it(env):
    with FakeSimulator(env.port, autoreply=True) as old:
        env.reset()
        env.step(0.0)
        with FakeSimulator(env.port, autoreply=True, frames=[synthetic_road_frame(7, 0.9)]) as new:
            for _ in range(200):  # the old one keeps answering until the new connection shows up
                _, _, _, truncated, info = env.step(0.0)
                if truncated:
                    break
            assert truncated and info["truncated_reason"] == "new_connection"
            obs, _ = env.reset()
            assert np.array_equal(obs, decode_frame(new.frames_b64[0]))
            env.step(0.7)
            assert float(new.next_event("steer")["steering_angle"]) == 0.7
            assert old.connected  # not closed by us, just no longer driven


def test_a_second_bridge_on_a_taken_port_fails_clearly(env):
    other = UdacityEnv(port=env.port)
    with pytest.raises(OSError, match="cannot serve the Udacity simulator"):
        other.start()
    other.close()


def test_oversized_frame_ends_only_that_connection(warnings_counter):
    e = UdacityEnv(port=0, connect_timeout=5.0, max_message_bytes=64 * 1024)
    with e:
        port = e.start()
        sim = FakeSimulator(port).connect()
        sim.send_event("telemetry", dict(GOOD, image="A" * 100_000))
        assert sim.wait_for(lambda c: c["disconnected"] >= 1, 5)
        assert sim.closed_by_server
        _eventually(lambda: warnings_counter.count >= 1)  # aiohttp closes the socket before the bridge logs why
        assert warnings_counter.count == 1 and e.bridge.stats["websocket_errors"] == 1
        sim.close()
        with FakeSimulator(port, autoreply=True) as sim2:  # the server carries on
            e.reset()
            e.step(0.2)
            assert float(sim2.next_event("steer")["steering_angle"]) == 0.2


def test_only_local_websocket_connections_are_served(env, warnings_counter):
    import http.client

    import websocket

    conn = http.client.HTTPConnection("127.0.0.1", env.port, timeout=5)  # engine.io long-polling
    conn.request("GET", "/socket.io/?EIO=3&transport=polling")
    assert conn.getresponse().status == 400
    conn.close()
    url = f"ws://127.0.0.1:{env.port}/socket.io/?EIO=4&transport=websocket"
    with pytest.raises(websocket.WebSocketBadStatusException):  # DNS rebinding: a page named evil.example
        websocket.create_connection(url, host="evil.example:4567", origin="http://evil.example:4567", timeout=5)
    with pytest.raises(websocket.WebSocketBadStatusException):  # a page elsewhere (engine.io's origin check)
        websocket.create_connection(url, origin="http://evil.example", timeout=5)
    with pytest.raises(websocket.WebSocketBadStatusException):  # same host, other port: another origin
        websocket.create_connection(url, origin=f"http://127.0.0.1:{env.port + 1}", timeout=5)
    with pytest.raises(websocket.WebSocketBadStatusException):  # a websocket that asks for long-polling
        websocket.create_connection(url.replace("transport=websocket", "transport=polling"), timeout=5)
    with pytest.raises(websocket.WebSocketBadStatusException):  # an engine.io version we do not speak
        websocket.create_connection(url.replace("EIO=4", "EIO=2"), timeout=5)
    assert warnings_counter.count == 6 and env.bridge.stats["refused"] == 6  # each refusal logged once
    # the server's own origin (websocket-client sends it by default) and no Origin at all are served
    for kwargs in ({}, {"suppress_origin": True}):
        ws = websocket.create_connection(url, timeout=5, **kwargs)
        try:
            assert ws.recv().startswith('0{"sid":')
        finally:
            ws.close()
    assert env.bridge.stats["refused"] == 6
    _eventually(lambda: env.bridge.stats["disconnects"] >= 2)  # both ended before the four below (MAX_CONNECTIONS)
    assert env.bridge.stats["disconnects"] == 2
    sims = [FakeSimulator(env.port).connect() for _ in range(4)]
    try:
        with pytest.raises(websocket.WebSocketBadStatusException):
            FakeSimulator(env.port).connect()  # a fifth
        assert env.bridge.stats["refused"] == 7
    finally:
        for sim in sims:
            sim.close()


# -- robustness -----------------------------------------------------------------------------------

def _fuzz_messages(rng: np.random.Generator, n: int, n_huge: int):
    """n messages the real simulator would never send, each with what the bridge must do.

    Returns a list of (payload, binary, outcome) with outcome one of "reply+log" (malformed
    telemetry: a log line and a 'manual' reply), "reply" (empty telemetry: 'manual'), "log"
    (dropped with a log line), "pong" (an engine.io ping).
    """
    jpeg = base64.b64decode(GOOD_B64)
    wrong_sizes = [_jpeg_b64(h, w) for h, w in [(32, 64), (161, 320), (160, 321), (320, 160), (1, 1)]]
    _, png = cv2.imencode(".png", GOOD_FRAME)
    png_b64 = base64.b64encode(png.tobytes()).decode()
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz0123456789{}[]\",:./-_ é€😀\\"))

    def text(k):
        return "".join(rng.choice(alphabet, size=int(k)))

    def telemetry(data):
        return event_frame("telemetry", data)

    bad_numbers = ["abc", "", " ", "1.2.3", "nan", "inf", "-inf", "1e999", "0x10", "1,2,3", "9" * 40, "--1"]
    wrong_types = [None, True, False, [], {}, [1.0], {"a": 1}]

    def bad_image():
        k = int(rng.integers(7))
        if k == 0:
            return "".join(rng.choice(list("!@#$%^&*"), size=8)) + GOOD_B64[8:]
        if k == 1:
            return base64.b64encode(rng.bytes(int(rng.integers(1, 3000)))).decode()
        if k == 2:
            return base64.b64encode(jpeg[: int(rng.integers(2, len(jpeg) - 3))]).decode()
        if k == 3:
            return wrong_sizes[int(rng.integers(len(wrong_sizes)))]
        if k == 4:
            return base64.b64encode(b"\xff\xd8" + rng.bytes(int(rng.integers(10, 500))) + b"\xff\xd9").decode()
        if k == 5:
            return png_b64
        return GOOD_B64[: int(rng.integers(1, len(GOOD_B64) - 8))] + "="  # bad padding / truncated text

    def without_some_fields():
        dropped = set(rng.choice(list(GOOD), int(rng.integers(1, 5)), replace=False))
        return {k: v for k, v in GOOD.items() if k not in dropped} | {"extra": 1}

    generators = [
        # malformed telemetry: logged and answered with 'manual'
        (lambda: telemetry(dict(GOOD, image=bad_image())), "reply+log", 10),
        (lambda: telemetry(dict(GOOD, image="")), "reply+log", 1),
        (lambda: telemetry(without_some_fields()), "reply+log", 3),
        (lambda: telemetry(dict(GOOD, **{str(rng.choice(["steering_angle", "throttle", "speed"])):
                                         bad_numbers[int(rng.integers(len(bad_numbers)))]})), "reply+log", 3),
        (lambda: telemetry(dict(GOOD, **{str(rng.choice(list(GOOD))):
                                         wrong_types[int(rng.integers(len(wrong_types)))]})),
         "reply+log", 3),
        (lambda: telemetry([["hello"], 5, 1.5, True, "x", [1, 2], 0][int(rng.integers(7))]), "reply+log", 2),
        # empty telemetry (a person drives): answered with 'manual', no log line
        (lambda: ['42["telemetry",{}]', '42["telemetry",null]', '42["telemetry"]'][int(rng.integers(3))], "reply", 2),
        # socket.io level: malformed JSON, other packet types, unknown events, shapes, namespaces
        (lambda: ['42["telemetry",{', "42[", '42["telemetry",{"a":}]', "42['x']", '42["telemetry"', "42" + text(20)]
         [int(rng.integers(6))], "log", 4),
        (lambda: ["40", "41", "43[1]", '44"err"', '451-["telemetry",{"_placeholder":true,"num":0}]', "46", "47",
                  "4x", "4", "4-1", "421"][int(rng.integers(11))], "log", 3),
        (lambda: event_frame(str(rng.choice(["steer", "manual", "foo", "Telemetry", ""])), {"a": 1}), "log", 2),
        (lambda: ["42[]", "42[1,2]", '42{"a":1}', '42"telemetry"', "42[null]", '42/admin,["telemetry",{}]']
         [int(rng.integers(6))], "log", 2),
        (lambda: ["4[1,2]", '4{"a":1}', "4null", "41.5", '4"x"', "4true"][int(rng.integers(6))], "log", 2),
        # websocket level: frames that are not engine.io packets the simulator sends
        (lambda: str(rng.choice(list("03567abc{[ x"))) + text(rng.integers(0, 40)), "log", 3),
        (lambda: "", "log", 1),
        (lambda: rng.bytes(int(rng.integers(1, 200))), "log", 2),
        # engine.io pings, as the simulator sends them
        (lambda: str(rng.choice(["2", "2probe"])), "pong", 1),
    ]
    weights = np.array([w for *_, w in generators], float)
    picks = rng.choice(len(generators), size=n - n_huge, p=weights / weights.sum())
    out = []
    for i in picks:
        make, outcome, _ = generators[i]
        payload = make()
        out.append((payload, isinstance(payload, bytes), outcome))
    for _ in range(n_huge):  # near the 1 MiB frame limit: valid base64, not a JPEG
        out.insert(int(rng.integers(len(out))), (telemetry(dict(GOOD, image="A" * 1_000_000)), False, "reply+log"))
    return out


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_ten_thousand_malformed_messages_are_each_answered_or_logged_without_crash_or_growth(
        env, warnings_counter):
    rng = np.random.default_rng(0)
    # no background pings (counts stay exact) and a short history (the fake must not grow either)
    sim = FakeSimulator(env.port, ping_interval=3600, history=100).connect()
    sent = 0
    expected = {"manual": 0, "pong": 0, "log": 0}
    measurements = []
    try:
        for _ in range(4):  # two warm the allocator up; growth is measured over the next two
            messages = _fuzz_messages(rng, 3000, n_huge=2)
            sent += len(messages)
            for payload, binary, outcome in messages:
                if binary:
                    sim.send_binary(payload)
                else:
                    sim.send_raw(payload)
                expected["manual"] += outcome.startswith("reply")
                expected["log"] += outcome.endswith("log")
                expected["pong"] += outcome == "pong"
            sim.ping()  # frames are handled in order: when this pong is back, all of the batch is done
            expected["pong"] += 1
            assert sim.wait_for(lambda c: c["pong"] >= expected["pong"], 60), (dict(sim.counts), expected)
            assert sim.counts["manual"] == expected["manual"], (dict(sim.counts), expected)
            assert sim.counts["pong"] == expected["pong"]
            assert warnings_counter.count == expected["log"], (warnings_counter.count, expected)
            assert sim.connected and env.bridge.running
            # bounded state: the env's event queue and the simulator's reply queue
            assert len(env.bridge.events) <= EVENT_CAPACITY
            assert env.bridge.newest_sid() == sim.sid and env.bridge.is_connected(sim.sid)
            assert env.bridge.pending_replies(sim.sid) <= 2
            gc.collect()
            measurements.append((_rss_mb(), len(gc.get_objects())))
        (rss0, objects0), (rss1, objects1) = measurements[1], measurements[3]
        assert rss1 - rss0 < 16, measurements  # MB; observed: 0 to 7 (allocator noise). 6000 kept messages: 30+
        assert objects1 - objects0 < 2000, measurements
        assert env.bridge.stats["messages"] > 0 and env.bridge.stats["malformed"] > 0

        # the server still serves a well-formed frame afterwards
        sim.send_telemetry(steering_angle=1.0, throttle=0.5, speed=20.0)
        obs, info = env.reset()
        assert info["speed_mph"] == 20.0 and obs.shape == (160, 320, 3)
        env.step(0.5)
        assert float(sim.next_event("steer")["steering_angle"]) == 0.5
    finally:
        sim.close()
    assert sent >= 10_000


def test_non_finite_action_is_sent_as_zero(env):
    with FakeSimulator(env.port, autoreply=True) as sim:
        env.reset()
        env.step(float("nan"))
        assert float(sim.next_event("steer")["steering_angle"]) == 0.0
        with pytest.raises(ValueError, match="one normalised steering"):
            env.step([0.1, 0.2])
        assert not math.isnan(env.step([0.0])[4]["steering_command"])


def test_bench_bridge_row_and_table():
    import io

    from agent.bench.bridge import ROW_KEYS, bench_bridge, print_bridge_table

    calls = []

    def policy(frame, info):
        calls.append((frame.shape, info["manual"]))
        return 0.1

    row = bench_bridge(n=30, policy_fn=policy, warmup=5)
    assert set(row) == set(ROW_KEYS) and row["n"] == 30 and row["label"] == "policy"
    assert len(calls) == 35 and calls[0] == ((160, 320, 3), False)
    assert 0 < row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"] <= row["max_ms"] and row["steps_per_s"] > 0
    out = io.StringIO()
    print_bridge_table([row], file=out)
    assert "p99 ms" in out.getvalue() and "policy" in out.getvalue()
