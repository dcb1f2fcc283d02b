"""Every name a module lists in ``__all__`` is defined (or imported) at its top level.

A name in ``__all__`` that the module lacks makes ``from module import *`` fail with an
AttributeError and tells readers of a public API that is not there. Checked statically (ast), so
no optional dependency (pygame, triton) has to be importable; a lazy package (a module-level
``__getattr__``, PEP 562) is imported and asked.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _top_level_names(tree: ast.Module) -> set[str] | None:
    """Names bound at a module's top level (None when it star-imports: not decidable statically)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name == "*":
                        return False
                    names.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):  # guarded imports and definitions
                for part in ("body", "orelse", "finalbody"):
                    if visit(getattr(node, part, [])) is False:
                        return False
                for h in getattr(node, "handlers", []):
                    if visit(h.body) is False:
                        return False
        return True

    return names if visit(tree.body) else None


def _all_of(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


MODULES = sorted(p for pkg in ("agent", "envs") for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_all_names_exist(path):
    tree = ast.parse(path.read_text(), str(path))
    public = _all_of(tree)
    defined = _top_level_names(tree)
    if public is None or defined is None:
        pytest.skip("no __all__, or a star import")
    missing = [n for n in public if n not in defined]
    if missing and "__getattr__" in defined:  # a lazy package (PEP 562): ask the module itself
        import importlib

        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts[:-1]
                                                  if path.name == "__init__.py"
                                                  else path.relative_to(ROOT).with_suffix("").parts))
        missing = [n for n in missing if not hasattr(module, n)]
    assert not missing, f"{path.relative_to(ROOT)}: __all__ lists {missing}, which the module does not define"


def test_the_check_finds_a_missing_name():
    tree = ast.parse("from x import a\nb = 1\ndef c(): pass\n__all__ = ['a', 'b', 'c', 'd']\n")
    defined = _top_level_names(tree)
    assert [n for n in _all_of(tree) if n not in defined] == ["d"]
