"""``hb.asarray`` and ``hb.convert``: any supported object to an hb.Tensor, and on to a framework.

``asarray`` finds the converter through ``_registry`` (dense adapters, and the sparse and
quantized modules); ``convert`` is ``asarray`` followed by the target adapter's
``from_hurray``, with the copy policy of ``_copy_policy`` and the learned shortcuts of
``_shortcuts`` in front.

An array sharded over several devices (a multi-device ``jax.Array``) becomes an
:class:`hb.ShardedTensor` of zero-copy shard views, through its adapter's ``shards``
module (``to_hurray``); ``convert`` hands a sharded tensor to the target's ``shards``
module (``from_hurray``: JAX rebuilds the sharding) or assembles it, a copy under the
copy policy, for a target whose arrays live on one device.
"""

from __future__ import annotations

import importlib
import inspect
from functools import cache, lru_cache
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

from . import _shortcuts, sparse
from ._copy_policy import check_copy, require_copy, warn_copy
from ._registry import (
    _ALIASES,
    adapter_name_for_type,
    get_adapter,
    get_adapter_module,
    special_kind,
)
from .errors import CopyRequiredError, UnsupportedError
from .shards import ShardedTensor, assemble, copy_shards, describe
from .tensor import Tensor, from_producer

__all__ = ["asarray", "asarray_one", "convert", "convert_full", "convert_sharded"]


@lru_cache(maxsize=256)
def route_for_type(tp: type) -> tuple[bool, str] | None:
    """``(True, module)`` for a sparse/quantized type, ``(False, adapter)`` for a dense one."""
    if sparse.native_type_adapter(tp) is not None:
        return True, "hurray_bridge.sparse"
    for base in tp.__mro__:
        if base.__module__ == "hurray_bridge.quant" and base.__name__ == "QuantizedArray":
            return True, "hurray_bridge.quant"
    name = adapter_name_for_type(tp)
    return None if name is None else (False, name)


_KIND_MODULES = {"sparse": "hurray_bridge.sparse", "quantized": "hurray_bridge.quant"}


def special_module(name: str, obj: Any) -> ModuleType | None:
    """The module that converts an object adapter ``name`` refused as dense: the kind the
    adapter tells (``special_kind``) - the core's sparse or quantization module, or the
    adapter's own ``shards`` module for a part of a sharded whole - or None."""
    kind = special_kind(name, obj)
    if kind is None:
        return None
    if kind == "sharded":  # its part: a partial ShardedTensor
        return get_adapter_module(name, "shards")
    return importlib.import_module(_KIND_MODULES[kind])


def special_for_tensor(t: Tensor) -> ModuleType:
    """The module that converts a non-dense hb.Tensor (sparse or quantized)."""
    if t.descriptor.layout.is_sparse:
        return importlib.import_module("hurray_bridge.sparse")
    return importlib.import_module("hurray_bridge.quant")


@cache
def sharded_module(name: str) -> ModuleType | None:
    """Adapter ``name``'s ``shards`` module, or None when it has none.

    Such a module exports what every adapter's ``shards`` module does: ``to_hurray(obj,
    copy=...)`` (a native sharded array as an hb.ShardedTensor; the core calls it for
    an object the adapter's ``special_kind`` names ``"sharded"``) and ``from_hurray(st,
    device=..., copy=...)`` (an hb.ShardedTensor as the framework's sharded array, or
    NotImplemented to have it assembled into one array).
    """
    try:
        return get_adapter_module(name, "shards")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("hurray_bridge.adapters."):
            raise  # the module exists but a dependency of it is missing
        return None


