"""One rule for existing files: every command that writes a file refuses an existing path unless
given ``--overwrite``, the existing file is left as it was, and no default output is a shipped file.

Each case runs the real command line on an existing file holding a marker, and expects exit code
2, a message that names ``--overwrite``, and the marker still there. The refusal must come before
any work (the commands would otherwise need recordings, policies or minutes to get that far).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_run import run_cli

SAMPLE = "recordings/nac-drive/sample-v0"
MARK = b"made by the user; must survive\n"

#: (name, argv with {f} for the existing file); each writes {f} only when it may
CASES = [
    ("train --out", ["train", "--data", SAMPLE, "--run-dir", "{d}/run", "--out", "{f}"]),
    ("train --json", ["train", "--data", SAMPLE, "--run-dir", "{d}/run", "--out", "{d}/new.pt", "--json", "{f}"]),
    ("train --save-bc", ["train", "--data", SAMPLE, "--run-dir", "{d}/run", "--out", "{d}/new.pt", "--save-bc", "{f}"]),
    ("expert train --out", ["expert", "train", "--run-dir", "{d}/run", "--out", "{f}"]),
    ("expert check-recovery --json", ["expert", "check-recovery", "--json", "{f}"]),
    ("evaluate --json", ["evaluate", "--policy", "nac.pt", "--json", "{f}"]),
    ("collect --out", ["collect", "--teacher.expert", "carracing-expert-discrete-margin.zip", "--out", "{f}"]),
    ("drive --record", ["drive", "--policy", "nac.pt", "--headless", "--record", "{f}"]),
    ("drive --dump-traces", ["drive", "--policy", "nac.pt", "--headless", "--dump-traces", "{f}"]),
    ("bench soak --out", ["bench", "soak", "--steps", "10", "--out", "{f}"]),
    ("compare --json", ["compare", "--report-only", "--out", "{d}/cmp", "--json", "{f}"]),
    ("bench nac --json", ["bench", "nac", "--json", "{f}"]),
    ("bench train --json", ["bench", "train", "--device", "cpu", "--json", "{f}"]),
    ("plot-traces --out", ["plot-traces", "{d}/traces.npz", "--out", "{f}"]),
    ("wiring --out", ["wiring", "--out", "{f}"]),
    ("convert-policy DST", ["convert-policy", "nac.pt", "{f}"]),
    ("average-policies --out", ["average-policies", "nac.pt", "nac.pt", "--out", "{f}"]),
    ("info --attach (writes the policy file)", ["info", "{f}", "--summary", "x"]),
]


@pytest.mark.parametrize("name,argv", CASES, ids=[c[0] for c in CASES])
def test_an_existing_file_is_refused_and_kept(name, argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)  # the sample recording and policies/
    suffix = (".mp4" if "record" in name else ".h5" if "dump" in name else ".pt" if "info" in name
              else ".zip" if "expert train" in name else "")
    target = tmp_path / f"existing{suffix}"
    inside = {"collect": "keep.txt", "bench soak": "soak.mp4"}  # these write into a folder
    kept = target
    for command, member in inside.items():
        if name.startswith(command):
            target.mkdir()
            kept = target / member
    kept.write_bytes(MARK)
    args = [a.format(f=target, d=tmp_path) for a in argv]
    rc, err = run_cli(args, capsys)
    assert rc == 2, f"{name}: exit {rc}, {err}"
    assert "--overwrite" in err, f"{name}: {err}"
    assert kept.read_bytes() == MARK, f"{name} changed the existing file"


def test_no_default_output_is_a_shipped_file():
    """The defaults of every --out point under runs/, never into policies/, recordings/ or results/."""
    from agent.compare.config import CompareConfig
    from agent.train.config import ExpertRun

    for default in (ExpertRun().out, CompareConfig().out):
        assert Path(default).parts[0] == "runs", default
