"""Every public name carries a docstring the reference site can show.

Read from the source, as the site's generator (griffe, under mkdocstrings) reads it, so
the adapters of frameworks that are not installed are checked too. A function, class or
module needs its docstring; a constant needs an attribute docstring: a string literal on
the line after its assignment. A name imported from another module is looked up there.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from scripts import public_api

ROOT = public_api.ROOT


def _module_path(module: pathlib.Path, level: int, name: str | None) -> pathlib.Path:
    """The source file a ``from <level dots><name> import ...`` in ``module`` reads."""
    if level == 0:
        assert name is not None and name.split(".")[0] == "hurray_bridge", name
        base, parts = ROOT, name.split(".")
    else:
        base = module.parent
        for _ in range(level - 1):
            base = base.parent
        parts = name.split(".") if name else []
    target = base.joinpath(*parts)
    return target / "__init__.py" if target.is_dir() else target.with_suffix(".py")


def _body(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, with those inside a top-level ``if``/``try`` block (both
    branches of an ``if``: ``if TYPE_CHECKING:`` holds what type checkers see, its ``else``
    what runs)."""
    out: list[ast.stmt] = []
    for node in tree.body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            out.extend(node.body)
        if isinstance(node, ast.If):
            out.extend(node.orelse)
    return out


def _is_overload(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(ast.unparse(d).split(".")[-1] == "overload" for d in node.decorator_list)


def docstring(module: pathlib.Path, name: str, seen: int = 0) -> str | None:
    """The docstring griffe finds for ``name`` in ``module`` (None: there is none)."""
    assert seen < 10, f"import chain too long for {name} from {module}"
    body = _body(public_api.parse(module))
    for i, node in enumerate(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            # An @overload signature carries no docstring, nor does the implementation a
            # type checker sees under `if TYPE_CHECKING:` when a front is what runs: the
            # docstring is the implementation's, or the front's further down.
            text = None if _is_overload(node) else ast.get_docstring(node)
            if text:
                return text
            continue
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ast.get_docstring(node)
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            wrapped = _front_of(node)
            if wrapped is not None:
                return docstring(module, wrapped, seen + 1)
            after = body[i + 1] if i + 1 < len(body) else None
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                    and isinstance(after.value.value, str):
                return after.value.value.strip() or None
            return None
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return None  # unpacked from a tuple: griffe sees no attribute to document
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                if node.module is not None:
                    source = _module_path(module, node.level, node.module)
                    if source.exists() and alias.name in _defined(source):
                        return docstring(source, alias.name, seen + 1)
                # `from . import dtypes`: the name is a module
                sub = _module_path(module, node.level,
                                   f"{node.module}.{alias.name}" if node.module else alias.name)
                return ast.get_docstring(public_api.parse(sub))
    if name in _defined(module):
        return None  # only signatures without a docstring
    raise AssertionError(f"{name} is in __all__ of {module} but not defined or imported there")


def _front_of(node: ast.stmt) -> str | None:
    """``general`` in ``name = ...front(general, ...)``: the function a dispatch front wraps.

    At run time the front carries that function's docstring (functools.update_wrapper), and
    the site's griffe extension (``scripts/griffe_fronts.py``) documents it the same way.
    """
    value = getattr(node, "value", None)
    if not isinstance(value, ast.Call) or not value.args or not isinstance(value.args[0], ast.Name):
        return None
    func = ast.unparse(value.func)
    return value.args[0].id if func.endswith("front") else None


def _defined(module: pathlib.Path) -> set[str]:
    names: set[str] = set()
    for node in _body(public_api.parse(module)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


MODULES = public_api.public_modules()


@pytest.mark.parametrize("module", MODULES, ids=[m.name for m in MODULES])
def test_every_public_name_has_a_docstring(module: public_api.PublicModule) -> None:
    names = public_api.all_names(public_api.parse(module.source))
    assert names, f"{module.name} has an empty __all__"
    assert ast.get_docstring(public_api.parse(module.source)), f"{module.name} has no docstring"
    missing = [n for n in names if not docstring(module.source, n)]
    assert not missing, f"{module.name}: no docstring for {missing}"


def test_the_checker_sees_a_missing_docstring(tmp_path: pathlib.Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('"""m."""\nA = 1\nB = 2\n"""B, documented."""\ndef f():\n    pass\n'
                   'def g():\n    """g."""\nh = x.front(g)\nk = x.front(f)\nP, Q = 1, 2\n',
                   encoding="utf-8")
    assert docstring(src, "A") is None and docstring(src, "f") is None
    assert docstring(src, "B") == "B, documented." and docstring(src, "g") == "g."
    assert docstring(src, "h") == "g." and docstring(src, "k") is None
    assert docstring(src, "P") is None
    typed = tmp_path / "t.py"
    typed.write_text('"""t."""\nfrom typing import TYPE_CHECKING, overload\n'
                     'def g():\n    """g."""\nif TYPE_CHECKING:\n'
                     '    @overload\n    def h(a: int) -> int: ...\n'
                     '    def h(a): ...\nelse:\n    h = x.front(g)\n'
                     '@overload\ndef k(a: int) -> int: ...\ndef k(a):\n    """k."""\n'
                     '@overload\ndef m(a: int) -> int: ...\ndef m(a): ...\n',
                     encoding="utf-8")
    assert docstring(typed, "h") == "g." and docstring(typed, "k") == "k."
    assert docstring(typed, "m") is None


def test_the_public_modules_are_the_packages_exports() -> None:
    # the reference covers every module hurray_bridge exports as a module, and each adapter
    exported = public_api.all_names(public_api.parse(ROOT / "hurray_bridge/__init__.py"))
    submodules = {n for n in exported if (ROOT / "hurray_bridge" / f"{n}.py").exists()}
    assert submodules == set(public_api.SUBMODULES)
    adapters = {p.name for p in (ROOT / "adapters").iterdir() if (p / "__init__.py").exists()}
    assert adapters == set(public_api.ADAPTERS)
