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
  never answer differently from the full path; ``tests/test_shortcuts.py`` checks
  that input by input against the full path.

The front that reads the table is compiled when ``hurray_bridge._speedups`` was
built, and this module's Python function otherwise (same steps).

Frameworks are imported here only when an object of theirs is being converted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

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


def _numpy_types() -> dict[str, Callable[[type], Entry | None]]:
    import numpy as np

    def torch(tp: type) -> Entry | None:
        if tp is not np.ndarray:
            return None
        import torch

        from_numpy = torch.from_numpy

        def numpy_to_torch(x: Any) -> Any:
            # torch.from_numpy refuses non-native byte order, negative strides and the
            # types it lacks; read-only arrays it accepts but warns in its own words,
            # where the full path warns in ours.
            return from_numpy(x) if x.flags.writeable else NotImplemented

        return entry(numpy_to_torch)

    def arrow(tp: type) -> Entry | None:
        if tp is not np.ndarray:
            return None
        import pyarrow as pa

        # Rank 1 only (other ranks become Arrow tensors); Array.from_dlpack refuses
        # strided memory, bool (bit-packed in Arrow) and complex.
        return entry(pa.Array.from_dlpack, guard=("ndim", 1))

    return {"torch": torch, "arrow": arrow}


def _torch_types() -> dict[str, Callable[[type], Entry | None]]:
    import torch

    def numpy(tp: type) -> Entry | None:
        if tp is not torch.Tensor:
            return None

        def torch_to_numpy(x: Any) -> Any:
            # Tensor.numpy refuses requires_grad, conj/neg bits, non-CPU devices and
            # the types NumPy lacks; the full path detaches or copies those. Empty
            # tensors it gives zero strides, the full path NumPy's own.
            return x.numpy() if x.numel() else NotImplemented

        return entry(torch_to_numpy)

    def arrow(tp: type) -> Entry | None:
        if tp is not torch.Tensor:
            return None
        import pyarrow as pa

        from_dlpack = pa.Array.from_dlpack

        def torch_to_arrow(x: Any) -> Any:
            # Rank 1 only (other ranks become Arrow tensors); CPU only (the full path
            # copies device memory to the host, and says so). Not a neg-bit view:
            # torch's __dlpack__ exports its memory as it is, without the sign. (A conj
            # bit needs a complex type, which Arrow refuses.)
            if x.ndim == 1 and x.is_cpu and not x.is_neg():
                return from_dlpack(x)
            return NotImplemented

        return entry(torch_to_arrow)

    def jax(tp: type) -> Entry | None:
        if tp is not torch.Tensor:
            return None
        from ._capsule import make_capsule
        from ._registry import get_adapter
        from .tensor import _COMPACT, _compact

        hj = get_adapter("jax")
        ht = get_adapter("torch")
        if hj._RAW_IMPORT is None:
            return None
        # The types the full path hands to the raw import as they are: not the 64-bit
        # ones (x64 decides), not float4 (the x2 container), none JAX lacks; by torch
        # dtype, the DLPack (code, bits) of each.
        jax_types = hj._tables()[0]
        codes = {tdt: d.dlpack for d, tdt in ht._TO_TORCH.items()
                 if d in jax_types and d.bits >= 8 and d.name not in hj._X64}
        importable = hj._strides_importable
        align = hj._cpu_alignment()
        raw_device = hj._raw_device
        can_pin = ht._CAN_PIN
        gpu_type = ht._GPU_TYPE  # kDLCUDA, or kDLROCM under a ROCm torch
        max_rank = ht.MAX_RANK

        def torch_to_jax(x: Any) -> Any:
            # jnp.from_dlpack's own calls, as the full path makes them (adapters/jax/__init__.py
            # _import). The full path detaches requires_grad tensors (torch's export
            # refuses them), materialises conj/neg bits (it exports them raw), copies CPU
            # memory that is misaligned or strided in a way JAX refuses, and takes the
            # public API for pinned memory: all declined here.
            raw = hj._RAW_IMPORT  # None once a jaxlib refused its private signature
            code = codes.get(x.dtype)
            if (raw is None or code is None or x.requires_grad or x.is_neg() or x.is_conj()
                    or x.ndim > max_rank):
                return NotImplemented
            if x.is_cpu:
                if can_pin and x.is_pinned():
                    return NotImplemented
                shape = tuple(x.shape)
                if x.is_contiguous():
                    # Compact strides, as the full path exports: torch's own may differ
                    # on size-1 dimensions, and JAX would then pick another layout.
                    strides = _COMPACT.get(shape) or _compact(shape)
                else:
                    strides = x.stride()
                    if not importable(shape, strides):
                        return NotImplemented
                data = x.data_ptr()
                if data % align and x.numel():
                    return NotImplemented
                # Our capsule, not torch's: its deleter never asks for the GIL while the
                # interpreter exits (torch's does for memory Python owns, from_numpy's),
                # which an XLA thread releasing it then would turn into an abort.
                capsule = make_capsule(data=data, shape=shape, strides=strides, code=code[0],
                                       bits=code[1], device_type=1, device_id=0, flags=0,
                                       owner=x, versioned=False)
                return raw(capsule, raw_device(1, 0), None, None, 1)
            if x.is_cuda:
                if not (x.is_contiguous() or importable(tuple(x.shape), x.stride())):
                    return NotImplemented  # the full path's refusal, in its words
                device = raw_device(gpu_type, x.get_device())
                # The producer orders its pending work before JAX's stream (DLPack). Its
                # capsule, as the full path forwards: torch synchronises.
                stream = device.get_stream_for_external_ready_events()
                return raw(x.__dlpack__(stream=stream), device, stream, None, gpu_type)
            return NotImplemented

        return entry(torch_to_jax)

    return {"numpy": numpy, "arrow": arrow, "jax": jax}


