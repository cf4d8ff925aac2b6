"""PaddlePaddle adapter: ``paddle.Tensor`` <-> ``hb.Tensor``, over DLPack.

Both directions hand the memory over without a copy wherever Paddle can hold it as it
is. What PaddlePaddle 3.3.1 does that the adapter works around (each measured, each a
test in tests/adapters/paddle/):

* ``__dlpack_device__()`` says ``(kDLCPU, None)`` for a CPU tensor. The export never
  asks it: a CPU tensor is read from its pointer, shape and strides, with a DenseTensor
  sharing its allocation as the owner (Paddle can give the tensor object a new
  allocation, ``paddle.assign(bigger, output=x)``); other tensors through their
  versioned capsule, whose device is ``(kDLCPU, 0)`` on the host.
* ``paddle.from_dlpack`` ignores the READ_ONLY flag of a versioned capsule: the tensor it
  makes is writable and its writes reach the memory. A read-only hb.Tensor (a loaded
  file's, a JAX or Arrow export) therefore reaches Paddle as a copy, reported under
  ``copy=None`` and refused under ``copy=False``; never as the read-only memory itself.
* ``paddle.uint16`` is printed as ``paddle.bfloat16`` and ``paddle.to_tensor`` turns
  a NumPy uint16 array into bfloat16 zeros; uint16, uint32 and uint64 tensors have no
  kernels (not even ``full`` or ``add``). The adapter holds none of the three.
* A negative stride makes ``paddle.from_dlpack`` ask for an allocation of about 2**64
  bytes (MemoryError); such a tensor reaches Paddle as a compact copy.
* A rank above 9 is Paddle's own limit (``DDim``): refused before Paddle sees it.
* A ``paddle.bool`` byte other than 0x00 and 0x01 is read as neither false nor true
  (``sum([0, 1, 2, 255])`` is 258, ``logical_not`` of 2 is 3): host bool8 memory holding
  one reaches Paddle as a copy with those bytes made 0x01, as JAX gets it.
* A tensor that records gradients (``stop_gradient=False``) refuses ``__dlpack__``: it is
  read through ``detach()`` (the same memory), and its hb.Tensor is read-only, as a write
  would change what autograd computes with.

GPU memory (a CUDA build of Paddle) goes through the same DLPack calls with Paddle's
stream handling; this machine has no GPU and that path is untested here.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import paddle

from hurray_bridge import _capsule
from hurray_bridge._copy_policy import check_copy, require_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import clean_bool8
from hurray_bridge._host import from_hurray as host_from_hurray
from hurray_bridge.descriptor import form_name
from hurray_bridge.dtypes import DType, all_dtypes, bool8, bool_, dtype_from_name
from hurray_bridge.errors import UnsupportedError, not_a_tensor
from hurray_bridge.tensor import CPU, Device, Tensor, from_dlpack, from_dlview

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "paddle"
"""The target name: ``hb.convert(x, "paddle")``."""
# Measured on 3.3.1: Paddle's capsules (legacy and versioned) point at the tensor's own
# memory, the versioned one without READ_ONLY, and a consumer's writes through a legacy
# capsule show in the Paddle tensor. Paddle tensors have no read-only state.
LEGACY_EXPORTS_MUTABLE = True
"""Whether Paddle's legacy DLPack capsules carry mutable memory (measured: they do)."""
# The export holds Paddle's allocation (its capsule owns a reference to it): Paddle frees
# nothing under a live export, so there is nothing to hold beforehand.
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory Paddle exports stays valid while the export lives."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""
HOLDS = frozenset({"dense"})
"""Dense tensors only (Paddle's sparse tensors have no DLPack form)."""

_CPU = int(DLDeviceType.kDLCPU)
_CUDA = int(DLDeviceType.kDLCUDA)
_CUDA_HOST = int(DLDeviceType.kDLCUDAHost)
DEVICES = frozenset({_CPU, _CUDA} if paddle.is_compiled_with_cuda() else {_CPU})
"""The host, and CUDA devices where this Paddle build has CUDA (kDLCPU, kDLCUDA)."""
fast_import = None
"""No hb.convert shortcut starts from a Paddle tensor (each takes the full path)."""
fast_export = None
"""No hb.convert shortcut ends in a Paddle tensor."""

MAX_RANK = 9
"""Paddle's largest rank (its ``DDim``: "only supports access to dimension 0 to 9")."""

# Element types Paddle has a DataType for but no kernels (see the module docstring).
_NO_KERNELS = frozenset({"uint16", "uint32", "uint64"})
_READONLY_WHY = ("Paddle ignores DLPack's READ_ONLY flag (its tensor would write the "
                 "read-only memory)")
