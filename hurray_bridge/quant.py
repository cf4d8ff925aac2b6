"""Quantized tensors and sub-byte storage.

A quantized hb.Tensor is its *storage* tensor (``DATA``, an integer, float8 or
float4 type, packed or padded) plus a ``SCALES`` buffer and, unless the scheme
is symmetric, a ``ZERO_POINTS`` buffer; the descriptor's quantization section
says how they combine (``real = (q - zero_point) * scale``, per tensor, per
axis or per block; docs/spec/quantization.md).

* torch quantized tensors (``qint8``, ``quint8``, ``qint32``; per-tensor and
  per-channel affine) convert both ways without copying the storage:
  ``DATA`` is read at ``x.data_ptr()`` (``int_repr()`` would copy it), and a
  quantized torch tensor is built over Hurray memory with ``Tensor.set_``.
  Their scales are float64 and zero points int64, as torch keeps them. That
  code is the torch adapter's (``hurray_bridge.adapters.torch.quant``).
* Every other scheme (per-block int4 with e8m0 scales, float8 storage, ...)
  travels as a :class:`QuantizedArray`: the target framework's storage, scales
  and zero-point arrays next to the :class:`~hurray_bridge.Quantization`.
  ``hb.asarray(QuantizedArray(...))`` reassembles the hb.Tensor.
* :func:`dequantize` is a NumPy reference whose float32 result matches
  ``torch.Tensor.dequantize`` bit for bit where torch has the scheme;
  :func:`quantize` implements the rounding and saturation rules of the spec.
* :func:`pack_subbyte` / :func:`unpack_subbyte` convert sub-byte tensors
  between the padded form (one element per byte: ml_dtypes, JAX on some
  backends) and the packed form (LSB first: ONNX, torch ``float4_e2m1fn_x2``,
  Arrow booleans), vectorised in NumPy.
"""

from __future__ import annotations

import dataclasses
from math import prod
from types import ModuleType
from typing import Any, NamedTuple

from . import _subbyte
from ._copy_policy import require_copy
from ._memory import alloc_aligned
from ._numpy import ml_dtypes, numpy
from ._registry import (
    _ALIASES,
    ADAPTERS,
    adapter_name_for_type,
    get_adapter,
    get_adapter_module,
    holds,
    special_kind,
)
from .descriptor import Descriptor, Quantization
from .dtypes import DType, Kind, bool8, bool_, dtype_from_name, float32, float64, uint8
from .errors import FormatError, UnsupportedError
from .layout import BufferRole, QuantScheme
from .tensor import CPU, Buffer, Tensor, from_native

__all__ = [
    "QuantizedArray",
    "components",
    "dequantize",
    "from_hurray",
    "pack_subbyte",
    "quantize",
    "quantized",
    "to_hurray",
    "unpack_subbyte",
]

_PER_TENSOR, _PER_AXIS = QuantScheme.PER_TENSOR, QuantScheme.PER_AXIS
_PER_BLOCK = QuantScheme.PER_BLOCK


class QuantizedArray(NamedTuple):
    """A quantized tensor as one framework's arrays: storage, scales, zero points, scheme.

    What ``hb.convert`` returns for a quantized tensor that the target cannot
    hold natively; ``hb.asarray`` turns it back into a quantized hb.Tensor.
    ``scales`` (and ``zero_points``) have ``quantization.scales_shape(data.shape)``
    entries; ``zero_points`` is ``None`` for a symmetric scheme.
    """

    data: Any
    scales: Any
    zero_points: Any
    quantization: Quantization


class _QComponents:
    """Owner of an assembled quantized tensor: keeps its component tensors."""

    __slots__ = ("__weakref__", "data", "scales", "zero_points")

    def __init__(self, data: Tensor, scales: Tensor, zero_points: Tensor | None) -> None:
        self.data = data
        self.scales = scales
        self.zero_points = zero_points

    def __repr__(self) -> str:
        return f"<quantized components {self.data!r}, {self.scales!r}, {self.zero_points!r}>"


