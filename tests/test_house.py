"""The house in order: imports point down the data flow and never round in a circle, modules stay
readable, and each package says what it owns.

The import graph is read from the source with ``ast``, not by importing anything. Every import
counts: at module level, inside functions (deferred on purpose, so that a measuring worker does not
load the compiler, still a dependency) and under ``if TYPE_CHECKING:`` (a type the module names is a
module it depends on). Relative imports are resolved; ``from pkg import sub`` imports ``pkg.sub``.

    .venv/bin/python tests/test_house.py   # what the tests below would refuse, without pytest
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "codegen", "costmodel", "workloads", "measure", "tuner", "experiments", "tests")

# Lowest first: a module imports only from its own layer or the layers below it. Each entry is a
# package or module with everything inside it; the longest entry that holds a module places it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),  # helpers nobody owns
    ("codegen", "costmodel", "workloads"),  # code generation, the cost model, where models come from
    ("measure",),  # candidates into numbers
    ("tuner.errors", "tuner.targets", "tuner.progress", "tuner.quiet"),  # what every part of the tuner shares
    ("tuner.spaces",),  # design spaces
    ("tuner.lowering", "tuner.database"),  # a model into kernels; the results kept
    ("tuner.tasks", "tuner.runtime"),  # kernels to tune; a compiled model run
    ("tuner.search", "tuner.compile"),  # tuning; compiling what it found
    ("tuner.options", "tuner.result"),  # what a run takes and gives
    ("tuner.partition",),  # a torch model in pieces around what TVM's importer refuses
    ("tuner.run",),  # a run in phases
    ("tuner.api",),  # tune()
    ("tuner", "tuner.cli", "tuner.torch_compile"),  # the doors
    ("experiments", "tests"),  # the project's own users
)

MAX_LINES = 450
# Modules over MAX_LINES, each with why it is one module: what would be lost by splitting it.
LONG_MODULES: dict[str, str] = {}
TUNER_TOP_LEVEL_MAX = 12  # modules directly in tuner/, __init__ included: the door and what all of it shares


def project_modules() -> dict[str, Path]:
    """Every module of the project's packages, by dotted name (a package by its own name)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "__pycache__" in parts or "results" in parts:
                continue
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, wherever in it the import stands."""
    script_dir = name.split(".")[0] if not (ROOT / name.split(".")[0] / "__init__.py").exists() else None
    found: set[str] = set()

    def add(dotted: str) -> None:
        if dotted in modules:
            found.add(dotted)
        elif script_dir and f"{script_dir}.{dotted}" in modules:  # tests/ and experiments/ run as scripts
            found.add(f"{script_dir}.{dotted}")

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path).split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join([*base, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            for alias in node.names:  # ``from pkg import submodule`` imports the submodule
                if f"{origin}.{alias.name}" in modules:
                    add(f"{origin}.{alias.name}")
                else:
                    add(origin)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest entry holding ``module``."""
    best, depth = None, -1
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            if (module == entry or module.startswith(entry + ".")) and entry.count(".") > depth:
                best, depth = index, entry.count(".")
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in tests/test_house.py")
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} -> {imported}"
        for module, imported_modules in sorted(graph.items())
        for imported in sorted(imported_modules)
        if layer_of(imported) > layer_of(module)
    ]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan)."""
    edges = {m: sorted(graph[m] & graph.keys()) for m in sorted(graph)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in edges:
        if node not in index:
            visit(node)
    return [_a_cycle(group, edges) for group in groups]


def _a_cycle(group: list[str], edges: dict[str, list[str]]) -> list[str]:
    """A path from the group's first module back to itself, inside the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way round
        nxt_frontier = []
        for node in frontier:
            for nxt in edges[node]:
                if nxt == start:
                    return [*paths[node], start]
                if nxt in members and nxt not in paths:
                    paths[nxt] = [*paths[node], nxt]
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return group


def long_modules() -> list[str]:
    found = []
    for path in project_modules().values():
        relative = str(path.relative_to(ROOT))
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES and relative not in LONG_MODULES:
            found.append(f"{relative}: {lines} lines")
    return found


