"""CuPy adapter: ``cupy.ndarray`` <-> ``hb.Tensor`` (CUDA device memory, zero-copy).

Both directions go through DLPack and never touch the data:

* ``to_hurray`` imports the array with :func:`hurray_bridge.tensor.from_dlpack`,
  which asks CuPy for no synchronisation (``stream=-1``: the bridge reads no
  device memory) and keeps the array as the tensor's *source*. A consumer that
  later imports the tensor has its ``stream`` forwarded to CuPy's
  ``__dlpack__``, which makes that stream wait for CuPy's current stream.
* ``from_hurray`` calls ``cupy.from_dlpack(t)``: CuPy passes its current stream,
  and the tensor forwards it to whoever produced the memory (torch, JAX, CuPy).

CuPy holds only CUDA memory (``cupy.from_dlpack`` rejects CPU capsules), so a
host tensor reaches CuPy through a reported host-to-device copy. Its dtypes are
NumPy's: the maps below are derived from the element-type table's NumPy column
(through the NumPy adapter), restricted to the DLPack type codes CuPy reads.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

import cupy
import numpy as np

from hurray_bridge._copy_policy import warn_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import from_hurray as host_from_hurray
from hurray_bridge._host import native_dtype as host_native_dtype
from hurray_bridge.descriptor import form_name
from hurray_bridge.dtypes import DLPACK_CODE, DType, all_dtypes
from hurray_bridge.errors import (
    BackendNotAvailableError,
    CopyRequiredError,
    UnsupportedError,
    not_a_tensor,
)
from hurray_bridge.tensor import Device, Tensor, from_dlpack

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "cupy"
"""The target name: ``hb.convert(x, "cupy")``."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. CuPy arrays have no read-only flag.
LEGACY_EXPORTS_MUTABLE = True
"""Whether CuPy's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory this framework exports stays valid while the export lives."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""
HOLDS = frozenset({"dense", "sparse"})
"""Dense arrays, and cupyx.scipy.sparse matrices (``.sparse``)."""
DEVICES = frozenset({int(DLDeviceType.kDLCUDA), int(DLDeviceType.kDLROCM)})
"""CUDA and ROCm devices (kDLCUDA, kDLROCM): host memory is copied to the device."""
fast_import = None
"""No hb.convert shortcut starts from a CuPy array (device memory takes the full path)."""
fast_export = None
"""No hb.convert shortcut ends in a CuPy array."""


_CUDA = int(DLDeviceType.kDLCUDA)
# CuPy imports managed memory directly (cupy/_core/dlpack.pyx).
_CUDA_MANAGED = int(DLDeviceType.kDLCUDAManaged)
# CUDA's per-thread default stream handle (cudaStreamPerThread), what CuPy passes as
# ``stream`` under Stream.ptds or CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1.
_PER_THREAD_STREAM = 2
# The DLPack version CuPy's importer implements (cupy/_core/dlpack.pyx IMPL_VER_*).
_CUPY_DLPACK_VERSION = (1, 0)

# DLPack type codes CuPy's importer maps to a dtype (cupy/_core/dlpack.pyx,
# ``_dlpack_to_cupy_array``). float8/float6/float4 codes and sub-byte integers have no
# CuPy dtype at all; bfloat16 only when CuPy enabled it (see _cupy_has_bfloat16).
# CuPy's dtypes are NumPy's: the NumPy adapter's table (ml_dtypes included) is the source.

_C = DLPACK_CODE
_CUPY_CODES = frozenset({_C.kDLInt, _C.kDLUInt, _C.kDLFloat, _C.kDLComplex, _C.kDLBool,
                         _C.kDLBfloat})


def _cupy_has_bfloat16() -> bool:
    # CuPy registers ml_dtypes.bfloat16 only when ml_dtypes is installed and NumPy >= 2.1.2
    # (cupy/cupy#9480, #9670); its DLPack module keeps the dtype it uses, None if disabled.
    try:
        from cupy._core import dlpack as cupy_dlpack
    except ImportError:  # pragma: no cover - CuPy always has it; stay safe on odd builds
        cupy_dlpack = None
    flag = getattr(cupy_dlpack, "bfloat16", Ellipsis)
    if flag is not Ellipsis:
        return flag is not None
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return False
    return np.lib.NumpyVersion(np.__version__) >= "2.1.2"


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, np.dtype], dict[np.dtype, DType]]:
    bf16 = _cupy_has_bfloat16()
    to_cp: dict[DType, np.dtype] = {}
    for d in all_dtypes():
        if d.dlpack is None or d.is_subbyte or d.dlpack[0] not in _CUPY_CODES:
            continue
        if d.dlpack[0] == _C.kDLBfloat and not bf16:
            continue
        try:
            to_cp[d] = host_native_dtype(d)
        except (UnsupportedError, BackendNotAvailableError):
            continue
    return to_cp, {v: k for k, v in to_cp.items()}


def _supported_names() -> str:
    return ", ".join(d.name for d in _tables()[0])


def native_dtype(dtype: DType) -> np.dtype:
    """The dtype a CuPy array of Hurray element type ``dtype`` has (a NumPy dtype)."""
    try:
        return _tables()[0][dtype]
    except KeyError:
        pass
    if dtype.name == "bfloat16":
        raise UnsupportedError(
            "CuPy has no bfloat16 here: CuPy enables it only when ml_dtypes is installed and "
            f"NumPy >= 2.1.2 (NumPy is {np.__version__}); install ml_dtypes or convert to "
            "torch or jax"
        )
    raise UnsupportedError(
        f"CuPy has no dtype for {dtype.name} (CuPy holds {_supported_names()}); "
        "convert it to torch or jax, or to numpy on the host"
    )


def dtype_of(dt: Any) -> DType:
    """The Hurray element type of a CuPy (NumPy) dtype."""
    dt = np.dtype(dt)
    try:
        return _tables()[1][dt]
    except KeyError:
        raise UnsupportedError(
            f"CuPy dtype {dt} has no Hurray element type (supported: {_supported_names()})"
        ) from None


# ---------------------------------------------------------------------- devices
def device_id_of(device: Any) -> int | None:
    """The CUDA device ordinal a ``device=`` argument names; ``None`` for "wherever it is".

    Accepts a ``cupy.cuda.Device``, an ``int``, ``"cuda"``/``"cuda:N"``, or a DLPack
    device (``hb.Device`` or a ``(device_type, id)`` tuple) of CUDA or CUDA-managed type.
    """
    if device is None:
        return None
    if isinstance(device, cupy.cuda.Device):
        return int(device.id)
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return int(device)
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind == "cuda" and (not index or index.isdigit()):
            return int(index) if index else int(cupy.cuda.runtime.getDevice())
    elif isinstance(device, tuple) and len(device) == 2:
        dev = Device(*device)
        if dev.type in (_CUDA, _CUDA_MANAGED):
            return int(dev.id)
    raise UnsupportedError(
        f"CuPy arrays live on CUDA devices; device={device!r} is not one "
        "(pass a cupy.cuda.Device, an int, 'cuda:N' or (2, N))"
    )


# --------------------------------------------------------------------- to Hurray
def _is_sparse(obj: Any) -> bool:
    return type(obj).__module__.startswith("cupyx.scipy.sparse")


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A ``cupy.ndarray`` as an hb.Tensor over its device memory (zero-copy unless ``copy=True``).

    ``copy=True`` copies on the array's device, on CuPy's current stream, and the
    tensor (``copied=True``) then owns the copy. Nothing else ever needs a copy:
    every CuPy layout (views, negative strides) is a Hurray strided layout.
    """
    if not isinstance(obj, cupy.ndarray):
        if _is_sparse(obj):
            raise UnsupportedError(
                f"{type(obj).__module__}.{type(obj).__qualname__} is a sparse matrix; the dense "
                "CuPy adapter does not take it: use hb.asarray / hb.convert, which route it to "
                "hurray_bridge.sparse"
            )
        raise UnsupportedError(
            f"the CuPy adapter converts cupy.ndarray, got {type(obj).__module__}."
            f"{type(obj).__qualname__}"
        )
    dtype_of(obj.dtype)  # a clear UnsupportedError before CuPy's own BufferError
    x = obj
    if copy:
        # ndarray.copy() copies to the *current* device: make that the array's own.
        with x.device:
            x = x.copy()
    try:
        t = from_dlpack(x)
    except BufferError as exc:
        raise UnsupportedError(f"CuPy refused to export a {obj.dtype} array: {exc}") from exc
    if copy:
        t._copied = True  # the tensor's memory is the copy made above
    return t


