"""Shortcuts for hb.convert: one framework call where it answers exactly as the bridge would.

``hb.convert(x, to)`` builds an hb.Tensor and hands it to the target adapter: about
2-3 us of Python per call, which doubles a hand-off that the frameworks do in
0.3-1.5 us. For a few pairs the target already has a direct import whose result is
the bridge's result - same memory (kept alive as long as the result), dtype, shape,
strides (where a dimension has more than one element: frameworks record anything for
the others), writability and warnings - for every input it accepts, and which
refuses (raises) every input it would treat differently. Those pairs take the direct
import. (What differs is the object that holds the memory: ``.base`` is the source
tensor, a capsule or a memoryview where the full path has its own holder.)

The rules:

* A shortcut is learned only after the full path has converted an object of that
  exact type to that target once (``learn``), keyed by ``(type(x), to)``:
  subclasses (``np.ma.MaskedArray``, ``nn.Parameter``) never share their base's entry.
* It serves only the two-argument call ``hb.convert(x, to)``, also with ``copy=None``
  or ``copy=False`` (every shortcut result shares the source's memory, so "never
  copy" changes nothing it returns; a shortcut that declines leaves the refusal to
  the full path).
* An entry (made by ``entry()``) is ``(fn, attr, value, kwnames, kwvalues,
  nonempty)``. With ``attr`` not None, ``getattr(x, attr)`` must equal ``value``
  before ``fn`` runs; with ``nonempty``, ``len(x)`` must be above 0 (cheap guards
  that need no Python frame). The call is ``fn(x, **dict(zip(kwnames, kwvalues)))``.
* ``fn`` returning ``NotImplemented``, or raising an ``Exception``, sends the call to
  the full path, which owns every copy, warning and error message. A shortcut can
  never answer differently from the full path; ``tests/hurray_bridge/test_shortcuts.py`` checks
  that input by input against the full path.

The front that reads the table is compiled when ``hurray_bridge._speedups`` was
built, and this module's Python function otherwise (same steps).

This module is the mechanism only, and imports no framework. The shortcuts themselves
belong to the source's adapter: ``hurray_bridge.adapters.<source>.shortcuts`` (found
through the registry when a pair is learned) has ``makers()``, target -> a function
that makes the entry for an exact source type, or None. They call the adapters'
public functions only, so that each rule of the full path is written once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ._registry import get_adapter_module

__all__ = ["TABLE", "Entry", "clear", "compiled", "entry", "front", "learn", "serves"]

Entry = tuple[Any, ...]  # (fn, attr, value, kwnames, kwvalues, nonempty)
# type(x) -> target name as passed (aliases included) -> entry, or None once a pair
# is known to have no shortcut (so the full path asks only once).
TABLE: dict[type, dict[str, Entry | None]] = {}


def entry(fn: Callable[..., Any], *, guard: tuple[str, Any] | None = None,
          kwargs: dict[str, Any] | None = None, nonempty: bool = False) -> Entry:
    """A table entry: call ``fn(x, **kwargs)`` when ``getattr(x, guard[0]) == guard[1]``
    and, with ``nonempty``, ``len(x) > 0``."""
    attr, value = guard if guard is not None else (None, None)
    kw = kwargs or {}
    if len(kw) > _MAX_KWARGS:
        raise ValueError(f"a shortcut takes at most {_MAX_KWARGS} keyword arguments")
    return (fn, attr, value, tuple(kw), tuple(kw.values()), bool(nonempty))


_MAX_KWARGS = 4  # MAX_KWARGS in _speedups_c/front.c


def _valid(found: Any) -> bool:
    """The shape ``entry()`` gives; both fronts ignore anything else (as a miss)."""
    return (type(found) is tuple and len(found) == 6 and type(found[3]) is tuple
            and type(found[4]) is tuple and len(found[3]) == len(found[4]) <= _MAX_KWARGS)


@functools.cache
def _makers(source: str) -> dict[str, Callable[[type], Entry | None]]:
    """Target -> maker of the shortcut for an exact source type, from the source adapter's
    ``shortcuts`` module (``makers()``); none for an adapter without one."""
    module = f"hurray_bridge.adapters.{source}.shortcuts"
    try:
        found = get_adapter_module(source, "shortcuts")
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise  # something the module itself imports is missing: not "no shortcuts"
        return {}
    makers: dict[str, Callable[[type], Entry | None]] = found.makers()
    return makers


def learn(tp: type, to: str, source: str | None, target: str) -> None:
    """Record the shortcut (or its absence) for ``(tp, to)`` after the full path succeeded.

    ``source`` and ``target`` are adapter names (``to`` may be an alias of ``target``).
    """
    inner = TABLE.setdefault(tp, {})
    if to in inner:
        return
    maker = _makers(source).get(target) if source is not None else None
    # setdefault: a thread that learned the pair meanwhile keeps its entry (entries are
    # never replaced; the compiled front caches them).
    inner.setdefault(to, None if maker is None else maker(tp))


def _python_front(general: Callable[..., Any], table: dict[type, dict[str, Entry | None]],
                  ) -> Callable[..., Any]:
    """The same steps as ``_speedups.Dispatcher``, for when it was not compiled."""

    def front(*args: Any, **kwargs: Any) -> Any:
        if (len(args) == 2 and type(args[1]) is str
                and (not kwargs or (len(kwargs) == 1
                                    and ((c := kwargs.get("copy", 0)) is None or c is False)))):
            obj = args[0]
            inner = table.get(type(obj))
            found: Any = None if inner is None else inner.get(args[1])
            if _valid(found):
                fn, attr, value, kwnames, kwvalues, nonempty = found
                try:
                    if ((nonempty is not True or len(obj) > 0)
                            and (attr is None or (got := getattr(obj, attr)) is value
                                 or got == value)):
                        out = fn(obj, **dict(zip(kwnames, kwvalues)))
                        if out is not NotImplemented:
                            return out
                except Exception:
                    pass  # the full path decides: it converts, or raises its own error
        return general(*args, **kwargs)

    front.general = general  # type: ignore[attr-defined]
    front.table = table  # type: ignore[attr-defined]
    front.forget = lambda: None  # type: ignore[attr-defined]  # no cache to drop here
    return front


_Dispatcher: Any
try:
    from ._speedups import Dispatcher as _Dispatcher
except ImportError:  # not compiled (no C compiler at install time): same steps in Python
    _Dispatcher = None

compiled = _Dispatcher is not None

F = TypeVar("F", bound=Callable[..., Any])


_FRONTS: list[Any] = []


def front(general: F, *, use_compiled: bool = True, name: str | None = None) -> F:
    """``general`` with the shortcut table in front of it, compiled when available.

    The front takes ``general``'s docstring and signature, and ``name`` (default:
    ``general``'s) as its ``__name__``; type checkers see ``general``'s type, which
    the front accepts and answers exactly."""
    if use_compiled and _Dispatcher is not None:
        out: Callable[..., Any] = _Dispatcher(general, TABLE)
    else:
        out = _python_front(general, TABLE)
    functools.update_wrapper(out, general)  # name, docstring, signature (__wrapped__)
    if name is not None:
        out.__name__ = out.__qualname__ = name
    _FRONTS.append(out)
    return cast(F, out)


class _Declined(Exception):
    pass


def _declined(*args: Any, **kwargs: Any) -> Any:
    raise _Declined


def serves(obj: Any, to: str) -> bool:
    """Whether ``hb.convert(obj, to)`` is answered by a learned shortcut now.

    Makes the call once through the same kind of front as ``hb.convert``, whose full
    path only reports that it was reached: a table entry alone does not say it, as a
    shortcut declines some inputs and falls back on any error.
    """
    probe = (_Dispatcher(_declined, TABLE) if _Dispatcher is not None
             else _python_front(_declined, TABLE))
    try:
        probe(obj, to)
    except _Declined:
        return False
    return True


def clear() -> None:
    """Forget every learned shortcut (the next calls take the full path and learn again)."""
    TABLE.clear()
    for f in _FRONTS:
        f.forget()
