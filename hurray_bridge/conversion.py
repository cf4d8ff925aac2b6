"""``hb.asarray`` and ``hb.convert``: any supported object to an hb.Tensor, and on to a framework.

``asarray`` finds the converter through ``_registry`` (dense adapters, and the sparse and
quantized modules); ``convert`` is ``asarray`` followed by the target adapter's
``from_hurray``, with the copy policy of ``_copy_policy`` and the learned shortcuts of
``_shortcuts`` in front.
"""

from __future__ import annotations

import importlib
import sys
from functools import lru_cache
from types import ModuleType
from typing import Any

from . import _shortcuts
from ._copy_policy import check_copy, warn_copy
from ._registry import _ALIASES, adapter_name_for_type, get_adapter, get_adapter_module
from .errors import UnsupportedError
from .tensor import Tensor, from_producer

__all__ = ["asarray", "convert", "convert_full"]


# Sparse and quantized natives: routed to hurray_bridge.sparse / hurray_bridge.quant.
# Recognised by type name and module only, so nothing is imported to recognise them.
_SPARSE_MODULES = ("scipy.sparse", "cupyx.scipy.sparse", "jax.experimental.sparse")
_ARROW_SPARSE = frozenset(
    {"SparseCOOTensor", "SparseCSRMatrix", "SparseCSCMatrix", "SparseCSFTensor"}
)


@lru_cache(maxsize=256)
def route_for_type(tp: type) -> tuple[bool, str] | None:
    """``(True, module)`` for a sparse/quantized type, ``(False, adapter)`` for a dense one."""
    for base in tp.__mro__:
        mod = base.__module__
        if mod.startswith(_SPARSE_MODULES) or (
            mod == "pyarrow.lib" and base.__name__ in _ARROW_SPARSE
        ):
            return True, "hurray_bridge.sparse"
        if mod == "hurray_bridge.quant" and base.__name__ == "QuantizedArray":
            return True, "hurray_bridge.quant"
    name = adapter_name_for_type(tp)
    return None if name is None else (False, name)


def special_torch(obj: Any) -> ModuleType | None:
    """The module for a sparse, quantized or distributed (DTensor) torch tensor, all of which
    the torch adapter refuses."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    dt = sys.modules.get("torch.distributed.tensor")
    if dt is not None and isinstance(obj, dt.DTensor):  # its part: a partial ShardedTensor
        return get_adapter_module("torch", "shards")
    if obj.layout is not torch.strided:
        return importlib.import_module("hurray_bridge.sparse")
    if obj.is_quantized:
        return importlib.import_module("hurray_bridge.quant")
    return None


def special_for_tensor(t: Tensor) -> ModuleType:
    """The module that converts a non-dense hb.Tensor (sparse or quantized)."""
    if t.descriptor.layout.is_sparse:
        return importlib.import_module("hurray_bridge.sparse")
    return importlib.import_module("hurray_bridge.quant")


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
    route = route_for_type(type(obj))  # type: ignore[arg-type]
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
            mod = special_torch(obj) if name == "torch" else None
            if mod is None:
                raise
            t = mod.to_hurray(obj, copy=copy)
        return t
    return from_producer(obj, copy)


def convert_full(
    obj: Any, to: str, device: Any = None, copy: bool | None = None, *, densify: bool = False
) -> Any:
    """Hand ``obj`` (native or hb.Tensor) to framework ``to``, zero-copy when possible.

    (``hb.convert`` is this function behind the shortcut front at the end of this module.)

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
        return special_for_tensor(t).from_hurray(t, to, device=device, copy=copy, densify=densify)
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
            _shortcuts.learn(tp, to, adapter_name_for_type(tp),  # type: ignore[arg-type]
                             _ALIASES.get(to, to))
    return out


# What ``hb.convert`` is: the plain two-argument call first tries a shortcut learned from
# an earlier call of the same (type, target) pair - in C when _speedups was built, else in
# Python, same steps - and every other call, or a shortcut that declines, runs
# ``convert_full`` above (see _shortcuts.py for the rules a shortcut must keep).
convert = _shortcuts.front(convert_full, name="convert")
