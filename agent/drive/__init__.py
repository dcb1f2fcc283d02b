"""drive: the live runner (``drive`` / ``agent drive``), one module per job.

- :mod:`agent.drive.config`: the options (:class:`~agent.drive.config.DriveConfig`, parsed by tyro), their
  checks and the run's constants.
- :mod:`agent.drive.session`: one run (:class:`~agent.drive.session.DriveSession`), its loop and ``run_drive``.
- :mod:`agent.drive.replay`: ``--replay``: a Udacity recording played through the bridge, scored against the driver.
- :mod:`agent.drive.explain`: the per-run interpretability (Grad-CAM, NAC traces, their history and dump).
- :mod:`agent.drive.hud`: the per-step view and the HUD renderer.
- :mod:`agent.drive.overlays`: the pygame drawers of the heat map and the trace panel.
- :mod:`agent.drive.saliency`: Grad-CAM on the policy's CNN.
- :mod:`agent.drive.traces`: NAC traces: extraction, history, recording, dump and plots.
- :mod:`agent.drive.window`: the pygame window.
- :mod:`agent.drive.video`: the mp4 writer of ``--record``.
- :mod:`agent.drive.wiring`: the NCP wiring diagram.

Importing the package hides pygame's banner (``PYGAME_HIDE_SUPPORT_PROMPT``); pygame itself is
imported only where it is used.
"""

import os

os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # no pygame banner on stdout
