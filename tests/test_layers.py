"""The import layers of pyproject.toml's [tool.importlinter] contracts hold, and the check can fail.

Layers, lowest first: envs -> agent.data -> agent.nn -> agent.experts -> agent.actors -> agent.eval
-> agent.train -> agent.drive | agent.compare -> agent.bench -> agent.cli (agent.log and
agent._torchvision_compat import nothing else of agent). `lint-imports` (import-linter) checks
them, with no cycles between sibling modules or packages; a separate check finds any cycle among
single modules with grimp, import-linter's graph builder.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _lint(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", str(config)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(cwd)}, timeout=300)


def test_the_layers_contract_is_kept():
    res = _lint(ROOT / "pyproject.toml", ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "BROKEN" not in res.stdout and "0 broken" in res.stdout
    for name in ("layers:", "utilities import nothing else of agent", "no import cycles"):
        assert name in res.stdout


def test_an_upward_import_and_a_cycle_break_the_contract(tmp_path):
    pkg = tmp_path / "toy"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from toy.low import b\n")
    (pkg / "low" / "b.py").write_text("import toy.high.a  # upward\n")  # and a cycle: a -> b -> a
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.importlinter]
        root_packages = ["toy"]

        [[tool.importlinter.contracts]]
        name = "toy layers"
        type = "layers"
        layers = ["toy.high", "toy.low"]

        [[tool.importlinter.contracts]]
        name = "toy acyclic"
        type = "acyclic_siblings"
        ancestors = ["toy"]
    """))
    res = _lint(tmp_path / "pyproject.toml", tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "toy layers BROKEN" in res.stdout and "toy acyclic BROKEN" in res.stdout
    assert "toy.low.b -> toy.high.a" in res.stdout  # the upward import is named


def _module_cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.find_modules_directly_imported_by(v)):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def test_no_module_imports_itself_through_others():
    sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("agent", "envs", cache_dir=None)
    assert len(graph.modules) > 50
    assert _module_cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    pkg = tmp_path / "loopy"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from loopy import b\n")
    (pkg / "b.py").write_text("from loopy import c\n")
    (pkg / "c.py").write_text("def f():\n    from loopy import a  # a function-local import counts too\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _module_cycles(grimp.build_graph("loopy", cache_dir=None)) == [["loopy.a", "loopy.b", "loopy.c"]]
