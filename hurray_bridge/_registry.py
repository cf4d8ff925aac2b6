"""Finding the adapter for an object or a target name, without importing frameworks.

The conversions themselves (``hb.asarray``, ``hb.convert``) are in ``conversion.py``.

An object's adapter is found from its type's module name (``torch``,
``jaxlib``, ``pyarrow`` ...), and only when that framework is already in
``sys.modules`` — an object of a framework that was never imported cannot
exist. Explicit targets (``hb.convert(x, "jax")``) import the adapter, and so
the framework, on demand.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from functools import lru_cache
from types import ModuleType
from typing import Any, NamedTuple

from .errors import BackendNotAvailableError, UnsupportedError

__all__ = ["ADAPTERS", "adapter_for", "adapter_name_for_type", "apart", "conflicts",
           "deferred_save", "get_adapter", "get_adapter_module", "holds", "host_memory_hold",
           "kept_apart", "legacy_exports_mutable", "sparse_adapter_name_for_type",
           "special_kind"]


class AdapterSpec(NamedTuple):
    name: str  # target name users pass to hb.convert
    framework: str  # top-level import name
    extra: str  # pip extra that installs it
    note: str = ""  # added to the not-installed message
    # Why `hurray matrix` leaves it out ("" when it is in): the report hands one array's
    # memory to another framework and compares addresses, which a lazy collection has not.
    not_in_matrix: str = ""
    # Why a plain `hurray matrix` leaves it out of its default set, which is the installed
    # frameworks whose arrays live in host memory ("" when in; --frameworks still names it).
    device_only: str = ""
    # Adapters whose frameworks cannot be imported into one process with this one, each
    # with why (measured): ((other adapter, why), ...). Read both ways (``conflicts``), so
    # either line of a pair may carry it.
    not_with: tuple[tuple[str, str], ...] = ()


ADAPTERS: dict[str, AdapterSpec] = {
    "numpy": AdapterSpec("numpy", "numpy", "numpy"),
    "torch": AdapterSpec("torch", "torch", "torch"),
    "jax": AdapterSpec("jax", "jax", "jax"),
    "arrow": AdapterSpec("arrow", "pyarrow", "arrow"),
    "cupy": AdapterSpec("cupy", "cupy", "cupy", "that extra installs cupy-cuda12x (CUDA 12); "
                        "for CUDA 13 use 'hurray-bridge[cupy-cuda13]'",
                        device_only="CuPy arrays live in GPU memory"),
    "dask": AdapterSpec("dask", "dask", "dask", not_in_matrix=(
        "a Dask array is a lazy collection of NumPy chunks, not one block of memory to hand "
        "off: its chunks are NumPy views (tests/adapters/dask proves it), and the NumPy "
        "column of the report stands for them")),
    "tensorflow": AdapterSpec("tensorflow", "tensorflow", "tensorflow", "install tensorflow-cpu "
                              "for the CPU-only build (the adapter needs 'import tensorflow')"),
    "mlx": AdapterSpec("mlx", "mlx", "mlx"),
    "paddle": AdapterSpec("paddle", "paddle", "paddle", not_with=(
        ("tensorflow", "PaddlePaddle 3.3.1 and TensorFlow 2.21 crash when one process "
                       "imports both: importing paddle after tensorflow is a segmentation "
                       "fault (measured)"),)),
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
    "dask": "dask",
    "tensorflow": "tensorflow",
    "mlx": "mlx",
    "paddle": "paddle",
}
_ALIASES = {"np": "numpy", "pyarrow": "arrow", "pa": "arrow", "pytorch": "torch"}
# Sparse types that are not their framework's dense type: module prefix (and, where the
# module holds dense types too, class names) -> adapter whose ``sparse`` module takes them.
_SPARSE_MODULES = (("scipy.sparse", "numpy", None), ("cupyx.scipy.sparse", "cupy", None),
                   ("jax.experimental.sparse", "jax", None),
                   ("pyarrow.lib", "arrow", frozenset({"SparseCOOTensor", "SparseCSRMatrix",
                                                      "SparseCSCMatrix", "SparseCSFTensor"})))


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
    apart_why = kept_apart(spec.name)
    if apart_why is not None:
        if importlib.util.find_spec(spec.framework) is None:  # not installed says more
            raise BackendNotAvailableError(spec.framework, spec.extra, spec.note)
        raise UnsupportedError(apart_why)
    try:
        # Not sys.modules directly: while another thread imports the adapter, its module
        # is there half made; import_module waits for that import to finish.
        mod = importlib.import_module(modname)
    except ImportError as exc:
        if isinstance(exc, BackendNotAvailableError):
            raise
        missing = getattr(exc, "name", None) or spec.framework
        detail = f"{missing} could not be imported" + (f" ({spec.note})" if spec.note else "")
        raise BackendNotAvailableError(spec.framework, spec.extra, detail) from exc
    _LOADED[name] = (modname, mod)
    return mod


def _framework(name: str) -> str:
    """The top-level module of adapter ``name`` (its own name for one not registered here)."""
    spec = ADAPTERS.get(name)
    return name if spec is None else spec.framework


def conflicts(name: str) -> dict[str, str]:
    """The adapters whose frameworks cannot share a process with adapter ``name``'s, each
    with why; read from both lines of a pair (``AdapterSpec.not_with``)."""
    out: dict[str, str] = {}
    spec = ADAPTERS.get(name)
    for other, why in spec.not_with if spec is not None else ():
        out[other] = why
    for other, other_spec in ADAPTERS.items():
        for who, why in other_spec.not_with:
            if who == name:
                out.setdefault(other, why)
    return out


def kept_apart(name: str) -> str | None:
    """Why adapter ``name``'s framework must not be imported into this process, or None.

    It must not when a framework it cannot share a process with (:func:`conflicts`) is
    imported already; once its own framework is imported, nothing is left to prevent.
    """
    if _framework(name) in sys.modules:
        return None
    for other, why in conflicts(name).items():
        if _framework(other) in sys.modules:
            return (f"{name} cannot be used in this process: {other} is imported already, "
                    f"and {why}. Use {name} and {other} in separate processes (a subprocess, "
                    "or two runs)")
    return None


def apart(names: list[str]) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """``names`` split into those that can share this process and those kept out of it:
    ``(kept, {left_out: (the adapter it conflicts with, why)})``. Of a conflicting pair,
    a framework imported already is kept; else the one named first."""
    ranked = sorted(names, key=lambda n: _framework(n) not in sys.modules)  # stable
    kept: list[str] = []
    left: dict[str, tuple[str, str]] = {}
    for name in ranked:
        clash = next(((k, why) for k, why in conflicts(name).items() if k in kept), None)
        if clash is None and _framework(name) not in sys.modules:
            clash = next(((k, why) for k, why in conflicts(name).items()
                          if _framework(k) in sys.modules), None)
        if clash is None:
            kept.append(name)
        else:
            left[name] = clash
    return [n for n in names if n in kept], left


def get_adapter_module(name: str, topic: str) -> ModuleType:
    """An adapter's module for one topic (``"sparse"``, ``"quant"``, ``"shards"``,
    ``"shortcuts"``): ``hurray_bridge.adapters.<framework>.<topic>``; imports the
    framework if needed, with get_adapter's error when it is not installed."""
    get_adapter(name)  # the same refusal for an unknown or missing framework
    spec = ADAPTERS[_ALIASES.get(name, name)]
    return importlib.import_module(f"hurray_bridge.adapters.{spec.name}.{topic}")


