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
  Their scales are float64 and zero points int64, as torch keeps them.
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
import sys
from math import prod
from typing import Any, NamedTuple

from ._copy_policy import warn_copy
from ._registry import _ALIASES, ADAPTERS, get_adapter
from .conversion import asarray
from .descriptor import Quantization
from .dtypes import DType, Kind, bool8, bool_, dtype_from_name, float32, float64, int64
from .errors import CopyRequiredError, FormatError, UnsupportedError
from .layout import BufferRole, QuantScheme
from .tensor import CPU, Buffer, Tensor

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
    dt = asarray(data, copy=copy)
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
    t = asarray(obj, copy=copy)
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
        if copy is False:
            raise CopyRequiredError(f"the {what} are strided {list(t.strides)}; a Hurray buffer "
                                    "is compact, so they must be copied, but copy=False")
        t = t.copy()
    return t


def _name(shape: tuple[int, ...]) -> str:
    return "scalar" if not shape else f"{len(shape)}-D"


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
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.is_quantized:
        return _from_torch(obj, copy)
    raise UnsupportedError(
        f"{type(obj).__module__}.{type(obj).__qualname__} is neither a quantized torch tensor "
        "nor an hb.quant.QuantizedArray"
    )


def _torch_storage() -> dict[Any, DType]:
    import torch

    return {torch.qint8: dtype_from_name("int8"), torch.quint8: dtype_from_name("uint8"),
            torch.qint32: dtype_from_name("int32")}


def _from_torch(x: Any, copy: bool | None) -> Tensor:
    import torch

    storage = _torch_storage().get(x.dtype)
    scheme = x.qscheme()
    if storage is None:
        raise UnsupportedError(
            f"torch {x.dtype} ({scheme}) packs sub-byte values and uses float zero points "
            "(real = q * scale + zero_point), which is not Hurray's affine mapping; "
            "dequantize it in torch (x.dequantize()) first"
        )
    if not x.is_cpu:
        raise UnsupportedError(f"quantized torch tensor on {x.device}: only CPU quantized "
                               "tensors are supported")
    if scheme == torch.per_tensor_affine:
        scales = torch.tensor([x.q_scale()], dtype=torch.float64)
        zps = torch.tensor([x.q_zero_point()], dtype=torch.int64)
        q = Quantization(_PER_TENSOR, float64, int64)
    elif scheme == torch.per_channel_affine:
        scales = x.q_per_channel_scales().to(torch.float64).contiguous()
        zps = x.q_per_channel_zero_points()
        if zps.is_floating_point():
            raise UnsupportedError("per-channel float zero points have no Hurray form")
        zps = zps.to(torch.int64).contiguous()
        q = Quantization(_PER_AXIS, float64, int64, axis=x.q_per_channel_axis())
    else:
        raise UnsupportedError(
            f"torch qscheme {scheme} has no Hurray form (per_tensor_affine and "
            "per_channel_affine do; float-qparams schemes compute q * scale + zero_point)"
        )
    if copy:
        data = asarray(x.int_repr())  # a compact copy of the storage
        data = Tensor._dense(data.data_ptr, data.shape, data.dtype, strides=None, padded=False,
                             device=CPU, owner=data.owner, readonly=False, copied=True)
    else:
        # int_repr() would copy; the storage is readable in place at data_ptr().
        shape = tuple(x.shape)
        strides = None if x.is_contiguous() else tuple(x.stride())
        ptr = x.data_ptr() if x.numel() else 0
        data = Tensor._dense(ptr, shape, storage, strides=strides, padded=False, device=CPU,
                             owner=x, readonly=False, copied=False)
    return quantized(data, asarray(scales), asarray(zps), quantization=q)


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
        if copy is False:
            raise CopyRequiredError("densify=True dequantizes into a new array (a copy), but "
                                    "copy=False")
        return get_adapter(name).from_hurray(dequantize(t), device=device, copy=None)
    if name == "torch" and _torch_has_scheme(t):
        return _to_torch(t, device, copy)
    c = components(t)
    ad = get_adapter(name)
    zp = None if c.zero_points is None else ad.from_hurray(c.zero_points, device=device,
                                                           copy=copy)
    return QuantizedArray(ad.from_hurray(c.data, device=device, copy=copy),
                          ad.from_hurray(c.scales, device=device, copy=copy), zp, c.quantization)


