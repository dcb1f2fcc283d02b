"""A recorded drive played as the Udacity simulator in Autonomous mode (:class:`ReplaySimulator`).

``drive --env udacity --replay DIR`` (:mod:`agent.drive.replay` reads the recording) connects a
:class:`ReplaySimulator` to the bridge. It is :class:`envs.udacity.fake.FakeSimulator` (a raw
websocket client speaking the simulator's exact wire protocol) with the recording as its camera:

- it connects as the simulator does (``ws://HOST:PORT/socket.io/?EIO=4&transport=websocket``,
  the engine.io OPEN packet, no socket.io CONNECT, its own pings);
- on connecting and after each reply it sends the next recorded frame as
  ``42["telemetry",{...}]``: the center camera's JPEG bytes as recorded (base64), and the
  recording's steering (in degrees, as the simulator reports its wheel), throttle and speed;
- it keeps the ``steer`` that answers each frame (:attr:`ReplaySimulator.answers`); a ``manual``
  reply (the bridge refused the frame, or asked for one) sends the same frame again, at most
  ``resend`` times, then goes on without an answer for it;
- after the answer to the last frame it closes the connection, as the simulator does when it quits.

The car does not follow the steering: the frames are the recording's, so each answer can be
scored against the driver's label of the same frame.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from envs.udacity.fake import FakeSimulator
from envs.udacity.protocol import MAX_STEERING_DEG

#: Times a frame answered with ``manual`` is sent again before the replay goes on without its answer.
RESEND = 3


class ReplaySimulator(FakeSimulator):
    """Plays recorded frames to the bridge in order, one per reply (see the module docstring).

    Args:
        port, host: the bridge's address.
        images: N JPEG files' bytes, the center camera's frames in the order to play them.
        steering: (N,) the recording's normalised steering (1.0 = 25 degrees, + = right).
        throttle, speed: (N,) the recording's throttle and speed (mph).
        timeout: seconds to wait for the connection and the OPEN packet.
        resend: times a frame answered with ``manual`` is sent again (:data:`RESEND`).

    Attributes:
        answers: (N,) float64, the normalised steering of the ``steer`` that answered each frame
            (NaN: not answered); ``answer_throttle`` likewise its throttle.
        frames_sent: distinct frames sent so far (the next frame's index); ``resent``: frames sent again.

    Raises:
        ValueError: no frames, or arrays whose lengths differ from ``images``.
    """

    def __init__(self, port: int, images: Sequence[bytes], steering, throttle, speed, host: str = "127.0.0.1", *,
                 timeout: float = 5.0, resend: int = RESEND):
        super().__init__(port, host, autoreply=True, frames=[], timeout=timeout)
        n = len(images)
        self.images = images
        self.recorded = {name: np.asarray(v, np.float64).reshape(-1)
                         for name, v in (("steering", steering), ("throttle", throttle), ("speed", speed))}
        if n == 0:
            raise ValueError("a replay needs at least one frame")
        bad = {name: len(v) for name, v in self.recorded.items() if len(v) != n}
        if bad:
            raise ValueError(f"{n} images but {bad} values: give one steering, throttle and speed per image")
        self.resend = int(resend)
        self.answers = np.full(n, np.nan)
        self.answer_throttle = np.full(n, np.nan)
        self.frames_sent = 0
        self.resent = 0
        #: ``time.perf_counter()`` when the first frame was sent and when the last answer came
        self.t_first_sent: float | None = None
        self.t_last_answer: float | None = None
        self._current: int | None = None  # the frame awaiting its reply
        self._tries = 0

    def __len__(self) -> int:
        return len(self.answers)

    @property
    def answered(self) -> int:
        """Frames answered with ``steer`` so far."""
        return int(np.count_nonzero(~np.isnan(self.answers)))

    def send_next(self) -> None:
        """Send the next recorded frame, or close the connection after the last one."""
        i = self.frames_sent
        if i >= len(self):
            self._current = None
            self.close()  # the simulator quits: the bridge sees the websocket close
            return
        self.frames_sent += 1
        self._send_frame(i)

    def _send_frame(self, i: int) -> None:
        self._current = i
        r = self.recorded
        image = base64.b64encode(bytes(self.images[i])).decode("ascii")
        t = self.send_telemetry(float(r["steering"][i]) * MAX_STEERING_DEG, float(r["throttle"][i]),
                                float(r["speed"][i]), image=image, frame_index=i)
        if self.t_first_sent is None:
            self.t_first_sent = t

    def answer(self, name: str, payload: Any) -> None:
        """Keep a ``steer``'s steering for the frame it answers, then send the next frame; on ``manual``
        send the same frame again (at most :attr:`resend` times)."""
        i = self._current
        if i is None:
            return
        if name == "steer":
            try:
                steering, throttle = float(payload["steering_angle"]), float(payload["throttle"])
            except (TypeError, KeyError, ValueError):
                steering = throttle = float("nan")  # a malformed command: no answer for this frame
            self.answers[i], self.answer_throttle[i] = steering, throttle
            self.t_last_answer = time.perf_counter()
        elif self._tries < self.resend:
            self._tries += 1
            self.resent += 1
            self._send_frame(i)
            return
        self._tries = 0
        self.send_next()

    def wait(self, timeout: float = 5.0) -> bool:
        """Wait until the connection ended (it does after the answer to the last frame); returns whether it did."""
        return self.wait_for(lambda counts: counts["disconnected"] > 0, timeout)


__all__ = ["RESEND", "ReplaySimulator"]
