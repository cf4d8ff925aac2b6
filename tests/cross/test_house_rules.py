"""The shape of the house, read from the source (no module is imported or run):

1. the core (``hurray_bridge/`` without ``adapters/``) imports no framework - not at
   module level, not inside a function - and NumPy/ml_dtypes only through the one
   lazy shim, ``hurray_bridge/_numpy.py``;
2. the core's modules form no import cycle, counting imports deferred into functions
   and ``importlib.import_module("hurray_bridge....")`` of a literal name (imports
   under ``if TYPE_CHECKING:`` run never, and are left out);
3. the core reads no private name of an adapter (an adapter's documented functions
   are its interface; its ``_names`` are its own).
4. no adapter reaches another: no file under ``adapters/<a>/`` imports
   ``adapters/<b>/`` (relatively, ``from ..b import``, or absolutely) or looks it up
   through the registry by name (``get_adapter("b")``); what several adapters need
   lives in the core;
5. every adapter exports the adapter contract's names and no other: its ``__all__`` is
   ``hurray_bridge._contract.NAMES`` (read from the source), and the module, once
   imported where its framework is installed, satisfies ``_contract.Adapter``; and a
   submodule that several adapters have (``sparse``, ``shards``, ``shortcuts``) exports
   the same names in each of them;
6. the core holds no framework's name: no string literal equal to an adapter's or a
   framework's name in ``hurray_bridge/`` outside ``_registry.py`` (which maps names to
   adapters) and ``_numpy.py`` (the door to NumPy, the core's kernel, which spells its
   name once), docstrings, ``__all__`` and ``if TYPE_CHECKING:`` blocks; a few public
   functions named after a framework, and the reports that list frameworks, are counted
   in ``NAMED_ON_PURPOSE`` (a new literal there fails too);
7. no test ends early in silence: ``if ...: return`` in a test function passes without
   asserting anything, and pytest counts it as a pass. A case that tests nothing is a
   ``pytest.skip`` with its reason, a hypothesis ``assume``, or is not generated.
8. no library module (``hurray_bridge/``, ``adapters/``) spells a DLPack device type as a
   bare number: not in a comparison with a ``.type``/``.device_type`` (or a
   ``device_type`` variable), not as ``Device(<number>, ...)``, not as a
   ``device_type=``/``dl_device=`` argument, not in a ``DEVICES`` set, not as a
   ``device_type`` default and not as what a ``__dlpack_device__`` returns. The names
   are ``hurray_bridge._dlpack.DLDeviceType``'s (bound to a plain int at module level
   where a hot path compares them), so the numbers live in one table, which
   ``tests/hurray_bridge/test_dlpack_abi.py`` checks against the C headers.
9. the tools stand above the library: no library module (``hurray_bridge/`` and
   ``adapters/``, outside the tools) imports a tool - the command line
   (``hurray_bridge.__main__``), the compatibility report (``hurray_bridge.matrix``), the
   conformance kit (``hurray_bridge.testing``) or its pytest plugin
   (``hurray_bridge._pytest_plugin``) - not even inside a function. A tool may import any
   library module and any other tool.
10. no module of ``hurray_bridge/files/`` imports a private name (``_name``) of another
   module: what one module of the file code needs from another is public there.
11. no library function (``hurray_bridge/``, ``adapters/``) runs over 80 lines (``def`` to
    its last line) or a cyclomatic complexity of 25 (as mccabe, ruff's C901, counts it:
    counted here so that no linter need be installed); one that would is split by what
    it decides. The few allowed past the limits are in ``LONG_FUNCTIONS_ALLOWED``, each
    with its reason.

Each rule prints every offence it finds, with file and line, so a failure says what
to move where.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "hurray_bridge"
ADAPTERS = ROOT / "adapters"
TESTS = ROOT / "tests"
PACKAGE = "hurray_bridge"

# Frameworks and framework helpers: they belong to an adapter.
FRAMEWORKS = frozenset({"torch", "jax", "jaxlib", "pyarrow", "scipy", "cupy", "cupyx",
                        "safetensors", "ray", "tvm_ffi", "tensorflow"})
# Compute kernels the core may use, through the shim only.
KERNELS = frozenset({"numpy", "ml_dtypes"})
SHIM = "hurray_bridge._numpy"


def core_modules() -> dict[str, Path]:
    """Dotted name -> file, for every Python file of the core."""
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (imports that never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = (test.id if isinstance(test, ast.Name)
                    else test.attr if isinstance(test, ast.Attribute) else None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import the file can make at run time."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_blocks(tree)
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:  # ``from . import wire`` imports a module
                yield node.lineno, f"{target}.{alias.name}"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def test_the_core_imports_no_framework() -> None:
    offences = []
    for module, path in core_modules().items():
        for line, target in imports(module, path):
            top = target.partition(".")[0]
            if top in FRAMEWORKS or (top in KERNELS and module != SHIM):
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offences, "framework code belongs to its adapter:\n" + "\n".join(offences)


def _graph() -> dict[str, set[str]]:
    mods = core_modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for _line, target in imports(module, path):
            # The longest core module that the import names (``a.b.c`` imports ``a.b``).
            parts = target.split(".")
            while parts and ".".join(parts) not in mods:
                parts.pop()
            dep = ".".join(parts)
            if dep and dep != module and not module.startswith(dep + "."):
                graph[module].add(dep)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_core_has_no_import_cycle() -> None:
    graph = _graph()
    # The package's __init__ imports its modules to re-export them; a module that
    # imports the package back (``import hurray_bridge as hb``) closes a cycle.
    cycles = _cycles(graph)
    assert not cycles, "import cycles among core modules:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(
            f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c)
        for c in cycles)


def _adapter_handles(tree: ast.AST) -> set[str]:
    """Names bound to an adapter module: ``get_adapter(...)``, ``adapter_for(...)`` or an
    import of ``hurray_bridge.adapters...``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fn = node.value.func
            called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(
                fn, ast.Attribute) else None
            if called in ("get_adapter", "adapter_for", "import_module"):
                is_adapter = called != "import_module" or (
                    node.value.args and isinstance(node.value.args[0], ast.Constant)
                    and str(node.value.args[0].value).startswith(f"{PACKAGE}.adapters"))
                if is_adapter:
                    names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                ("adapters", f"{PACKAGE}.adapters")):
            names.update(a.asname or a.name for a in node.names)
    return names


