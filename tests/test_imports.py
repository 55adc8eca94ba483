"""The layer rules of docs/layers.md, read from every module's imports (AST: module level, inside
functions and under TYPE_CHECKING alike), and no import loop anywhere in netra/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "netra"

# (importer prefix, imported prefix): modules under the first never import modules under the second.
FORBIDDEN = [
    ("netra.engine", "netra.serve"),  # the worker and the response layer meet only over HTTP ...
    ("netra.serve", "netra.engine"),  # ... and share netra.web and netra.tokenizers
    ("netra.web", "netra.serve"),
    ("netra.web", "netra.engine"),
    ("netra.tokenizers", "netra.serve"),
    ("netra.tokenizers", "netra.engine"),
    ("netra.runtime", "netra.build"),  # loading code objects never needs the compiler's module
    ("netra.ops", "netra.engine"),  # ops serve any caller; the engine is one of them
    ("netra.kernel_lock", "netra.build"),
]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The netra modules ``name`` imports (a ``from package import module`` counts as the module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


GRAPH = {name: _imports(name, path, _modules()) for name, path in _modules().items()}


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize(("importer", "imported"), FORBIDDEN, ids=[f"{a}-/->{b}" for a, b in FORBIDDEN])
def test_layer_rule(importer: str, imported: str) -> None:
    broken = sorted(f"{m} imports {t}" for m, targets in GRAPH.items() if _under(m, importer)
                    for t in targets if _under(t, imported))
    assert not broken, broken


def test_no_import_loop_in_netra() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not loops, loops


def test_the_rules_see_imports() -> None:
    """The reader finds what it must: a known import at module level, one inside a function, and a
    relative one resolve to their modules (a reader that found nothing would pass every rule)."""
    assert "netra.web.errors" in GRAPH["netra.serve.openai_api"]
    assert "netra.engine.server" in GRAPH["netra.engine.cli"]  # imported inside main()
    assert len(GRAPH) > 100 and sum(len(v) for v in GRAPH.values()) > 300
