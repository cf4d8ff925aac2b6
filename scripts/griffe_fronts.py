"""A griffe extension: a function behind a dispatch front is documented as that function.

``hb.convert``, ``hb.asarray`` and the torch adapter's ``to_hurray`` are objects that
``front(general, ...)`` returns (``hurray_bridge/_shortcuts.py``, ``_exchange.py``): at run
time they carry ``general``'s name, docstring and signature (functools.update_wrapper), but
read from the source they are plain assignments. This gives the reference what
``help()`` gives: the wrapped function's signature and docstring under the public name.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

# `name = <anything>front(general, ...)`: the first argument is the function wrapped.
_FRONT = re.compile(r"^[\w.]*front\((?P<general>\w+)\b")


class DispatchFronts(griffe.Extension):
    """Document each front as the function it wraps."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        for mod in [pkg, *self._submodules(pkg)]:
            for name, member in list(mod.members.items()):
                if member.is_alias or not member.is_attribute:
                    continue
                m = _FRONT.match(str(member.value))
                if m is None or m["general"] not in mod.members:
                    continue
                general = mod.members[m["general"]]
                target = general.final_target if general.is_alias else general
                if not target.is_function:
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
