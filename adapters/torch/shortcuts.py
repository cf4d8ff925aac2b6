"""hb.convert shortcuts from torch tensors (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hurray_bridge._shortcuts import Entry, entry

from . import CAN_PIN, DTYPES, GPU_DEVICE_TYPE, hold_storage

__all__ = ["makers"]


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


def _to_numpy(tp: type) -> Entry | None:
    if tp is not torch.Tensor:
        return None
    compiled = _compiled_to_numpy()
    if compiled is not None:
        return entry(compiled)

    def torch_to_numpy(x: Any) -> Any:
        # Tensor.numpy refuses requires_grad, conj/neg bits, non-CPU devices and
        # the types NumPy lacks; the full path detaches or copies those. Empty
        # tensors it gives zero strides, the full path NumPy's own.
        return x.numpy() if x.numel() else NotImplemented

    return entry(torch_to_numpy)


def _to_arrow(tp: type) -> Entry | None:
    if tp is not torch.Tensor:
        return None
    import pyarrow as pa

    from_dlpack = pa.Array.from_dlpack

    def torch_to_arrow(x: Any) -> Any:
        # Rank 1 only (other ranks become Arrow tensors); CPU only (the full path
        # copies device memory to the host, and says so). Not a neg-bit view:
        # torch's __dlpack__ exports its memory as it is, without the sign. (A conj
        # bit needs a complex type, which Arrow refuses.) Not requires_grad: torch's
        # export refuses it (the full path detaches), and the detach below would not.
        if x.ndim == 1 and x.is_cpu and not x.is_neg() and not x.requires_grad:
            hold_storage(x)  # as the full path's to_hurray: resize_ must not free it
            # torch's capsule holds the tensor object it was asked of, whose storage
            # x.set_(y) or x.data = y would swap and free: a detached alias of its own
            # keeps this storage whatever happens to x.
            return from_dlpack(x.detach())
        return NotImplemented

    return entry(torch_to_arrow)


def _to_jax(tp: type) -> Entry | None:
    if tp is not torch.Tensor:
        return None
    from hurray_bridge._capsule import make_capsule
    from hurray_bridge.descriptor import MAX_RANK
    from hurray_bridge.dtypes import Kind
    from hurray_bridge.tensor import _COMPACT, _compact

    from ..jax import bool8_needs_normalising, import_obstacle, raw_import_types, raw_route

    try:
        if raw_route(1, 0) is None:
            return None  # this jaxlib has no raw import: the full path's public API
    except Exception:
        return None
    # By torch dtype, the DLPack (code, bits) of each type the full path hands to JAX's
    # import as it is, and whether it is complex: the conj bit exists on complex tensors
    # only (torch asserts so), and asking the others costs a tenth of the shortcut.
    types = raw_import_types()
    codes = {tdt: (*d.dlpack, d.kind is Kind.COMPLEX) for d, tdt in DTYPES.items()
             if d in types and d.dlpack is not None}
    gpu_type = GPU_DEVICE_TYPE  # kDLCUDA, or kDLROCM under a ROCm torch
    torch_bool = torch.bool

    def torch_to_jax(x: Any) -> Any:
        # The jax adapter's own decisions and calls (import_obstacle, raw_route), as its
        # from_hurray makes them for this tensor's hb.Tensor. The full path detaches
        # requires_grad tensors (torch's export refuses them), materialises conj/neg bits
        # (it exports them raw), copies CPU memory that JAX would not alias, and takes
        # the public API for pinned memory: all declined here.
        code = codes.get(x.dtype)
        if (code is None or x.requires_grad or x.is_neg() or (code[2] and x.is_conj())
                or x.ndim > MAX_RANK):
            return NotImplemented
        if x.is_cpu:
            if CAN_PIN and x.is_pinned():
                return NotImplemented
            shape = tuple(x.shape)
            given = None if x.is_contiguous() else x.stride()
            data = x.data_ptr()
            if import_obstacle(shape, given, 1, data) is not None and x.numel():
                return NotImplemented
            if x.dtype is torch_bool and bool8_needs_normalising(data, x.numel(), x):
                return NotImplemented  # JAX misreads such bytes: the full path normalises
            route = raw_route(1, 0)
            if route is None:
                return NotImplemented
            storage = hold_storage(x)  # as the full path's to_hurray: the owner
            # Compact strides, as the full path exports: torch's own may differ on
            # size-1 dimensions, and JAX would then pick another layout.
            strides = (_COMPACT.get(shape) or _compact(shape)) if given is None else given
            # Our capsule, not torch's: its deleter never asks for the GIL while the
            # interpreter exits (torch's does for memory Python owns, from_numpy's),
            # which an XLA thread releasing it then would turn into an abort.
            capsule = make_capsule(data=data, shape=shape, strides=strides, code=code[0],
                                   bits=code[1], device_type=1, device_id=0, flags=0,
                                   owner=storage, versioned=False)
            return route[0](capsule, route[1], None, None, 1)
        if x.is_cuda:
            if not x.is_contiguous() and import_obstacle(tuple(x.shape), x.stride(),
                                                         gpu_type) is not None:
                return NotImplemented  # the full path's refusal, in its words
            route = raw_route(gpu_type, x.get_device())
            if route is None:
                return NotImplemented
            raw, device, stream = route
            # The producer orders its pending work before JAX's stream (DLPack). Its
            # capsule, as the full path forwards: torch synchronises.
            return raw(x.__dlpack__(stream=stream), device, stream, None, gpu_type)
        return NotImplemented

    return entry(torch_to_jax)


def makers() -> dict[str, Callable[[type], Entry | None]]:
    """Target adapter -> maker of the shortcut for an exact source type (None: none)."""
    return {"numpy": _to_numpy, "arrow": _to_arrow, "jax": _to_jax}