def _torch_import() -> tuple[Callable[[Any], Any], Callable[[], None]]:
    """``torch.from_dlpack``, and the full path's once-per-process read-only notice, for
    the shortcuts that hand torch immutable memory (JAX's, Arrow's)."""
    import torch

    from ._registry import get_adapter

    return torch.from_dlpack, get_adapter("torch").warn_readonly


def _is_jax_array(tp: type) -> bool:
    # jax.Array's one concrete class (its module moved between jaxlib releases).
    return tp.__name__ == "ArrayImpl" and tp.__module__.startswith("jaxlib")


def _jax_types() -> dict[str, Callable[[type], Entry | None]]:
    import numpy as np

    def numpy(tp: type) -> Entry | None:
        if not _is_jax_array(tp):
            return None
        asarray = np.asarray

        def jax_to_numpy(x: Any) -> Any:
            # The full path's own pin: memoryview waits for the value and holds the
            # buffer against delete/donation. It refuses non-CPU arrays, deleted
            # ones and the types without a buffer format (bfloat16, float8, int4).
            return asarray(memoryview(x))

        return entry(jax_to_numpy)

    def torch(tp: type) -> Entry | None:
        if not _is_jax_array(tp):
            return None
        from_dlpack, warn_readonly = _torch_import()

        def jax_to_torch(x: Any) -> Any:
            # Accelerator memory takes the full path, which negotiates a stream with
            # the consumer. JAX's export holds the buffer against delete/donation as
            # the full path's pin does, for every type (bfloat16 too, which has no
            # buffer format); it refuses deleted, multi-device and int4/int2 arrays.
            # (is_deleted first: jaxlib 0.10.2 segfaults on platform() of a deleted array.)
            if x.is_deleted() or x.platform() != "cpu":
                return NotImplemented
            out = from_dlpack(x.__dlpack__())
            if out.numel():
                warn_readonly()  # JAX memory is immutable; said once per process
            return out

        return entry(jax_to_torch)

    return {"numpy": numpy, "torch": torch}


def _arrow_types() -> dict[str, Callable[[type], Entry | None]]:
    import pyarrow as pa

    # Exact classes of the numeric types DLPack carries: bool (bit-packed),
    # timestamps, dictionaries and extension types have their own classes.
    numeric = {pa.Int8Array, pa.Int16Array, pa.Int32Array, pa.Int64Array, pa.UInt8Array,
               pa.UInt16Array, pa.UInt32Array, pa.UInt64Array, pa.HalfFloatArray,
               pa.FloatArray, pa.DoubleArray}

    def numpy(tp: type) -> Entry | None:
        if tp not in numeric:
            return None
        import numpy as np

        # Arrow exports a read-only capsule, and NumPy honours it - except for empty
        # arrays, which it makes writable (hence nonempty). Arrow refuses arrays with
        # nulls; copy=False (never a copy on CPU anyway) keeps NumPy from retrying the
        # legacy protocol after that refusal, which would draw Arrow's deprecation
        # warning before the full path's own error. (A null_count guard costs 20 %.)
        return entry(np.from_dlpack, kwargs={"copy": False}, nonempty=True)

    def torch(tp: type) -> Entry | None:
        if tp not in numeric:
            return None
        from_dlpack, warn_readonly = _torch_import()

        def arrow_to_torch(x: Any) -> Any:
            if x.null_count or not x.is_cpu:
                return NotImplemented
            # A capsule skips torch.from_dlpack's device negotiation (half its time).
            out = from_dlpack(x.__dlpack__(max_version=(1, 0)))
            if out.numel():
                warn_readonly()  # Arrow memory is immutable; said once per process
            return out

        return entry(arrow_to_torch)

    return {"numpy": numpy, "torch": torch}


# Source adapter -> builder of {target: entry maker}.
_SOURCES: dict[str, Callable[[], dict[str, Callable[[type], Entry | None]]]] = {
    "numpy": _numpy_types,
    "torch": _torch_types,
    "jax": _jax_types,
    "arrow": _arrow_types,
}


@functools.cache
def _makers(source: str) -> dict[str, Callable[[type], Entry | None]]:
    build = _SOURCES.get(source)
    return {} if build is None else build()


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


_FRONTS: list[Any] = []


def front(general: Callable[..., Any], *, use_compiled: bool = True,
          name: str | None = None) -> Callable[..., Any]:
    """``general`` with the shortcut table in front of it, compiled when available.

    The front takes ``general``'s docstring and signature, and ``name`` (default:
    ``general``'s) as its ``__name__``."""
    if use_compiled and _Dispatcher is not None:
        out: Callable[..., Any] = _Dispatcher(general, TABLE)
    else:
        out = _python_front(general, TABLE)
    functools.update_wrapper(out, general)  # name, docstring, signature (__wrapped__)
    if name is not None:
        out.__name__ = out.__qualname__ = name
    _FRONTS.append(out)
    return out


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