def test_the_core_reads_no_private_name_of_an_adapter() -> None:
    offences = []
    for _module, path in core_modules().items():
        tree = ast.parse(path.read_text(), str(path))
        handles = _adapter_handles(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    ("adapters", f"{PACKAGE}.adapters")):
                offences += [f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}"
                             for a in node.names if a.name.startswith("_")]
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__"):
                continue
            base = node.value
            direct = isinstance(base, ast.Call) and (
                isinstance(base.func, ast.Name) and base.func.id in ("get_adapter", "adapter_for"))
            if direct or (isinstance(base, ast.Name) and base.id in handles):
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno} reads .{node.attr}")
    assert not offences, "the core reads adapter privates:\n" + "\n".join(offences)


def adapter_reaches(adapter: str, module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, other adapter) for each import of, or registry look-up by name of, an adapter
    other than ``adapter`` in the file of ``module`` (``hurray_bridge.adapters.<adapter>...``)."""
    prefixes = (f"{PACKAGE}.adapters.", "adapters.")
    for line, target in imports(module, path):
        for prefix in prefixes:
            if target.startswith(prefix):
                other = target[len(prefix):].partition(".")[0]
                if other and other != adapter:
                    yield line, other
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            fn = node.func
            called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(
                fn, ast.Attribute) else None
            if called in ("get_adapter", "get_adapter_module") and node.args[0].value != adapter:
                yield node.lineno, node.args[0].value


def adapter_files() -> Iterator[tuple[str, str, Path]]:
    """(adapter, dotted module name, file) for every Python file of every adapter."""
    for folder in sorted(p for p in ADAPTERS.iterdir() if (p / "__init__.py").is_file()):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(ADAPTERS).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield folder.name, ".".join([PACKAGE, "adapters", *parts]), path


def test_no_adapter_reaches_another() -> None:
    files = list(adapter_files())
    assert {"numpy", "torch", "jax", "arrow", "cupy"} <= {a for a, _, _ in files}
    offences = [f"{path.relative_to(ROOT)}:{line} reaches adapters/{other}/"
                for adapter, module, path in files
                for line, other in adapter_reaches(adapter, module, path)]
    assert not offences, (
        "adapters are peers: what several of them need belongs in the core (hurray_bridge/), "
        "not in one adapter the others import:\n" + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("from ..torch import warn_readonly\n", [(1, "torch")]),
    ("def f():\n    from ..numpy import to_hurray\n", [(2, "numpy")]),
    ("from hurray_bridge.adapters.arrow import dtype_of\n", [(1, "arrow")]),
    ("import hurray_bridge.adapters.numpy.sparse\n", [(1, "numpy")]),
    ("from hurray_bridge._registry import get_adapter\nget_adapter('numpy').to_hurray(1)\n",
     [(2, "numpy")]),
    ("from . import to_hurray\nfrom .sparse import from_hurray\n", []),
    ("from hurray_bridge.adapters.jax import shards\n", []),
    ("from hurray_bridge._host import to_hurray\n", []),
])
def test_the_checker_sees_an_adapter_reaching_another(tmp_path: Path, source: str,
                                                      found: list[tuple[int, str]]) -> None:
    path = tmp_path / "shortcuts.py"
    path.write_text(source)
    assert sorted(set(adapter_reaches("jax", "hurray_bridge.adapters.jax.shortcuts",
                                      path))) == found


def exported(path: Path) -> list[str] | None:
    """The literal ``__all__`` of a module's source, or None when it has none."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if (isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)):
            value: list[str] = ast.literal_eval(node.value)
            return value
    return None


