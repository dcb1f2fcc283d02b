"""``agent bench soak`` (issue 38, item 7): a few steps of drive --record --dump-traces with every
overlay, checked for the report's structure (never for time, nor for how small the memory is)."""

from __future__ import annotations

import json
import os
import re

import pytest

from agent.bench.soak import rss_bytes
from agent.cli import main
from agent.drive.traces import load_traces

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")


def test_rss_is_read_from_somewhere():
    n, source = rss_bytes()
    assert n > 0 and source


def test_soak_prints_rss_at_the_start_and_the_end_and_removes_its_folder(tmp_path, capsys):
    report = tmp_path / "soak.json"
    assert main(["bench", "soak", "--steps", "6", "--env-worker", "off", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(line.startswith("soak: drive --headless --record --dump-traces, nac.pt") for line in lines), out
    assert re.search(r"^machine: .+, \d+ CPUs; device \w+; env worker off; python [\d.]+, torch \S+, numpy \S+",
                     out, re.M), out
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| after")]
    assert rows[0].startswith("| start (no step run) | 0 | ") and rows[1].startswith("| episode 1 | 6 | ")
    assert rows[-1].startswith("| end (video and traces closed) | 6 | ")
    m = re.search(r"^RSS start ([\d.]+) MB, end ([\d.]+) MB, peak ([\d.]+) MB", out, re.M)
    assert m and float(m[1]) > 0 and float(m[2]) > 0
    r = json.loads(report.read_text())
    assert r["steps"] == 6 and r["episodes"] == 1 and r["rss_start_mb"] > 0 and r["rss_end_mb"] > 0
    assert [s["episode"] for s in r["samples"]] == ["start", "1", "end"]
    assert r["video_mb"] > 0 and r["traces_mb"] > 0 and r["folder"] is None
    assert {"python", "torch", "numpy", "h5py", "gymnasium"} <= set(r["versions"])
    video = re.search(r"^wrote (\S+soak\.mp4) ", out, re.M)[1]  # drive's own line names the temporary folder
    assert not os.path.exists(os.path.dirname(video))


def test_soak_keeps_its_files_in_out_and_never_overwrites_them(tmp_path, capsys):
    out = tmp_path / "keep"
    assert main(["bench", "soak", "--steps", "3", "--env-worker", "off", "--out", str(out)]) == 0
    assert "in " + str(out) in capsys.readouterr().out
    d = load_traces(out / "soak.h5")
    assert d["phi"].shape[0] == 3 and d["cam"].shape[0] == 3 and (out / "soak.mp4").stat().st_size > 0
    before = (out / "soak.h5").stat().st_mtime_ns
    assert main(["bench", "soak", "--steps", "3", "--out", str(out)]) == 2
    assert "--overwrite" in capsys.readouterr().err and (out / "soak.h5").stat().st_mtime_ns == before
    with pytest.raises(SystemExit) as e:  # tyro refuses a value out of range
        main(["bench", "soak", "--steps", "0"])
    assert e.value.code == 2