def _torch_has_scheme(t: Tensor) -> bool:
    d = t.descriptor
    q = d.quantization
    assert q is not None
    return (d.dtype.name in ("int8", "uint8", "int32") and t.device.is_host_accessible
            and q.scheme in (_PER_TENSOR, _PER_AXIS)
            and (q.zero_point_dtype is None or q.zero_point_dtype.kind in (Kind.INT, Kind.UINT)))


_QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


def _to_torch(t: Tensor, device: Any, copy: bool | None) -> Any:
    import torch

    if device not in (None, "cpu", CPU, (1, 0)) and str(device) != "cpu":
        raise UnsupportedError(f"quantized torch tensors are built on the CPU; device={device!r}")
    ad = get_adapter("torch")
    c = components(t)
    q = c.quantization
    axis = -1 if q.axis is None else q.axis
    ir = ad.from_hurray(c.data, copy=False)  # the storage, zero-copy (strides kept)
    scales = ad.from_hurray(c.scales).to(torch.float64).reshape(-1)
    zps = (torch.zeros(scales.shape, dtype=torch.int64) if c.zero_points is None
           else ad.from_hurray(c.zero_points).to(torch.int64).reshape(-1))
    lo, hi = _QRANGE[t.dtype.name]
    if zps.numel() and (int(zps.min()) < lo or int(zps.max()) > hi):
        raise FormatError(f"a zero point lies outside the {t.dtype.name} range [{lo}, {hi}] "
                          "that torch requires", field="quantization.zero_points")
    qdtype = {"int8": torch.qint8, "uint8": torch.quint8, "int32": torch.qint32}[t.dtype.name]
    try:
        if q.scheme == _PER_TENSOR:
            out = torch._empty_affine_quantized([0], scale=float(scales[0]),
                                                zero_point=int(zps[0]), dtype=qdtype)
        else:
            out = torch._empty_per_channel_affine_quantized(
                [0], scales=scales, zero_points=zps, axis=axis, dtype=qdtype)
        # Point the quantized tensor at the storage itself: no copy (int_repr's inverse).
        out.set_(ir.untyped_storage(), ir.storage_offset(), ir.shape, ir.stride())
        shared = ir.numel() == 0 or out.data_ptr() == ir.data_ptr()
    except (RuntimeError, AttributeError, TypeError):
        shared = False
    if not shared:
        if copy is False:
            raise CopyRequiredError("this torch cannot build a quantized tensor over existing "
                                    "memory; a copy is needed, but copy=False")
        if copy is None:
            warn_copy("torch", "quantized tensor built from a copy of the storage")
        if q.scheme == _PER_TENSOR:
            out = torch._make_per_tensor_quantized_tensor(ir, float(scales[0]), int(zps[0]))
        else:
            out = torch._make_per_channel_quantized_tensor(ir, scales, zps, axis)
        return out
    return out.clone() if copy else out


# ========================================================================= dequantize
def _np() -> Any:
    import numpy

    return numpy


def _codes(t: Tensor) -> Any:
    """The raw codes of a sub-byte tensor, one uint8 per element in row-major order."""
    np = _np()
    n = prod(t.shape)
    bits = t.dtype.bits
    if not t.descriptor.padded:
        raw = np.frombuffer(t.memoryview(), np.uint8) if n else np.zeros(0, np.uint8)
        return _unpack_into(raw, n, bits, np.empty(n, np.uint8)).reshape(t.shape)
    raw = Tensor._dense(t.data_ptr, t.shape, dtype_from_name("uint8"), strides=t.strides,
                        padded=False, device=t.device, owner=t, readonly=t.readonly,
                        copied=t.copied)
    # Padded: the value is in the low bits; the high bits are ignored on read (ADR-011).
    return get_adapter("numpy").from_hurray(raw, copy=False) & np.uint8((1 << bits) - 1)


def _storage_values(t: Tensor) -> Any:
    """Storage as int64 (integer types) or float64 (float8/float4) NumPy values."""
    np = _np()
    d = t.dtype
    if d.is_subbyte:
        codes = _codes(t)
        if d.kind == Kind.FLOAT:
            import ml_dtypes

            return codes.view(getattr(ml_dtypes, d.name)).astype(np.float64)
        v = codes.astype(np.int64)
        if d.kind == Kind.INT:
            sign = 1 << (d.bits - 1)
            v = (v ^ sign) - sign  # sign-extend the low bits
        return v
    a = get_adapter("numpy").from_hurray(t, copy=False)
    return a.astype(np.float64 if d.kind == Kind.FLOAT else np.int64)