def asarray(obj: Any, copy: bool | None = None) -> Tensor | ShardedTensor:
    """Any supported native object (or DLPack producer) as an :class:`hb.Tensor`.

    ``copy=None`` shares memory when it can and copies (setting ``t.copied``)
    when it cannot; ``copy=False`` raises :class:`CopyRequiredError` instead
    of copying; ``copy=True`` always copies.

    An array sharded over several devices (a ``jax.Array`` with a multi-device
    sharding) gives an :class:`hb.ShardedTensor` instead: one shard per device
    buffer, each a zero-copy view of it (``copy=True`` copies every shard). An
    hb.ShardedTensor is returned as it is (copied with ``copy=True``).
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
            # Kinds that share a dense type (torch's sparse and quantized tensors, arrays
            # on several devices) are told apart only here, after the adapter refused
            # them, so dense objects pay nothing for the check.
            mod = special_module(name, obj)
            if mod is None:
                raise
            out: Tensor | ShardedTensor = mod.to_hurray(obj, copy=copy)
            return out
        return t
    if isinstance(obj, ShardedTensor):
        return copy_shards(obj) if copy else obj
    return from_producer(obj, copy)


def asarray_one(obj: Any, copy: bool | None = None, *, what: str) -> Tensor:
    """:func:`asarray` for code that takes one tensor (``what`` names it in the refusal
    of a sharded one)."""
    t = asarray(obj, copy)
    if isinstance(t, ShardedTensor):
        raise UnsupportedError(
            f"{what} holds one tensor, and this is a sharded tensor ({describe(t)}): assemble "
            "it first (hb.convert(x, 'numpy'), or hb.shards.assemble(hb.asarray(x))), or pass "
            "its shards one by one"
        )
    return t


def convert_full(
    obj: Any, to: str, device: Any = None, copy: bool | None = None, *, densify: bool = False,
    **options: Any,
) -> Any:
    """Hand ``obj`` (native or hb.Tensor) to framework ``to``, zero-copy when possible.

    (``hb.convert`` is this function behind the shortcut front at the end of this module.)

    ``to`` is one of ``"numpy"``, ``"torch"``, ``"jax"``, ``"cupy"``, ``"arrow"``, or
    another installed adapter's name (``"dask"``, ``"tensorflow"``, ...).

    ``options`` are the target adapter's own keywords, passed to its ``from_hurray`` for
    a dense tensor: Arrow's ``kind=``, Dask's ``chunks=``
    (``hb.convert(x, "dask", chunks=(1024, -1))``). A keyword the target does not take,
    or any for a sparse, quantized or sharded tensor, raises
    :class:`~hurray_bridge.UnsupportedError` naming it.

    Sparse tensors become the target's sparse object (for ``"numpy"``: a
    ``scipy.sparse`` array); quantized ones a torch quantized tensor where torch
    has the scheme, else an ``hb.quant.QuantizedArray`` of the target's arrays
    (storage, scales, zero points). ``densify=True`` asks for a dense array
    instead (a sparse tensor densified, a quantized one dequantized to float32):
    never done without it. It has no effect on a dense tensor.

    A sharded tensor (an hb.ShardedTensor, or a native array on several devices):
    see :func:`convert_sharded`.
    """
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    target = get_adapter(to)
    if options:
        _check_options(target, to, options)
    t = asarray(obj, copy=False if copy is False else None)
    if options and (isinstance(t, ShardedTensor) or not t.is_dense):
        raise UnsupportedError(_options_refused(t, target.NAME, options, densify))
    if isinstance(t, ShardedTensor):
        return convert_sharded(t, to, device=device, copy=copy)
    if not t.is_dense:
        return special_for_tensor(t).from_hurray(t, to, device=device, copy=copy, densify=densify)
    if copy is None and t._copied and not isinstance(obj, Tensor):
        # The source side copied (non-native byte order, strides that are not whole
        # elements, a torch conj/neg view, Arrow chunks or bits to gather): a framework
        # result has no ``copied`` flag to say so, so the warning does.
        warn_copy(_ALIASES.get(to, to),
                  f"the {type(obj).__module__.partition('.')[0]} source could not be read "
                  f"in place (hb.asarray(x).copied is True; hb.asarray(x, copy=False) says why)")
    out = target.from_hurray(t, device=device, copy=copy, **options)
    if device is None and not options and (copy is None or copy is False):
        tp = type(obj)
        known = _shortcuts.TABLE.get(tp)
        if known is None or to not in known:
            _shortcuts.learn(tp, to, adapter_name_for_type(tp),  # type: ignore[arg-type]
                             _ALIASES.get(to, to))
    return out


@cache
def _own_keywords(from_hurray: Any) -> tuple[str, ...]:
    """The keywords an adapter's ``from_hurray`` takes besides ``device`` and ``copy``."""
    params = inspect.signature(from_hurray).parameters.values()
    return tuple(p.name for p in params
                 if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("device", "copy"))


def _named(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r:.40}" for k, v in options.items())


def _check_options(target: ModuleType, to: str, options: dict[str, Any]) -> None:
    takes = _own_keywords(target.from_hurray)
    unknown = [k for k in options if k not in takes]
    if unknown:
        name = target.NAME
        raise UnsupportedError(
            f"hb.convert(x, {to!r}) takes no {', '.join(k + '=' for k in unknown)}: "
            + (f"{name}'s from_hurray takes {', '.join(k + '=' for k in takes)} besides "
               "device= and copy=" if takes else
               f"{name}'s from_hurray takes only device= and copy=")
            + " (the keywords of hb.convert itself are device=, copy= and densify=)")


