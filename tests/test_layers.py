"""The package's imports flow one way (docs/DESIGN.md, "Layers"): read from the source, every import counted, whether
at the top of a module or inside a function.

- no module imports a module of a higher layer;
- no two modules import each other, directly or through others (no cycle);
- no module imports another module's private name (``_name``);
- nothing in the package imports the package root (``inseq_mixing/__init__.py`` is the entry point only).
"""

import ast
from pathlib import Path

import pytest

import inseq_mixing

PACKAGE = Path(inseq_mixing.__file__).parent

#: The layers, lowest first: a module may import its own layer's modules and lower layers' modules only.
LAYERS = (
    ("specs", "memory", "deferred", "demo"),  # family specs, the embedded demo's data, the bottom helpers
    ("trace",),  # the one forward pass
    ("methods",),  # the papers' math
    ("declarations",),  # one declaration per method
    ("frontends",),  # Inseq, encoder-only and speech front ends; the one place a model's kind is decided
    ("runs",),  # dataset runs and their store
    ("evaluation",),  # the papers' protocols
    ("views",),  # reports, tables, figures
    ("cli",),
)
#: Entry points: they may import anything, and nothing in the package imports them.
ENTRY_POINTS = ("inseq_mixing", "inseq_mixing.testing")


def module_name(path: Path) -> str:
    parts = ["inseq_mixing", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(name: str) -> list[tuple[str, str, int]]:
    """The package modules ``name`` imports, as (module, imported name or "", line)."""
    path = MODULES[name]
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
            base = base if node.level else node.module or ""
            if not base.startswith("inseq_mixing"):
                continue
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in MODULES:  # ``from . import bart``: the submodule itself
                    found.append((submodule, "", node.lineno))
                else:
                    found.append((base, alias.name, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, "", node.lineno) for alias in node.names if alias.name.startswith("inseq_mixing")]
    return found


def layer(name: str) -> int | None:
    """The layer of a module (None for the entry points)."""
    if name in ENTRY_POINTS:
        return None
    top = name.split(".")[1]
    for index, members in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{name} is in no layer: add it to LAYERS in {__file__}")


GRAPH = {name: imports(name) for name in MODULES}


def test_every_module_has_a_layer():
    for name in MODULES:
        layer(name)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{name} (layer {LAYERS[layer(name)][0]}) imports {target} (layer {LAYERS[layer(target)][0]}), line {line}"
        for name, found in GRAPH.items()
        if layer(name) is not None
        for target, _, line in found
        if target not in ENTRY_POINTS and layer(target) > layer(name)
    ]
    assert not upward, "\n".join(upward)


def test_nothing_imports_an_entry_point():
    found = [
        f"{name} imports {target}, line {line}"
        for name, edges in GRAPH.items()
        for target, _, line in edges
        if target in ENTRY_POINTS and target != name
    ]
    assert not found, "\n".join(found)


def test_no_import_cycle():
    """Tarjan's strongly connected components over the module graph: any component of two or more modules is a
    cycle."""
    edges = {name: sorted({target for target, _, _ in found if target in MODULES}) for name, found in GRAPH.items()}
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


def test_no_module_imports_another_modules_private_name():
    found = [
        f"{name} imports {target}.{imported}, line {line}"
        for name, edges in GRAPH.items()
        for target, imported, line in edges
        if imported.startswith("_") and target != name
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "source, broken",
    [
        ("methods/norms.py", "from ..frontends import identify\n"),  # an upward import
        ("specs/base.py", "from .. import register\n"),  # the root
        ("frontends/common.py", "from .router import _is_inseq_model\n"),  # a private name (and a cycle)
    ],
)
def test_the_checks_fail_on_a_broken_import(source, broken, monkeypatch):
    """Each rule, broken once on a copy of the graph, is caught."""
    name = module_name(PACKAGE / source)
    original = GRAPH[name]
    path = MODULES[name]
    text = path.read_text(encoding="utf-8")
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: text + broken if self == path else _read(self))
    GRAPH[name] = imports(name)
    try:
        failures = 0
        for check in (
            test_no_module_imports_a_higher_layer,
            test_nothing_imports_an_entry_point,
            test_no_import_cycle,
            test_no_module_imports_another_modules_private_name,
        ):
            try:
                check()
            except AssertionError:
                failures += 1
        assert failures >= 1
    finally:
        GRAPH[name] = original


def _read(path: Path) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()
