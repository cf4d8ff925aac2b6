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

This module is the mechanism only, and imports no framework. The shortcuts are made
from two hooks per adapter, never written per pair of frameworks: a **fast import**
(``fast_import(tp)``: the raw forms below that an object of exact type ``tp`` can be
read as, each with the entry that reads it) and a **fast export** (``fast_export()``:
the raw forms the adapter builds its native object from, best first, each with the
entry that builds it). ``maker`` composes the source's import with the target's
export in the first form the target takes that the source gives: N + N hooks, and
the torch -> JAX shortcut is torch's fast import of the ``RAW`` form followed by
JAX's fast export of it. In either dict, ``None`` in place of an entry means "the
object itself is that form" (a NumPy array is a host ndarray), so composing with it
adds no call. Both hooks are names of the adapter contract (``hurray_bridge._contract``;
None where an adapter has none), read through the registry when a pair is learned;
they live in ``hurray_bridge.adapters.<name>.shortcuts`` and call their own
adapter's functions only, so that each rule of the full path is written once.

The raw forms, which neither side may interpret differently:

* ``NDARRAY``: a NumPy array over the source's memory, writable exactly when the full
  path's result would be (NumPy is the core's host kernel, so every adapter can read it);
* ``EXPORTER``: an object with ``__dlpack__`` over CPU memory, which the consumer may
  import as it is (it keeps the memory alive and carries its writability);
* ``READONLY_CAPSULE``: a DLPack capsule of CPU memory that must never be written,
  for consumers that cannot mark memory read-only (they give the full path's notice);
* ``RAW``: the tuple ``(data, shape, strides, code, bits, device_type, device_id,
  owner, exporter)`` - a data pointer, the shape, strides in elements (None:
  compact), the DLPack type code and bits, the DLPack device, the object that keeps
  host memory valid, and for device memory the object whose ``__dlpack__(stream=)``
  gives the capsule (the consumer names its stream).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ._registry import get_adapter

__all__ = ["EXPORTER", "FORMS", "NDARRAY", "RAW", "READONLY_CAPSULE", "TABLE", "Entry", "clear",
           "compiled", "compose", "entry", "front", "learn", "maker", "serves",
           "tensor_shortcut"]

Entry = tuple[Any, ...]  # (fn, attr, value, kwnames, kwvalues, nonempty)
# type(x) -> target name as passed (aliases included) -> entry, or None once a pair
# is known to have no shortcut (so the full path asks only once).
TABLE: dict[type, dict[str, Entry | None]] = {}

# The raw forms a fast import gives and a fast export takes (the module docstring).
NDARRAY = "host ndarray"
EXPORTER = "dlpack exporter"
READONLY_CAPSULE = "read-only capsule"
RAW = "raw"
FORMS = (NDARRAY, EXPORTER, READONLY_CAPSULE, RAW)


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


Hooks = dict[str, "Entry | None"]


def _hooks(name: str) -> Any:
    """Adapter ``name`` (whose ``fast_import`` and ``fast_export`` may be None)."""
    return get_adapter(name)


def _run(fn: Callable[..., Any], kw: dict[str, Any]) -> Callable[[Any], Any]:
    """``fn`` with its keyword arguments bound (the bare ``fn`` when there are none)."""
    return functools.partial(fn, **kw) if kw else fn


def compose(imp: Entry | None, exp: Entry | None) -> Entry | None:
    """The entry that reads an object with ``imp`` and builds the result with ``exp``.

    ``None`` for either is "the object itself is the raw form": the other entry is the
    shortcut as it is. The composed entry keeps ``imp``'s guards (they are about the
    source object); ``exp``'s are checked on the raw form. Either side's
    ``NotImplemented`` declines the call.
    """
    if imp is None or exp is None:
        return exp if imp is None else imp
    if not (_valid(imp) and _valid(exp)):
        raise ValueError("compose takes entries made by entry()")
    read = _run(imp[0], dict(zip(imp[3], imp[4])))
    build = _run(exp[0], dict(zip(exp[3], exp[4])))
    attr, value, nonempty = exp[1], exp[2], exp[5]
    if attr is None and not nonempty:
        def composed(x: Any) -> Any:
            raw = read(x)
            return raw if raw is NotImplemented else build(raw)
    else:
        def composed(x: Any) -> Any:
            raw = read(x)
            if raw is NotImplemented or (nonempty and not len(raw)) or (
                    attr is not None and (got := getattr(raw, attr)) is not value
                    and got != value):
                return NotImplemented
            return build(raw)
    return (composed, *imp[1:3], (), (), imp[5])


def maker(tp: type, source: str, target: str) -> Entry | None:
    """The shortcut from exact type ``tp`` (of adapter ``source``) to adapter ``target``:
    the source's fast import composed with the target's fast export in the first form
    the target takes (in its order) that the source gives; None where they share none."""
    # getattr: an adapter outside the contract (one being written) simply has no hooks.
    read = getattr(_hooks(source), "fast_import", None)
    build = getattr(_hooks(target), "fast_export", None)
    if read is None or build is None or source == target:
        return None
    gives: Hooks = read(tp)
    takes: Hooks = build()
    for form, exp in takes.items():
        if form in gives:
            return compose(gives[form], exp)
    return None


def tensor_shortcut(target: str) -> Entry | None:
    """The shortcut from an hb.Tensor to adapter ``target``: the core's own host view of
    it (``_host.tensor_view``, the ``NDARRAY`` form) where that array is the target's
    result itself (its fast export takes ``NDARRAY`` as it is); None for other targets.

    Those build their result from an ndarray by rules that their ``from_hurray`` of an
    hb.Tensor need not share (a read-only tensor, a type they store differently), so
    they keep the full path. The view declines (``NotImplemented``) every tensor that
    the full path would not hand over as that same view.
    """
    build = getattr(_hooks(target), "fast_export", None)
    if build is None or NDARRAY not in (takes := build()) or takes[NDARRAY] is not None:
        return None
    from ._host import tensor_view  # (the target's adapter has imported the host kernel)
    return entry(tensor_view)


def learn(tp: type, to: str, source: str | None, target: str) -> None:
    """Record the shortcut (or its absence) for ``(tp, to)`` after the full path succeeded.

    ``source`` and ``target`` are adapter names (``to`` may be an alias of ``target``).
    """
    inner = TABLE.setdefault(tp, {})
    if to in inner:
        return
    if source is None:
        from .tensor import Tensor
        found = tensor_shortcut(target) if tp is Tensor else None
    else:
        found = maker(tp, source, target)
    # setdefault: a thread that learned the pair meanwhile keeps its entry (entries are
    # never replaced; the compiled front caches them).
    inner.setdefault(to, found)


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