def _options_refused(t: Tensor | ShardedTensor, name: str, options: dict[str, Any],
                     densify: bool) -> str:
    """Why target keywords are refused for a tensor that is not one dense block."""
    if isinstance(t, ShardedTensor):
        kind = "sharded"
    elif t.descriptor.sparse is not None:
        kind = "sparse"
    elif t.descriptor.quantization is not None:
        kind = "quantized"
    else:
        kind = f"{t.descriptor.layout.name.lower()} (not one dense block)"
    them = "it" if len(options) == 1 else "them"
    steps = (f"densify it first (hb.convert(x, 'numpy', densify=True)), then pass {them} "
             "converting that" if densify and kind in ("sparse", "quantized") else
             f"convert it without {them}, then use {name}'s own functions on the result"
             + (" (x.rechunk(...))" if name == "dask" else ""))
    return (f"{_named(options)} applies to a dense tensor, and this one is {kind}: {steps}"
            + ("; densify=True does not carry target keywords" if densify else ""))


def convert_sharded(
    st: ShardedTensor, to: str, device: Any = None, copy: bool | None = None
) -> Any:
    """A sharded tensor for framework ``to``.

    A framework with sharded arrays (JAX) gets one, over the same shard memory
    wherever it can take it (see ``hurray_bridge.adapters.jax.shards.from_hurray``).
    Every other target holds an array on one device, so the shards are assembled
    into one fresh host array (each distinct box read once, from its lowest
    replica): a copy, reported with :class:`hb.CopyWarning` under ``copy=None``,
    refused with :class:`hb.CopyRequiredError` under ``copy=False``.
    """
    name = _ALIASES.get(to, to)
    from_sharded = getattr(sharded_module(name), "from_hurray", None)
    if from_sharded is not None:
        out = from_sharded(st, device=device, copy=copy)
        if out is not NotImplemented:
            return out
    where = describe(st)
    for t in st.primary_shards():
        if not t.device.is_host_accessible:
            raise UnsupportedError(
                f"cannot assemble a sharded tensor ({where}) into one {name} array: a shard is "
                f"on {t.device} and the bridge assembles host memory only; gather it with its "
                "framework first (for a jax.Array: jax.device_get(x), or jax.device_put(x, "
                "device) onto one device)"
            )
    why = (f"a sharded tensor ({where}) is assembled into one array, as {name} holds an array "
           "on one device")
    require_copy(copy, name, why, refusal=(
        f"{why}: that is a copy, but copy=False; pass copy=None or copy=True to assemble it, "
        "or keep the shards (hb.asarray(x) views them without a copy)"))
    whole = assemble(st, to="hurray")
    target = get_adapter(name)
    try:
        return target.from_hurray(whole, device=device, copy=False)
    except CopyRequiredError:
        # The target copies once more (another device, a form it stores differently):
        # under its own policy message.
        return target.from_hurray(whole, device=device, copy=copy)


if TYPE_CHECKING:
    # What type checkers see: the target name picks the result's type, that of its adapter's
    # from_hurray for a dense tensor (docs/typing.md says what else a target may give).
    # Never run, so nothing is imported. CuPy and pyarrow ship no type information: their
    # arrays would be Unknown to pyright, and a partly Unknown overload makes every
    # hb.convert call an error under its strict mode, so those targets give Any.
    import jax
    import numpy.typing as npt
    import torch

    @overload
    def convert(obj: Any, to: Literal["torch", "pytorch"], device: Any = None,
                copy: bool | None = None, *, densify: bool = False,
                **options: Any) -> torch.Tensor: ...
    @overload
    def convert(obj: Any, to: Literal["jax"], device: Any = None,
                copy: bool | None = None, *, densify: bool = False,
                **options: Any) -> jax.Array: ...
    @overload
    def convert(obj: Any, to: Literal["numpy", "np"], device: Any = None,
                copy: bool | None = None, *, densify: bool = False,
                **options: Any) -> npt.NDArray[Any]: ...
    @overload
    def convert(obj: Any, to: str, device: Any = None,
                copy: bool | None = None, *, densify: bool = False,
                **options: Any) -> Any: ...
    def convert(obj: Any, to: str, device: Any = None,
                copy: bool | None = None, *, densify: bool = False,
                **options: Any) -> Any: ...
else:
    # What ``hb.convert`` is: the plain two-argument call first tries a shortcut learned
    # from an earlier call of the same (type, target) pair - in C when _speedups was built,
    # else in Python, same steps - and every other call, or a shortcut that declines, runs
    # ``convert_full`` above (see _shortcuts.py for the rules a shortcut must keep).
    convert = _shortcuts.front(convert_full, name="convert")