def packages_without_a_line_on_what_they_own() -> list[str]:
    """Packages whose docstring does not open with one whole sentence on one line."""
    found = []
    for package in PACKAGES[:-2]:  # experiments/ and tests/ are folders of scripts
        for init in sorted((ROOT / package).rglob("__init__.py")):
            lines = (ast.get_docstring(ast.parse(init.read_text())) or "").splitlines()
            if not lines or not lines[0].rstrip().endswith("."):
                found.append(str(init.relative_to(ROOT)))
    return found


def test_imports_point_down_the_layers():
    graph = import_graph()
    upward = upward_imports(graph)
    assert not upward, f"these import a layer above their own (LAYERS in tests/test_house.py): {upward}"


def test_no_import_circle_anywhere():
    """Moving an import into a function or under TYPE_CHECKING does not remove a circle, it hides it."""
    found = [" -> ".join(cycle) for cycle in cycles(import_graph())]
    assert not found, f"import circles: {found}"


def test_a_module_over_450_lines_is_named_with_its_reason():
    assert not long_modules(), (
        f"split these along their seams, or name each in LONG_MODULES with why it is one module: {long_modules()}"
    )
    listed_but_short = [path for path in LONG_MODULES if len((ROOT / path).read_text().splitlines()) <= MAX_LINES]
    assert not listed_but_short, f"no longer over {MAX_LINES} lines, take them off LONG_MODULES: {listed_but_short}"


def test_every_package_says_what_it_owns_and_the_tuner_top_level_stays_small():
    assert not packages_without_a_line_on_what_they_own(), packages_without_a_line_on_what_they_own()
    top_level = sorted(path.name for path in (ROOT / "tuner").glob("*.py"))
    assert len(top_level) <= TUNER_TOP_LEVEL_MAX, f"tuner/ holds {len(top_level)} modules: {top_level}"


def test_measure_registers_no_tensor_intrinsic_and_holds_no_tir_pass():
    """Code generation lives in codegen/; measure/ turns candidates into numbers."""
    code = re.compile(r"TensorIntrin\.register|prim_func_pass|tir\.transform\.\w+Pass\b|@.*\.transform\.")
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "measure").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if code.search(line)
    ]
    assert not found, f"code generation in measure/ (it belongs in codegen/): {found}"


def test_the_reader_resolves_relative_imports_and_every_kind_of_import(tmp_path):
    """The reader itself, on a package of its own: imports at module level, in class bodies, inside
    functions and under TYPE_CHECKING are all edges; and the layer and circle finders."""
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text(
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from . import b\n"
        "from .c import thing\n"
        "import pkg.d\n"
        "if TYPE_CHECKING:\n"
        "    from .e import E\n"
        "try:\n"
        "    from .f import F\n"
        "except ImportError:\n"
        "    F = None\n"
        "class K:\n"
        "    from .g import G\n"
        "def later():\n"
        "    from .h import H\n"
    )
    (tmp_path / "pkg" / "sub" / "x.py").write_text("from ..c import thing\nfrom .. import sub\n")
    modules = {name: tmp_path / "unused.py" for name in ["pkg", *(f"pkg.{m}" for m in "bcdefgh"), "pkg.sub"]}
    a, x = tmp_path / "pkg" / "a.py", tmp_path / "pkg" / "sub" / "x.py"
    assert imports_of("pkg.a", a, modules) == {f"pkg.{m}" for m in "bcdefgh"}
    assert imports_of("pkg.sub.x", x, {**modules, "pkg.sub.x": x}) == {"pkg.c", "pkg.sub"}
    graph = import_graph()
    assert "measure.types" in graph["measure.engine.engine"]  # and on the project itself
    assert "tuner.run" in graph["tuner.cli.main"]  # an import inside a function
    assert cycles({"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}) == [["a.x", "a.y", "a.z", "a.x"]]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []
    assert layer_of("tuner.search.loop") > layer_of("tuner.spaces.metaschedule") > layer_of("tuner.errors")
    assert layer_of("tuner.cli.main") == layer_of("tuner") > layer_of("tuner.api")
    assert upward_imports({"measure.engine": {"tuner.api"}, "tuner.api": {"measure.engine"}}) == [
        "measure.engine -> tuner.api"
    ]


if __name__ == "__main__":
    graph = import_graph()
    for line in long_modules():
        print("long:", line)
    for line in upward_imports(graph):
        print("upward:", line)
    for cycle in cycles(graph):
        print("circle:", " -> ".join(cycle))
    for init in packages_without_a_line_on_what_they_own():
        print("says not what it owns:", init)
    sys.exit(0)
