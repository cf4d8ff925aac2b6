"""MLX adapter: ``mlx.core.array`` <-> ``hb.Tensor`` (Apple's MLX; its CPU build on Linux).

What mlx 0.32.4 (``mlx[cpu]``) does, measured, and what this adapter makes of it:

* **Export is zero-copy and writable.** An array exports its memory through the buffer
  protocol (writable, as MLX documents: ``np.array(a, copy=False)`` is a view whose
  writes MLX sees) and through DLPack, legacy capsules only (``"dltensor"`` even when
  asked for ``max_version=(1, 0)``). MLX writes that memory in place itself
  (``a[0] = 1`` changes an earlier buffer view), so ``LEGACY_EXPORTS_MUTABLE`` is True
  and ``to_hurray`` gives a writable tensor over the array's own memory: the buffer
  protocol for every type NumPy reads, DLPack for bfloat16 (whose buffer format
  ``"bfloat16"`` NumPy cannot read). A write there is not seen by MLX's lazy graph:
  results computed from the array but not yet evaluated read the new values.
* **A buffer view does not hold the memory.** It holds the Python array, whose memory an
  update can replace (``a += b`` of a wider type gives ``a`` new memory) and free under
  the view (``np.array(a, copy=False)`` then reads freed memory). A DLPack capsule holds
  the memory itself, so every export keeps one, unconsumed, while it lives. MLX then
  makes its own later updates of the array (``a[0] = 1``, ``a += 1``) in new memory, as
  it does whenever memory is shared: the export keeps the values it had.
* **Arrays are lazy.** ``a + 1`` is a graph node without memory until evaluated;
  ``to_hurray`` evaluates it (``mx.eval``) before taking its memory.
* **Import always copies.** ``mx.array`` and ``mx.from_dlpack`` copy every CPU source
  (``from_dlpack(copy=False)``: "Cannot import a CPU array without a copy"), so every
  ``from_hurray`` of memory that holds elements is a copy, reported as the copy policy
  says (a ``CopyWarning`` under ``copy=None``, ``CopyRequiredError`` under
  ``copy=False``). The one exception is a tensor that is itself a whole view of an MLX
  array (one of ``to_hurray``'s exports): that array comes back, no copy. Read-only
  memory is never handed to MLX to hold: MLX gets its own copy.
* **float64 is narrowed on import** unless ``dtype=`` is passed (``mx.array`` of a
  float64 array gives float32, complex128 gives complex64, silently). MLX holds float64
  on the CPU, so ``from_hurray`` names the dtype and float64 stays float64; MLX has
  no complex128, so that type is refused (``native_dtypes()`` lacks it).
* **Negative strides are refused** by MLX's import ("Cannot convert DLPack arrays with
  negative strides"): such a tensor is made compact first (one more copy, said in the
  report of the copy). Gaps and transposes MLX gathers itself.
* **bool8 bytes other than 0x00 and 0x01** are read by MLX as their integer value
  (``sum([0, 1, 2, 255])`` is 258); they are imported as uint8 and made 0/1 by MLX's
  own ``astype``, within the copy the import makes anyway.
* 1-bit bool arrives unpacked to ``mx.bool_`` (MLX has no packed boolean); MLX has no
  float8, float4 or sub-byte integer types.

``hb.convert`` from MLX to NumPy or torch of a compact array takes a shortcut after its
first call (``.shortcuts``: the export seen through the core's host view, without the
conversion around it); no shortcut ends in MLX, as every import copies.

MLX's CPU allocator places arrays at 8 or 24 bytes past a 64-byte boundary, so JAX
(which aliases only 64-byte aligned CPU memory) copies what MLX exports; NumPy, torch
and Arrow share it. Only the host is declared: MLX's Metal (macOS) and CUDA builds are
untested here, and an array whose DLPack device is not the CPU is refused.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from hurray_bridge import _host, _subbyte
from hurray_bridge._copy_policy import check_copy, require_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge.dtypes import DType, all_dtypes, bfloat16, bool8
from hurray_bridge.errors import UnsupportedError, not_a_tensor
from hurray_bridge.tensor import CPU, Device, Tensor, for_immutable_consumer, from_dlpack, host_copy

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "mlx"
"""The target name: ``hb.convert(x, "mlx")``."""
HOLDS = frozenset({"dense"})
"""Dense arrays only (MLX has no sparse arrays; its quantized weights are plain arrays)."""
_CPU = int(DLDeviceType.kDLCPU)
DEVICES = frozenset({_CPU})
"""The host only (kDLCPU): the CPU build is the one tested (see the module docstring)."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. MLX exports legacy capsules only, over the
# memory its buffer protocol hands out writable and its own a[i] = v writes in place.
LEGACY_EXPORTS_MUTABLE = True
"""Whether MLX's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: an export keeps its array, and so its buffer, alive."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""

_array = mx.array
_VERSION = getattr(mx, "__version__", "")
_IMPORT_COPIES = ("MLX copies every import of host memory (mx.array and mx.from_dlpack take "
                  "no foreign CPU memory)")


def _mlx_name(d: DType) -> str:
    return "bool_" if d is bool8 else d.name


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, Any], dict[Any, DType]]:
    # MLX names its types as the element-type table does (bool8 is its bool_); a type this
    # MLX lacks (float8, sub-byte, complex128) has no attribute of that name.
    to_mx = {d: native for d in all_dtypes() if d.bits >= 8
             and isinstance(native := getattr(mx, _mlx_name(d), None), mx.Dtype)}
    _BY_TAG.update((d.tag, v) for d, v in to_mx.items())
    return to_mx, {v: k for k, v in to_mx.items()}


# Tag -> mx.Dtype, for from_hurray's fast path (hashing a DType hashes all its fields).
_BY_TAG: dict[int, Any] = {}
_tables()  # (fills it)


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type MLX holds, with its ``mx.Dtype``."""
    return dict(_tables()[0])


