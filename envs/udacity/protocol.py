"""The Udacity simulator's wire protocol: what it sends and how we read it, without any transport.

The simulator (udacity/self-driving-car-sim, "Autonomous mode") is the socket.io *client*: it
opens ``ws://127.0.0.1:4567/socket.io/?EIO=4&transport=websocket`` and we are the server
(:mod:`envs.udacity.bridge`). Facts from its source (docs/design.md section 5):

- It speaks the old protocol despite the ``EIO=4`` in its URL: it sends engine.io PINGs ("2")
  itself and expects PONGs ("3"), and it never sends the socket.io namespace CONNECT ("40").
- Sim -> us: event ``telemetry`` with string fields ``steering_angle`` (degrees, about +-25),
  ``throttle`` (0..1), ``speed`` (mph, 0..30) and ``image`` (base64 JPEG, 320x160 RGB). It sends
  one on connecting, then exactly one in reply to each ``steer`` or ``manual`` of ours. While a
  person drives (W/S held) it sends an empty ``{}``, which we answer with ``manual`` ``{}``.
- Us -> sim: event ``steer`` with ``steering_angle`` (a string, normalised to [-1, 1]; the
  simulator multiplies it by its 25 degree maximum) and ``throttle`` (a string, -1..1; negative
  brakes while the car moves forward faster than about 5 mph and reverses below that).

This module holds those constants, the decoded :class:`Telemetry` and its validating decoders
(:func:`decode_telemetry`, :func:`decode_frame`, :func:`parse_number`), which raise
:class:`TelemetryError` on anything malformed: nothing here trusts the simulator's bytes. JPEGs
are decoded by :mod:`envs.udacity.camera`, as recordings are. One limit: a JPEG that is
structurally complete but has corrupted entropy data decodes to a damaged picture (libjpeg
reports that only as a warning); truncated, foreign-format or wrongly sized images are refused.
It has no transport (the websocket and its packets are :mod:`envs.udacity.bridge` and
:mod:`envs.udacity.codec`).
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from envs.udacity.camera import FRAME_SHAPE, CameraImageError, decode_camera_jpeg

#: The TCP port the simulator connects to (hard-coded in the simulator).
DEFAULT_PORT = 4567
#: The simulator's steering limit in degrees; a normalised steering of 1.0 means this angle.
MAX_STEERING_DEG = 25.0
#: The largest websocket frame accepted (bytes). A real frame is 10-30 kB of base64 JPEG.
MAX_MESSAGE_BYTES = 1 << 20
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

    The JPEG goes through :func:`envs.udacity.camera.decode_camera_jpeg`, the decoder the
    recording reader uses too, so a live frame equals the same JPEG read from a recording. Its
    header (format and 320x160 size) is checked before any pixel is decoded, so a forged header
    cannot make us allocate a huge image; a truncated JPEG is refused rather than returned with
    grey rows.

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
    try:
        return decode_camera_jpeg(data)
    except CameraImageError as e:
        raise TelemetryError(f"field 'image' {e}") from None


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


def _format_number(x: float) -> str:
    """A number as a field of ``steer`` (the simulator parses strings)."""
    return format(x, ".6f")


__all__ = [
    "DEFAULT_PORT", "FRAME_SHAPE", "MAX_MESSAGE_BYTES", "MAX_STEERING_DEG", "Telemetry", "TelemetryError",
    "decode_frame", "decode_telemetry", "parse_number",
]