# ========================================================================= assembly
def quantized(data: Any, scales: Any, zero_points: Any = None, *, quantization: Quantization,
              copy: bool | None = None) -> Tensor:
    """A quantized hb.Tensor from its storage, scales and zero points (zero-copy).

    Each may be any native array or hb.Tensor. ``scales`` must hold exactly
    ``quantization.scales_shape(data.shape)`` values (flat or in that shape) of
    ``quantization.scale_dtype``; likewise ``zero_points``. A mismatch raises
    FormatError naming ``quantization.scales`` / ``quantization.zero_points``.
    """
    if not isinstance(quantization, Quantization):
        raise FormatError(f"expected an hb.Quantization, got {quantization!r}",
                          field="quantization")
    q = quantization
    dt = _tensor(data, copy)
    if not dt.is_dense:
        raise UnsupportedError("quantized storage must be a dense tensor")
    # Builds (and validates) the descriptor: storage type, axis range, dynamic axis.
    desc = dataclasses.replace(dt.descriptor, quantization=q)
    want = q.scales_shape(dt.shape)
    n = prod(want)
    st = _param(scales, q.scale_dtype, n, want, "scales", copy)
    if (zero_points is None) != (q.zero_point_dtype is None):
        raise FormatError(
            "zero points given for a symmetric scheme (zero_point_dtype=None)" if zero_points
            is not None else f"the scheme has {q.zero_point_dtype} zero points but none given",
            field="quantization.zero_points")
    zt = None if zero_points is None else _param(zero_points, q.zero_point_dtype, n, want,
                                                 "zero_points", copy)
    comps = [c for c in (dt, st, zt) if c is not None]
    if len({c.device for c in comps}) != 1:
        raise UnsupportedError("storage, scales and zero points are on different devices: "
                               f"{', '.join(str(c.device) for c in comps)}")
    bufs = [Buffer(BufferRole.DATA, dt.buffers[0].ptr, dt.buffers[0].nbytes),
            Buffer(BufferRole.SCALES, st.buffers[0].ptr, st.buffers[0].nbytes)]
    if zt is not None:
        bufs.append(Buffer(BufferRole.ZERO_POINTS, zt.buffers[0].ptr, zt.buffers[0].nbytes))
    return Tensor(desc, bufs, device=dt.device, owner=_QComponents(dt, st, zt),
                  readonly=any(c.readonly for c in comps), copied=any(c.copied for c in comps))


def _param(obj: Any, dtype: DType | None, n: int, want: tuple[int, ...], what: str,
           copy: bool | None) -> Tensor:
    t = _tensor(obj, copy)
    field = f"quantization.{what}"
    if not t.is_dense:
        raise FormatError(f"{what} must be a dense array", field=field)
    if t.dtype != dtype:
        raise FormatError(f"{what} are {t.dtype.name} but the quantization says {dtype}; cast "
                          "them first", field=field)
    got = prod(t.shape)
    if got != n:
        raise FormatError(
            f"{got} {what} given; a {_name(want)} scale array for this shape has {n} "
            f"({list(want)})", field=field)
    if t.strides is not None:
        why = f"the {what} are strided {list(t.strides)}; a Hurray buffer is compact"
        require_copy(copy, None, why, refusal=f"{why}, so they must be copied, but copy=False")
        t = t.copy()
    return t


def _name(shape: tuple[int, ...]) -> str:
    return "scalar" if not shape else f"{len(shape)}-D"


def _tensor(obj: Any, copy: bool | None = None) -> Tensor:
    """``obj`` as an hb.Tensor, as ``hb.asarray`` would make it of what this module takes.

    Not ``hb.asarray`` itself: that routes quantized objects to this module, so this
    module reaches the dense adapters through the registry instead.
    """
    if isinstance(obj, QuantizedArray) or _quantizing_adapter(obj) is not None:
        return to_hurray(obj, copy=copy)
    return from_native(obj, copy)


