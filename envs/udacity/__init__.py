"""The Udacity self-driving-car simulator as a gymnasium env, one module per job.

- :mod:`envs.udacity.protocol`: the simulator's messages: constants, :class:`Telemetry` and its
  validating decoders (no transport).
- :mod:`envs.udacity.camera`: the camera JPEG decoder, shared by live telemetry and recordings.
- :mod:`envs.udacity.codec`: the engine.io 3 / socket.io 2 text packets (pure encode/decode functions).
- :mod:`envs.udacity.bridge`: the websocket server the simulator connects to (:class:`UdacityBridge`).
- :mod:`envs.udacity.throttle`: the PI speed controller that sets the throttle (:class:`ThrottleController`).
- :mod:`envs.udacity.env`: the gymnasium env (:class:`UdacityEnv`, ``agent/Udacity-v0``).
- :mod:`envs.udacity.fake`: a wire-level fake simulator for tests and benchmarks (:class:`FakeSimulator`).
- :mod:`envs.udacity.replay`: a recorded drive played as the simulator (:class:`ReplaySimulator`, ``drive --replay``).

Importing this package is cheap: the names above are imported on first use
(``envs.udacity.UdacityEnv`` loads aiohttp then).
"""

_LAZY = {
    "UdacityEnv": "envs.udacity.env",
    "ThrottleController": "envs.udacity.throttle",
    "UdacityBridge": "envs.udacity.bridge",
    "FakeSimulator": "envs.udacity.fake",
    "ReplaySimulator": "envs.udacity.replay",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envs.udacity' has no attribute {name!r}")


__all__ = ["FakeSimulator", "ReplaySimulator", "ThrottleController", "UdacityBridge", "UdacityEnv"]
