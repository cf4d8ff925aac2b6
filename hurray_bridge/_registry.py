"""Finding the adapter for an object or a target name, without importing frameworks.

An object's adapter is found from its type's module name (``torch``,
``jaxlib``, ``pyarrow`` ...), and only when that framework is already in
``sys.modules`` — an object of a framework that was never imported cannot
exist. Explicit targets (``hb.convert(x, "jax")``) import the adapter, and so
the framework, on demand.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from functools import cache, lru_cache
from types import ModuleType
from typing import Any, NamedTuple

from . import _shortcuts
from .errors import BackendNotAvailableError, UnsupportedError
from .tensor import Tensor, from_dlpack

__all__ = ["ADAPTERS", "CopyWarning", "adapter_for", "asarray", "convert", "get_adapter"]


class CopyWarning(UserWarning):
    """A conversion with ``copy=None`` had to copy the data (it says why)."""


class AdapterSpec(NamedTuple):
    name: str  # target name users pass to hb.convert
    framework: str  # top-level import name
    extra: str  # pip extra that installs it
    note: str = ""  # added to the not-installed message


ADAPTERS: dict[str, AdapterSpec] = {
    "numpy": AdapterSpec("numpy", "numpy", "numpy"),
    "torch": AdapterSpec("torch", "torch", "torch"),
    "jax": AdapterSpec("jax", "jax", "jax"),
    "arrow": AdapterSpec("arrow", "pyarrow", "arrow"),
    "cupy": AdapterSpec("cupy", "cupy", "cupy", "that extra installs cupy-cuda12x (CUDA 12); "
                        "for CUDA 13 use 'hurray-bridge[cupy-cuda13]'"),
}
# Top-level module of an object's type -> adapter name.
_MODULE_TO_ADAPTER = {
    "numpy": "numpy",
    "torch": "torch",
    "jax": "jax",
    "jaxlib": "jax",
    "pyarrow": "arrow",
    "cupy": "cupy",
    "cupyx": "cupy",
}
_ALIASES = {"np": "numpy", "pyarrow": "arrow", "pa": "arrow", "pytorch": "torch"}


# Target name (or alias) -> (module name, adapter) once imported; hb.convert looks its
# target up on every call. Trusted only while sys.modules still holds that module.
_LOADED: dict[str, tuple[str, ModuleType]] = {}


def get_adapter(name: str) -> ModuleType:
    """The adapter module for a target name; imports the framework if needed."""
    try:
        modname, mod = _LOADED[name]
    except (KeyError, TypeError):  # not loaded yet, or not a name at all
        pass
    else:
        if sys.modules.get(modname) is mod:
            return mod
    spec = ADAPTERS.get(_ALIASES.get(name, name)) if isinstance(name, str) else None
    if spec is None:
        raise UnsupportedError(f"unknown target {name!r}; choose one of {', '.join(ADAPTERS)}")
    modname = f"hurray_bridge.adapters.{spec.name}"
    loaded = sys.modules.get(modname)
    if loaded is not None:
        _LOADED[name] = (modname, loaded)
        return loaded
    try:
        mod = importlib.import_module(modname)
    except ImportError as exc:
        if isinstance(exc, BackendNotAvailableError):
            raise
        missing = getattr(exc, "name", None) or spec.framework
        detail = f"{missing} could not be imported" + (f" ({spec.note})" if spec.note else "")
        raise BackendNotAvailableError(spec.framework, spec.extra, detail) from exc
    _LOADED[name] = (modname, mod)
    return mod


@lru_cache(maxsize=256)
def _adapter_name_for_type(tp: type) -> str | None:
    top = tp.__module__.partition(".")[0]
    name = _MODULE_TO_ADAPTER.get(top)
    if name is None:
        # Subclasses defined elsewhere (a torch.Tensor subclass in user code).
        for base in tp.__mro__[1:]:
            top = base.__module__.partition(".")[0]
            if top in _MODULE_TO_ADAPTER:
                return _MODULE_TO_ADAPTER[top]
    return name


# Sparse and quantized natives: routed to hurray_bridge.sparse / hurray_bridge.quant.
# Recognised by type name and module only, so nothing is imported to recognise them.
_SPARSE_MODULES = ("scipy.sparse", "cupyx.scipy.sparse", "jax.experimental.sparse")
_ARROW_SPARSE = frozenset(
    {"SparseCOOTensor", "SparseCSRMatrix", "SparseCSCMatrix", "SparseCSFTensor"}
)


@lru_cache(maxsize=256)
def _route_for_type(tp: type) -> tuple[bool, str] | None:
    """``(True, module)`` for a sparse/quantized type, ``(False, adapter)`` for a dense one."""
    for base in tp.__mro__:
        mod = base.__module__
        if mod.startswith(_SPARSE_MODULES) or (
            mod == "pyarrow.lib" and base.__name__ in _ARROW_SPARSE
        ):
            return True, "hurray_bridge.sparse"
        if mod == "hurray_bridge.quant" and base.__name__ == "QuantizedArray":
            return True, "hurray_bridge.quant"
    name = _adapter_name_for_type(tp)
    return None if name is None else (False, name)


def _special_torch(obj: Any) -> ModuleType | None:
    """The module for a sparse or quantized torch tensor (which the torch adapter refuses)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    if obj.layout is not torch.strided:
        return importlib.import_module("hurray_bridge.sparse")
    if obj.is_quantized:
        return importlib.import_module("hurray_bridge.quant")
    return None