# ------------------------------------------------------------------- from Hurray
_relay_lock = threading.Lock()
_relay_streams: dict[int, Any] = {}


def _relay_stream(device_id: int) -> Any:
    # One non-blocking stream per device, created on first need and kept for the process.
    s = _relay_streams.get(device_id)
    if s is None:
        with _relay_lock:
            s = _relay_streams.get(device_id)
            if s is None:
                s = _relay_streams[device_id] = cupy.cuda.Stream(non_blocking=True)
    return s


def _import_device(t: Tensor, device_id: int) -> Any:
    """``cupy.from_dlpack(t)`` on ``device_id``, synchronised with CuPy's current stream."""
    with cupy.cuda.Device(device_id):
        current = cupy.cuda.get_current_stream()
        if current.ptr != _PER_THREAD_STREAM:
            # CuPy passes its current stream (1 for the legacy default one); the tensor
            # forwards it to the producer, which makes that stream wait for its work.
            return cupy.from_dlpack(t)
        # CuPy would pass 2 (the per-thread default stream), which torch refuses with
        # BufferError ("per-thread default stream is not supported", code: torch
        # Tensor.__dlpack__). Hand the producer a real stream instead and make the
        # per-thread stream wait for it: the same ordering, expressed with an event.
        relay = _relay_stream(device_id)
        capsule = t.__dlpack__(stream=relay.ptr, max_version=_CUPY_DLPACK_VERSION)
        current.wait_event(relay.record())
        return cupy.from_dlpack(capsule)  # CuPy accepts a bare capsule as well


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """An hb.Tensor as a ``cupy.ndarray``: a view of its device memory unless a copy is needed.

    ``device`` picks the CUDA device (see :func:`device_id_of`); a tensor on another
    device, or in host memory, is copied there (refused under ``copy=False``).
    CuPy has no read-only arrays: a read-only tensor arrives writable, as the DLPack
    standard asks of such consumers; keeping it unmodified is then the caller's task.
    """
    if not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if not t.is_dense:
        d = t.descriptor
        what = form_name(d)
        raise UnsupportedError(
            f"CuPy arrays are dense; a {what} tensor goes through hb.convert(t, 'cupy') "
            "(cupyx.scipy.sparse for sparse layouts) or hb.convert(..., densify=True)"
        )
    native_dtype(t.dtype)  # UnsupportedError naming the type before any exchange
    target = device_id_of(device)
    dev = t.device

    if dev.type == _CUDA or dev.type == _CUDA_MANAGED:
        here = dev.id
        if dev.type == _CUDA and target is not None and target != here:
            if copy is False:
                raise CopyRequiredError(
                    f"the tensor is on cuda:{here} and device=cuda:{target}: moving it is a copy, "
                    "but copy=False"
                )
            out = _import_device(t, here)
            with cupy.cuda.Device(target):
                out = out.copy()  # peer copy onto the current (target) device
            if copy is None:
                warn_copy(NAME, f"moved from cuda:{here} to cuda:{target} (device={device!r})")
            return out
        out = _import_device(t, here)
        if copy:
            with out.device:
                out = out.copy()
        return out

    if dev.is_host_accessible:
        if copy is False:
            raise CopyRequiredError(
                f"a {dev} tensor must be copied to the GPU for CuPy (CuPy arrays live in CUDA "
                "device memory), but copy=False"
            )
        host = host_from_hurray(t, copy=False)  # a view; keeps t alive while copying
        dst = target if target is not None else int(cupy.cuda.runtime.getDevice())
        with cupy.cuda.Device(dst):
            out = cupy.array(host, copy=True)
        if copy is None:
            warn_copy(NAME, f"{dev} memory copied to cuda:{dst} (CuPy holds device memory only)")
        return out

    raise UnsupportedError(
        f"CuPy cannot import {dev} memory (it reads CUDA and CUDA-managed memory); convert "
        "with the adapter of the framework that owns it"
    )


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type CuPy holds, with its dtype."""
    return dict(_tables()[0])


def special_kind(obj: Any) -> str | None:
    """None: every CuPy object ``to_hurray`` refuses stays refused (cupyx sparse matrices
    are told apart by their type before this adapter sees them)."""
    return None
