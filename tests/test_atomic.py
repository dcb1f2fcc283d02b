"""agent.atomic: whole files or nothing, and no temporary file left behind."""

import json

import numpy as np
import pytest

from agent.atomic import write_atomic, write_json_atomic


def _leftovers(folder):
    return [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("content", [b"abc", "abc", bytearray(b"abc"), memoryview(b"abc")])
def test_writes_bytes_and_text(tmp_path, content):
    target = tmp_path / "deep" / "er" / "f.bin"
    assert write_atomic(target, content) == target
    assert target.read_bytes() == b"abc"
    assert _leftovers(target.parent) == []


def test_usual_permissions(tmp_path):
    """Like open(): 0o666 less the umask (a results file or a policy others may read), not mkstemp's 0o600."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        target = write_atomic(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_writer_function_and_replace(tmp_path):
    target = tmp_path / "a.npz"
    target.write_bytes(b"old")
    write_atomic(target, lambda fh: np.savez(fh, x=np.arange(3)))
    assert np.load(target)["x"].tolist() == [0, 1, 2]


def test_failing_writer_keeps_the_old_file(tmp_path):
    target = tmp_path / "f.json"
    target.write_text("old")

    def boom(fh):
        fh.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(target, boom)
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_os_error_names_the_file_and_what_was_kept(tmp_path):
    target = tmp_path / "taken"
    target.mkdir()  # a folder where the file should go: the rename fails
    (target / "x").write_text("inside")
    with pytest.raises(OSError, match="cannot write the model card .*previous one is kept"):
        write_atomic(target, b"new", what="model card")
    assert (target / "x").read_text() == "inside"
    assert _leftovers(tmp_path) == []


def test_bad_content_type(tmp_path):
    with pytest.raises(TypeError, match="bytes, str or a function"):
        write_atomic(tmp_path / "f", 3)
    assert list(tmp_path.iterdir()) == []


def test_json(tmp_path):
    target = tmp_path / "r.json"
    write_json_atomic(target, {"a": 1, "p": tmp_path})
    text = target.read_text()
    assert text.endswith("\n")
    assert json.loads(text) == {"a": 1, "p": str(tmp_path)}


def test_save_figure_format_from_suffix_closes_and_keeps_the_old_file_on_error(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agent.atomic import save_figure

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], [1, 0])
    png = save_figure(fig, tmp_path / "sub" / "a.png", dpi=50)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plt.fignum_exists(fig.number)  # closed
    fig, ax = plt.subplots(figsize=(2, 1))
    svg = save_figure(fig, tmp_path / "a.svg")
    assert b"<svg" in svg.read_bytes()[:400]
    before = png.read_bytes()
    fig, ax = plt.subplots(figsize=(2, 1))
    with pytest.raises(ValueError):  # matplotlib knows no ".nope" format
        save_figure(fig, tmp_path / "sub" / "a.nope")
    assert not plt.fignum_exists(fig.number)
    assert png.read_bytes() == before and sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["a.png"]
