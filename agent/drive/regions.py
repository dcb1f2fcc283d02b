"""Where the student looks: CarRacing's frame split into regions, and each region's share of a
saliency map's mass beside its share of the area.

Regions, one per pixel, in this order of precedence (a pixel takes the first that claims it):

- ``car``: the player's car, drawn by gymnasium at a fixed place of the 96x96 view (rows 64-79,
  columns 42-53: :data:`CAR_BOX`): the pixels there that are neither road nor grass (its red body,
  dark wheels and their shading);
- ``road edge``: within :data:`EDGE_PX` pixels of the boundary between road and not-road, on
  either side, and the red and white kerbs;
- ``road``: the rest of the grey road (:func:`road_mask`);
- ``grass``: green pixels;
- ``dashboard``: the indicator strip at the bottom (:data:`DASHBOARD_ROWS` rows of a 96-row view);
- ``other``: anything else the CNN reads.

Pixels the CNN does not read (the dashboard strip of a ``speed-input`` policy) belong to no region
and count neither in the mass nor in the area. A region whose mass share is above its area share
draws more attention than its size ("enrichment" = mass share / area share, 1 = as much as its area).

This measures, with numbers, the saliency claim of the NAC paper (Razzaq et al., arXiv
2512.10282, Figure 6 and Appendix D.3.3): that NAC keeps its focus on the road, where other cores
look at the sides or at nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from agent.drive.stats import mean_interval

#: The regions, in order of precedence.
REGIONS = ("car", "dashboard", "road edge", "road", "grass", "other")
#: Rows and columns (start, stop) of the 96x96 view where gymnasium draws the player's car.
CAR_BOX = ((64, 80), (42, 54))
#: Pixels either side of the road's boundary that count as its edge.
EDGE_PX = 2
#: Rows of CarRacing's dashboard strip at the bottom of its 96-row view (gymnasium draws the
#: indicators 5/40 of the frame high; :data:`agent.drive.saliency.DASHBOARD_ROWS`).
DASHBOARD_ROWS = 12


def road_mask(frame: np.ndarray) -> np.ndarray:
    """(H, W) float32: 1 on CarRacing's grey road pixels, else 0.

    gymnasium draws the road in grey, RGB (102, 102, 102) plus up to 5 per tile
    (``ROAD_COLOR`` 0.4 and ``0.01 * (i % 3)``), the grass in green (102, 204/230, 102), the kerbs
    red and white, the car red and the dashboard strip black. A pixel is road when its three
    channels lie within 12 of each other and its grey level within 85..125 (the frame's
    anti-aliased road edges count when grey enough).

    Args:
        frame: (H, W, 3) uint8 RGB, as the env renders it.

    Raises:
        ValueError: not an (H, W, 3) frame.
    """
    f = np.asarray(frame)
    if f.ndim != 3 or f.shape[2] != 3:
        raise ValueError(f"road_mask needs an (H, W, 3) RGB frame, got shape {f.shape}")
    f = f.astype(np.int16)
    hi, lo = f.max(axis=2), f.min(axis=2)
    mean = f.mean(axis=2)
    return ((hi - lo <= 12) & (mean >= 85) & (mean <= 125)).astype(np.float32)


def region_labels(frame: np.ndarray, edge_px: int = EDGE_PX) -> np.ndarray:
    """(H, W) int8: each pixel's region, an index into :data:`REGIONS`.

    Args:
        frame: (96, 96, 3) uint8 RGB CarRacing frame (another size: no car box).
        edge_px: the road edge's half-width in pixels (>= 0; 0: kerbs only).

    Raises:
        ValueError: not an (H, W, 3) frame, or a negative ``edge_px``.
    """
    import cv2

    if edge_px < 0:
        raise ValueError(f"edge_px must be >= 0, got {edge_px}")
    road = road_mask(frame) > 0  # checks the shape
    f = np.asarray(frame).astype(np.int16)
    r, g, b = f[..., 0], f[..., 1], f[..., 2]
    red = (r >= 150) & (g <= 110) & (b <= 110)
    white = (r >= 200) & (g >= 200) & (b >= 200)
    green = (g >= r + 40) & (g >= b + 40)
    labels = np.full(road.shape, REGIONS.index("other"), np.int8)
    labels[green] = REGIONS.index("grass")
    labels[road] = REGIONS.index("road")
    car = np.zeros_like(road)
    box = np.zeros_like(road)
    view = np.ones_like(road)
    if road.shape == (96, 96):
        (r0, r1), (c0, c1) = CAR_BOX
        box[r0:r1, c0:c1] = True
        car = box & ~road & ~green  # body, wheels and their shading
        view[-DASHBOARD_ROWS:] = False
    edge = (red | white) & ~car
    if edge_px > 0:
        k = np.ones((2 * edge_px + 1, 2 * edge_px + 1), np.uint8)
        r8 = (road | (box & ~green)).astype(np.uint8)  # the car sits on the road: its outline is no road edge
        edge |= (cv2.dilate(r8, k) > 0) & ~(cv2.erode(r8, k) > 0)
    labels[edge & view] = REGIONS.index("road edge")
    labels[~view] = REGIONS.index("dashboard")
    labels[car] = REGIONS.index("car")
    return labels


def region_shares(frames: Sequence[np.ndarray], cams: Sequence[np.ndarray], readable: np.ndarray | None = None,
                  edge_px: int = EDGE_PX) -> dict:
    """Each region's share of the saliency mass and of the area, per step and pooled.

    Args:
        frames: S frames (96, 96, 3) uint8.
        cams: S maps (96, 96), >= 0 (a :class:`agent.drive.saliency.SaliencyMap`'s ``cam``); an
            all-zero map has no mass and is skipped in the mass shares (counted in ``empty``).
        readable: (96, 96) weights of the pixels the CNN reads (> 0: read), or None (all).
        edge_px: as :func:`region_labels`.

    Returns:
        ``{"steps", "empty", "regions": {name: {"mass": interval, "area": interval, "pooled_mass",
        "pooled_area", "enrichment"}}}``. ``mass``/``area`` are the mean of the per-step shares with a
        Student-t 95 % interval (``mean``, ``lo``, ``hi``, ``n``); ``pooled_mass`` is the region's
        share of all maps' mass together; ``enrichment`` is ``pooled_mass / pooled_area``.

    Raises:
        ValueError: different numbers of frames and maps, mismatched shapes, negative map values, or
            no step.
    """
    if len(frames) != len(cams):
        raise ValueError(f"{len(frames)} frames but {len(cams)} maps")
    if not len(frames):
        raise ValueError("no steps to measure")
    n_reg = len(REGIONS)
    mass_steps, area_steps = [], []
    mass_tot, area_tot = np.zeros(n_reg), np.zeros(n_reg)
    empty = 0
    for frame, cam in zip(frames, cams):
        cam = np.asarray(cam, np.float64)
        labels = region_labels(frame, edge_px)
        if cam.shape != labels.shape:
            raise ValueError(f"map shape {cam.shape} differs from the frame's {labels.shape}")
        if (cam < 0).any():
            raise ValueError("saliency maps must be >= 0")
        keep = np.ones(labels.shape, bool) if readable is None else np.asarray(readable) > 0
        area = np.array([(keep & (labels == i)).sum() for i in range(n_reg)], np.float64)
        area_steps.append(area / area.sum())
        area_tot += area
        m = np.array([cam[keep & (labels == i)].sum() for i in range(n_reg)])
        if m.sum() <= 0:
            empty += 1
            continue
        mass_steps.append(m / m.sum())
        mass_tot += m
    mass_steps = np.array(mass_steps).reshape(-1, n_reg)
    area_steps = np.array(area_steps)
    pooled_area = area_tot / area_tot.sum()
    pooled_mass = mass_tot / mass_tot.sum() if mass_tot.sum() > 0 else np.full(n_reg, np.nan)
    regions = {}
    for i, name in enumerate(REGIONS):
        regions[name] = {
            "mass": mean_interval(mass_steps[:, i]), "area": mean_interval(area_steps[:, i]),
            "pooled_mass": float(pooled_mass[i]), "pooled_area": float(pooled_area[i]),
            "enrichment": float(pooled_mass[i] / pooled_area[i]) if pooled_area[i] > 0 else float("nan"),
        }
    return {"steps": len(frames), "empty": empty, "edge_px": int(edge_px), "regions": regions}


def shares_markdown(rows: dict) -> str:
    """A markdown table of several :func:`region_shares` results: ``{label: result}`` -> one row per
    label, per region the mass share [95 % CI] beside the area share and the enrichment."""
    head = "| policy / map | steps | " + " | ".join(f"{r}: mass / area (×)" for r in REGIONS) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for label, res in rows.items():
        cells = []
        for r in REGIONS:
            g = res["regions"][r]
            m = g["mass"]
            cells.append(f"{100 * m['mean']:.1f} % [{100 * m['lo']:.1f}, {100 * m['hi']:.1f}] / "
                         f"{100 * g['pooled_area']:.1f} % ({g['enrichment']:.2f}×)")
        lines.append(f"| {label} | {res['steps']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


__all__ = ["CAR_BOX", "EDGE_PX", "REGIONS", "region_labels", "region_shares", "road_mask", "shares_markdown"]