def _quantizing_adapter(obj: Any) -> str | None:
    """The adapter that says ``obj`` is one of its framework's quantized tensors, or None."""
    # An object of a framework's type exists only where that framework is imported
    # already: asking its adapter imports nothing new.
    name = adapter_name_for_type(type(obj))  # type: ignore[arg-type]
    if name is None or not holds(name, "quantized"):
        return None
    return name if special_kind(name, obj) == "quantized" else None


def _native_quant(name: str) -> ModuleType | None:
    """The quantized-tensor module of adapter ``name`` (``.quant``), or None when its
    framework has no quantized tensors (its adapter does not declare the kind)."""
    if not holds(name, "quantized"):
        return None
    return get_adapter_module(name, "quant")


def components(t: Tensor) -> QuantizedArray:
    """A quantized hb.Tensor's storage, scales and zero points as dense hb.Tensors (no copy)."""
    d = _require_quantized(t)
    q = d.quantization
    assert q is not None
    own = t.owner
    data_buf = t.buffer(BufferRole.DATA)
    if isinstance(own, _QComponents) and own.data.buffers[0].ptr == data_buf.ptr:
        return QuantizedArray(own.data, own.scales, own.zero_points, q)
    dense = Tensor(dataclasses.replace(d, quantization=None), [data_buf], device=t.device,
                   owner=t, readonly=t.readonly, copied=t.copied)
    want = q.scales_shape(d.shape)

    def view(role: BufferRole, dtype: DType) -> Tensor:
        return Tensor._dense(t.buffer(role).ptr, want, dtype, strides=None, padded=False,
                             device=t.device, owner=t, readonly=t.readonly, copied=t.copied)

    zp = None if q.zero_point_dtype is None else view(BufferRole.ZERO_POINTS, q.zero_point_dtype)
    return QuantizedArray(dense, view(BufferRole.SCALES, q.scale_dtype), zp, q)


def _require_quantized(t: Tensor) -> Any:
    d = t.descriptor
    if d.quantization is None:
        raise UnsupportedError(f"this hb.Tensor ({d.dtype.name}, {d.layout.name}) is not "
                               "quantized")
    if d.layout.is_sparse:
        raise UnsupportedError(
            "a quantized sparse tensor has no native form in any framework, and dequantize() "
            "takes dense storage; read its buffers with t.buffer(role)")
    return d