def _special_for_tensor(t: Tensor) -> ModuleType:
    """The module that converts a non-dense hb.Tensor (sparse or quantized)."""
    if t.descriptor.layout.is_sparse:
        return importlib.import_module("hurray_bridge.sparse")
    return importlib.import_module("hurray_bridge.quant")


def adapter_for(obj: Any) -> ModuleType | None:
    """The adapter for a native object, or ``None`` if no adapter claims it."""
    name = _adapter_name_for_type(type(obj))  # type: ignore[arg-type]  # types are hashable
    # An object of a framework's type means the framework is loaded already:
    # getting its adapter imports nothing new.
    return None if name is None else get_adapter(name)


def asarray(obj: Any, copy: bool | None = None) -> Tensor:
    """Any supported native object (or DLPack producer) as an :class:`hb.Tensor`.

    ``copy=None`` shares memory when it can and copies (setting ``t.copied``)
    when it cannot; ``copy=False`` raises :class:`CopyRequiredError` instead
    of copying; ``copy=True`` always copies.
    """
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if isinstance(obj, Tensor):
        return obj.copy() if copy else obj
    route = _route_for_type(type(obj))  # type: ignore[arg-type]
    if route is not None:
        special, name = route
        if special:
            t: Tensor = importlib.import_module(name).to_hurray(obj, copy=copy)
            return t
        adapter = get_adapter(name)
        try:
            t = adapter.to_hurray(obj, copy=copy)
        except UnsupportedError:
            # Sparse and quantized torch tensors are told apart only here, after the
            # adapter refused them, so dense tensors pay nothing for the check.
            mod = _special_torch(obj) if name == "torch" else None
            if mod is None:
                raise
            t = mod.to_hurray(obj, copy=copy)
        return t
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, copy=copy)
    raise UnsupportedError(
        f"cannot convert {type(obj).__module__}.{type(obj).__qualname__} to hb.Tensor: "
        f"it is not an array of {', '.join(ADAPTERS)} and has no __dlpack__"
    )


def convert(
    obj: Any, to: str, device: Any = None, copy: bool | None = None, *, densify: bool = False
) -> Any:
    """Hand ``obj`` (native or hb.Tensor) to framework ``to``, zero-copy when possible.

    ``to`` is one of ``"numpy"``, ``"torch"``, ``"jax"``, ``"cupy"``, ``"arrow"``.

    Sparse tensors become the target's sparse object (for ``"numpy"``: a
    ``scipy.sparse`` array); quantized ones a torch quantized tensor where torch
    has the scheme, else an ``hb.quant.QuantizedArray`` of the target's arrays
    (storage, scales, zero points). ``densify=True`` asks for a dense array
    instead (a sparse tensor densified, a quantized one dequantized to float32):
    never done without it. It has no effect on a dense tensor.
    """
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    target = get_adapter(to)
    t = asarray(obj, copy=False if copy is False else None)
    if not t.is_dense:
        return _special_for_tensor(t).from_hurray(t, to, device=device, copy=copy, densify=densify)
    if copy is None and t._copied and not isinstance(obj, Tensor):
        # The source side copied (non-native byte order, strides that are not whole
        # elements, a torch conj/neg view, Arrow chunks or bits to gather): a framework
        # result has no ``copied`` flag to say so, so the warning does.
        warn_copy(_ALIASES.get(to, to),
                  f"the {type(obj).__module__.partition('.')[0]} source could not be read "
                  f"in place (hb.asarray(x).copied is True; hb.asarray(x, copy=False) says why)")
    out = target.from_hurray(t, device=device, copy=copy)
    if device is None and (copy is None or copy is False):
        tp = type(obj)
        known = _shortcuts.TABLE.get(tp)
        if known is None or to not in known:
            _shortcuts.learn(tp, to, _adapter_name_for_type(tp),  # type: ignore[arg-type]
                             _ALIASES.get(to, to))
    return out


# The plain two-argument call first tries a learned shortcut (see _shortcuts).
convert = _shortcuts.front(convert)


def check_copy(copy: Any) -> None:
    """Refuse a ``copy`` that is not True, False or None (``copy="no"`` would mean True)."""
    if copy is not None and copy is not True and copy is not False and copy not in (0, 1):
        raise UnsupportedError(f"copy must be True, False or None, got {copy!r}")


def not_a_tensor(t: Any, target: str) -> UnsupportedError:
    """The error every adapter's ``from_hurray`` raises for an argument that is no hb.Tensor."""
    return UnsupportedError(f"from_hurray() takes an hb.Tensor, got {type(t).__name__} "
                            f"{t!r:.60}; hb.convert(x, {target!r}) takes native objects")


@cache
def _own_dirs() -> tuple[str, ...]:
    """Source folders whose frames a warning skips: the package and its adapters, wherever
    the install put them, so a warning names the user's line however deep it was raised
    (through hb.convert, a shortcut, or an adapter called directly). Found on the first
    warning, not at import."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    spec = importlib.util.find_spec("hurray_bridge.adapters")
    origin = spec.origin if spec is not None else None
    return (here,) if origin is None else (here, os.path.dirname(os.path.abspath(origin)) + os.sep)


def user_stacklevel() -> int:
    """The ``stacklevel`` for ``warnings.warn`` called here that names the first frame
    outside hurray_bridge (warnings count its caller as 1)."""
    own = _own_dirs()
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def warn_copy(target: str, reason: str) -> None:
    """Report a copy made under ``copy=None``, at the caller's line."""
    warnings.warn(f"copied for {target}: {reason}", CopyWarning, stacklevel=user_stacklevel())