def test_every_adapter_exports_the_contracts_names() -> None:
    from hurray_bridge._contract import NAMES

    folders = sorted(p for p in ADAPTERS.iterdir() if (p / "__init__.py").is_file())
    assert len(folders) >= 5
    offences = []
    for folder in folders:
        names = exported(folder / "__init__.py")
        if names is None:
            offences.append(f"adapters/{folder.name}/__init__.py has no literal __all__")
            continue
        if sorted(names) != sorted(NAMES) or len(names) != len(set(names)):
            extra = sorted(set(names) - set(NAMES))
            missing = sorted(set(NAMES) - set(names))
            offences.append(f"adapters/{folder.name}/__init__.py: extra {extra}, "
                            f"missing {missing}")
    assert not offences, (
        "adapters are alike: each exports exactly hurray_bridge._contract.NAMES (what only "
        "one adapter needs is private or lives in a submodule):\n" + "\n".join(offences))


def shared_submodules() -> dict[str, dict[str, list[str] | None]]:
    """Submodule file name -> adapter -> its literal ``__all__``, for every file name that
    more than one adapter has (``__init__.py`` aside: the contract's test covers it)."""
    by_name: dict[str, dict[str, list[str] | None]] = {}
    for folder in sorted(p for p in ADAPTERS.iterdir() if (p / "__init__.py").is_file()):
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                by_name.setdefault(path.stem, {})[folder.name] = exported(path)
    return {name: found for name, found in by_name.items() if len(found) > 1}


def unlike_submodules(shared: dict[str, dict[str, list[str] | None]]) -> list[str]:
    offences = []
    for name, found in sorted(shared.items()):
        if len({tuple(sorted(v)) if v is not None else None for v in found.values()}) > 1:
            offences.append(f"{name}.py: " + "; ".join(
                f"{a} exports {sorted(v) if v is not None else 'no literal __all__'}"
                for a, v in sorted(found.items())))
    return offences


def test_submodules_of_one_name_export_the_same_names() -> None:
    shared = shared_submodules()
    assert {"sparse", "shards", "shortcuts"} <= set(shared)
    offences = unlike_submodules(shared)
    assert not offences, (
        "adapters are alike: a submodule that several adapters have exports the same names "
        "in each (what only one needs stays out of __all__):\n" + "\n".join(offences))


@pytest.mark.parametrize("found, unlike", [
    ({"shards": {"jax": ["to_hurray", "from_hurray"], "torch": ["from_hurray", "to_hurray"]}},
     []),
    ({"shards": {"jax": ["to_sharded", "from_sharded"], "torch": ["to_hurray"]}}, ["shards"]),
    ({"sparse": {"jax": ["to_hurray"], "torch": None}}, ["sparse"]),
])
def test_the_checker_sees_unlike_submodules(found: dict[str, dict[str, list[str] | None]],
                                            unlike: list[str]) -> None:
    assert [o.split(".py:")[0] for o in unlike_submodules(found)] == unlike


def _framework_of() -> dict[str, str]:
    # Every registered adapter, so that one added to the registry is checked at once.
    from hurray_bridge._registry import ADAPTERS

    return {name: spec.framework for name, spec in ADAPTERS.items()}


_FRAMEWORK_OF = _framework_of()


@pytest.mark.parametrize("name", sorted(_FRAMEWORK_OF))
def test_every_adapter_satisfies_the_contract(name: str) -> None:
    import importlib
    import inspect

    from hurray_bridge._contract import KINDS, NAMES, Adapter

    pytest.importorskip(_FRAMEWORK_OF[name], reason=f"{_FRAMEWORK_OF[name]} is not installed")
    mod = importlib.import_module(f"hurray_bridge.adapters.{name}")
    assert isinstance(mod, Adapter)
    assert all(hasattr(mod, n) for n in NAMES)
    assert mod.NAME == name
    assert "dense" in mod.HOLDS and mod.HOLDS <= KINDS
    assert mod.DEVICES and all(type(d) is int and d > 0 for d in mod.DEVICES)
    assert type(mod.LEGACY_EXPORTS_MUTABLE) is bool
    assert mod.HOLD_HOST_MEMORY is None or callable(mod.HOLD_HOST_MEMORY)
    assert (mod.fast_import is None) == (mod.fast_export is None)
    assert "copy" in inspect.signature(mod.to_hurray).parameters
    assert {"device", "copy"} <= set(inspect.signature(mod.from_hurray).parameters)
    table = mod.native_dtypes()
    assert table, f"{name} declares no element type"
    for dtype, native in table.items():  # the table and the two lookups agree
        assert mod.native_dtype(dtype) == native
        assert mod.dtype_of(native) is dtype or mod.dtype_of(native) == dtype
    assert mod.special_kind(object()) is None
    # Each declared kind beyond dense has its module: the core asks only those.
    modules = {"sparse": "sparse", "quantized": "quant", "sharded": "shards"}
    for kind in mod.HOLDS - {"dense"}:
        importlib.import_module(f"hurray_bridge.adapters.{name}.{modules[kind]}")