# ========================================================================= to Hurray
def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A quantized torch tensor or a :class:`QuantizedArray` as a quantized hb.Tensor.

    The storage is shared (``copy=None``/``False``); ``copy=True`` copies it.
    """
    if isinstance(obj, QuantizedArray):
        return quantized(obj.data, obj.scales, obj.zero_points, quantization=obj.quantization,
                         copy=copy)
    name = _quantizing_adapter(obj)
    if name is not None:
        t: Tensor = get_adapter_module(name, "quant").to_hurray(obj, copy=copy)
        return t
    raise UnsupportedError(
        f"{type(obj).__module__}.{type(obj).__qualname__} is neither a quantized torch tensor "
        "nor an hb.quant.QuantizedArray"
    )


# ======================================================================= from Hurray
def _target_name(to: str) -> str:
    key = _ALIASES.get(to, to) if isinstance(to, str) else to
    if key not in ADAPTERS:
        raise UnsupportedError(f"unknown target {to!r}; choose one of {', '.join(ADAPTERS)}")
    return str(key)


def from_hurray(t: Tensor, to: str, *, device: Any = None, copy: bool | None = None,
                densify: bool = False) -> Any:
    """A quantized hb.Tensor for framework ``to``.

    torch, with a scheme torch has (int8/uint8/int32 storage, per-tensor or
    per-axis, integer or no zero points): a quantized torch tensor over the
    same storage. Otherwise a :class:`QuantizedArray` of ``to``'s arrays.
    ``densify=True``: the dequantized float32 array instead (a new array).
    """
    name = _target_name(to)
    _require_quantized(t)
    if densify:
        why = "densify=True dequantizes into a new array (a copy)"
        require_copy(copy, None, why, refusal=f"{why}, but copy=False")
        return get_adapter(name).from_hurray(dequantize(t), device=device, copy=None)
    tq = _native_quant(name)  # a framework with quantized tensors of its own
    if tq is not None and tq.has_scheme(t):
        return tq.from_hurray(t, device=device, copy=copy)
    c = components(t)
    ad = get_adapter(name)
    zp = None if c.zero_points is None else ad.from_hurray(c.zero_points, device=device,
                                                           copy=copy)
    return QuantizedArray(ad.from_hurray(c.data, device=device, copy=copy),
                          ad.from_hurray(c.scales, device=device, copy=copy), zp, c.quantization)


# ========================================================================= dequantize
def _fresh(shape: tuple[int, ...], dtype: DType) -> tuple[Tensor, Any]:
    """A zeroed hb.Tensor of a whole-byte type in new 64-byte aligned host memory, and a
    writable NumPy view of it to compute into.

    The bridge's own memory is 64-byte aligned (DESIGN.md), which is also what JAX needs
    to alias host memory instead of copying it again.
    """
    alloc = alloc_aligned(prod(shape) * dtype.itemsize)
    t = Tensor._dense(alloc.ptr if alloc else 0, shape, dtype, strides=None, padded=False,
                      device=CPU, owner=alloc, readonly=False, copied=False)
    from ._host import from_hurray as host_array  # NumPy, on use only

    return t, host_array(t, copy=False)


def _codes(t: Tensor) -> Any:
    """The raw codes of a sub-byte tensor, one uint8 per element in row-major order."""
    np = numpy()
    n = prod(t.shape)
    bits = t.dtype.bits
    if not t.descriptor.padded:
        raw = np.frombuffer(t.memoryview(), np.uint8) if n else np.zeros(0, np.uint8)
        return _subbyte.unpack(raw, n, bits, np.empty(n, np.uint8)).reshape(t.shape)
    raw = Tensor._dense(t.data_ptr, t.shape, dtype_from_name("uint8"), strides=t.strides,
                        padded=False, device=t.device, owner=t, readonly=t.readonly,
                        copied=t.copied)
    # Padded: the value is in the low bits; the high bits are ignored on read (ADR-011).
    from ._host import from_hurray as host_array  # NumPy, on use only

    return host_array(raw, copy=False) & np.uint8((1 << bits) - 1)


def _storage_values(t: Tensor) -> Any:
    """Storage as int64 (integer types) or float64 (float8/float4) NumPy values."""
    np = numpy()
    d = t.dtype
    if d.is_subbyte:
        codes = _codes(t)
        if d.kind == Kind.FLOAT:
            return codes.view(getattr(ml_dtypes(), d.name)).astype(np.float64)
        v = codes.astype(np.int64)
        if d.kind == Kind.INT:
            sign = 1 << (d.bits - 1)
            v = (v ^ sign) - sign  # sign-extend the low bits
        return v
    from ._host import from_hurray as host_array  # NumPy, on use only

    a = host_array(t, copy=False)
    return a.astype(np.float64 if d.kind == Kind.FLOAT else np.int64)


def _param_values(t: Tensor) -> Any:
    np = numpy()
    from ._host import from_hurray as host_array  # NumPy, on use only

    a = host_array(t, copy=False)
    if t.dtype.kind == Kind.FLOAT:
        return a.astype(np.float64)  # exact: every scale type fits float64
    return a.astype(np.int64)


def _expand(v: Any, q: Quantization, shape: tuple[int, ...]) -> Any:
    """Scale (or zero-point) values broadcastable against the storage of ``shape``."""
    np = numpy()
    if q.scheme == _PER_TENSOR:
        return v.reshape(())
    assert q.axis is not None
    if q.scheme == _PER_AXIS:
        return v.reshape([shape[q.axis] if i == q.axis else 1 for i in range(len(shape))])
    assert q.block_size is not None
    v = v.reshape(q.scales_shape(shape))
    # Element i of the axis takes block i // block_size. Indexing, not np.repeat: a
    # block_size may be anything up to 2**64 - 2 (one block), which repeat cannot take
    # (and would allocate block_size copies of each scale for).
    n = shape[q.axis]
    block = min(q.block_size, max(n, 1))
    return np.take(v, np.arange(n) // block, axis=q.axis)


def dequantize(t: Any, *, dtype: DType | str = "float32") -> Tensor:
    """Real values of a quantized tensor, ``(q - zero_point) * scale``, as a new hb.Tensor.

    A NumPy reference (host memory). ``dtype`` is ``float32`` (default) or
    ``float64``. The float32 arithmetic is torch's own, so the result equals
    ``torch.Tensor.dequantize()`` bit for bit for every scheme torch has:

    * per-tensor: ``f32(q - zp) * f32(scale)`` (the difference exact in
      integers, the product in float32);
    * per-axis and per-block: ``f32(f64(f32(q) - f32(zp)) * scale)`` (the
      difference in float32, the product in float64, then rounded once).

    float64: ``f64(q - zp) * f64(scale)``. Accepts a quantized hb.Tensor, a
    quantized torch tensor or a :class:`QuantizedArray`.
    """
    if not isinstance(t, Tensor):
        t = _tensor(t)
    d = _require_quantized(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"dequantize() is a host (NumPy) reference; this tensor is on "
                               f"{t.device}")
    out_dt = dtype if isinstance(dtype, DType) else dtype_from_name(dtype)
    if out_dt not in (float32, float64):
        raise UnsupportedError(f"dequantize() returns float32 or float64, not {out_dt.name}")
    np = numpy()
    c = components(t)
    q = c.quantization
    shape = d.shape
    qv = _storage_values(c.data)
    s = _expand(_param_values(c.scales), q, shape)
    z = 0 if c.zero_points is None else _expand(_param_values(c.zero_points), q, shape)
    exact_int = qv.dtype == np.int64 and d.dtype.bits <= 32 and (
        c.zero_points is None or (c.zero_points.dtype.kind != Kind.FLOAT
                                  and c.zero_points.dtype.name != "uint64"))
    result, out = _fresh(shape, out_dt)
    with np.errstate(all="ignore"):  # NaN/inf scales give NaN/inf, as in torch
        if out_dt is float64:
            diff = (qv - z).astype(np.float64) if exact_int else qv.astype(np.float64) - z
            np.multiply(diff, s, out=out)
        elif q.scheme == _PER_TENSOR:
            diff = (qv - z) if exact_int else (qv.astype(np.float64) - z)
            np.multiply(np.asarray(diff).astype(np.float32), np.float32(s), out=out)
        else:
            d32 = np.asarray(qv).astype(np.float32) - np.asarray(z).astype(np.float32)
            out[...] = (d32.astype(np.float64) * s).astype(np.float32)
    return result


# =========================================================================== quantize
def quantize(x: Any, dtype: DType | str, quantization: Quantization, scales: Any,
             zero_points: Any = None, *, padded: bool = False) -> Tensor:
    """Quantize real values by the spec's rules (quantization.md §4), as a new hb.Tensor.

    ``q = saturate(round(x / scale) + zero_point)``: for integer storage
    round-half-to-even and clamp to the type's range (NaN raises ValueError);
    for float8/float4 storage round to the nearest value of the format and
    saturate to its largest finite magnitude. The division is in float64, by
    the scales as stored in ``quantization.scale_dtype``. Sub-byte storage is
    packed unless ``padded=True``.
    """
    np = numpy()
    from . import _host  # NumPy, on use only
    storage = dtype if isinstance(dtype, DType) else dtype_from_name(dtype)
    xt = _tensor(x)
    xs = np.asarray(_host.from_hurray(xt, copy=False), np.float64) if xt.is_dense else None
    if xs is None:
        raise UnsupportedError("quantize() takes a dense array of real values")
    shape = tuple(xs.shape)
    q = quantization
    # Validate the scheme against the shape and storage before computing anything.
    Descriptor(shape, storage, quantization=q, padded=padded and storage.is_subbyte)
    want = q.scales_shape(shape)
    s_t, s_stored = _as_type(scales, q.scale_dtype, want, "scales")
    z_t: Tensor | None = None
    z_stored: Any = None
    if q.zero_point_dtype is not None:
        if zero_points is None:
            raise FormatError(f"the scheme has {q.zero_point_dtype} zero points but none given",
                              field="quantization.zero_points")
        z_t, z_stored = _as_type(zero_points, q.zero_point_dtype, want, "zero_points")
    elif zero_points is not None:
        raise FormatError("zero points given for a symmetric scheme",
                          field="quantization.zero_points")
    s = _expand(s_stored.astype(np.float64), q, shape)
    z = 0 if z_stored is None else _expand(
        z_stored.astype(np.float64 if z_stored.dtype.kind == "f" else np.int64), q, shape)
    with np.errstate(all="ignore"):
        v = xs / s
    if storage.kind in (Kind.INT, Kind.UINT):
        if np.isnan(v).any():
            raise FormatError("quantize(): NaN has no integer quantized value (quantization.md "
                              "§4); replace NaNs first", field="x")
        lo, hi = _int_range(storage)
        r = np.clip(np.rint(v) + z, lo, hi)  # rint: round half to even
        if storage.is_subbyte:
            codes = (r.astype(np.int64) & ((1 << storage.bits) - 1)).astype(np.uint8)
            data = _subbyte_tensor(codes, storage, padded)
        else:
            data, out = _fresh(shape, storage)
            out[...] = r
    else:
        native = _host.native_dtype(storage)
        v = v + z
        if storage.name == "float4_e2m1fn" and np.isnan(v).any():
            raise ValueError("quantize(): float4_e2m1fn has no NaN (quantization.md §4)")
        big = float(ml_dtypes().finfo(native).max)
        v = np.clip(v, -big, big)  # saturate (NaN stays NaN)
        cast = v.astype(native)
        if storage.is_subbyte:
            data = _subbyte_tensor(cast.view(np.uint8) & np.uint8(0xF), storage, padded)
        else:
            data, out = _fresh(shape, storage)
            out[...] = cast
    return quantized(data, s_t, z_t, quantization=q)


def _int_range(d: DType) -> tuple[int, int]:
    if d.kind == Kind.INT:
        return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
    return 0, (1 << d.bits) - 1


def _as_type(obj: Any, dtype: DType, want: tuple[int, ...], what: str) -> tuple[Tensor, Any]:
    """``obj`` cast to ``dtype`` in ``want``'s shape, in new memory: (hb.Tensor, NumPy view)."""
    np = numpy()
    t = _tensor(obj)
    from ._host import from_hurray as host_array  # NumPy, on use only

    a = np.asarray(host_array(t, copy=False))
    n = prod(want)
    if a.size != n:
        raise FormatError(f"{a.size} {what} given; this shape needs {n} ({list(want)})",
                          field=f"quantization.{what}")
    out_t, out = _fresh(want, dtype)
    out[...] = a.reshape(want)
    return out_t, out