def _param_values(t: Tensor) -> Any:
    np = _np()
    a = get_adapter("numpy").from_hurray(t, copy=False)
    if t.dtype.kind == Kind.FLOAT:
        return a.astype(np.float64)  # exact: every scale type fits float64
    return a.astype(np.int64)


def _expand(v: Any, q: Quantization, shape: tuple[int, ...]) -> Any:
    """Scale (or zero-point) values broadcastable against the storage of ``shape``."""
    np = _np()
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
        t = asarray(t)
    d = _require_quantized(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"dequantize() is a host (NumPy) reference; this tensor is on "
                               f"{t.device}")
    out_dt = dtype if isinstance(dtype, DType) else dtype_from_name(dtype)
    if out_dt not in (float32, float64):
        raise UnsupportedError(f"dequantize() returns float32 or float64, not {out_dt.name}")
    np = _np()
    from .sparse import aligned_zeros

    c = components(t)
    q = c.quantization
    shape = d.shape
    qv = _storage_values(c.data)
    s = _expand(_param_values(c.scales), q, shape)
    z = 0 if c.zero_points is None else _expand(_param_values(c.zero_points), q, shape)
    exact_int = qv.dtype == np.int64 and d.dtype.bits <= 32 and (
        c.zero_points is None or (c.zero_points.dtype.kind != Kind.FLOAT
                                  and c.zero_points.dtype.name != "uint64"))
    out = aligned_zeros(shape, np.float32 if out_dt is float32 else np.float64)
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
    return asarray(out)


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
    np = _np()
    np_ad = get_adapter("numpy")
    storage = dtype if isinstance(dtype, DType) else dtype_from_name(dtype)
    xt = asarray(x)
    xs = np.asarray(np_ad.from_hurray(xt, copy=False), np.float64) if xt.is_dense else None
    if xs is None:
        raise UnsupportedError("quantize() takes a dense array of real values")
    shape = tuple(xs.shape)
    q = quantization
    # Validate the scheme against the shape and storage before computing anything.
    from .descriptor import Descriptor

    Descriptor(shape, storage, quantization=q, padded=padded and storage.is_subbyte)
    want = q.scales_shape(shape)
    s_stored = _as_type(scales, q.scale_dtype, want, "scales")
    z_stored = None
    if q.zero_point_dtype is not None:
        if zero_points is None:
            raise FormatError(f"the scheme has {q.zero_point_dtype} zero points but none given",
                              field="quantization.zero_points")
        z_stored = _as_type(zero_points, q.zero_point_dtype, want, "zero_points")
    elif zero_points is not None:
        raise FormatError("zero points given for a symmetric scheme",
                          field="quantization.zero_points")
    s = _expand(s_stored.astype(np.float64), q, shape)
    z = 0 if z_stored is None else _expand(
        z_stored.astype(np.float64 if z_stored.dtype.kind == "f" else np.int64), q, shape)
    with np.errstate(all="ignore"):
        v = xs / s
    from .sparse import aligned_zeros

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
            out = aligned_zeros(shape, np_ad.native_dtype(storage))
            out[...] = r
            data = asarray(out)
    else:
        import ml_dtypes

        native = np_ad.native_dtype(storage)
        v = v + z
        if storage.name == "float4_e2m1fn" and np.isnan(v).any():
            raise ValueError("quantize(): float4_e2m1fn has no NaN (quantization.md §4)")
        big = float(ml_dtypes.finfo(native).max)
        v = np.clip(v, -big, big)  # saturate (NaN stays NaN)
        cast = v.astype(native)
        if storage.is_subbyte:
            data = _subbyte_tensor(cast.view(np.uint8) & np.uint8(0xF), storage, padded)
        else:
            out = aligned_zeros(shape, native)
            out[...] = cast
            data = asarray(out)
    return quantized(data, s_stored, z_stored, quantization=q)


def _int_range(d: DType) -> tuple[int, int]:
    if d.kind == Kind.INT:
        return -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
    return 0, (1 << d.bits) - 1


def _as_type(obj: Any, dtype: DType, want: tuple[int, ...], what: str) -> Any:
    np = _np()
    t = asarray(obj)
    a = np.asarray(get_adapter("numpy").from_hurray(t, copy=False))
    n = prod(want)
    if a.size != n:
        raise FormatError(f"{a.size} {what} given; this shape needs {n} ({list(want)})",
                          field=f"quantization.{what}")
    from .sparse import aligned_zeros

    out = aligned_zeros(want, get_adapter("numpy").native_dtype(dtype))
    out[...] = a.reshape(want)
    return out