@lru_cache(maxsize=256)
def adapter_name_for_type(tp: type) -> str | None:
    top = tp.__module__.partition(".")[0]
    name = _MODULE_TO_ADAPTER.get(top)
    if name is None:
        # Subclasses defined elsewhere (a torch.Tensor subclass in user code).
        for base in tp.__mro__[1:]:
            top = base.__module__.partition(".")[0]
            if top in _MODULE_TO_ADAPTER:
                return _MODULE_TO_ADAPTER[top]
    return name


@lru_cache(maxsize=256)
def sparse_adapter_name_for_type(tp: type) -> str | None:
    """The adapter whose ``sparse`` module takes objects of type ``tp``, told by the type's
    module and name alone (imports nothing), or None: a type of its own, not one a
    framework shares with its dense objects (torch's adapter tells those, ``special_kind``)."""
    for base in tp.__mro__:
        mod = base.__module__
        for prefix, name, classes in _SPARSE_MODULES:
            if (mod == prefix or mod.startswith(prefix + ".")) and (
                    classes is None or base.__name__ in classes):
                return name
    return None


def adapter_for(obj: Any) -> ModuleType | None:
    """The adapter for a native object, or ``None`` if no adapter claims it."""
    name = adapter_name_for_type(type(obj))  # type: ignore[arg-type]  # types are hashable
    # An object of a framework's type means the framework is loaded already:
    # getting its adapter imports nothing new.
    return None if name is None else get_adapter(name)