_NEGATIVE_WHY = "Paddle cannot hold negative strides (its DLPack import fails on them)"
_BOOL8_WHY = ("bool8 bytes other than 0x00 and 0x01, which Paddle reads as neither false nor "
              "true, are made 0x01 in a copy")


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, Any], dict[Any, DType]]:
    # Paddle names its types as the element-type table does; the ones it lacks (float8
    # fnuz, e8m0, sub-byte types) are not attributes of the module.
    to_pd: dict[DType, Any] = {}
    for d in all_dtypes():
        if d.dlpack is None or d.is_subbyte or d.name in _NO_KERNELS:
            continue
        native = getattr(paddle, "bool" if d is bool8 else d.name, None)
        if isinstance(native, paddle.dtype):
            to_pd[d] = native
    return to_pd, {v: k for k, v in to_pd.items()}


def _held() -> str:
    return ", ".join(d.name for d in _tables()[0])


def native_dtype(dtype: DType) -> Any:
    """The Paddle dtype of a Hurray element type."""
    try:
        return _tables()[0][dtype]
    except KeyError:
        pass
    if dtype.name in _NO_KERNELS:
        raise UnsupportedError(
            f"Paddle {paddle.__version__} cannot hold {dtype.name}: its {dtype.name} has no "
            "kernels (no arithmetic, not even paddle.full), and paddle.uint16 is reported as "
            "bfloat16. Cast the values to a signed type wide enough for them first (int64 "
            "holds every uint32), or convert them to numpy or torch instead")
    if dtype is bool_:
        raise UnsupportedError("Paddle has no 1-bit bool; from_hurray unpacks it to "
                               "paddle.bool (a copy)")
    raise UnsupportedError(f"Paddle {paddle.__version__} has no dtype for {dtype.name} "
                           f"(it holds {_held()}); convert it to numpy, torch or jax instead")


def dtype_of(dt: Any) -> DType:
    """The Hurray element type of a Paddle dtype."""
    try:
        return _tables()[1][dt]
    except (KeyError, TypeError):
        pass
    name = str(dt).removeprefix("paddle.").lower()
    if isinstance(dt, paddle.dtype):
        name = dt.name.lower()  # paddle.uint16 prints as bfloat16: its enum name is right
    if name in _NO_KERNELS:
        native_dtype(dtype_from_name(name))  # its refusal names the fix
    raise UnsupportedError(f"Paddle dtype {dt} has no Hurray element type (supported: "
                           f"{_held()})")


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type Paddle holds, with its dtype."""
    return dict(_tables()[0])


def special_kind(obj: Any) -> str | None:
    """None: the adapter takes dense tensors only, and every refusal stands."""
    return None


# --------------------------------------------------------------------- to Hurray
def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A ``paddle.Tensor`` as an hb.Tensor over its memory (zero-copy unless ``copy=True``)."""
    if not isinstance(obj, paddle.Tensor):
        raise UnsupportedError(
            f"the Paddle adapter converts paddle.Tensor, got {type(obj).__module__}."
            f"{type(obj).__qualname__}")
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    dtype_of(obj.dtype)  # the refusal names the type before Paddle's own errors
    x = obj
    tracked = not x.stop_gradient
    if tracked:
        x = x.detach()  # Paddle refuses __dlpack__ of a tensor that records gradients
    place = x.place
    if place.is_cpu_place() and not copy:
        t = _host_view(x, obj.dtype)
        if t is not None:
            if tracked:
                t._readonly = True
            return t
    if place.is_gpu_place():
        t = from_dlpack(x, copy=copy)
    elif place.is_cpu_place() or place.is_cuda_pinned_place():
        # The capsule says (kDLCPU, 0); __dlpack_device__ would say (kDLCPU, None).
        view = _capsule.consume_capsule(x.__dlpack__(max_version=(1, 0)))
        t = from_dlview(view)
        if copy:
            t = t.copy()
    else:
        raise UnsupportedError(f"a Paddle tensor on {place} cannot be converted: the adapter "
                               "takes CPU and CUDA tensors; move it with x.cpu() first")
    if tracked and not copy:
        t._readonly = True  # a write would bypass autograd; x.detach() shares it writable
    return t


def _host_view(x: Any, dt: Any) -> Tensor | None:
    """A CPU tensor as an hb.Tensor read from its pointer, shape and strides (~5x faster
    than consuming its DLPack capsule in Python), or None where this Paddle lacks the
    calls it needs (the capsule path then serves).

    The owner is a DenseTensor sharing ``x``'s allocation, not ``x``: Paddle replaces a
    tensor's allocation under the same object (``paddle.assign(bigger, output=x)``), and
    the shared one keeps the exported memory alive, as the capsule's owner does.
    """
    try:
        holder = _DenseTensor()
        holder._share_data_with(x.get_tensor())
    except Exception:  # a Paddle without these (private) calls
        return None
    shape = tuple(x.shape)
    strides = None if x.is_contiguous() else tuple(x.strides)
    return Tensor._dense(x.data_ptr(), shape, _tables()[1][dt], strides=strides, padded=False,
                         device=CPU, owner=holder, readonly=False, copied=False)


_DenseTensor: Any = getattr(getattr(paddle, "base", None), "core", None)
_DenseTensor = getattr(_DenseTensor, "DenseTensor", None)