# Names the core must not spell: adapters' target names, their aliases and their
# frameworks' top-level modules.
FRAMEWORK_NAMES = frozenset({"numpy", "np", "torch", "pytorch", "jax", "jaxlib", "arrow",
                             "pyarrow", "pa", "cupy", "cupyx", "scipy", "mlx",
                             "paddle"})
# The two modules allowed to spell them (see rule 6).
NAMING_MODULES = frozenset({"hurray_bridge/_registry.py", "hurray_bridge/_numpy.py"})
# file -> (how many literals, why): public API named after a framework, and the reports
# whose rows are frameworks. Lower a count when you remove one; never raise it.
NAMED_ON_PURPOSE = {
    "hurray_bridge/shards.py": (5, "hb.from_jax / hb.to_jax / hb.to_dtensor, and "
                                   "assemble's documented default to='numpy'"),
    "hurray_bridge/matrix.py": (17, "the compatibility report: its columns are frameworks"),
    "hurray_bridge/testing/_context.py": (4, "the kit's report names the installed versions"),
}


def framework_literals(path: Path) -> Iterator[tuple[int, str]]:
    """(line, literal) for each string constant equal to a framework's name, outside
    docstrings, ``__all__`` and ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_blocks(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
              and isinstance(node.value.value, str)):
            skip.add(id(node.value))  # a docstring, of a module, class, function or attribute
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and node.value in FRAMEWORK_NAMES and id(node) not in skip):
            yield node.lineno, node.value


def test_the_core_holds_no_framework_name() -> None:
    offences = []
    for _module, path in core_modules().items():
        rel = path.relative_to(ROOT).as_posix()
        if rel in NAMING_MODULES:
            continue
        found = list(framework_literals(path))
        allowed = NAMED_ON_PURPOSE.get(rel, (0, ""))[0]
        if len(found) > allowed:
            offences += [f"{rel}:{line} {value!r}" for line, value in found]
        elif len(found) < allowed:
            offences.append(f"{rel}: {len(found)} names now, NAMED_ON_PURPOSE says {allowed}: "
                            "lower the count")
    assert not offences, (
        "the core asks adapters what they declare (hurray_bridge/_contract.py) instead of "
        "naming a framework; a name belongs in _registry.py:\n" + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("if name == 'torch':\n    pass\n", [(1, "torch")]),
    ("get_adapter('numpy').dtype_of(x)\n", [(1, "numpy")]),
    ("def f():\n    'jax is named here, in a docstring'\n    return 'pyarrow'\n",
     [(3, "pyarrow")]),
    ('"""numpy"""\n__all__ = ["numpy"]\n', []),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    x: 'torch'\n", []),
    ("X = 1\n'torch'\n", []),
    ("name = 'numpyish'\n", []),
])
def test_the_checker_sees_a_framework_name(tmp_path: Path, source: str,
                                           found: list[tuple[int, str]]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert sorted(framework_literals(path)) == found


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, without those of functions or classes inside it
    (a helper's early return is its own business)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def silent_returns(path: Path) -> Iterator[tuple[int, str]]:
    """(line, test) for each ``if ...: return`` (nothing else in the branch) in a test."""
    tree = ast.parse(path.read_text(), str(path))
    for fn in ast.walk(tree):
        if not (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                and fn.name.startswith("test")):
            continue
        for node in _own_nodes(fn):
            if (isinstance(node, ast.If) and len(node.body) == 1
                    and isinstance(node.body[0], ast.Return)
                    and (node.body[0].value is None or (
                        isinstance(node.body[0].value, ast.Constant)
                        and node.body[0].value.value is None))):
                yield node.lineno, fn.name


def test_no_test_returns_early_without_asserting() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line} {name}"
                for path in sorted(TESTS.rglob("*.py")) for line, name in silent_returns(path)]
    assert not offences, (
        "a test that returns before asserting counts as a pass that tested nothing: skip it "
        "with its reason (pytest.skip), assume() it away (hypothesis), or do not generate "
        "the case:\n" + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("def test_a(x):\n    if x is None:\n        return\n    assert x\n", [(2, "test_a")]),
    ("def test_a(x):\n    if x:\n        return None\n    else:\n        assert x\n",
     [(2, "test_a")]),
    ("class TestA:\n    def test_b(self, x):\n        if x:\n            return\n",
     [(3, "test_b")]),
    ("def test_a(x):\n    if x is None:\n        pytest.skip('no x: why')\n    assert x\n", []),
    ("def test_a(x):\n    try:\n        f(x)\n    except E:\n        return\n", []),
    ("def test_a(x):\n    def inner():\n        if x:\n            return\n    assert inner\n",
     []),
    ("def helper(x):\n    if x:\n        return\n", []),
])
def test_the_checker_sees_a_silent_return(tmp_path: Path, source: str,
                                          found: list[tuple[int, str]]) -> None:
    path = tmp_path / "test_mod.py"
    path.write_text(source)
    assert list(silent_returns(path)) == found


@pytest.mark.parametrize("source, found", [
    ("import torch\n", ["torch"]),
    ("def f():\n    from jax import numpy\n", ["jax"]),
    ("import importlib\nimportlib.import_module('pyarrow')\n", ["pyarrow"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n", []),
])
def test_the_checker_sees_deferred_and_dynamic_imports(tmp_path: Path, source: str,
                                                       found: list[str]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    tops = [t.partition(".")[0] for _, t in imports("hurray_bridge.mod", path)]
    assert sorted({t for t in tops if t in FRAMEWORKS}) == found


def test_the_checker_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


_TYPE_ATTRS = frozenset({"type", "device_type"})
_TYPE_NAMES = frozenset({"device_type", "dev_type"})


def _number(node: ast.AST, positive: bool = False) -> bool:
    return (isinstance(node, ast.Constant) and type(node.value) is int
            and (node.value > 0 or not positive))


def _numbers(node: ast.AST) -> bool:
    """A positive int literal, or a tuple/list/set literal holding one (0 is no device
    type: ``dev.type < 0`` checks a range)."""
    return _number(node, True) or (isinstance(node, (ast.Tuple, ast.List, ast.Set))
                                   and any(_number(e, True) for e in node.elts))


def _numbered_pair(node: ast.AST) -> bool:
    """A ``(device_type, device_id)`` literal whose type is a number."""
    return isinstance(node, ast.Tuple) and len(node.elts) == 2 and _number(node.elts[0])


def _named(node: ast.AST) -> str:
    return (node.id if isinstance(node, ast.Name)
            else node.attr if isinstance(node, ast.Attribute) else "")


def bare_device_types(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) for each DLPack device type spelled as a bare number (rule 8)."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any((isinstance(s, ast.Attribute) and s.attr in _TYPE_ATTRS)
                   or (isinstance(s, ast.Name) and s.id in _TYPE_NAMES) for s in sides) \
                    and any(_numbers(s) for s in sides):
                yield node.lineno, "a device type compared with a number"
            elif any("device" in _named(s).lower() for s in sides) and any(
                    _numbered_pair(s) or (isinstance(s, (ast.Tuple, ast.List, ast.Set))
                                          and any(_numbered_pair(e) for e in s.elts))
                    for s in sides):
                yield node.lineno, "a device compared with a (number, id) pair"
        elif isinstance(node, ast.Call):
            if _named(node.func) == "Device" and node.args and _number(node.args[0]):
                yield node.lineno, "Device(<number>, ...)"
            for kw in node.keywords:
                if kw.arg in ("device_type", "dl_device") and (
                        _number(kw.value) or _numbered_pair(kw.value)):
                    yield node.lineno, f"{kw.arg}=<number>"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if any(n == "DEVICES" or n.endswith("_DEVICES") for n in names) and any(
                    _number(n, True) for n in ast.walk(node.value)):
                yield node.lineno, "a DEVICES set holding a number"
            elif any(n in _TYPE_NAMES for n in names) and _number(node.value):
                yield node.lineno, "a device type set to a number"
        elif (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
              and node.name == "__dlpack_device__"):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and ret.value is not None \
                        and _numbered_pair(ret.value):
                    yield ret.lineno, "__dlpack_device__ returns a number"


def test_no_library_module_spells_a_device_type_as_a_number() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line} {what}"
                for root in (CORE, ADAPTERS) for path in sorted(root.rglob("*.py"))
                for line, what in bare_device_types(path)]
    assert not offences, (
        "a DLPack device type is a name of hurray_bridge._dlpack.DLDeviceType "
        "(DLDeviceType.kDLCUDA; bind _CUDA = int(DLDeviceType.kDLCUDA) at module level "
        "where a hot path compares it, or use hurray_bridge.tensor.CPU for (kDLCPU, 0)), "
        "never a bare number:\n" + "\n".join(offences))


def _codey(node: ast.AST) -> bool:
    """A name that holds a DLPack type code or a (code, bits) pair: ``code``, ``dl_code``,
    ``t.code``, ``bool_code``, ``dlpack``, ``d.dlpack`` (not ``exit_code``, ``returncode``)."""
    name = _named(node).lower()
    return name in ("code", "dlpack", "type_code") or (
        name.endswith("_code") and name not in ("exit_code", "status_code", "error_code"))


def _coded(node: ast.AST) -> bool:
    """A number, a ``(number, bits)`` pair, or a tuple/list/set of them (a pair's second
    element is its bits, a number whatever the code is named)."""
    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        return _numbered_pair(node)
    return _number(node) or (isinstance(node, (ast.Tuple, ast.List, ast.Set))
                             and any(_number(e) or _numbered_pair(e) for e in node.elts))


def bare_type_codes(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) for each DLPack ``DLDataTypeCode`` spelled as a bare number."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_codey(s) or (isinstance(s, ast.Tuple) and s.elts and _codey(s.elts[0]))
                   for s in sides) and any(_coded(s) for s in sides):
                yield node.lineno, "a type code compared with a number"
        elif isinstance(node, ast.Call):
            if _named(node.func) in ("dtype_from_dlpack", "DLDataType") and node.args \
                    and _number(node.args[0]):
                yield node.lineno, f"{_named(node.func)}(<number>, ...)"
            for kw in node.keywords:
                if kw.arg in ("code", "type_code") and _number(kw.value):
                    yield node.lineno, f"{kw.arg}=<number>"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_codey(t) for t in targets) and _coded(node.value):
                yield node.lineno, "a type code set to a number"


def test_no_library_module_spells_a_dlpack_type_code_as_a_number() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line} {what}"
                for root in (CORE, ADAPTERS) for path in sorted(root.rglob("*.py"))
                if path.name != "dtypes.py" or path.parent != CORE  # where they are named
                for line, what in bare_type_codes(path)]
    assert not offences, (
        "a DLPack type code is a name of hurray_bridge.dtypes.DLPACK_CODE "
        "(int(DLPACK_CODE.kDLBool), or a DType's .dlpack pair), never a bare number:\n"
        + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("bool_code = (6, 8)\n", [(1, "a type code set to a number")]),
    ("if code == 2 and bits == 16:\n    pass\n", [(1, "a type code compared with a number")]),
    ("ok = (code, bits) in {(2, 32), (0, 8)}\n", [(1, "a type code compared with a number")]),
    ("ok = t.dlpack == (4, 16)\n", [(1, "a type code compared with a number")]),
    ("d = dtype_from_dlpack(2, 32)\n", [(1, "dtype_from_dlpack(<number>, ...)")]),
    ("d = DLDataType(code=1, bits=8, lanes=1)\n", [(1, "code=<number>")]),
    # the names, bits and lanes alone, exit codes and other pairs pass
    ("bool_code = (int(DLPACK_CODE.kDLBool), 8)\nok = code == _FLOAT and bits == 16\n", []),
    ("ok = proc.returncode == 0 and exit_code != 1\nshape = (2, 8)\n", []),
    ("ok = t.dtype.bits == 8 and v.lanes == 1\nd = DLDataType(_C.kDLInt, 8, 1)\n", []),
])
def test_the_checker_sees_a_bare_type_code(tmp_path: Path, source: str,
                                           found: list[tuple[int, str]]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert sorted(bare_type_codes(path)) == found


@pytest.mark.parametrize("source, found", [
    ("if t.device.type == 2:\n    pass\n", [(1, "a device type compared with a number")]),
    ("ok = view.device_type not in (3, 11)\n", [(1, "a device type compared with a number")]),
    ("ok = 1 == device_type\n", [(1, "a device type compared with a number")]),
    ("ok = device not in ('cpu', CPU, (1, 0))\n",
     [(1, "a device compared with a (number, id) pair")]),
    ("d = Device(10, 0)\n", [(1, "Device(<number>, ...)")]),
    ("d = hb.Device(1, k)\n", [(1, "Device(<number>, ...)")]),
    ("c = x.__dlpack__(dl_device=(1, 0))\n", [(1, "dl_device=<number>")]),
    ("c = make_capsule(device_type=1, device_id=0)\n", [(1, "device_type=<number>")]),
    ("DEVICES = frozenset({1, GPU})\n", [(1, "a DEVICES set holding a number")]),
    ("_HOST_DEVICES = (None, 'cpu', (1, 0))\n", [(1, "a DEVICES set holding a number")]),
    ("class S:\n    device_type: int = 1\n", [(2, "a device type set to a number")]),
    ("class A:\n    def __dlpack_device__(self):\n        return (1, 0)\n",
     [(3, "__dlpack_device__ returns a number")]),
    # the names, a range check, other fields' numbers and versions pass
    ("if t.device.type == _CPU and dev.type >= 0 and dev.id == 1:\n    pass\n", []),
    ("DEVICES = frozenset({int(DLDeviceType.kDLCPU)})\nd = Device(_CUDA, 0)\n", []),
    ("ok = dtype.bits == 1 and version == (1, 0)\nx = f(max_version=(1, 0))\n", []),
    ("device_id: int = 0\ndevice = CPU\n", []),
])
def test_the_checker_sees_a_bare_device_type(tmp_path: Path, source: str,
                                             found: list[tuple[int, str]]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert sorted(bare_device_types(path)) == found


# ------------------------------------------------------------------ 9. tools above
TOOLS = frozenset({f"{PACKAGE}.__main__", f"{PACKAGE}.matrix", f"{PACKAGE}.testing",
                   f"{PACKAGE}._pytest_plugin"})


def is_tool(module: str) -> bool:
    """A module of a tool (the package ``testing`` with every module under it)."""
    return any(module == t or module.startswith(t + ".") for t in TOOLS)


def tools_imported(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, tool) for each line of ``module`` that imports a tool (or a module of one)."""
    found = {(line, tool) for line, target in imports(module, path) for tool in TOOLS
             if target == tool or target.startswith(tool + ".")}
    yield from sorted(found)


