"""The wire-level fake Udacity simulator for the tests (it lives in :mod:`envs.udacity.fake`,
where :mod:`agent.bench.bridge` uses it too; tests/ is not a package)."""

from envs.udacity.fake import FakeSimulator, encode_frame_b64, event_frame, synthetic_road_frame

__all__ = ["FakeSimulator", "encode_frame_b64", "event_frame", "synthetic_road_frame"]
