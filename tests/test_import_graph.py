"""The import graph of ``src/bubblescope``: no circles, no private names across modules, layers in one direction,
and no import of a module that is not there (a path left behind when a module moves).

The graph is read from the source with the standard library's :mod:`ast` (nothing is imported or run). Every
``import`` and ``from ... import`` in a module counts, wherever it stands: at module level, inside a function (a
lazy import still ties the two modules: the circle is there, only postponed) or under ``if TYPE_CHECKING``.
Relative imports are resolved against the importing module's package; ``from . import x`` is an import of the
module ``x`` when there is one, else of the name ``x`` from the package. Imports built at run time
(``importlib.import_module``) are not seen. Importing a submodule runs its package's ``__init__`` first, but that
is not an arrow from the submodule to its package: a package face that hands on names from its own submodules
would otherwise make a circle with each of them.

The layers are docs/design.md's: ``cli → diagnose/profile → models/engines → profiler → results → reports``
(the results schemas live in ``reports/``), plus a base of small modules every layer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "bubblescope"

# Top-level modules and packages of bubblescope by layer, from the top: a module imports only modules of its own
# layer or of the layers below, and BASE. "__init__" is the package's face (it re-exports the main job).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("entry points", frozenset({"__init__", "__main__", "cli"})),
    ("diagnose/profile", frozenset({"diagnosis", "tracediagnose", "tpdiagnose", "tplaunch", "profile_program",
                                    "profile_command", "profile_runner", "fidelity", "counters", "tuning", "tuned",
                                    "trace_inputs", "generate_command"})),
    ("models/engines", frozenset({"engines", "fallback", "generation", "hf_engine", "torch_ops", "triton_interp", "models",
                                  "reference_engine", "megakernel_engine", "fused_engine"})),
    ("profiler", frozenset({"profiler"})),
    ("results/reports", frozenset({"reports"})),
)
# Imported from every layer; they import only one another.
BASE = frozenset({"errors", "wording", "libwarnings", "outdir", "version"})

# The stages of profiler/trace/ in the order their imports go: a module imports only modules of its own stage or
# of the stages before it. The data flows read -> events -> columns -> steps -> summaries; the read stage hands
# each event to the events stage, so in import order the events stage comes first.
TRACE = f"{PACKAGE}.profiler.trace"
TRACE_STAGES: tuple[tuple[str, frozenset[str]], ...] = (
    ("events", frozenset({"schema", "values", "opevents", "events", "batch", "pairs"})),
    ("read", frozenset({"file", "window", "walk", "workers"})),
    ("columns", frozenset({"heap", "intervals", "categories", "apis", "columns", "repeats", "frames", "arrays",
                           "load"})),
    ("steps", frozenset({"arraysummary", "metrics", "steps", "graphs", "periodic", "cpuops", "stepfind",
                         "hostops"})),
    ("summaries", frozenset({"timeline", "checks", "summary", "ranks", "ranksummary", "__init__"})),
)


class Import(NamedTuple):
    """One import statement's arrow: ``source`` imports ``target`` (both dotted module names) at ``line``;
    ``name`` is the name taken from ``target`` (None when ``target`` itself is what is imported)."""

    source: str
    target: str
    line: int
    name: str | None


def module_files(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``) for every ``.py`` file under ``src/package``."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _known(name: str, modules: dict) -> str | None:
    """The longest prefix of the dotted ``name`` that is a module of ``modules`` (None: not one of ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, tree: ast.AST, is_package: bool, modules: dict, package: str):
    """``(Import, local name bound to the imported module or None, the dotted module the statement names)`` per
    name an import statement of ``tree`` takes from the package; a named module that does not exist is taken as
    the nearest one above it."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if target := _known(alias.name, modules):
                    # `import a.b` binds `a`; `import a.b as m` binds m to a.b
                    local = alias.asname if alias.asname and target == alias.name else \
                        None if alias.asname else alias.name.split(".")[0]
                    yield Import(module, target, node.lineno, None), local, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != package:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # from . import module
                    yield Import(module, f"{base}.{alias.name}", node.lineno, None), alias.asname or alias.name, base
                elif target := _known(base, modules):
                    yield Import(module, target, node.lineno, alias.name), None, base


def _parsed(src: Path, package: str):
    modules = module_files(src, package)
    for module, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        yield module, tree, list(_imports(module, tree, is_package, modules, package))


def import_graph(src: Path, package: str) -> dict[str, list[Import]]:
    """Every module of ``src/package`` -> the imports of modules of the package that it makes."""
    return {module: [i for i, _, _ in imports] for module, _, imports in _parsed(src, package)}


def missing_modules(src: Path, package: str) -> list[str]:
    """Imports of a module of the package that does not exist (a path left behind by a move), one per statement."""
    modules = module_files(src, package)
    found = {f"{module} (line {arrow.line}) imports {named}, which does not exist": None
             for module, _, imports in _parsed(src, package) for arrow, _, named in imports if named not in modules}
    return list(found)


def find_cycles(graph: dict[str, list[Import]]) -> list[list[Import]]:
    """One circle per strongly connected group of modules (Tarjan), as the arrows that close it: the shortest
    path from the group's first module (by name) through the group back to it."""
    succ = {m: sorted({i.target for i in arrows if i.target != m}) for m, arrows in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # recursive: a module graph is a few hundred nodes deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    cycles = []
    for group in sorted(groups):
        members, start = set(group), group[0]
        came: dict[str, Import] = {}
        frontier, found = [start], None
        while found is None:  # breadth first; the group is a circle, so the way back exists
            nxt = []
            for v in frontier:
                for arrow in sorted(graph[v], key=lambda i: (i.target, i.line)):
                    if arrow.target == start:
                        found = found or arrow
                    elif arrow.target in members and arrow.target not in came:
                        came[arrow.target] = arrow
                        nxt.append(arrow.target)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[0].source != start:
            path.insert(0, came[path[0].source])
        cycles.append(path)
    return cycles


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(src: Path, package: str) -> list[str]:
    """Uses of another module's private name (``_name``, not ``__dunder__``): ``from .m import _name``, an import
    of a private module, or ``m._name`` on a module ``m`` imported as a name."""
    found = []
    for module, tree, imports in _parsed(src, package):
        bound = {}
        for arrow, local, _ in imports:
            taken = arrow.name if arrow.name is not None else arrow.target.rpartition(".")[2]
            if arrow.target != module and _private(taken):
                found.append(f"{module} (line {arrow.line}) imports {taken} from {arrow.target}")
            if local is not None:
                bound[local] = arrow.target
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and _private(node.attr) and bound[node.value.id] != module):
                found.append(f"{module} (line {node.lineno}) uses {node.attr} of {bound[node.value.id]}")
    return found