def library_modules() -> Iterator[tuple[str, Path]]:
    """(dotted name, file) for every module of the library: the core and the adapters,
    less the tools."""
    for module, path in core_modules().items():
        if not is_tool(module):
            yield module, path
    for _adapter, module, path in adapter_files():
        yield module, path


def test_no_library_module_imports_a_tool() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line} imports {target}"
                for module, path in library_modules()
                for line, target in tools_imported(module, path)]
    assert not offences, (
        "the CLI, the report, the kit and the pytest plugin are tools on top of the library; "
        "what a library module needs from one belongs in the library:\n" + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("from . import matrix\n", [(1, "hurray_bridge.matrix")]),
    ("def f():\n    from .testing import CHECKS\n", [(2, "hurray_bridge.testing")]),
    ("from .testing._consumer import validate_consumer\n", [(1, "hurray_bridge.testing")]),
    ("import importlib\nimportlib.import_module('hurray_bridge.__main__')\n",
     [(2, "hurray_bridge.__main__")]),
    ("from hurray_bridge._pytest_plugin import pytest_addoption\n",
     [(1, "hurray_bridge._pytest_plugin")]),
    ("from .matrixes import x\nfrom .files import format\nfrom . import _registry\n", []),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import matrix\n", []),
])
def test_the_checker_sees_a_library_module_importing_a_tool(
        tmp_path: Path, source: str, found: list[tuple[int, str]]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert list(tools_imported("hurray_bridge.mod", path)) == found


def test_the_tools_are_modules_of_the_package() -> None:
    """Each tool named exists: a rename would otherwise leave the rule checking nothing."""
    mods = core_modules()
    assert all(t in mods for t in TOOLS), sorted(TOOLS - set(mods))
    assert not is_tool(f"{PACKAGE}.matrixes") and is_tool(f"{PACKAGE}.testing._consumer")


# ----------------------------------------------- 10. files/: no private name crosses
FILES = CORE / "files"


def private_imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, module.name) for each private name that ``path`` imports from another module
    (``from .m import _name``; an alias does not hide it)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = here[: len(here) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            # ``from . import _numpy`` imports a module (a private module is still a module,
            # the compiled _speedups too: its stub stands for it)
            folder = ROOT.joinpath(*source.split("."))
            if alias.name.startswith("_") and not alias.name.startswith("__") and not any(
                    (folder / f"{alias.name}{kind}").is_file() for kind in (".py", ".pyi")):
                yield node.lineno, f"{source}.{alias.name}"


def test_no_files_module_imports_a_private_name() -> None:
    offences = [f"{path.relative_to(ROOT)}:{line} imports {name}"
                for module, path in core_modules().items() if path.is_relative_to(FILES)
                for line, name in private_imports(module, path)]
    assert not offences, (
        "a name another module of files/ needs is public (no leading underscore) in its own "
        "module:\n" + "\n".join(offences))


@pytest.mark.parametrize("source, found", [
    ("from .format import _read_head\n", [(1, "hurray_bridge.files.format._read_head")]),
    ("from .pread import pread_into as _pread_into\n", []),
    ("def f():\n    from ..shards import _missing_box\n",
     [(2, "hurray_bridge.shards._missing_box")]),
    ("from .. import _numpy, _speedups\nfrom .format import read_head as _read_head\n", []),
])
def test_the_checker_sees_a_private_name_imported(tmp_path: Path, source: str,
                                                 found: list[tuple[int, str]]) -> None:
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert sorted(private_imports("hurray_bridge.files.mod", path)) == found


# Rule 11: functions a reader can hold in their head.
MAX_FUNCTION_LINES = 80
MAX_COMPLEXITY = 25
# Functions allowed past the limits, each with its reason. Nothing else belongs here: a
# function past them is split by what it decides, each piece a named function.
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}


