"""The kit's entry points for producer authors: :func:`check_producer` and the loader of
a ``MODULE:FACTORY`` name that the pytest plugin and ``hurray check`` use."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..dtypes import dtype_from_name
from ._checks import CHECKS, run
from ._context import Ctx
from ._report import Report, short


def _label(factory: Callable[..., Any]) -> str:
    mod = getattr(factory, "__module__", None)
    qual = getattr(factory, "__qualname__", None)
    return f"{mod}:{qual}" if mod and qual else repr(factory)


def check_producer(
    factory: Callable[..., Any],
    *,
    dtype: str = "float32",
    readonly: bool | None = None,
    checks: Iterable[str] | None = None,
    label: str | None = None,
) -> Report:
    """Run the DLPack producer checks on the objects ``factory`` makes.

    ``factory(shape, dtype_name)`` returns a fresh object of that shape and
    element type (``dtype_name`` is a Hurray name such as ``"float32"``); a
    factory taking no arguments returns one fixed object, and the checks that
    need other shapes are skipped. ``readonly`` says whether the producer's
    memory is read-only when the object itself cannot tell (no
    ``flags.writeable``, ``readonly`` or ``is_mutable``). ``checks`` runs a
    subset, by name (see :data:`CHECKS`; one name may be given as a string).
    Never raises for a failing check: the :class:`Report` holds every result
    (``report.raise_if_failed()``). An unknown check name raises ``ValueError``,
    an unknown ``dtype`` :class:`hb.UnsupportedError`.
    """
    dtype = dtype_from_name(dtype).name
    if isinstance(checks, str):
        checks = (checks,)  # one name, not its letters
    asked = list(CHECKS) if checks is None else list(checks)
    unknown = [n for n in asked if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(map(repr, unknown))}; the checks are "
                         f"{', '.join(CHECKS)}")
    names = [n for n in CHECKS if n in asked]  # always in the documented order
    ctx = Ctx(factory, dtype, readonly)
    return Report((run(ctx, n) for n in names), producer=label or _label(factory),
                  dtype=dtype)


_EXAMPLES = {"factory": "mylib.testing:make_tensor", "consumer": "mylib:from_dlpack",
             "write": "mylib.testing:write"}


def split_spec(spec: str, *, what: str = "factory") -> tuple[str, str]:
    """``(module, attribute)`` of a ``"MODULE:ATTR"`` name; ``ValueError`` for another form."""
    form = "MODULE:FACTORY" if what == "factory" else "MODULE:FUNCTION"
    example = _EXAMPLES.get(what, _EXAMPLES["factory"])
    if not isinstance(spec, str):
        raise ValueError(f"load_factory() takes a '{form}' string (for example "
                         f"{example}), got {type(spec).__name__} {spec!r:.60}")
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{spec!r} is not {form} (for example {example})")
    return module, attr


def load_factory(spec: str, *, what: str = "factory") -> Callable[..., Any]:
    """The callable named by ``"package.module:factory"`` (attribute paths with dots work).

    The current directory is searched too when the module is not found
    elsewhere, as ``python -m`` would. Raises ``ValueError`` naming the problem;
    ``what`` (``"factory"``, ``"consumer"``, ``"write"``) is the role the messages name.
    """
    module, attr = split_spec(spec, what=what)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        missing = exc.name or module
        if cwd in sys.path or not (module == missing or module.startswith(missing + ".")):
            raise ValueError(f"cannot import {module!r}: {exc}") from exc
        sys.path.insert(0, cwd)
        try:
            mod = importlib.import_module(module)
        except Exception as exc2:
            raise ValueError(f"cannot import {module!r}: {short(exc2)}") from exc2
    except Exception as exc:
        raise ValueError(f"importing {module!r} failed: {short(exc)}") from exc
    obj: Any = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a callable {what}")
    return obj
