"""The import graph of preheat_lab: every module parsed with `ast`, every import of a
preheat_lab module counted wherever it stands (module level or inside a function), and no
cycle. An import inside a function is allowed only where it is the point: `__main__` imports
an experiment's modules when the command runs (they need numpy, pandas, matplotlib; see
preheat_lab.deps), never to step around a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "preheat_lab"
#: Modules that may import preheat_lab modules inside functions (the lazy dispatch).
LAZY = {"__main__"}


def _imports(module: str, tree: ast.Module) -> list[tuple[str, int, bool]]:
    """(imported preheat_lab module, line, inside a function) for each import in TREE."""
    local: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            local |= {id(n) for n in ast.walk(node) if n is not node}
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 0 and (node.module or "").split(".")[0]
                                   == "preheat_lab"):
                mod = node.module or ""
                if node.level == 0:
                    mod = mod.partition(".")[2]
                if mod:
                    names.append(mod.split(".")[0])
                else:  # from . import a, b
                    names += [a.name for a in node.names]
            elif node.level > 1:
                raise AssertionError(f"{module}:{node.lineno}: relative import above the package")
        elif isinstance(node, ast.Import):
            names += [a.name.split(".")[1] for a in node.names
                      if a.name.startswith("preheat_lab.")]
        out += [(n, node.lineno, id(node) in local) for n in names]
    return out


def graph() -> dict[str, dict[str, list[tuple[int, bool]]]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py")}
    g: dict[str, dict[str, list[tuple[int, bool]]]] = {}
    for name, path in sorted(modules.items()):
        edges: dict[str, list[tuple[int, bool]]] = {}
        for target, line, inside in _imports(name, ast.parse(path.read_text(), str(path))):
            assert target in modules, f"{name}:{line}: imports preheat_lab.{target}: no such module"
            if target != name:
                edges.setdefault(target, []).append((line, inside))
        g[name] = edges
    return g


def _cycle(g: dict[str, dict[str, list[tuple[int, bool]]]]) -> list[str] | None:
    """One cycle of G (a path that starts and ends at the same module), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(g[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state:
                found = visit(w)
                if found:
                    return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(g):
        if v not in state:
            found = visit(v)
            if found:
                return found
    return None


def test_the_graph_sees_imports_of_every_form():
    tree = ast.parse("from . import a, b\nfrom .c import x\nimport preheat_lab.d\n"
                     "from preheat_lab.e import y\n"
                     "def f():\n    from . import g\n")
    assert _imports("m", tree) == [("a", 1, False), ("b", 1, False), ("c", 2, False),
                                   ("d", 3, False), ("e", 4, False), ("g", 6, True)]


def test_the_cycle_search_finds_one():
    g = {"a": {"b": [(1, False)]}, "b": {"c": [(1, True)]}, "c": {"a": [(1, False)]}}
    assert _cycle(g) == ["a", "b", "c", "a"]
    g["c"] = {}
    assert _cycle(g) is None


def test_no_import_cycle_counting_imports_inside_functions():
    g = graph()
    assert len(g) > 20 and g["table1"], "the package was not read"
    cycle = _cycle(g)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_imports_of_the_package_are_at_module_level_except_the_lazy_dispatch():
    inside = [f"{m}.py:{line} imports {t}" for m, edges in graph().items() if m not in LAZY
              for t, where in edges.items() for line, local in where if local]
    assert not inside, "imports inside functions (move them to the top): " + "; ".join(inside)