def native_dtype(dtype: DType) -> Any:
    """The ``mx.Dtype`` of Hurray element type ``dtype``."""
    try:
        return _tables()[0][dtype]
    except KeyError:
        pass
    held = ", ".join(d.name for d in _tables()[0])
    fix = ("cast it to complex64 first (MLX holds no 128-bit complex), or convert it to "
           "numpy, torch or jax" if dtype.name == "complex128"
           else "convert it to numpy, torch or jax, which hold it")
    raise UnsupportedError(f"MLX has no dtype for {dtype.name} (MLX {_VERSION} holds "
                           f"{held}); {fix}")


def dtype_of(native: Any) -> DType:
    """The Hurray element type of an ``mx.Dtype``."""
    try:
        return _tables()[1][native]
    except (KeyError, TypeError):
        raise UnsupportedError(
            f"MLX dtype {native} has no Hurray element type (supported: "
            f"{', '.join(d.name for d in _tables()[0])})") from None


# --------------------------------------------------------------------- to Hurray
class _MlxOwner:
    """An MLX array whose memory a tensor describes whole, the object its export came
    from, and what keeps that memory alive (see ``to_hurray``)."""

    __slots__ = ("__weakref__", "array", "export", "keep")

    def __init__(self, array: Any, export: object, keep: object) -> None:
        self.array = array
        self.export = export
        self.keep = keep

    def __repr__(self) -> str:
        return f"<mlx.core.array export {self.array.dtype}{list(self.array.shape)}>"


def _export(obj: Any, dtype: DType) -> Tensor:
    """The memory ``obj`` holds now, as a tensor of ``dtype`` (its own)."""
    mx.eval(obj)  # a lazy result has no memory until evaluated
    if dtype is bfloat16:
        return from_dlpack(obj)  # writable: LEGACY_EXPORTS_MUTABLE
    # The buffer protocol: writable, zero-copy, and a tenth of a DLPack import's cost.
    exporter: Any = obj  # (MLX's stubs do not declare its buffer protocol)
    return _host.to_hurray(np.asarray(memoryview(exporter)))


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """An ``mx.array`` as an hb.Tensor over its own memory, writable, evaluated first
    (zero-copy unless ``copy=True``)."""
    if not isinstance(obj, _array):
        raise UnsupportedError(f"the MLX adapter converts mlx.core.array, got "
                               f"{type(obj).__module__}.{type(obj).__qualname__}")
    check_copy(copy)
    dtype = dtype_of(obj.dtype)
    kind, index = obj.__dlpack_device__()
    if kind != _CPU:
        raise UnsupportedError(
            f"this MLX array is on {Device(kind, index)}; the MLX adapter takes CPU memory "
            "only (its GPU builds are untested): copy it to the CPU in MLX first")
    export = _export(obj, dtype)
    if copy:
        return export.copy()
    # MLX's buffer protocol holds the Python array, not its memory: an update that gives
    # the array new memory (a += b of a wider type) frees the old memory under the view
    # (mlx 0.32.4; np.array(a, copy=False) then reads freed memory). A DLPack capsule holds
    # the memory itself, so one is kept, unconsumed, for as long as the tensor lives (the
    # bfloat16 export came through DLPack and holds it already).
    keep = None if dtype is bfloat16 else obj.__dlpack__()
    # Owned by a record of the array, so that from_hurray gives the array back (the
    # tensor is this function's own, made just above: its owner is set once, here).
    export._owner = _MlxOwner(obj, export._owner, keep)
    return export


# ------------------------------------------------------------------- from Hurray
def _check_device(device: Any) -> None:
    if device is None or device == "cpu" or device == mx.cpu:
        return
    if isinstance(device, mx.Device) and device.type == mx.cpu:
        return
    if isinstance(device, tuple) and len(device) == 2 and Device(*device) == CPU:
        return
    raise UnsupportedError(
        f"device={device!r}: the MLX adapter imports to the CPU only (pass None, 'cpu', "
        "mx.cpu or (1, 0)); MLX's GPU builds are untested here")


