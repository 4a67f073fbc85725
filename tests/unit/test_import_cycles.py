"""No import cycle anywhere in the trainyard package, read from the source.

Every import counts, at module level and inside functions: an import moved into a function hides a cycle
from the interpreter at load time but leaves two modules that each need the other, which is the design
debt this test is about (``launchers/local`` and ``launchers/deepspeed`` did exactly that). Imports under
``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "include"
PACKAGE = "trainyard"


def modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, except those in ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _imports_of(child))
            continue
        yield from _imports_of(node)


def _imports_of(node: ast.AST):
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        yield node
    else:
        yield from _imports(node)


def graph(mods: dict[str, Path], package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from a.b import c`` is a.b.c when that is a module)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolved against this module's package
                    anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                while target and target not in mods:  # `import a.b.c` of a name inside a module
                    target = target.rpartition(".")[0]
                if target.split(".")[0] == package and target != name:
                    edges[name].add(target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path that returns to its start) per strongly connected component with more than one
    module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_path_in(comp, edges) for comp in components]


def _path_in(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A concrete cycle through the component's first module (breadth-first, so the shortest)."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v] & members):
            if w == start:
                return [*paths[v], start]
            if w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"{component} is not strongly connected")


def test_trainyard_has_no_import_cycle():
    found = cycles(graph(modules()))
    assert not found, "import cycles in include/trainyard:\n" + "\n".join(" -> ".join(c) for c in found)


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return modules(tmp_path, "pkg")


@pytest.mark.parametrize(
    "name, files, expected",
    [
        (
            "module level",
            {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "from pkg import a\n"},
            [["pkg.a", "pkg.b", "pkg.a"]],
        ),
        (
            "hidden in a function",
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import f\n",
                "pkg/b.py": "def f():\n    from pkg.a import g\n",
            },
            [["pkg.a", "pkg.b", "pkg.a"]],
        ),
        (
            "three modules",
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import x\n",
                "pkg/b.py": "from pkg.c import y\n",
                "pkg/c.py": "class C:\n    def m(self):\n        import pkg.a\n",
            },
            [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]],
        ),
        (
            "relative",
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/sub/a.py": "from . import b\n",
                "pkg/sub/b.py": "from .a import x\n",
            },
            [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]],
        ),
        (
            "type-checking only",
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "import pkg.b\n",
                "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
            },
            [],
        ),
        ("a chain is no cycle", {"pkg/__init__.py": "", "pkg/a.py": "import pkg.b\n", "pkg/b.py": "import os\n"}, []),
    ],
)
def test_the_check_finds_cycles(tmp_path, name, files, expected):
    assert cycles(graph(_tree(tmp_path, files), "pkg")) == expected