# ------------------------------------------------------------------- from Hurray
def _place(device: Any) -> Any:
    """The Paddle place ``device`` names, or None for "where the tensor is"."""
    if device is None:
        return None
    if isinstance(device, (paddle.CPUPlace, paddle.CUDAPlace, paddle.CUDAPinnedPlace)):
        return device
    if isinstance(device, tuple) and len(device) == 2:
        d = Device(*device)
        if d.is_host_accessible:
            return paddle.CPUPlace()
        if d.type == _CUDA:
            device = f"gpu:{d.id}"
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cpu" and not index:
            return paddle.CPUPlace()
        if kind in ("gpu", "cuda") and (not index or index.isdigit()):
            if not paddle.is_compiled_with_cuda():
                raise UnsupportedError(f"device={device!r}: Paddle {paddle.__version__} here "
                                       "is built without CUDA; use device='cpu' (or None)")
            return paddle.CUDAPlace(int(index or 0))
    raise UnsupportedError(f"device must be None, 'cpu', 'gpu:N', a Paddle place or an "
                           f"hb.Device; got {device!r}")


def _same_place(t: Tensor, place: Any) -> bool:
    if isinstance(place, paddle.CPUPlace):
        return t.device.is_host_accessible
    return t.device.type == _CUDA and t.device.id == place.get_device_id()


def _needs_normalising(t: Tensor) -> bool:
    """Whether host bool8 ``t`` holds a byte other than 0x00 and 0x01 (one NumPy pass)."""
    return bool(host_from_hurray(t, copy=False).view(np.uint8).max() > 1)


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """An hb.Tensor as a ``paddle.Tensor``: a view of its memory unless a copy is needed.

    A copy is needed for read-only memory (Paddle would write it), negative strides, 1-bit
    bool (unpacked to ``paddle.bool``) and bool8 bytes other than 0 and 1; under
    ``copy=None`` each is reported with a CopyWarning, under ``copy=False`` refused.
    ``device`` (``"cpu"``, ``"gpu:N"``, a Paddle place, an hb.Device) moves the result: a
    copy unless the tensor is there already.
    """
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if not t.is_dense:
        raise UnsupportedError(f"Paddle takes dense tensors; a {form_name(t.descriptor)} "
                               "tensor needs hb.convert(..., densify=True)")
    shape = t.shape
    if len(shape) > MAX_RANK:
        raise UnsupportedError(
            f"Paddle holds at most {MAX_RANK} dimensions and this tensor has {len(shape)} "
            f"(shape {list(shape)}); reshape it to {MAX_RANK} or fewer first")
    place = _place(device)
    host = t.device.is_host_accessible
    if not host and t.device.type != _CUDA:
        raise UnsupportedError(f"Paddle cannot import {t.device} memory (it takes host and "
                               "CUDA memory); copy it to the host in its own framework first")
    move = place is not None and not _same_place(t, place)
    if move:
        require_copy(copy, NAME, f"moving a {t.device} tensor to {place}",
                     refusal=f"moving a {t.device} tensor to {place} is a copy, but copy=False")
    if t.dtype is bool_:
        if not host:
            raise UnsupportedError(f"1-bit bool on {t.device} cannot reach Paddle: the bridge "
                                   "unpacks host memory only")
        if not t.nbytes:  # nothing to unpack, and no allocation for nothing
            out = paddle.zeros(list(shape), dtype=paddle.bool)
            return out.to(place) if move else out
        if not move:
            require_copy(copy, NAME, "1-bit packed bool unpacked to paddle.bool",
                         refusal="1-bit packed bool must be unpacked to paddle.bool (one byte "
                                 "per element), which is a copy, but copy=False")
        out = paddle.from_dlpack(host_from_hurray(t, copy=True))
        return out.to(place) if move else out
    native_dtype(t.dtype)  # refuses, naming the type, what Paddle cannot hold
    if not host:
        out = paddle.from_dlpack(t, copy=True) if copy and not move else paddle.from_dlpack(t)
        return out.to(place) if move else out

    reasons = []
    if t.nbytes:
        if t.readonly and not copy and not move:  # a move copies: nothing writes t
            reasons.append(_READONLY_WHY)
        strides = t.strides
        if strides is not None and any(s < 0 and d > 1 for d, s in zip(shape, strides)):
            reasons.append(_NEGATIVE_WHY)
        if t.dtype is bool8 and _needs_normalising(t):
            reasons.append(_BOOL8_WHY)
    if reasons and not copy and not move:
        why = "; ".join(reasons)
        require_copy(copy, NAME, why, refusal=f"Paddle would need a copy: {why}; copy=False")
    src = t.copy() if (reasons or copy) and t.nbytes else t
    if _BOOL8_WHY in reasons:
        clean_bool8(src)  # src is a compact copy of its own
    # Only an empty tensor, which has no memory to write, reaches here read-only.
    out = paddle.from_dlpack(src.__dlpack__(max_version=(1, 0)))
    return out.to(place) if move else out