def _whole_array(t: Tensor) -> Any:
    """The MLX array ``t`` is a whole, unchanged view of (a ``to_hurray`` export), or None."""
    owner = t.owner
    if type(owner) is not _MlxOwner or t.copied:
        return None
    x = owner.array
    if t.dtype != dtype_of(x.dtype) or t.shape != tuple(x.shape):
        return None
    # Where the array's memory is now: an update MLX could not make in place (a[0] = 1 on
    # a view of another array) gives the array new memory, and t keeps the old values.
    now = _export(x, t.dtype)
    if t.data_ptr != now.data_ptr or t.strides != now.strides:
        return None
    return x


def _unpacked_bool(t: Tensor) -> Any:
    """A packed 1-bit bool tensor as NumPy bool8 values (a copy)."""
    n = 1
    for d in t.shape:
        n *= d
    raw = np.frombuffer(t.memoryview(), np.uint8) if t.nbytes else np.zeros(0, np.uint8)
    return _subbyte.unpack(raw, n, 1).reshape(t.shape).astype(np.bool_)


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """An hb.Tensor as an ``mx.array``: always a copy (MLX imports nothing in place), except
    for a tensor that is a whole view of an MLX array, which gives that array back.

    ``device``: None or the CPU (``"cpu"``, ``mx.cpu``, ``(1, 0)``).
    """
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if (copy is True and device is None and t._strides is None and t._device.type == _CPU
            and t._nbytes and (t._desc is None or t.is_dense)):
        # The common asked-for copy (compact host memory), in the fewest steps: the same
        # import as below (Tensor's slots are read directly: properties cost 2-3x).
        mxdt = _BY_TAG.get(t._dtype.tag)
        if mxdt is not None and t._dtype is not bool8:
            out = _array(for_immutable_consumer(t), dtype=mxdt)
            if out.dtype != mxdt:  # a narrowing MLX did on its own would be a silent change
                raise UnsupportedError(f"MLX made {out.dtype} of {t._dtype.name}; please "
                                       "report it")
            return out
    check_copy(copy)
    _check_device(device)
    if not t.is_dense:
        raise UnsupportedError(
            f"MLX arrays are dense; a {t.descriptor.layout.name} tensor must be densified "
            "first (hb.convert(..., densify=True))")
    dtype = t.dtype
    packed_bool = dtype.bits == 1
    mxdt = mx.bool_ if packed_bool else native_dtype(dtype)
    if not copy:
        same = _whole_array(t)
        if same is not None:
            return same
    if not t.device.is_host_accessible:
        require_copy(copy, NAME, f"{t.device} memory is copied to the host (MLX's CPU build)")
        t = host_copy(t, NAME)
        copy = True  # reported: what follows is part of the same copy
    if not t.nbytes:
        return mx.zeros(t.shape, mxdt)  # nothing to copy: a new empty array
    reasons = [_IMPORT_COPIES]
    if packed_bool:
        reasons.append("packed 1-bit bool unpacked to bool_ (MLX has no packed boolean)")
    negative = t.strides is not None and any(s < 0 for s in t.strides)
    if negative:
        reasons.append(f"strides {t.strides} are negative, which MLX's import refuses: "
                       "made compact first")
    require_copy(copy, NAME, "; ".join(reasons),
                 refusal=f"MLX would have to copy: {'; '.join(reasons)}; copy=False cannot be "
                         "honoured (pass copy=None or True, or keep the data where it is)")
    if packed_bool:
        out = _array(_unpacked_bool(t), dtype=mx.bool_)
    else:
        src = t.copy() if negative else t
        if dtype is bool8:
            # As bytes, then 0/1: MLX reads a bool byte of 2 or 255 as that number.
            out = _array(_host.from_hurray(src, copy=False).view(np.uint8)).astype(mx.bool_)
        else:
            # dtype= keeps float64 (MLX narrows it to float32 when left to choose); an
            # immutable consumer, so read-only memory may be read (MLX copies it).
            out = _array(for_immutable_consumer(src), dtype=mxdt)
    if out.dtype != mxdt:  # a narrowing MLX did on its own would be a silent change
        raise UnsupportedError(f"MLX made {out.dtype} of {dtype.name}; please report it")
    return out


def special_kind(obj: Any) -> str | None:
    """None: MLX has only dense arrays, so every refusal stands."""
    return None


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for ``mx.array`` (``.shortcuts``): its buffer as an ndarray."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """None of the raw forms (``.shortcuts``): every import into MLX is a copy, which a
    shortcut could not report."""
    from .shortcuts import fast_export as hook

    return hook()