def _decisions(body: list[ast.stmt]) -> int:
    """The decision points of a block, counted as mccabe (ruff's C901) counts them: each
    if/elif, loop, except clause, try's else, match case (less an irrefutable last one)
    and nested function adds one; boolean operators and comprehensions add none."""
    n = 0
    for stmt in body:
        if isinstance(stmt, ast.If):
            n += 1 + _decisions(stmt.body)
            orelse = stmt.orelse
            # an elif is an If alone in the else block
            n += _decisions(orelse)
        elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            n += 1 + _decisions(stmt.body) + _decisions(stmt.orelse)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            n += _decisions(stmt.body)
        elif isinstance(stmt, (ast.Try, ast.TryStar)):
            n += _decisions(stmt.body) + (1 if stmt.orelse else 0) + _decisions(stmt.orelse)
            n += _decisions(stmt.finalbody)
            n += sum(1 + _decisions(h.body) for h in stmt.handlers)
        elif isinstance(stmt, ast.Match):
            n += sum(1 + _decisions(c.body) for c in stmt.cases)
            last = stmt.cases[-1] if stmt.cases else None
            if last is not None and last.guard is None and (
                    isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None):
                n -= 1
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n += 1 + _decisions(stmt.body)
        elif isinstance(stmt, ast.ClassDef):
            n += _decisions(stmt.body)
    return n


