"""A griffe extension: a function behind a dispatch front is documented as that function.

``hb.convert``, ``hb.asarray`` and the torch adapter's ``to_hurray`` are objects that
``front(general, ...)`` returns (``hurray_bridge/_shortcuts.py``, ``_exchange.py``): at run
time they carry ``general``'s name, docstring and signature (functools.update_wrapper), but
read from the source they are plain assignments. This gives the reference what
``help()`` gives: the wrapped function's signature and docstring under the public name.

Where typed overloads stand under ``if TYPE_CHECKING:`` and the front in its ``else``
(``hb.convert``), griffe keeps the overloads and their undocumented implementation: that
function then takes the wrapped function's docstring, and keeps its overloads.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import griffe

# `name = <anything>front(general, ...)`: the first argument is the function wrapped.
_FRONT = re.compile(r"^[\w.]*front\((?P<general>\w+)\b")


class DispatchFronts(griffe.Extension):
    """Document each front as the function it wraps."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for mod in [pkg, *self._submodules(pkg)]:
            fronts = _fronts_in(mod.filepath)
            for name, member in list(mod.members.items()):
                if member.is_alias:
                    continue
                if member.is_attribute:
                    m = _FRONT.match(str(member.value))
                    general_name = m["general"] if m is not None else None
                elif member.is_function and member.docstring is None:
                    general_name = fronts.get(name)
                else:
                    continue
                if general_name is None or general_name not in mod.members:
                    continue
                general = mod.members[general_name]
                target = general.final_target if general.is_alias else general
                if not target.is_function:
                    continue
                if member.is_function:  # the typed overloads' implementation (see above)
                    member.docstring = target.docstring
                    continue
                fn = griffe.Function(name, lineno=member.lineno, endlineno=member.endlineno,
                                     parameters=target.parameters, returns=target.returns,
                                     docstring=target.docstring)
                mod.set_member(name, fn)

    def _submodules(self, mod: griffe.Module) -> list[griffe.Module]:
        out: list[griffe.Module] = []
        for member in mod.modules.values():
            if not member.is_alias:
                out += [member, *self._submodules(member)]
        return out


def _fronts_in(path: Any) -> dict[str, str]:
    """``{name: general}`` for each ``name = ...front(general, ...)`` at the top level of the
    source file ``path``, inside a top-level ``if``/``else`` too."""
    if not isinstance(path, Path) or path.suffix != ".py":
        return {}
    out: dict[str, str] = {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes: list[ast.stmt] = []
    for node in tree.body:
        nodes.append(node)
        if isinstance(node, ast.If):
            nodes += node.body + node.orelse
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name):
            m = _FRONT.match(ast.unparse(node.value))
            if m is not None:
                out[node.targets[0].id] = m["general"]
    return out
