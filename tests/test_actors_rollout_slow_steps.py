"""The slow-steps figure: steps below 10 units/s after the car first reached that speed (the
"brake trap" saw-tooth that neither the standstill nor the crawl figure counts), in
:class:`agent.actors.rollout.Episode`, the live :class:`agent.actors.rollout.StallMeter`, ``drive``'s printed
line and ``agent evaluate``'s JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent.cli import main
from agent.actors.rollout import SLOW_SPEED, STALL_STEPS, Episode, StallMeter, slow_steps

# the start (0 -> 28 units/s), a brake to 3, then a saw-tooth between 4 and 9.5 units/s for 60
# steps, then driving on at 40
START = np.linspace(0.0, 28.0, 15)
TRAP = np.tile(np.r_[np.linspace(4.0, 9.5, 5), 3.0], 10)
SPEEDS = np.r_[START, [3.0], TRAP, np.full(20, 40.0)]


def _episode(after: np.ndarray) -> Episode:
    n = len(after)
    return Episode(0, None, np.zeros(n, np.int64), None, np.zeros(n, np.float32), np.zeros(n, bool),
                   np.zeros(n, bool), np.r_[np.float32(0.0), after.astype(np.float32)])


def test_slow_steps_count_the_saw_tooth_but_not_the_start():
    assert SLOW_SPEED == 10.0
    assert slow_steps(SPEEDS) == 1 + len(TRAP)  # the brake to 3, then every step of the saw-tooth
    assert slow_steps(START) == 0  # the climb to speed before the car first reaches 10 is not slow
    assert slow_steps(np.full(30, 4.0)) == 0  # never reached 10: the crawl figure's case, not this one
    assert slow_steps([12.0, np.nan, 5.0, 11.0, 9.9]) == 2  # NaN is neither
    ep = _episode(SPEEDS)
    assert ep.slow_steps == 61 and ep.longest_crawl == 3  # the crawl figure: 3 steps in a row at most (the start)
    assert _episode(np.full(3, np.nan)).slow_steps is None


def test_the_live_meter_agrees_with_the_episode():
    from agent.drive.session import stall_text

    meter = StallMeter()
    assert meter.slow_steps is None and "slow" not in stall_text(meter)
    for v in SPEEDS:
        meter.update(float(v), False, 10)
    assert meter.slow_steps == _episode(SPEEDS).slow_steps
    assert stall_text(meter).endswith(f"slow {meter.slow_steps:4d} steps")
    meter.reset()
    for v in [5.0, 12.0, 8.0, 9.0, 15.0, 3.0]:
        meter.update(v, False, 10)
    assert meter.slow_steps == 3


@pytest.mark.parametrize("after", [SPEEDS, START, np.r_[START, np.full(80, 6.0)]])
def test_more_than_stall_steps_counts_an_episode_as_slow(after):
    assert (_episode(after).slow_steps > STALL_STEPS) == (slow_steps(after) > 50)


def test_evaluate_reports_slow_steps(tmp_path):
    js = tmp_path / "e.json"
    # the expert drives off at once and stays fast: 0 slow steps, the figure and its threshold written
    assert main(["evaluate", "--policy", "carracing-expert-discrete-margin.zip", "--teacher.start-rule", "--episodes",
                 "2", "--track-seed", "700000", "--max-steps", "120", "--workers", "1", "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["slow_speed"] == SLOW_SPEED and len(res["slow_steps"]) == 2
    assert res["episodes_slow"] == sum(s > STALL_STEPS for s in res["slow_steps"])
    assert all(s <= 120 for s in res["slow_steps"])


# the moved saw-tooth (README, "The brake floor"): between 12 and 24 units/s, never below 10
HIGH_TRAP = np.tile(np.r_[np.linspace(12.0, 24.0, 5), 13.0], 10)


def test_a_higher_threshold_counts_the_saw_tooth_above_the_floor():
    after = np.r_[START, HIGH_TRAP, np.full(20, 40.0)]
    assert slow_steps(after) == 0  # at 10 units/s it goes uncounted
    assert slow_steps(after, 25.0) == len(HIGH_TRAP)  # the climb to 28 at the start is not counted
    ep = _episode(after)
    assert ep.slow_steps_below(25.0) == len(HIGH_TRAP) and ep.slow_steps_below(SLOW_SPEED) == ep.slow_steps == 0
    assert _episode(np.full(3, np.nan)).slow_steps_below(25.0) is None


@pytest.mark.parametrize("bad", [0.0, -5.0, float("nan"), float("inf")])
def test_a_threshold_that_is_not_a_positive_speed_is_refused(bad):
    with pytest.raises(ValueError, match="slow-speed threshold"):
        slow_steps(SPEEDS, bad)


def test_evaluate_takes_the_slow_speed(tmp_path, capsys):
    js = tmp_path / "e.json"
    args = ["evaluate", "--policy", "carracing-expert-discrete-margin.zip", "--teacher.start-rule", "--episodes", "1",
            "--track-seed", "700000", "--max-steps", "120", "--workers", "1"]
    assert main([*args, "--slow-speed", "50", "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["slow_speed"] == 50.0 and len(res["slow_steps"]) == 1
    assert "steps below 50 units/s after first reaching it" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # a value the field refuses: tyro's parser reports it
        main([*args, "--slow-speed", "0"])
    err = " ".join("".join(" " if c in "│╭╮╰╯─" else c for c in capsys.readouterr().err).split())
    assert exc.value.code == 2 and "--slow-speed must be a positive number" in err


def test_a_cut_short_episode_reports_no_missed_tiles():
    """drive's episode line: "tiles missed N" only for an episode that ran to the env's own end; one
    cut by --max-steps (or stopped) says "lap cut short" (220 tiles "missed" after 100 steps meant nothing)."""
    from agent.actors.rollout import StallMeter
    from agent.drive.session import stall_text

    meter = StallMeter()
    meter.update(12.0, False, 220)
    assert "tiles missed 220" in stall_text(meter)
    cut = stall_text(meter, cut_short=True)
    assert "lap cut short" in cut and "tiles missed" not in cut
