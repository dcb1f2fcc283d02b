"""Whether a test may mount a small tmpfs of its own (``unshare -Urm``) to fill a real disk."""
from __future__ import annotations

import shutil
import subprocess
import sys


def unshare_works() -> bool:
    """True on Linux where an unprivileged user namespace may mount a tmpfs (``unshare -Urm``)."""
    if not shutil.which("unshare") or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
                           capture_output=True)
    return probe.returncode == 0
