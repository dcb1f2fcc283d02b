"""The project's Markdown links point at files that exist, and the README stays an entry (<= 300 lines)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")  # [text](target) or [text](target#anchor)


def markdown_files() -> list[Path]:
    """Every Markdown file the project ships: the top level, docs/, policies/, recipes/ and results/."""
    files = sorted(ROOT.glob("*.md"))
    for folder in ("docs", "policies", "recipes", "results", "recordings"):
        files += sorted((ROOT / folder).rglob("*.md"))
    return files


def broken_links(md: Path) -> list[str]:
    """The relative link targets in ``md`` that name no file or folder (URLs are not checked)."""
    broken = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        if not (md.parent / target).exists():
            broken.append(target)
    return broken


def test_the_link_pattern_finds_broken_and_whole_links(tmp_path):
    (tmp_path / "there.md").write_text("x")
    md = tmp_path / "page.md"
    md.write_text("[a](there.md) [b](there.md#section) [c](missing.md) [d](https://example.org/x) [e](gone/#top)")
    assert broken_links(md) == ["missing.md", "gone/"]


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md):
    assert broken_links(md) == [], f"{md.relative_to(ROOT)} links to files that do not exist"


def test_the_readme_is_an_entry_not_a_diary():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; studies go into docs/experiments/"


def test_the_research_log_lists_every_dated_page():
    log = (ROOT / "docs" / "experiments" / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs" / "experiments").glob("20*.md"))
    assert pages, "docs/experiments/ holds no dated pages"
    missing = [p for p in pages if f"]({p})" not in log]
    assert missing == [], f"docs/experiments/README.md does not list {missing}; add a row for each"
