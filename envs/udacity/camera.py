"""The simulator's camera JPEGs -> RGB frames: the one decoder for live telemetry and for recordings.

The policy must see in the simulator exactly what it saw in training, so the live bridge
(:func:`envs.udacity.protocol.decode_frame`, base64 from the websocket) and the recording reader
(:func:`agent.data.udacity.load_recording`, files in ``IMG/``) both decode with
:func:`decode_camera_jpeg`. The pixels come from OpenCV's ``cv2.imdecode`` (libjpeg-turbo, as
the shipped policies were trained with), the header is read first with Pillow, without decoding
pixels, so a forged header cannot make us allocate a huge image.
"""

from __future__ import annotations

import io

import cv2
import numpy as np
from PIL import Image

#: The camera frame the simulator sends and records: 160 rows x 320 columns, RGB.
FRAME_SHAPE = (160, 320, 3)
_JPEG_SOI, _JPEG_EOI = b"\xff\xd8", b"\xff\xd9"
#: EXIF orientation is ignored: the simulator writes none, and the size check reads the stored size.
_IMREAD_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


class CameraImageError(ValueError):
    """Bytes that are not a usable 320x160 camera JPEG; the message completes "the image ..." ."""


def decode_camera_jpeg(data: bytes | bytearray | memoryview) -> np.ndarray:
    """Decode one camera JPEG to a (160, 320, 3) uint8 RGB array.

    Checks, in this order: the JPEG start marker; the end marker within the last 32 bytes (a
    truncated file is refused rather than returned with grey rows); the header's format and
    320x160 size (Pillow, before any pixel is decoded); then OpenCV decodes the pixels. One limit:
    a JPEG that is structurally complete but has corrupted entropy data decodes to a damaged
    picture (libjpeg reports that only as a warning).

    Raises:
        CameraImageError: empty, not a JPEG, truncated, undecodable, or not 320x160.
    """
    data = bytes(data)
    if not data:
        raise CameraImageError("is empty")
    if not data.startswith(_JPEG_SOI):
        raise CameraImageError(f"is not a JPEG (starts with {data[:4]!r})")
    if _JPEG_EOI not in data[-32:]:
        raise CameraImageError(f"is a truncated JPEG ({len(data)} bytes, no end marker)")
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:  # reads the header only
            width, height = img.size
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, ... on corrupt headers
        raise CameraImageError(f"is not a decodable JPEG ({type(e).__name__}: {e})") from None
    if (height, width) != FRAME_SHAPE[:2]:
        raise CameraImageError(f"is {width}x{height}, expected {FRAME_SHAPE[1]}x{FRAME_SHAPE[0]}")
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), _IMREAD_FLAGS)
    if bgr is None:
        raise CameraImageError("is not a decodable JPEG (OpenCV could not decode its pixels)")
    if bgr.shape != FRAME_SHAPE or bgr.dtype != np.uint8:
        raise CameraImageError(f"decoded to shape {bgr.shape} {bgr.dtype}, expected {FRAME_SHAPE} uint8")
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


__all__ = ["FRAME_SHAPE", "CameraImageError", "decode_camera_jpeg"]
