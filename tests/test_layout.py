"""The package's layout, read from the tree: folders by feature, imports only downward.

Every import of a memfit module is read with `ast` (those inside functions too), and each
folder may import its own modules and those of the folders below it in `LAYERS`, never one
above: the dependency graph has no cycle between folders, and a reader can follow every call
into a child process by import (no function is named to a child by a string).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "memfit"

# Lowest first. A folder (or top-level module) may import from its own layer and the layers
# below it. `memfit` is the package's own `__init__` (the public API).
LAYERS: list[set[str]] = [
    {"errors"},
    {"sizes", "serialize", "checks"},
    {"console"},
    {"backend"},
    {"budget"},
    {"process"},
    {"zoo", "recomputation"},
    {"workload"},
    {"estimation"},
    {"measuring"},
    {"search", "data"},
    {"training"},
    {"planning"},
    {"watch", "doctor"},
    {"report"},
    {"memfit"},
    {"demo"},
    {"cli"},
    {"__main__"},
]
# Top-level modules beside the folders: the errors, and at most three shared primitives.
TOP_LEVEL = {"__init__", "__main__", "errors", "sizes", "serialize", "checks"}
# The functions that start a child process: their first argument is the child's function.
STARTERS = {"run_in_child", "ChildWorker"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(("memfit", *parts))] = path
    return modules


MODULES = _modules()


def _unit(module: str) -> str:
    """The folder a module belongs to (its top-level module's name outside folders)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "memfit"


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(memfit module imported, line, at the module's top level) for each import in a file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "memfit" or node.module.startswith("memfit."):
                names = [node.module]
                names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "memfit"]
        resolved = set()
        for name in names:
            while name not in MODULES and "." in name:
                name = name.rpartition(".")[0]
            if name in MODULES:
                resolved.add(name)
        if len(resolved) > 1 and names and names[0] in resolved:
            resolved.discard(names[0])  # `from pkg import submodule`: the submodule counts
        found += [(name, node.lineno, id(node) in top) for name in sorted(resolved)]
    return found


def _layer(unit: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"{unit!r} is in no layer of tests/test_layout.py: add it")


def test_the_top_level_holds_only_folders_and_the_shared_primitives() -> None:
    loose = {path.stem for path in PACKAGE.glob("*.py")}
    assert loose <= TOP_LEVEL, f"top-level modules to move into a folder: {loose - TOP_LEVEL}"
    assert len(loose - {"__init__", "__main__", "errors"}) <= 3


def test_no_folder_imports_a_folder_above_it() -> None:
    upward = []
    for module, path in MODULES.items():
        here = _unit(module)
        for imported, line, _top in _imports(path):
            there = _unit(imported)
            if there != here and _layer(there) > _layer(here):
                upward.append(f"{path.relative_to(PACKAGE)}:{line}: {here} -> {there}")
    assert not upward, "imports of a folder above:\n" + "\n".join(upward)


def test_module_level_imports_have_no_cycle() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        for imported, _line, top in _imports(path):
            if top and imported != module and not module.startswith(imported + "."):
                graph[module].add(imported)
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for imported in sorted(graph[module]):
            if seen.get(imported) == 1:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            elif imported not in seen:
                visit(imported, [*path, imported])
        seen[module] = 2

    for module in sorted(MODULES):
        if module not in seen:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_an_import_inside_a_function_says_why(module: str) -> None:
    # memfit's own modules are imported at the top; one that stays inside a function (it
    # imports Keras, or the two modules import each other) says why on the line above, and
    # an optional one sits in a `try`. `if TYPE_CHECKING:` imports run at no time.
    lines = MODULES[module].read_text().split("\n")
    tree = ast.parse("\n".join(lines))
    exempt = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            exempt |= {id(inner) for inner in ast.walk(node)}
        elif isinstance(node, ast.Try):
            exempt |= {id(inner) for part in node.body for inner in ast.walk(part)}
    top = {id(node) for node in tree.body}
    silent = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and id(node) not in top | exempt
        and _is_memfit(node)
        and not _says_why(lines, node.lineno)
    ]
    assert not silent, f"{module}: memfit imports inside functions, no reason given: {silent}"


def _says_why(lines: list[str], lineno: int) -> bool:
    """A comment on the import's line, or above the block of imports it belongs to."""
    if "#" in lines[lineno - 1]:
        return True
    above = lineno - 2
    while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def _is_memfit(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and (node.module or "").split(".")[0] == "memfit"
    return any(alias.name.split(".")[0] == "memfit" for alias in node.names)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_child_process_is_given_its_function_not_a_name(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text())
    named = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) in STARTERS
        and node.args
        and isinstance(node.args[0], ast.Constant)
    ]
    assert not named, f"{module}: a child's function named by a string at lines {named}"


def test_the_layers_name_every_folder() -> None:
    folders = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    named = set().union(*LAYERS)
    assert folders <= named, f"folders in no layer: {folders - named}"
