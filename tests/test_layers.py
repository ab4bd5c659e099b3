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
    ("specs", "memory", "deferred", "demo", "hooks"),  # family specs, the embedded demo's data, the bottom helpers
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


# ----- kinds and protocols (issue 53): the kind is decided in the front ends and read from its record elsewhere -----

KIND_NAMES = ("generation", "encoder", "speech", "vision")


def kind_tests(name: str) -> list[tuple[int, str]]:
    """Where a module asks which kind a model is: an ``is_<kind>`` attribute, or a ``.kind`` compared with a kind's
    name (``found.kind == "vision"``, ``kind in ("speech", "vision")``)."""
    found = []
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and node.attr in {f"is_{kind}" for kind in KIND_NAMES}:
            found.append((node.lineno, node.attr))
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            reads_kind = any(isinstance(side, ast.Attribute) and side.attr == "kind" for side in sides)
            names = {
                constant.value for side in sides for constant in ast.walk(side) if isinstance(constant, ast.Constant)
            }
            if reads_kind and names & set(KIND_NAMES):
                found.append((node.lineno, "kind compared with a kind's name"))
    return found


def test_nothing_outside_the_front_ends_asks_which_kind_a_model_is():
    asking = {name: kind_tests(name) for name in MODULES if layer(name) != LAYERS.index(("frontends",))}
    assert not {name: lines for name, lines in asking.items() if lines}


def kind_modules() -> dict[str, set[str]]:
    """The evaluation modules of each kind: those the protocol registry names for it."""
    from inseq_mixing.evaluation.protocols import COMPARISONS, PROTOCOLS, STORED

    named = [(entry.kind, entry.run) for entry in PROTOCOLS.values()]
    named += [*COMPARISONS.items(), *STORED.items()]
    modules: dict[str, set[str]] = {}
    for kind, path in named:
        modules.setdefault(kind, set()).add(path.partition(":")[0])
    return modules


def test_no_kind_s_protocol_module_imports_another_kind_s():
    modules = kind_modules()
    owner = {module: kind for kind, names in modules.items() for module in names}
    assert not [module for module, kinds in _owners(modules).items() if len(kinds) > 1]  # each module one kind's
    crossing = [(module, imported, line) for module, kind in owner.items() for imported, _, line in GRAPH[module]
                if owner.get(imported, kind) != kind]  # fmt: skip
    assert not crossing
    # and the shared evaluation modules (entries, scoring) import no kind's module: they look it up
    shared = [name for name in MODULES if name.startswith("inseq_mixing.evaluation.") and name not in owner]
    reaching = [(name, imported) for name in shared for imported, _, _ in GRAPH[name] if imported in owner]
    assert not reaching


def _owners(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    owners: dict[str, set[str]] = {}
    for kind, names in modules.items():
        for name in names:
            owners.setdefault(name, set()).add(kind)
    return owners


@pytest.mark.parametrize(
    ("source", "broken", "check"),
    [
        ("views/explorer.py", "found = None\nfound.kind == 'vision'\n", "kind"),
        ("cli.py", "def _f(found):\n    return found.is_speech\n", "kind"),
        ("evaluation/vision.py", "from .speech import run_speech\n", "protocols"),
        ("evaluation/stored.py", "from .encoders import evaluate_encoder\n", "protocols"),
    ],
)
def test_the_kind_checks_fail_when_broken(source, broken, check, monkeypatch):
    name = module_name(PACKAGE / source)
    path = MODULES[name]
    text = path.read_text(encoding="utf-8")
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: text + broken if self == path else _read(self))
    original = GRAPH[name]
    GRAPH[name] = imports(name)
    try:
        test = {"kind": test_nothing_outside_the_front_ends_asks_which_kind_a_model_is,
                "protocols": test_no_kind_s_protocol_module_imports_another_kind_s}[check]  # fmt: skip
        with pytest.raises(AssertionError):
            test()
    finally:
        GRAPH[name] = original


def inseq_imports(name: str) -> list[int]:
    """The lines where a module imports Inseq (at the top or inside a function)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    lines = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and (node.module or "").split(".")[0] == "inseq" and not node.level]  # fmt: skip
    lines += [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Import)
              and any(alias.name.split(".")[0] == "inseq" for alias in node.names)]  # fmt: skip
    return lines


def test_the_runner_imports_no_inseq():
    """A dataset run drives every kind through its front end's hooks; the Inseq glue is the generation front end's."""
    assert not inseq_imports("inseq_mixing.runs.runner")
    assert inseq_imports("inseq_mixing.frontends.generation")  # the check sees an import where there is one


#: Names in the modality-free encoder base that would tie it to one modality.
MODALITY_NAMES = ("tokenizer", "processor", "pixel_values", "mask_token_id", "input_features")


def private_uses(source: str, base: type) -> list[tuple[int, str]]:
    """Where a modality's module defines or reads a private name of ``base`` (``self._fill``, ``super()._x``,
    ``def _gradient_sequences``): a modality reaches the base through its public hooks only."""
    private = {name for name in vars(base) if name.startswith("_") and not name.startswith("__")}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            found.append((node.lineno, node.attr))
        if isinstance(node, ast.FunctionDef) and node.name in private:
            found.append((node.lineno, node.name))
    return found


def test_the_encoder_modalities_share_a_base_that_knows_no_modality():
    """Text and images are two modalities of one encoder base (issue 53): neither extends the other, the base names no
    tokenizer or processor, and each modality uses the base's public hooks only."""
    from inseq_mixing.frontends.encoder_base import EncoderFrontEnd
    from inseq_mixing.frontends.encoders import EncoderAttributionModel
    from inseq_mixing.frontends.vision import VisionAttributionModel

    assert VisionAttributionModel.__bases__ == (EncoderFrontEnd,) == EncoderAttributionModel.__bases__
    tree = ast.parse(MODULES["inseq_mixing.frontends.encoder_base"].read_text(encoding="utf-8"))
    words = [getattr(node, "attr", None) or getattr(node, "id", None) or getattr(node, "value", None)
             for node in ast.walk(tree) if isinstance(node, ast.Attribute | ast.Name | ast.Constant)]  # fmt: skip
    named = [word for word in words if word in MODALITY_NAMES]
    assert not named
    for name in ("inseq_mixing.frontends.encoders", "inseq_mixing.frontends.vision"):
        assert not private_uses(MODULES[name].read_text(encoding="utf-8"), EncoderFrontEnd), name
    broken = "class X(EncoderFrontEnd):\n    def f(self):\n        return self._fill\n"
    assert private_uses(broken, EncoderFrontEnd)  # the check sees a private use where there is one