def complexity(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's cyclomatic complexity, as mccabe (ruff's C901) measures it."""
    return 1 + _decisions(fn.body)


def oversized_functions(path: Path, rel: str) -> Iterator[tuple[str, int, int]]:
    """(``rel::Class.function``, lines, complexity) of each function in ``path`` longer than
    MAX_FUNCTION_LINES lines (its ``def`` to its last line) or more complex than
    MAX_COMPLEXITY."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def visit(node: ast.AST, prefix: str) -> Iterator[tuple[str, int, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                cc = complexity(child)
                if lines > MAX_FUNCTION_LINES or cc > MAX_COMPLEXITY:
                    yield f"{rel}::{name}", lines, cc
                yield from visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                yield from visit(child, prefix + child.name + ".")
            else:
                yield from visit(child, prefix)

    yield from visit(tree, "")


def test_no_library_function_is_too_long_or_too_complex() -> None:
    found = {name: (lines, cc) for root in (CORE, ADAPTERS)
             for path in sorted(root.rglob("*.py"))
             for name, lines, cc in oversized_functions(path, path.relative_to(ROOT).as_posix())}
    offences = [f"{name}: {lines} lines, complexity {cc}"
                for name, (lines, cc) in found.items() if name not in LONG_FUNCTIONS_ALLOWED]
    assert not offences, (
        f"a library function has at most {MAX_FUNCTION_LINES} lines and a cyclomatic "
        f"complexity of at most {MAX_COMPLEXITY}: split it by what it decides, each piece a "
        "named function (inline only where a hot path measures the call):\n"
        + "\n".join(offences))
    stale = sorted(set(LONG_FUNCTIONS_ALLOWED) - set(found))
    assert not stale, f"within the limits now: take them out of LONG_FUNCTIONS_ALLOWED: {stale}"


