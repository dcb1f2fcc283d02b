"""The labels of one trace plot (current value, range), drawn from scratch: the reference half that
tests/test_drive_speed.py and tests/test_trace_scroll.py share for their full-redraw plots."""
from __future__ import annotations

import numpy as np


def draw_reference_labels(panel, surf, r, mean: np.ndarray, lo: float, hi: float) -> None:
    """Blit the value label (the newest finite mean) and the range labels beside plot rectangle ``r``,
    placed by :func:`agent.drive.overlays.plot_label_layout` as the panel places them."""
    from agent.drive.overlays import plot_label_layout

    ok = np.isfinite(mean)
    last = float(mean[ok][-1]) if ok.any() else None
    texts = {"value": None if last is None else panel._text(f"{last:8.3f}"),
             "hi": panel._text(f"{hi:.3g}", (120, 125, 140), True), "lo": panel._text(f"{lo:.3g}", (120, 125, 140), True)}
    lay = plot_label_layout(r, last, lo, hi, None if last is None else texts["value"].get_height(),
                            texts["hi"].get_height(), texts["lo"].get_height())
    for key in ("value", "hi", "lo"):  # a range label under the value's label is left out
        if lay[key] is not None:
            surf.blit(texts[key], (r.right + 4, lay[key]))
