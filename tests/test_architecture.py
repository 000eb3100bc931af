"""The package's layers: imports go one way, from the entry points down to the models, with no circle.

Every import is counted, also those inside functions and under `if TYPE_CHECKING:`: a type-only import
upwards is still a module that knows the layer above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sapiens2"

# Top to bottom. A module may import modules of its own folder and of the layers below it; the folders
# of one layer never import each other.
LAYERS: list[set[str]] = [
    {"__main__"},  # `python -m sapiens2`
    {"__init__", "cli", "video"},  # entry points: the public names, the command line, videos from Python
    {"serving"},  # what a public web server needs
    {"batch", "training"},  # the batch engine (command line, videos, Ray); fine-tuning
    {"runtime"},  # running tasks: Runtime, cancellation, error sentences
    {"tasks"},  # the task registry
    {"pipelines"},  # one module per task: its steps, finish and options
    {"outputs"},  # pictures, exports, results
    {"vision"},  # input hygiene, processing, detector, pose decoding, dense post-processing
    {"models"},  # the networks, their configs, weights and the Hub
    {"data"},  # facts as data: keypoint and body-part names, skeletons, palettes
    {"settings"},  # every setting given through environment variables, read once at an entry point
    # The base: exceptions, the progress callback type, PyTorch's MPS fallback (set before torch is imported).
    {"errors", "progress", "_mps_fallback"},
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = ["sapiens2", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` (at `path`) imports, wherever the import statement stands."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from package import submodule` imports the submodule; other names come from the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
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
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_folder_has_a_layer():
    assert {layer(name) for name in modules()} <= set(RANK), "a new folder needs its place in LAYERS"


def test_imports_go_down_the_layers():
    upward = sorted(
        f"{source} imports {target}"
        for source, targets in graph().items()
        for target in targets
        if layer(source) != layer(target) and RANK[layer(source)] >= RANK[layer(target)]
    )
    assert not upward, "\n".join(upward)


def test_no_import_circle():
    assert cycles(graph()) == []


def test_every_folder_says_what_it_holds_and_may_import():
    for folder in sorted(path.parent for path in PACKAGE.rglob("__init__.py")):
        docstring = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert docstring, f"{folder.relative_to(PACKAGE.parent)}/__init__.py says nothing"
        if folder.parent == PACKAGE and folder.name in RANK and RANK[folder.name] < len(LAYERS) - 1:
            assert "import" in docstring.lower(), f"{folder.name}/__init__.py does not say what it imports"


def test_the_checks_catch_what_they_are_for():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert layer("sapiens2.models.hub") == "models" and layer("sapiens2") == "__init__"
    source = PACKAGE / "runtime" / "runtime.py"
    assert "sapiens2.tasks.registry" in imported("sapiens2.runtime.runtime", source, set(modules()))