def layer_violations(graph: dict[str, list[Import]], unit, layers, base=frozenset()) -> list[str]:
    """Imports that go up ``layers`` (``((name, {unit, ...}), ...)``, from the top: a module imports only units of
    its own layer or of the layers below), and imports by a ``base`` unit of a non-base one. ``unit(module)`` is
    the unit a module belongs to, or None for a module the layers do not cover (its imports are not judged,
    nor imports of it). A unit in no layer and not in ``base`` is reported too, so that a new one has to be
    placed."""
    rank = {u: i for i, (_, units) in enumerate(layers) for u in units}
    units = {m: unit(m) for m in graph}
    out = [f"{u}: in no layer" for u in sorted({u for u in units.values() if u is not None})
           if u not in rank and u not in base]
    for module, arrows in graph.items():
        a = units[module]
        for arrow in arrows:
            b = units.get(arrow.target)
            if a is None or b is None or a == b or b in base:
                continue
            if a not in rank and a not in base or b not in rank:  # a unit in no layer: reported above
                continue
            if a in base:
                out.append(f"{module} (line {arrow.line}) imports {arrow.target}: a base module imports only base ones")
            elif rank[b] < rank[a]:
                out.append(f"{module} (line {arrow.line}) imports {arrow.target}: up from {layers[rank[a]][0]!r} to "
                           f"{layers[rank[b]][0]!r}")
    return out


def top_level(module: str) -> str:
    """The unit of a module for the project's layers: its top-level module or subpackage (``__init__`` for the
    package's face)."""
    return module.split(".")[1] if "." in module else "__init__"


def trace_stage_unit(module: str) -> str | None:
    """The unit of a module for the trace package's stages: its name in ``profiler/trace/`` (``__init__`` for the
    package's face), None outside the package."""
    if module == TRACE:
        return "__init__"
    return module.removeprefix(TRACE + ".") if module.startswith(TRACE + ".") else None


def _cycle_text(cycle: list[Import]) -> str:
    return " -> ".join([cycle[0].source] + [f"{i.target} (line {i.line} of {i.source})" for i in cycle])


# ---- the project -------------------------------------------------------------------------------------------------
GRAPH = import_graph(SRC, PACKAGE)


def test_the_graph_is_read_from_the_sources():
    # arrows of every kind the module doc names, each known to be in the code: a module-level relative import of
    # a name, `from . import <module>`, an import inside a function, one under TYPE_CHECKING
    arrows = {(i.source, i.target, i.name) for imports in GRAPH.values() for i in imports}
    assert (f"{TRACE}.load", f"{TRACE}.walk", "parse") in arrows
    assert (f"{TRACE}.steps", f"{TRACE}.arraysummary", None) in arrows
    assert (f"{PACKAGE}.engines", f"{PACKAGE}.fallback", "build_auto") in arrows  # lazy, in build_engine
    assert (f"{TRACE}.walk", f"{TRACE}.workers", "Workers") in arrows  # TYPE_CHECKING
    assert len(GRAPH) == len(list((SRC / PACKAGE).rglob("*.py")))


def test_every_import_names_a_module_that_exists():
    found = missing_modules(SRC, PACKAGE)
    assert not found, "\n".join(found)


def test_no_module_imports_another_that_imports_it_back():
    cycles = find_cycles(GRAPH)
    assert not cycles, "import circles:\n" + "\n".join(_cycle_text(c) for c in cycles)


