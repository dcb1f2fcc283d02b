"""The bridge cannot be held (issue 38, item 5): an idle connection loses its slot to a new one.

Real websockets on loopback against :class:`envs.udacity.bridge.UdacityBridge`, with the fake
simulator of envs/udacity/fake.py. The idle timeout is 0.2 s here (3 s by default), so each test
takes about a second or two.
"""

from __future__ import annotations

import threading
import time

import pytest
import websocket
from udacity_fake_sim import FakeSimulator

from envs.udacity.bridge import IDLE_TIMEOUT_S, MAX_CONNECTIONS, UdacityBridge

IDLE_S = 0.2


@pytest.fixture
def bridge():
    b = UdacityBridge(port=0, idle_timeout_s=IDLE_S)
    b.start()
    yield b
    b.stop()


class _Talker:
    """A fake simulator that sends a telemetry frame every 20 ms from its own thread (as in Autonomous mode)."""

    def __init__(self, port: int, manual: bool = False):
        self.sim = FakeSimulator(port).connect()
        self.manual = manual
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.sim.send_manual() if self.manual else self.sim.send_telemetry()
            except Exception:  # noqa: BLE001 - closed: the test sees it through sim.connected
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self.sim.close()


def _pinger(port: int) -> FakeSimulator:
    """A connection that only sends engine.io pings (every 50 ms): alive, but it never drives."""
    return FakeSimulator(port, ping_interval=0.05).connect()


def test_idle_connections_that_only_ping_give_their_slots_to_new_simulators(bridge):
    talker = _Talker(bridge.port)
    holders = [_pinger(bridge.port) for _ in range(MAX_CONNECTIONS - 1)]  # every slot taken
    newcomers: list[FakeSimulator] = []
    try:
        deadline = time.monotonic() + 5
        while bridge.stats["telemetry"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        for attempt in range(10):  # the 10 tries; each newcomer in turn sits idle and is evicted later
            time.sleep(IDLE_S * 1.5)
            newcomers.append(FakeSimulator(bridge.port).connect())  # would raise WebSocketBadStatusException (503)
            assert bridge.stats["evicted"] == attempt + 1
        everyone = holders + newcomers
        deadline = time.monotonic() + 5
        # each eviction is seen twice by the client (its socket closes; its reader thread then marks the
        # close as the server's): wait for both, which a busy machine can take a while to show
        while time.monotonic() < deadline:
            gone = [s for s in everyone if not s.connected]
            if len(gone) >= 10 and all(s.closed_by_server for s in gone):
                break
            time.sleep(0.01)
        evicted = [s for s in everyone if not s.connected]
        assert len(evicted) == 10 and all(s.closed_by_server for s in evicted)
        assert evicted[:3] == holders  # the stalest go first: the three holders, then the newcomers in order
        assert evicted[3:] == newcomers[:7]
        assert talker.sim.connected and bridge.is_connected(talker.sim.sid)  # the simulator that talks stays
        assert bridge.stats["refused"] == 0
        assert holders[0].counts["pong"] >= 1  # the holders did ping, and were answered, before they lost the slot
    finally:
        talker.close()
        for s in holders + newcomers:
            s.close()


def test_connections_that_send_telemetry_are_never_evicted(bridge):
    talkers = [_Talker(bridge.port, manual=(i % 2 == 1)) for i in range(MAX_CONNECTIONS)]  # manual mode talks too
    try:
        time.sleep(IDLE_S * 2)
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            FakeSimulator(bridge.port).connect()
        assert refused.value.status_code == 503
        assert bridge.stats["evicted"] == 0 and bridge.stats["refused"] == 1
        assert all(t.sim.connected and bridge.is_connected(t.sim.sid) for t in talkers)
    finally:
        for t in talkers:
            t.close()


def test_malformed_telemetry_does_not_keep_a_slot_and_a_fresh_connection_is_not_idle():
    bridge = UdacityBridge(port=0, idle_timeout_s=1.0)  # longer: the newcomer must still be fresh below
    bridge.start()
    talkers = [_Talker(bridge.port) for _ in range(MAX_CONNECTIONS - 1)]
    garbage = FakeSimulator(bridge.port).connect()
    stop = threading.Event()

    def send_garbage():
        while not stop.wait(0.02):
            try:
                garbage.send_event("telemetry", {"steering_angle": "x", "speed": "fast"})
            except Exception:  # noqa: BLE001 - evicted
                return

    thread = threading.Thread(target=send_garbage, daemon=True)
    thread.start()
    newcomer = None
    try:
        time.sleep(1.2)
        newcomer = FakeSimulator(bridge.port).connect()  # takes the slot of the one sending garbage
        assert garbage.wait_for(lambda c: c["disconnected"] >= 1, 5) and garbage.closed_by_server
        assert bridge.stats["evicted"] == 1 and bridge.stats["malformed"] >= 1
        # the newcomer has not been idle for 1 s yet, and the others talk: a sixth is refused
        with pytest.raises(websocket.WebSocketBadStatusException):
            FakeSimulator(bridge.port).connect()
        assert newcomer.connected and bridge.stats["evicted"] == 1
    finally:
        stop.set()
        thread.join(2.0)
        garbage.close()
        if newcomer is not None:
            newcomer.close()
        for t in talkers:
            t.close()
        bridge.stop()


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
def test_idle_timeout_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="idle_timeout_s"):
        UdacityBridge(port=0, idle_timeout_s=bad)
    assert IDLE_TIMEOUT_S > 0
