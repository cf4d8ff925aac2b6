"""torch quantized tensors <-> quantized hb.Tensors, sharing the storage.

torch's ``qint8``, ``quint8`` and ``qint32`` tensors, per-tensor and per-channel
affine, convert both ways without copying the storage: ``DATA`` is read at
``x.data_ptr()`` (``int_repr()`` would copy it), and a quantized torch tensor
is built over Hurray memory with ``Tensor.set_``. Their scales are float64
and zero points int64, as torch keeps them. The models, the checks and every
other scheme are in ``hurray_bridge.quant``, which comes here for torch.
"""

from __future__ import annotations

from typing import Any

import torch

from hurray_bridge._copy_policy import require_copy
from hurray_bridge.descriptor import Quantization
from hurray_bridge.dtypes import DType, Kind, dtype_from_name, float64, int64
from hurray_bridge.errors import FormatError, UnsupportedError
from hurray_bridge.layout import QuantScheme
from hurray_bridge.quant import components, quantized
from hurray_bridge.tensor import CPU, Tensor

from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "has_scheme", "to_hurray"]

_PER_TENSOR, _PER_AXIS = QuantScheme.PER_TENSOR, QuantScheme.PER_AXIS

# torch quantized dtype <-> the Hurray storage type of its int_repr().
_STORAGE: dict[Any, DType] = {torch.qint8: dtype_from_name("int8"),
                              torch.quint8: dtype_from_name("uint8"),
                              torch.qint32: dtype_from_name("int32")}
_QDTYPE = {d.name: q for q, d in _STORAGE.items()}
_QRANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


# ========================================================================= to Hurray
def to_hurray(x: Any, *, copy: bool | None = None) -> Tensor:
    """A quantized torch tensor as a quantized hb.Tensor over the same storage
    (``copy=True``: a compact copy of it)."""
    storage = _STORAGE.get(x.dtype)
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
        data = dense_to_hurray(x.int_repr())  # a compact copy of the storage
        data = Tensor._dense(data.data_ptr, data.shape, data.dtype, strides=None, padded=False,
                             device=CPU, owner=data.owner, readonly=False, copied=True)
    else:
        # int_repr() would copy; the storage is readable in place at data_ptr().
        shape = tuple(x.shape)
        strides = None if x.is_contiguous() else tuple(x.stride())
        ptr = x.data_ptr() if x.numel() else 0
        data = Tensor._dense(ptr, shape, storage, strides=strides, padded=False, device=CPU,
                             owner=x, readonly=False, copied=False)
    return quantized(data, dense_to_hurray(scales), dense_to_hurray(zps), quantization=q)


# ======================================================================= from Hurray
def has_scheme(t: Tensor) -> bool:
    """Whether torch has a quantized tensor for this quantized hb.Tensor: int8, uint8 or
    int32 storage in host memory, per tensor or per axis, integer or no zero points."""
    d = t.descriptor
    q = d.quantization
    assert q is not None
    return (d.dtype.name in _QRANGE and t.device.is_host_accessible
            and q.scheme in (_PER_TENSOR, _PER_AXIS)
            and (q.zero_point_dtype is None or q.zero_point_dtype.kind in (Kind.INT, Kind.UINT)))


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """A quantized torch tensor over the storage of ``t`` (one :func:`has_scheme` accepts)."""
    if device not in (None, "cpu", CPU) and str(device) != "cpu":
        raise UnsupportedError(f"quantized torch tensors are built on the CPU; device={device!r}")
    c = components(t)
    q = c.quantization
    axis = -1 if q.axis is None else q.axis
    # The storage, zero-copy (strides kept) unless the dense path must copy it (memory
    # mapped read-only), which it reports under copy=None and refuses under copy=False;
    # copy=True copies once, at the end.
    ir = dense_from_hurray(c.data, copy=None if copy is None else False)
    scales = dense_from_hurray(c.scales).to(torch.float64).reshape(-1)
    zps = (torch.zeros(scales.shape, dtype=torch.int64) if c.zero_points is None
           else dense_from_hurray(c.zero_points).to(torch.int64).reshape(-1))
    lo, hi = _QRANGE[t.dtype.name]
    if zps.numel() and (int(zps.min()) < lo or int(zps.max()) > hi):
        raise FormatError(f"a zero point lies outside the {t.dtype.name} range [{lo}, {hi}] "
                          "that torch requires", field="quantization.zero_points")
    qdtype = _QDTYPE[t.dtype.name]
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
        require_copy(copy, "torch", "quantized tensor built from a copy of the storage",
                     refusal="this torch cannot build a quantized tensor over existing "
                             "memory; a copy is needed, but copy=False")
        if q.scheme == _PER_TENSOR:
            return torch._make_per_tensor_quantized_tensor(ir, float(scales[0]), int(zps[0]))
        return torch._make_per_channel_quantized_tensor(ir, scales, zps, axis)
    return out.clone() if copy else out
