"""Round trips through frameworks: :func:`assert_round_trip` and the state it compares
after every hop."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, NamedTuple

from .._dlpack import DLPACK_VERSION
from .._registry import _ALIASES, ADAPTERS, adapter_for, apart
from ..conversion import asarray, asarray_one, convert
from ..dtypes import DType
from ..errors import CopyRequiredError, CopyWarning, UnsupportedError
from ..tensor import CPU, Tensor, canonical_bytes, from_dlpack
from ._report import short


def _framework(obj: Any) -> str:
    if isinstance(obj, Tensor):
        return "hb"
    adapter = adapter_for(obj)
    return "hb" if adapter is None else str(adapter.NAME)


class _HostCopy:
    """A device tensor's host copy, asked of its own producer (``dl_device=CPU, copy=True``)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __dlpack_device__(self) -> tuple[int, int]:
        return CPU

    def __dlpack__(self, **kwargs: Any) -> object:
        return self._obj.__dlpack__(max_version=DLPACK_VERSION, dl_device=CPU, copy=True)


class _State(NamedTuple):
    dtype: DType
    shape: tuple[int, ...]
    data: bytes
    ptr: int | None  # None: the object cannot be seen without a copy


def _state(obj: Any) -> _State:
    t = asarray_one(obj, what="round_trip")
    try:
        ptr: int | None = asarray_one(obj, copy=False, what="round_trip").data_ptr
    except CopyRequiredError:
        ptr = None
    if not t.device.is_host_accessible:
        t = from_dlpack(_HostCopy(t))
    return _State(t.dtype, t.shape, canonical_bytes(t), ptr)


def _first_difference(a: bytes, b: bytes, itemsize: int) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            k = i // itemsize
            s = slice(k * itemsize, (k + 1) * itemsize)
            return f"element {k} (flat) is {a[s].hex()} before and {b[s].hex()} after"
    return f"{len(a)} bytes before, {len(b)} after"


def _hop(obj: Any, target: str, copy: bool | None) -> Any:
    if target == "hb":
        return asarray(obj, copy=copy)
    return convert(obj, target, copy=copy)


def _check_targets(via: Any) -> None:
    """A usage error (not a failed hop) for ``via`` that names no framework."""
    if not isinstance(via, (list, tuple)):
        raise UnsupportedError(f"via must be a framework name or a sequence of them, got "
                               f"{type(via).__name__} {via!r:.60}")
    for i, name in enumerate(via):
        if name != "hb" and (not isinstance(name, str) or _ALIASES.get(name, name) not in ADAPTERS):
            raise UnsupportedError(f"via[{i}] = {name!r} is not a framework; choose from "
                                   f"{', '.join(ADAPTERS)} or 'hb'")


def assert_round_trip(
    x: Any, via: Sequence[str] | str | None = None, zero_copy: bool | None = None
) -> Any:
    """Hand ``x`` through the frameworks in ``via`` and back, asserting it survives every hop.

    Hop 1 converts ``x`` to ``via[0]`` with ``hb.convert``, and so on; the last
    hop returns to ``x``'s own framework (an ``hb.Tensor`` for an hb.Tensor or
    any other DLPack producer). ``"hb"`` in ``via`` means ``hb.asarray``;
    ``via=None`` means every installed CPU framework (less any that cannot share this
    process with one imported already: the registry's ``not_with``). After each hop the dtype,
    the shape and the bytes (bit-exact, so NaN payloads count) must equal
    ``x``'s. ``zero_copy=True`` also asserts that every hop keeps the data
    pointer (``hb.asarray(obj).data_ptr``); ``zero_copy=False`` converts with
    ``copy=True`` and asserts that every hop moved to new memory.

    Returns the object that came back. Raises ``AssertionError`` naming the hop
    (``"hop 2: torch -> jax: ..."``); a framework that is not installed raises
    :class:`hb.BackendNotAvailableError` unchanged.
    """
    if via is None:
        from ..matrix import available_frameworks

        # Of frameworks that cannot share a process (the registry's not_with), the ones
        # this process cannot import are left out.
        via = apart([f for f in available_frameworks() if f != _framework(x)])[0]
    elif isinstance(via, str):
        via = (via,)
    _check_targets(via)
    origin = _framework(x)
    chain = [*via, origin]
    copy = True if zero_copy is False else None
    before = _state(x)
    last = before
    names = [origin]
    obj = x
    for i, target in enumerate(chain, 1):
        where = f"hop {i}: {names[-1]} -> {target}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                new = _hop(obj, target, copy)
            except ImportError:
                raise
            except Exception as exc:
                raise AssertionError(f"{where}: conversion failed: {short(exc, 400)}") from exc
        copies = [str(w.message) for w in caught if issubclass(w.category, CopyWarning)]
        for w in caught:
            if not issubclass(w.category, CopyWarning):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        try:
            after = _state(new)
        except Exception as exc:
            raise AssertionError(f"{where}: the result cannot be read back: {short(exc, 400)}"
                                 ) from exc
        if after.dtype != before.dtype:
            raise AssertionError(f"{where}: dtype changed {before.dtype.name} -> "
                                 f"{after.dtype.name}" + (f" ({copies[0]})" if copies else ""))
        if after.shape != before.shape:
            raise AssertionError(f"{where}: shape changed {before.shape} -> {after.shape}")
        if after.data != before.data:
            raise AssertionError(f"{where}: values differ: "
                                 + _first_difference(before.data, after.data,
                                                     max(1, before.dtype.bits // 8)))
        prev = last.ptr
        if zero_copy is True and prev != after.ptr:
            reason = copies[0] if copies else (
                "the target's memory cannot be seen without a copy" if after.ptr is None
                else "no CopyWarning was emitted: a silent copy")
            raise AssertionError(f"{where}: data pointer changed {_hex(prev)} -> "
                                 f"{_hex(after.ptr)} ({reason})")
        if zero_copy is False and before.data and prev is not None and prev == after.ptr:
            raise AssertionError(f"{where}: copy=True kept the data pointer {_hex(prev)}")
        names.append(target)
        obj, last = new, after
    return obj


def _hex(p: int | None) -> str:
    return "unknown" if p is None else f"0x{p:x}"