def test_no_module_uses_another_modules_private_names():
    found = private_uses(SRC, PACKAGE)
    assert not found, "private names used across modules:\n" + "\n".join(found)


def test_nothing_imports_up_the_layers():
    found = layer_violations(GRAPH, top_level, LAYERS, BASE)
    assert not found, "\n".join(found)


def test_the_trace_package_imports_in_stage_order():
    # TRACE_STAGES lists the stages from the bottom; layer_violations takes layers from the top
    found = layer_violations(GRAPH, trace_stage_unit, tuple(reversed(TRACE_STAGES)))
    assert not found, "\n".join(found)


# ---- the checker, on hand-made trees -----------------------------------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_hand_made_circle_is_found_through_a_lazy_import_and_named_and_a_stale_path_too(tmp_path):
    src = _tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import step\n",
        "pkg/b.py": "def step():\n    from . import a  # lazy: the circle is only postponed\n    return a\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import step\n",
        "pkg/sub/d.py": "import pkg.sub.c\nfrom pkg import b\n",
        "pkg/sub/e.py": "def f():\n    from ..gone import g  # a module moved away\n    import pkg.sub.old\n",
    })
    graph = import_graph(src, "pkg")
    assert {(i.target, i.line, i.name) for i in graph["pkg.a"]} == {("pkg.b", 1, "step")}
    assert {(i.target, i.line, i.name) for i in graph["pkg.b"]} == {("pkg.a", 2, None)}
    assert {(i.target, i.name) for i in graph["pkg.sub.c"]} == {("pkg.a", "step")}  # `..` resolved
    assert {(i.target, i.name) for i in graph["pkg.sub.d"]} == {("pkg.sub.c", None), ("pkg.b", None)}
    assert missing_modules(src, "pkg") == ["pkg.sub.e (line 2) imports pkg.gone, which does not exist",
                                           "pkg.sub.e (line 3) imports pkg.sub.old, which does not exist"]
    (cycle,) = find_cycles(graph)
    assert [(i.source, i.target, i.line) for i in cycle] == [("pkg.a", "pkg.b", 1), ("pkg.b", "pkg.a", 2)]
    assert _cycle_text(cycle) == "pkg.a -> pkg.b (line 1 of pkg.a) -> pkg.a (line 2 of pkg.b)"

    (src / "pkg/b.py").write_text("def step():\n    return 1\n", encoding="utf-8")  # the lazy import gone
    assert find_cycles(import_graph(src, "pkg")) == []


def test_a_three_module_circle_is_one_path_back_to_its_start(tmp_path):
    src = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/x.py": "from . import y\n", "pkg/y.py": "from .z import f\n",
                           "pkg/z.py": "import pkg.x\n\ndef f():\n    pass\n", "pkg/w.py": "from .x import y\n"})
    (cycle,) = find_cycles(import_graph(src, "pkg"))
    assert [i.source for i in cycle] == ["pkg.x", "pkg.y", "pkg.z"] and cycle[-1].target == "pkg.x"


def test_private_names_are_found_imported_or_reached_through_a_module(tmp_path):
    src = _tree(tmp_path, {
        "pkg/__init__.py": "from .m import __version__\n",
        "pkg/m.py": "__version__ = '1'\n_SECRET = 1\n\ndef _own():\n    return _SECRET\n",
        "pkg/n.py": "from .m import _SECRET, __version__\n",
        "pkg/o.py": "from . import m\n\ndef f():\n    return m._own()\n",
        "pkg/p.py": "from . import m\n\ndef f():\n    return m.__version__\n",
    })
    assert private_uses(src, "pkg") == ["pkg.n (line 1) imports _SECRET from pkg.m",
                                        "pkg.o (line 4) uses _own of pkg.m"]


def test_an_upward_import_and_an_unplaced_module_are_reported(tmp_path):
    src = _tree(tmp_path, {"pkg/__init__.py": "", "pkg/cli.py": "from .lib import run\nfrom . import extra\n",
                           "pkg/lib.py": "def run():\n    from .cli import main\n", "pkg/util.py": "",
                           "pkg/extra.py": "from . import util\n"})
    graph = import_graph(src, "pkg")
    layers = (("top", frozenset({"__init__", "cli"})), ("bottom", frozenset({"lib"})))
    # extra is in no layer: said once, not again for cli's import of it
    assert layer_violations(graph, top_level, layers, frozenset({"util"})) == [
        "extra: in no layer", "pkg.lib (line 2) imports pkg.cli: up from 'bottom' to 'top'"]
    (src / "pkg/lib.py").write_text("from . import util\n", encoding="utf-8")  # down into the base: allowed
    (src / "pkg/util.py").write_text("from . import lib\n", encoding="utf-8")  # but the base stays below all
    layers += (("extra", frozenset({"extra"})),)
    assert layer_violations(import_graph(src, "pkg"), top_level, layers, frozenset({"util"})) == [
        "pkg.util (line 1) imports pkg.lib: a base module imports only base ones"]
