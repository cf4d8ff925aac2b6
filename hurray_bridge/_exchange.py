"""The DLPack C exchange API (DLPack 1.3), through the optional compiled module.

A producer type may publish ``type(x).__dlpack_c_exchange_api__``, a capsule holding a
static table of C functions that export and import tensors without ``__dlpack__``'s
Python call, keywords and capsule (docs/impl/c-ffi.md §8). With
``hurray_bridge._speedups`` built:

* :func:`install` gives hb.Tensor the compiled ``__dlpack__`` and
  ``__dlpack_device__`` (plain exports in C, every other call by the Python methods,
  which keep every rule) and publishes hb.Tensor's own table;
* :func:`register` lets an adapter describe its framework's tensor type (which
  attributes send a tensor to the Python path, how dtypes and devices map); a
  :func:`front` (``hb.asarray``, the adapter's ``to_hurray``) then imports such a
  tensor in C, and declines to its Python function for everything else;
* :func:`import_exchange` imports an object that no adapter claims through its
  type's table (``hb.from_dlpack``), or answers ``None``;
* :func:`numpy_entry` makes a registered type's tensors NumPy arrays in C (the
  torch -> numpy shortcut of ``hb.convert``).

Without the compiled module every function here says so (``None``, ``False``, the
Python function itself), and the callers take the Python path: the same answers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["compiled", "front", "import_exchange", "install", "live_exports", "numpy_entry",
           "register"]

_c: Any
try:
    from . import _speedups as _c
except ImportError:  # not compiled (no C compiler at install time)
    _c = None
if _c is not None and not hasattr(_c, "exchange_setup"):
    _c = None  # a build from before the exchange API: its other parts still serve

compiled = _c is not None

F = TypeVar("F", bound=Callable[..., Any])

# hb.Tensor's slots in the order of the HB_S_* constants of _speedups_c/speedups.h.
SLOTS = ("_base0", "_buffers", "_copied", "_data", "_desc", "_device", "_dtype", "_nbytes",
         "_owner", "_padded", "_readonly", "_shape", "_source", "_strides", "_dl")

# Tensor.__dlpack__ and __dlpack_device__ as written in Python (None until install()).
python_dlpack: Callable[..., object] | None = None
python_dlpack_device: Callable[..., object] | None = None
installed = False


def _generic_ok(tp: type) -> bool:
    """Whether hb.from_dlpack may import ``tp``'s objects through its exchange table: not
    a type an adapter claims (its adapter's rules decide, not the table: torch's skips
    the refusals of torch's own ``__dlpack__``)."""
    from ._registry import adapter_name_for_type

    return adapter_name_for_type(tp) is None


def install(tensor_type: type, *, device_type: type, cpu: Any, cpu_dl: tuple[Any, int],
            unsupported: type, row_major: Any, strided: Any,
            dtypes: list[tuple[Any, int, int, bool]]) -> bool:
    """Compiled DLPack methods and the exchange table for hb.Tensor (``tensor_type``);
    ``False`` (nothing changed) without the compiled module.

    ``dtypes``: ``(DType, DLPack code, bits, is complex)`` of every DLPack element type.
    """
    global python_dlpack, python_dlpack_device, installed
    if _c is None:
        return False
    attrs = tensor_type.__dict__
    python_dlpack = attrs["__dlpack__"]
    python_dlpack_device = attrs["__dlpack_device__"]
    _c.exchange_setup(tensor_type, tuple(attrs[name] for name in SLOTS), device_type, cpu,
                      cpu_dl, unsupported, row_major, strided, python_dlpack,
                      python_dlpack_device, attrs["_export"], _generic_ok, dtypes)
    dlpack, dlpack_device, table = _c.exchange_methods()
    type.__setattr__(tensor_type, "__dlpack__", dlpack)
    type.__setattr__(tensor_type, "__dlpack_device__", dlpack_device)
    type.__setattr__(tensor_type, "__dlpack_c_exchange_api__", table)
    installed = True
    return True


def front(general: F, *, positional_copy: bool = False, name: str | None = None) -> F:
    """``general(obj, copy=None)`` with the compiled import of registered types in front
    (``general`` itself without the compiled module).

    The front serves ``f(obj)`` and ``f(obj, copy=None / False)`` (``f(obj, None)`` too
    with ``positional_copy``) for an object of a registered type, and calls ``general``
    with the same arguments for everything else and whatever it declines. Type checkers
    see ``general``'s type: the front takes the same arguments and gives the same answers.
    """
    if _c is None:
        return general
    out: Callable[..., Any] = _c.ImportFront(general, positional_copy)
    functools.update_wrapper(out, general)
    if name is not None:
        out.__name__ = out.__qualname__ = name
    return cast(F, out)


def register(tp: type, *, samples: list[tuple[Any, Any, Any]], probe: tuple[Any, tuple[int, ...]],
             decline_attrs: tuple[str, ...] = (), decline_methods: tuple[str, ...] = (),
             complex_methods: tuple[str, ...] = (), pinned_method: str | None = None,
             dtype_attr: str = "dtype", pinned_device: Any = None, gpu_type: int = 0,
             max_rank: int = 64,
             host_hold: tuple[str, str, Callable[[Any, Any], object]] | None = None,
             ) -> str | None:
    """Let the fronts import ``tp``'s objects in C; ``None`` when done, else why not.

    An object is read through ``tp``'s exchange table (its memory, kept alive by the
    object itself) and declined to the Python path when any of ``decline_attrs`` /
    ``decline_methods`` is true, for complex element types also ``complex_methods``.
    ``samples``: ``(native dtype, an object of it or None, hb.DType or None)`` for every
    native dtype, checked against the table; ``probe``: an object and its own strides,
    one of them on a size-1 dimension, which the table must report unchanged. On the
    host, ``pinned_method`` true means ``pinned_device``; device memory of
    ``gpu_type`` keeps the object as the tensor's source. ``host_hold``, ``(storage
    method, check method, fn)``: before host memory is shared, ``fn(obj, storage)`` runs
    when ``obj.<storage method>().<check method>()`` is true (torch: a storage that
    ``resize_`` could free is made non-resizable); a failure declines to Python.
    """
    if _c is None:
        return "hurray_bridge._speedups was not built"
    why: str | None = _c.register_import(
        tp, tuple(decline_attrs), tuple(decline_methods), tuple(complex_methods),
        pinned_method, dtype_attr, list(samples), pinned_device, gpu_type, max_rank, probe,
        host_hold)
    return why


def import_exchange(obj: Any) -> Any:
    """An hb.Tensor over ``obj``'s memory through its type's exchange table, or ``None``
    (no table, a type an adapter claims, or anything the table or the checks of
    ``_capsule.consume_capsule`` refuse). The tensor's source is not set."""
    return None if _c is None else _c.import_exchange(obj)


def numpy_entry(tp: type, array_api: Any, ndarray: type, descrs: dict[Any, Any],
                fallback: Callable[[Any], Any] | None = None) -> Any:
    """A callable making NumPy arrays of a registered type's objects in C (or
    ``NotImplemented`` for one it would not take), or ``None``. For hb.Tensor itself
    (``tp``), the read-only views of ``_host.tensor_view``, and ``fallback(t)`` the
    answer for every tensor it does not take."""
    return None if _c is None else _c.numpy_entry(tp, array_api, ndarray, descrs, fallback)


def live_exports() -> int:
    """Exports made in C (compiled ``__dlpack__``, the exchange table) not yet released."""
    return 0 if _c is None else int(_c.live_exports())