def holds(name: str, kind: str) -> bool:
    """Whether adapter ``name`` declares ``kind`` (``"sparse"``, ``"quantized"``,
    ``"sharded"``) in its ``HOLDS``; an adapter that declares nothing holds dense objects
    only."""
    return kind in getattr(get_adapter(name), "HOLDS", ("dense",))


def special_kind(name: str, obj: Any) -> str | None:
    """The kind adapter ``name`` tells ``obj`` is, which its ``to_hurray`` refused
    (its ``special_kind``); None where it tells none, or has no way to tell."""
    tell = getattr(get_adapter(name), "special_kind", None)
    kind: str | None = None if tell is None else tell(obj)
    return kind


def legacy_exports_mutable(tp: type) -> bool:
    """Whether a legacy DLPack capsule of a ``tp`` object hands out memory that may be written.

    A legacy capsule has no READ_ONLY flag, so only the producer's framework can say:
    each adapter declares it (``LEGACY_EXPORTS_MUTABLE``). A type no adapter claims, or
    an adapter that cannot be loaded or says nothing, gives False: read-only, as NumPy
    reads every legacy capsule. (An object of the type exists, so its framework is
    loaded: getting the adapter imports no framework.)
    """
    return _declared(tp, "LEGACY_EXPORTS_MUTABLE", False) is True


def host_memory_hold(tp: type) -> Any:
    """The function that keeps host memory a ``tp`` object exports valid while it is shared
    (``HOLD_HOST_MEMORY`` of its adapter), or ``None``.

    Some frameworks can free an exported buffer under its consumers (torch's ``resize_``
    reallocates a storage): their adapter names a function, called with the producer
    before its host memory is shared, that stops it. ``hb.from_dlpack`` calls it, as the
    adapters' own exports do. A type no adapter claims, or an adapter that cannot be
    loaded, gives ``None``.
    """
    return _declared(tp, "HOLD_HOST_MEMORY", None)


def deferred_save(tp: type) -> Any:
    """How ``tp`` values are written into a file by the processes that hold their parts
    (``DEFERRED_SAVE`` of its adapter, a ``_deferred.DeferredSave``), or ``None`` for
    values the saving process writes itself."""
    return _declared(tp, "DEFERRED_SAVE", None)


def _declared(tp: type, declaration: str, default: Any) -> Any:
    """What the adapter of ``tp`` objects declares as ``declaration``; ``default`` for a
    type no adapter claims, an adapter that cannot be loaded, or one that says nothing."""
    name = adapter_name_for_type(tp)
    if name is None:
        return default
    try:
        adapter = get_adapter(name)
    except ImportError:
        return default
    return getattr(adapter, declaration, default)
