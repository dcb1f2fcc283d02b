"""Make ``import torchvision`` work beside the CPU-only torch wheel (grad-cam imports torchvision).

PyPI's torchvision 0.28.0 wheel is the CUDA build: its ``_C.so`` links ``libtorch_cuda.so``, which
the CPU wheel of torch 2.13.0 does not have. torchvision tolerates a missing ``_C`` everywhere but
in ``_meta_registrations.py``, which calls ``torch.library.register_fake("torchvision::nms")`` and
``("torchvision::qnms")`` unconditionally, so ``import torchvision`` raises
``RuntimeError: operator torchvision::nms does not exist``. When (and only when) ``_C`` cannot be
loaded, :func:`ensure_torchvision` defines the schemas of those two operators (no kernels: calling
them still fails, as it would without the shim) so the import succeeds. grad-cam uses none of
torchvision's compiled operators, only its pure-Python transforms.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

log = logging.getLogger(__name__)
_LIB = None  # keeps the schema definitions alive for the life of the process


def _extension_loads(pkg_dir: Path) -> bool:
    import torch

    libs = sorted(pkg_dir.glob("_C*.so")) + sorted(pkg_dir.glob("_C*.pyd"))
    if not libs:
        return False
    try:
        torch.ops.load_library(str(libs[0]))
        return True
    except (OSError, RuntimeError, ImportError):
        return False


def ensure_torchvision() -> None:
    """Import torchvision, first defining the ``nms``/``qnms`` schemas if its ``_C`` cannot load.

    Raises:
        ImportError: torchvision is not installed.
    """
    global _LIB
    import sys

    if "torchvision" in sys.modules:
        return
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        raise ImportError("torchvision is not installed (pip install torchvision==0.28.0)")
    if _LIB is None and not _extension_loads(Path(spec.origin).parent):
        import torch

        log.debug("torchvision's compiled operators do not load beside this torch; defining nms/qnms schemas")
        _LIB = torch.library.Library("torchvision", "DEF")
        _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    import torchvision  # noqa: F401