def _branches(n: int, indent: str) -> str:
    return "".join(f"{indent}if x == {i}:\n{indent}    y = {i}\n" for i in range(n))


@pytest.mark.parametrize("source, found", [
    # 81 lines: def, 79 statements, return
    ("def f(x):\n" + "    x += 1\n" * 79 + "    return x\n", [("m.py::f", 81, 1)]),
    ("def f(x):\n" + "    x += 1\n" * 78 + "    return x\n", []),
    # 25 ifs: complexity 26, in 52 lines; inside a class the method is named by it
    ("class A:\n    def f(self, x):\n" + _branches(25, "        ") + "        return x\n",
     [("m.py::A.f", 52, 26)]),
    ("def f(x):\n" + _branches(24, "    ") + "    return x\n", []),
    # elif, loops, except, try's else, a nested function count; and/or do not
    ("def f(x):\n    if x:\n        pass\n    elif x and x or x:\n        pass\n"
     "    for i in x:\n        pass\n    while x:\n        pass\n"
     "    try:\n        pass\n    except E:\n        pass\n    else:\n        pass\n"
     "    def g():\n        if x:\n            pass\n", []),
])
def test_the_checker_sees_a_long_or_complex_function(tmp_path: Path, source: str,
                                                     found: list[tuple[str, int, int]]) -> None:
    path = tmp_path / "m.py"
    path.write_text(source)
    assert list(oversized_functions(path, "m.py")) == found


def test_the_complexity_counter_counts_as_mccabe() -> None:
    fn = ast.parse(
        "def f(x):\n    if x:\n        pass\n    elif x and x or x:\n        pass\n"
        "    for i in x:\n        pass\n    while x:\n        pass\n"
        "    try:\n        pass\n    except E:\n        pass\n    else:\n        pass\n"
        "    def g():\n        if x:\n            pass\n"
        "    with x:\n        if x:\n            pass\n"
        "    y = [i for i in x if i]\n").body[0]
    assert isinstance(fn, ast.FunctionDef)
    # 1 + if + elif + for + while + except + else + def g + its if + the if under with
    assert complexity(fn) == 10
