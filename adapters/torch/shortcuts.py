"""torch's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from typing import Any

import torch

from hurray_bridge._shortcuts import (
    EXPORTER,
    NDARRAY,
    RAW,
    READONLY_CAPSULE,
    Entry,
    entry,
)
from hurray_bridge.descriptor import MAX_RANK
from hurray_bridge.dtypes import Kind

from . import _KDL_CPU, CAN_PIN, DTYPES, GPU_DEVICE_TYPE, hold_storage, warn_readonly

__all__ = ["fast_export", "fast_import"]


def _compiled_to_numpy() -> Any:
    """The torch -> NumPy shortcut in C (hurray_bridge._speedups, over torch's DLPack C
    exchange API), or None: a NumPy array over the tensor's memory, for the inputs
    Tensor.numpy() takes with the element types it gives (checked here, type by type),
    and NotImplemented for the rest, as torch_to_numpy below. Compact tensors get
    NumPy's compact strides (the full path's), not torch's on size-1 dimensions."""
    from hurray_bridge import _exchange

    from . import COMPILED_IMPORT

    if not COMPILED_IMPORT:
        return None
    import numpy as np

    from hurray_bridge._host import native_dtype

    descrs = {}
    for d, tdt in DTYPES.items():
        try:
            got = torch.empty(1, dtype=tdt).numpy().dtype
        except (TypeError, RuntimeError):
            continue  # a type Tensor.numpy() refuses (bfloat16, float8): the full path
        if d.bits >= 8 and got == native_dtype(d):
            descrs[d] = got
    core = getattr(np, "_core", None) or np.core
    return _exchange.numpy_entry(torch.Tensor, core._multiarray_umath._ARRAY_API, np.ndarray,
                                 descrs)


def _ndarray() -> Entry:
    compiled = _compiled_to_numpy()
    if compiled is not None:
        return entry(compiled)

    def torch_to_numpy(x: Any) -> Any:
        # Tensor.numpy refuses requires_grad, conj/neg bits, non-CPU devices and
        # the types NumPy lacks; the full path detaches or copies those. Empty
        # tensors it gives zero strides, the full path NumPy's own.
        return x.numpy() if x.numel() else NotImplemented

    return entry(torch_to_numpy)


def _exporter(x: Any) -> Any:
    # CPU only (the full path copies device memory to the host, and says so). Not a
    # neg-bit view: torch's __dlpack__ exports its memory as it is, without the sign.
    # (A conj bit needs a complex type, which no consumer of this form takes.) Not
    # requires_grad: torch's export refuses it (the full path detaches), and the
    # detach below would not.
    if x.is_cpu and not x.is_neg() and not x.requires_grad:
        hold_storage(x)  # as the full path's to_hurray: resize_ must not free it
        # torch's capsule holds the tensor object it was asked of, whose storage
        # x.set_(y) or x.data = y would swap and free: a detached alias of its own
        # keeps this storage whatever happens to x.
        return x.detach()
    return NotImplemented


def _raw() -> Entry:
    # By torch dtype, the DLPack (code, bits) of each type and whether it is complex:
    # the conj bit exists on complex tensors only (torch asserts so), and asking the
    # others costs a tenth of the shortcut.
    codes = {tdt: (*d.dlpack, d.kind is Kind.COMPLEX) for d, tdt in DTYPES.items()
             if d.dlpack is not None}
    gpu_type = GPU_DEVICE_TYPE  # kDLCUDA, or kDLROCM under a ROCm torch

    def torch_raw(x: Any) -> Any:
        # What the full path's to_hurray reads: it detaches requires_grad tensors
        # (torch's export refuses them), materialises conj/neg bits (it exports them
        # raw) and takes the public API for pinned memory: all declined here.
        code = codes.get(x.dtype)
        if (code is None or x.requires_grad or x.is_neg() or (code[2] and x.is_conj())
                or x.ndim > MAX_RANK):
            return NotImplemented
        if x.is_cpu:
            if CAN_PIN and x.is_pinned():
                return NotImplemented
            # The storage is the owner, as the full path's to_hurray holds it.
            return (x.data_ptr(), tuple(x.shape), None if x.is_contiguous() else x.stride(),
                    code[0], code[1], _KDL_CPU, 0, hold_storage(x), None)
        if x.is_cuda:
            return (0, tuple(x.shape), None if x.is_contiguous() else x.stride(),
                    code[0], code[1], gpu_type, x.get_device(), x, x)
        return NotImplemented

    return entry(torch_raw)


def fast_import(tp: type) -> dict[str, Entry | None]:
    """A torch tensor as a host ndarray, a DLPack exporter and raw memory."""
    if tp is not torch.Tensor:
        return {}
    return {NDARRAY: _ndarray(), EXPORTER: entry(_exporter), RAW: _raw()}


_from_numpy = torch.from_numpy
_from_dlpack = torch.from_dlpack


def _from_ndarray(x: Any) -> Any:
    # torch.from_numpy refuses non-native byte order, negative strides and the types
    # it lacks; read-only arrays it accepts but warns in its own words, where the full
    # path warns in ours.
    return _from_numpy(x) if x.flags.writeable else NotImplemented


def _from_readonly_capsule(capsule: Any) -> Any:
    out = _from_dlpack(capsule)
    if out.numel():
        warn_readonly()  # the memory is immutable: the full path's notice, once
    return out


def fast_export() -> dict[str, Entry | None]:
    """A torch tensor from a read-only capsule (with the full path's read-only notice) or
    from a writable host ndarray (torch.from_numpy)."""
    return {READONLY_CAPSULE: entry(_from_readonly_capsule), NDARRAY: entry(_from_ndarray)}