def _subbyte_tensor(codes: Any, dtype: DType, padded: bool) -> Tensor:
    """A hb.Tensor over fresh memory holding sub-byte ``codes`` (uint8, low bits)."""
    shape = tuple(codes.shape)
    n = prod(shape)
    if padded:
        raw, out = _fresh(shape, uint8)
        out[...] = codes
    else:
        raw, out = _fresh((-(-n * dtype.bits // 8),), uint8)
        _subbyte.pack(codes, dtype.bits, out)
    return Tensor._dense(raw.data_ptr, shape, dtype, strides=None, padded=padded, device=CPU,
                         owner=raw.owner, readonly=False, copied=False)


# ============================================================================ sub-byte
def pack_subbyte(t: Any) -> Tensor:
    """The packed form (LSB first, row-major) of a padded sub-byte tensor, in new memory.

    Accepts a padded ``int4``/``uint4``/``int2``/``uint2``/``float4_e2m1fn``/``bool``
    tensor (strided too), or ``bool8`` (which becomes 1-bit ``hb.bool``). A packed
    tensor is returned as it is. A quantized tensor keeps its scales (shared).
    Empty tensors occupy 0 bytes.
    """
    if not isinstance(t, Tensor):
        t = _tensor(t)
    if t.descriptor.quantization is not None:
        return _requantized(t, pack_subbyte)
    _require_dense_host(t, "pack_subbyte")
    d = t.dtype
    if d is bool8:
        target = bool_
    elif d.is_subbyte:
        if not t.descriptor.padded:
            return t
        target = d
    else:
        raise UnsupportedError(f"pack_subbyte() packs sub-byte types and bool8, not {d.name}")
    np = numpy()
    raw = Tensor._dense(t.data_ptr, t.shape, dtype_from_name("uint8"), strides=t.strides,
                        padded=False, device=t.device, owner=t, readonly=t.readonly,
                        copied=t.copied)
    from ._host import from_hurray as host_array  # NumPy, on use only

    codes = host_array(raw, copy=False)
    if target is bool_:
        codes = codes != 0  # any non-zero byte is true; bool8 should only hold 0 and 1
    out = _subbyte_tensor(np.asarray(codes, np.uint8), target, False)
    return Tensor._dense(out.data_ptr, out.shape, target, strides=None, padded=False, device=CPU,
                         owner=out.owner, readonly=False, copied=True)


def unpack_subbyte(t: Any) -> Tensor:
    """The padded form (one element per byte) of a packed sub-byte tensor, in new memory.

    1-bit ``hb.bool`` becomes ``bool8`` (ADR-009: byte booleans are bool8); the
    other types keep their type with the padded flag set (what ml_dtypes and
    NumPy hold). A padded tensor is returned as it is. A quantized tensor keeps
    its scales (shared). Empty tensors occupy 0 bytes.
    """
    if not isinstance(t, Tensor):
        t = _tensor(t)
    if t.descriptor.quantization is not None:
        return _requantized(t, unpack_subbyte)
    _require_dense_host(t, "unpack_subbyte")
    d = t.dtype
    if not d.is_subbyte:
        if d is bool8:
            return t
        raise UnsupportedError(f"unpack_subbyte() unpacks sub-byte types, not {d.name}")
    if t.descriptor.padded:
        if d is not bool_:
            return t
        codes = _codes(t)  # padded 1-bit bool -> bool8: normalise to 0/1
    else:
        codes = None
    n = prod(t.shape)
    raw, out = _fresh(t.shape, uint8)
    if codes is not None:
        out[...] = codes
    elif n:
        _subbyte.unpack(t.memoryview(), n, d.bits, out.reshape(-1))
    if d is bool_:
        return Tensor._dense(raw.data_ptr, t.shape, bool8, strides=None, padded=False,
                             device=CPU, owner=raw.owner, readonly=False, copied=True)
    return Tensor._dense(raw.data_ptr, t.shape, d, strides=None, padded=True, device=CPU,
                         owner=raw.owner, readonly=False, copied=True)


def _require_dense_host(t: Tensor, who: str) -> None:
    if not t.is_dense:
        raise UnsupportedError(
            f"{who}() takes a dense tensor, not a {t.descriptor.layout.name} one")
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"{who}() works on host memory; this tensor is on {t.device}")


def _requantized(t: Tensor, fn: Any) -> Tensor:
    c = components(t)
    data = fn(c.data)
    if data is c.data:
        return t
    return quantized(data, c.scales, c.zero_points, quantization=c.quantization)