def _subbyte_tensor(codes: Any, dtype: DType, padded: bool) -> Tensor:
    """A hb.Tensor over fresh memory holding sub-byte ``codes`` (uint8, low bits)."""
    np = _np()
    from .sparse import aligned_zeros

    shape = tuple(codes.shape)
    n = prod(shape)
    if padded:
        out = aligned_zeros(shape, np.uint8)
        out[...] = codes
    else:
        out = aligned_zeros((-(-n * dtype.bits // 8),), np.uint8)
        _pack_into(np.ascontiguousarray(codes).reshape(-1), dtype.bits, out)
    ptr = out.__array_interface__["data"][0] if n else 0
    return Tensor._dense(ptr, shape, dtype, strides=None, padded=padded, device=CPU, owner=out,
                         readonly=False, copied=False)


# ============================================================================ sub-byte
def _pack_into(codes: Any, bits: int, out: Any) -> Any:
    """Pack ``codes`` (uint8, one per element, low ``bits`` significant) LSB-first into ``out``."""
    np = _np()
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    n = codes.size
    full = n // per
    if full:
        lanes = codes[: full * per].reshape(full, per)
        head = out[:full]
        for j in range(per):  # at most 8 vectorised passes
            head |= (lanes[:, j] & mask) << np.uint8(j * bits)
    for j in range(n - full * per):  # the tail of the last byte: fewer than 8 elements
        out[full] |= (codes[full * per + j] & mask) << np.uint8(j * bits)
    return out


def _unpack_into(packed: Any, n: int, bits: int, out: Any) -> Any:
    """Unpack ``n`` LSB-first ``bits``-wide codes from ``packed`` into ``out`` (uint8)."""
    np = _np()
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    full = n // per
    if full:
        lanes = out[: full * per].reshape(full, per)
        src = packed[:full]
        for j in range(per):
            np.bitwise_and(src >> np.uint8(j * bits), mask, out=lanes[:, j])
    for j in range(n - full * per):
        out[full * per + j] = (packed[full] >> np.uint8(j * bits)) & mask
    return out


def pack_subbyte(t: Any) -> Tensor:
    """The packed form (LSB first, row-major) of a padded sub-byte tensor, in new memory.

    Accepts a padded ``int4``/``uint4``/``int2``/``uint2``/``float4_e2m1fn``/``bool``
    tensor (strided too), or ``bool8`` (which becomes 1-bit ``hb.bool``). A packed
    tensor is returned as it is. A quantized tensor keeps its scales (shared).
    Empty tensors occupy 0 bytes.
    """
    if not isinstance(t, Tensor):
        t = asarray(t)
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
    np = _np()
    raw = Tensor._dense(t.data_ptr, t.shape, dtype_from_name("uint8"), strides=t.strides,
                        padded=False, device=t.device, owner=t, readonly=t.readonly,
                        copied=t.copied)
    codes = get_adapter("numpy").from_hurray(raw, copy=False)
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
        t = asarray(t)
    if t.descriptor.quantization is not None:
        return _requantized(t, unpack_subbyte)
    _require_dense_host(t, "unpack_subbyte")
    d = t.dtype
    if not d.is_subbyte:
        if d is bool8:
            return t
        raise UnsupportedError(f"unpack_subbyte() unpacks sub-byte types, not {d.name}")
    np = _np()
    from .sparse import aligned_zeros

    if t.descriptor.padded:
        if d is not bool_:
            return t
        codes = _codes(t)  # padded 1-bit bool -> bool8: normalise to 0/1
    else:
        codes = None
    n = prod(t.shape)
    out = aligned_zeros(t.shape, np.uint8)
    if codes is not None:
        out[...] = codes
    elif n:
        _unpack_into(np.frombuffer(t.memoryview(), np.uint8), n, d.bits, out.reshape(-1))
    ptr = out.__array_interface__["data"][0] if n else 0
    if d is bool_:
        return Tensor._dense(ptr, t.shape, bool8, strides=None, padded=False, device=CPU,
                             owner=out, readonly=False, copied=True)
    return Tensor._dense(ptr, t.shape, d, strides=None, padded=True, device=CPU, owner=out,
                         readonly=False, copied=True)


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
