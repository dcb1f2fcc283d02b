"""agent.drive.regions: CarRacing's view split into car / dashboard / road edge / road / grass, and the
shares of a saliency map's mass beside the shares of the area."""

import numpy as np
import pytest

from agent.drive.regions import CAR_BOX, DASHBOARD_ROWS, REGIONS, region_labels, region_shares, shares_markdown


def _frame(road_cols=(36, 60)):
    """A synthetic 96x96 CarRacing view: grass, a vertical grey road, the red car in its box, the black strip."""
    f = np.zeros((96, 96, 3), np.uint8)
    f[:] = (102, 204, 102)
    f[:, road_cols[0]:road_cols[1]] = (102, 102, 102)
    (r0, r1), (c0, c1) = CAR_BOX
    f[r0 + 2:r1 - 2, c0 + 3:c1 - 3] = (204, 0, 0)
    f[-DASHBOARD_ROWS:] = 0
    f[-6:, 5:9] = 255  # dashboard indicators: white, not a kerb
    return f


def test_regions_of_a_synthetic_view():
    f = _frame()
    L = region_labels(f, edge_px=2)
    name = {i: r for i, r in enumerate(REGIONS)}
    assert name[L[10, 48]] == "road" and name[L[10, 10]] == "grass" and name[L[10, 90]] == "grass"
    assert name[L[10, 34]] == "road edge" and name[L[10, 35]] == "road edge" and name[L[10, 33]] == "grass"
    assert name[L[10, 37]] == "road edge" and name[L[10, 38]] == "road"  # 2 px either side
    assert name[L[72, 48]] == "car"
    # the car's outline on the road is no road edge
    assert name[L[CAR_BOX[0][0] + 1, 48]] == "road"
    assert (L[-DASHBOARD_ROWS:] == REGIONS.index("dashboard")).all()
    assert not (L[:-DASHBOARD_ROWS] == REGIONS.index("dashboard")).any()
    assert region_labels(f, edge_px=0)[10, 36] == REGIONS.index("road")  # no band: kerbs only


def test_a_map_on_the_road_gives_the_road_its_mass():
    f = _frame()
    cam = np.zeros((96, 96), np.float32)
    cam[:40, 42:54] = 1.0  # well inside the road
    res = region_shares([f, f], [cam, cam])
    road = res["regions"]["road"]
    assert road["pooled_mass"] == pytest.approx(1.0) and road["mass"]["mean"] == pytest.approx(1.0)
    assert res["regions"]["grass"]["pooled_mass"] == 0.0
    assert road["enrichment"] == pytest.approx(1.0 / road["pooled_area"])
    assert sum(g["pooled_area"] for g in res["regions"].values()) == pytest.approx(1.0)
    # a uniform map has each region's share of the area: enrichment 1 everywhere
    flat = region_shares([f], [np.ones((96, 96), np.float32)])
    for g in flat["regions"].values():
        if g["pooled_area"] > 0:
            assert g["enrichment"] == pytest.approx(1.0)


def test_unreadable_pixels_and_empty_maps():
    f = _frame()
    readable = np.ones((96, 96), np.float32)
    readable[-DASHBOARD_ROWS:] = 0
    cam = np.zeros((96, 96), np.float32)
    cam[-5:, :] = 1.0  # all of it on the blanked strip
    cam[0, 0] = 0.5  # and a little on the grass
    res = region_shares([f, f], [cam, np.zeros_like(cam)], readable=readable)
    assert res["empty"] == 1 and res["regions"]["grass"]["pooled_mass"] == pytest.approx(1.0)
    assert res["regions"]["dashboard"]["pooled_area"] == 0.0
    md = shares_markdown({"test": res})
    assert md.count("\n") == 3 and "road edge: mass / area" in md


def test_bad_input_is_refused():
    f = _frame()
    with pytest.raises(ValueError, match="2 frames but 1 maps"):
        region_shares([f, f], [np.zeros((96, 96))])
    with pytest.raises(ValueError, match=">= 0"):
        region_shares([f], [-np.ones((96, 96))])
    with pytest.raises(ValueError, match="differs"):
        region_shares([f], [np.zeros((48, 48))])
    with pytest.raises(ValueError, match="no steps"):
        region_shares([], [])
    with pytest.raises(ValueError, match="edge_px"):
        region_labels(f, edge_px=-1)
    with pytest.raises(ValueError, match="RGB frame"):
        region_labels(f[..., 0])
