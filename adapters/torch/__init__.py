"""PyTorch adapter: ``torch.Tensor`` <-> ``hb.Tensor``.

To Hurray, a tensor is read from ``data_ptr()``, ``shape``, ``stride()`` and
``dtype`` directly: no DLPack round trip, and no ``__dlpack__`` refusals
(torch's export rejects ``requires_grad`` and conj-bit tensors, which a
read of the pointer does not need to). From Hurray, ``torch.from_dlpack``
imports the memory zero-copy; what torch's DLPack import refuses or would
misread is handed over as a byte view and re-typed with ``Tensor.view``.

``torch.float4_e2m1fn_x2`` is a packed container: each element is one byte
holding two fp4 values, the first in the low nibble (torch's own unpacker,
``torch.onnx._internal.exporter._type_casting.unpack_float4x2_as_uint8``, and
the pack helper of ``torch.testing._internal.common_quantized`` agree; the
ordering was fixed in torchao, pytorch/ao#2939 and #3123). Its Hurray form is
packed ``float4_e2m1fn`` with the last dimension doubled, which is exactly the
row-major LSB-first packing of the format, so both directions are zero-copy.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch

from hurray_bridge import _exchange, _subbyte
from hurray_bridge._copy_policy import check_copy, require_copy, user_stacklevel, warn_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._memory import host_array, write_protected
from hurray_bridge.descriptor import MAX_RANK
from hurray_bridge.dtypes import DType, Kind, bool_, float4_e2m1fn, native_types, uint8
from hurray_bridge.errors import CopyRequiredError, FormatError, UnsupportedError, not_a_tensor
from hurray_bridge.tensor import CPU, Device, Tensor, from_dlpack

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "torch"
"""The target name: ``hb.convert(x, "torch")``."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. torch has no read-only tensors: its
# memory is the caller's to write.
LEGACY_EXPORTS_MUTABLE = True
"""Whether torch's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""

_LATER = ("the dense torch adapter takes strided tensors only; sparse and quantized tensors "
          "go through hb.asarray / hb.convert (hurray_bridge.sparse, hurray_bridge.quant)")
_READONLY_MESSAGE = ("torch tensor shares read-only memory; torch cannot mark it read-only, "
                     "and a write through it changes that memory for every other view of it "
                     "(pass copy=True for a writable copy)")
_readonly_warned = False  # torch.from_numpy warns once per process too (TORCH_WARN_ONCE)
_PROTECTED = ("the memory is mapped read-only or belongs to an immutable Python object "
              "(bytes), and a torch tensor cannot be read-only: a write through one would kill "
              "the process or change that object, so torch gets a copy")

# Plain ints, not enum members: the hand-offs compare them on every call.
_KDL_CPU, _KDL_CUDA, _KDL_CUDA_HOST, _KDL_ROCM, _KDL_ROCM_HOST, _KDL_ONEAPI = (
    int(DLDeviceType.kDLCPU), int(DLDeviceType.kDLCUDA), int(DLDeviceType.kDLCUDAHost),
    int(DLDeviceType.kDLROCM), int(DLDeviceType.kDLROCMHost), int(DLDeviceType.kDLOneAPI))
_IS_HIP = torch.version.hip is not None
GPU_DEVICE_TYPE = _KDL_ROCM if _IS_HIP else _KDL_CUDA
"""The DLPack device type of this torch's GPU memory: kDLCUDA (2), or kDLROCM (10) under ROCm."""
_PINNED_TYPE = _KDL_ROCM_HOST if _IS_HIP else _KDL_CUDA_HOST
_CPU_DEVICE = torch.device("cpu")
_STRIDED = torch.strided
_COMPLEX = Kind.COMPLEX
# On the CPU-only wheels every is_pinned() answers False, and the call costs a fifth of
# an export: it is skipped there.
CAN_PIN = (torch.version.cuda is not None or torch.version.hip is not None
           or not torch.__version__.endswith("+cpu"))
"""Whether this torch build can pin host memory (one with CUDA or ROCm): only then does
``to_hurray`` ask a CPU tensor whether it is pinned."""


def _resolve(name: str) -> Any:
    dt = getattr(torch, name, None)
    return dt if isinstance(dt, torch.dtype) else None


def _tables() -> tuple[dict[DType, torch.dtype], dict[torch.dtype, DType]]:
    to_torch = native_types("torch", _resolve)
    return to_torch, {v: k for k, v in to_torch.items()}


# Unpacked to a private name first: a docstring documents a plain assignment only.
_DTYPES, _FROM_TORCH = _tables()
DTYPES = _DTYPES
"""Hurray element type -> torch dtype, for every type this torch holds (float4_e2m1fn ->
the ``float4_e2m1fn_x2`` container). Read it, never change it."""
_TO_TORCH = DTYPES  # the adapter's own (and its tests') name
# By tag: hashing a DType hashes every field (two enums with a Python-level __hash__).
_BY_TAG = {d.tag: v for d, v in _TO_TORCH.items()}
_FP4_X2 = _TO_TORCH.get(float4_e2m1fn)  # torch.float4_e2m1fn_x2 (torch >= 2.8)

def _numpy_route() -> dict[int, Any]:
    """Tag -> NumPy dtype, for the types ``torch.from_numpy`` turns into the same torch dtype.

    Host memory reaches torch through a NumPy view of it (see from_hurray): NumPy is
    used only when torch itself loaded it, and only for types checked here once.
    """
    np = sys.modules.get("numpy")
    route: dict[int, Any] = {}
    if np is None:
        return route
    for d, tdt in _TO_TORCH.items():
        module, _, name = (d.numpy or "").partition(":")
        if d.bits < 8 or module != "numpy" or not hasattr(np, name):
            continue
        npdt = np.dtype(getattr(np, name))
        try:
            ok = torch.from_numpy(np.empty(1, npdt)).dtype == tdt
        except (TypeError, RuntimeError):
            continue
        if ok:
            route[d.tag] = npdt
    return route


_NUMPY_ROUTE = _numpy_route()
_np = sys.modules.get("numpy")
_frombuffer: Any = None if _np is None else _np.frombuffer
_from_numpy = torch.from_numpy
_torch_frombuffer = torch.frombuffer

# Element types torch holds but whose DLPack import it refuses: imported as a uint8
# view and re-typed. float8 import arrived after 2.9 (DLConvertor's getDLDataType
# said "not supported by dlpack"); an entry is added the first time torch refuses one.
_BYTE_VIEW: set[DType] = set()


def native_dtype(dtype: DType) -> torch.dtype:
    """The torch dtype of a Hurray element type (``float4_e2m1fn`` -> ``float4_e2m1fn_x2``)."""
    try:
        return _TO_TORCH[dtype]
    except KeyError:
        raise UnsupportedError(
            f"torch {torch.__version__} has no dtype for {dtype.name}"
        ) from None


def dtype_of(dt: torch.dtype) -> DType:
    """The Hurray element type of a torch dtype."""
    try:
        return _FROM_TORCH[dt]
    except KeyError:
        raise _unsupported_dtype(dt) from None


def _unsupported_dtype(dt: torch.dtype) -> UnsupportedError:
    name = str(dt).removeprefix("torch.")
    if dt.is_complex:  # complex32 (chalf): no Hurray type
        why = "Hurray has no complex32 element type; convert with x.to(torch.complex64)"
    elif name.startswith(("q", "quint")):
        why = _LATER
    elif name.startswith(("int", "uint", "bits")):
        # int1..7/uint1..7 are shell dtypes for tensor subclasses (pytorch/pytorch#117208):
        # their storage is one byte per element and its meaning belongs to the subclass.
        why = "it is a shell dtype whose packing only its tensor subclass knows"
    else:
        why = "it has no Hurray element type"
    return UnsupportedError(
        f"torch dtype {dt} cannot be converted to hb.Tensor: {why} (supported: "
        f"{', '.join(sorted(str(d).removeprefix('torch.') for d in _FROM_TORCH))})"
    )


# --------------------------------------------------------------------- to Hurray
def hold_storage(x: torch.Tensor) -> Any:
    """Make the storage under ``x``, a CPU tensor about to be shared, non-resizable, and
    return it: the export's owner.

    ``resize_()`` of any tensor on that storage reallocates it and frees the old memory,
    which a zero-copy export of it would go on reading (and ``hb.dumps`` writing into a
    file). torch refuses to resize a non-resizable storage (``RuntimeError``), which is
    how ``Tensor.numpy()`` keeps its arrays valid; every zero-copy export of a CPU tensor
    the bridge makes does the same, before it hands the memory out. Like ``x.numpy()``'s,
    the mark is permanent. Costs one storage read once the mark is set, a NumPy array
    the first time. Without NumPy torch has no call that sets it: the export goes ahead
    unmarked (docs/impl/c-ffi.md §8.1).

    The storage, not ``x``, keeps the memory alive: ``x.set_(y)`` or ``x.data = y`` swaps
    the storage under the same tensor object and frees the old one (``Tensor.numpy()``'s
    arrays hold the storage too).
    """
    storage = x.untyped_storage()
    if storage.resizable():
        _freeze(x, storage)
    return storage


HOLD_HOST_MEMORY = hold_storage
"""Called with a CPU tensor before ``hb.from_dlpack`` shares its memory: :func:`hold_storage`
(torch's ``resize_`` would otherwise free the memory under the export)."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""
HOLDS = frozenset({"dense", "sparse", "quantized", "sharded"})
"""Dense tensors, sparse layouts, quantized tensors (``.quant``) and DTensors (``.shards``)."""
DEVICES = frozenset({_KDL_CPU, GPU_DEVICE_TYPE})
"""The host and the GPUs of this torch build (kDLCUDA, or kDLROCM under ROCm)."""



def _freeze(x: torch.Tensor, storage: Any) -> None:
    # Tensor.numpy() is torch's one public call that sets the mark (on the storage, so
    # on every tensor over it). It refuses the types NumPy lacks (bfloat16, float8) and
    # shapes NumPy cannot hold (an empty [2**61, 0]): a byte tensor over the same
    # storage then takes it.
    try:
        x.numpy()
        return
    except (TypeError, RuntimeError, ValueError):
        pass
    try:
        torch.empty(0, dtype=torch.uint8).set_(storage).numpy()
    except RuntimeError:  # "Numpy is not available"
        if sys.modules.get("numpy") is not None:
            raise


def _refusal(x: torch.Tensor) -> UnsupportedError:
    """Why a torch tensor has no Hurray form: its layout, dtype (quantized or not) or nesting.

    Checked in that order, so that a tensor wrong in several ways is named by the first.
    """
    if x.layout is not _STRIDED:
        return UnsupportedError(f"torch layout {x.layout}: {_LATER}")
    if _FROM_TORCH.get(x.dtype) is None:
        if x.is_quantized:
            return UnsupportedError(
                f"quantized torch tensor ({x.dtype}, qscheme {x.qscheme()}): {_LATER}"
            )
        return _unsupported_dtype(x.dtype)
    return UnsupportedError("nested (ragged) torch tensors have no Hurray form")


def _materialised(x: torch.Tensor, copy: bool | None) -> torch.Tensor:
    """The values behind a lazy conj/neg bit, resolved into new memory (a copy), if allowed."""
    bit = "conj" if x.is_conj() else "neg"
    # No warning here: hb.convert reports a source that was copied (t.copied).
    require_copy(copy, None, f"torch tensor has its {bit} bit set", refusal=(
        f"torch tensor has its {bit} bit set: its values must be materialised (a copy) "
        "but copy=False; call x.resolve_conj() first"))
    return x.resolve_conj().resolve_neg()


def _other_device(x: torch.Tensor, copy: bool | None, copied: bool, tracked: bool) -> Tensor:
    """A tensor neither on the CPU nor CUDA (xpu, mps...): through torch's own DLPack export,
    which knows those devices' mapping; a meta tensor is refused (no data)."""
    if x.is_meta:
        raise UnsupportedError("a torch meta tensor has no data to convert")
    if copy and not copied:
        x = x.clone(memory_format=torch.contiguous_format)
    t = from_dlpack(x)
    if copied or copy:
        t._copied = True
    elif tracked:
        _share_tracked(t)
    return t


def _fp4_unpacked(x: torch.Tensor, ndim: int, copy: bool | None
                  ) -> tuple[torch.Tensor, tuple[int, ...], bool]:
    """float4_e2m1fn_x2 as packed float4_e2m1fn: (the tensor, its fp4 shape, whether copied).

    Hurray packs sub-byte types across the whole tensor, so a strided x2 tensor is made
    contiguous (a copy) first, and a rank-0 one has no dimension to double.
    """
    if ndim == 0:
        raise UnsupportedError(
            "a rank-0 torch.float4_e2m1fn_x2 tensor holds two fp4 values but has no "
            "dimension to double; reshape it to (1,) first"
        )
    copied = False
    if not x.is_contiguous():
        require_copy(copy, None, "non-contiguous torch.float4_e2m1fn_x2", refusal=(
            f"non-contiguous torch.float4_e2m1fn_x2 (strides {x.stride()}) must be made "
            "contiguous (a copy) to become packed float4_e2m1fn, but copy=False"))
        x = x.contiguous()
        copied = True
    shape = x.shape
    return x, (*shape[:-1], shape[-1] * 2), copied


def _data_ptr(x: torch.Tensor, obj: Any) -> int:
    """The address of x's memory; refused where there is none to share (fake and wrapper
    tensors)."""
    try:
        ptr = x.data_ptr()
    except RuntimeError as exc:  # FakeTensor, functional wrappers: no real storage
        raise UnsupportedError(f"torch tensor has no accessible storage: {exc}") from exc
    if not ptr and x.numel():
        # A wrapper subclass (a DTensor: its memory is its local shard) has no data at 0.
        raise UnsupportedError(_no_memory(obj))
    return ptr


def _asked_copy(x: torch.Tensor, ptr: int, shape_t: tuple[int, ...], dtype: DType,
                strides: Any, device: Device, on_gpu: bool, source: Any) -> Tensor:
    """copy=True of memory not yet copied: a clone on the GPU, hb's own copy on the host."""
    if on_gpu:
        x = x.clone(memory_format=torch.contiguous_format)
        return Tensor._dense(x.data_ptr(), shape_t, dtype, strides=None, padded=False,
                             device=device, owner=x, readonly=False, copied=True,
                             source=None if source is None else x)
    t = Tensor._dense(ptr, shape_t, dtype, strides=strides, padded=False, device=device,
                      owner=x, readonly=False, copied=False)
    return t.copy()


def _to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A torch tensor as an hb.Tensor over the same memory; zero-copy unless ``copy=True``.

    Autograd never travels: a ``requires_grad`` tensor is read through
    ``detach()`` (same memory), and its hb.Tensor is read-only, since a write would
    change what autograd computes with (see :func:`from_hurray` for torch itself).
    Conj/neg-bit tensors are materialised (a copy).
    """
    if not isinstance(obj, torch.Tensor):
        raise UnsupportedError(
            f"expected a torch.Tensor, got {type(obj).__module__}.{type(obj).__qualname__}"
        )
    x = obj
    dtype = _FROM_TORCH.get(x.dtype)
    if x.layout is not _STRIDED or dtype is None or x.is_nested:
        raise _refusal(x)
    tracked = x.requires_grad
    if tracked:
        x = x.detach()  # same memory, no autograd history
    copied = False
    # The conj bit exists on complex tensors only (torch asserts so): is_conj() is asked
    # of those alone, a third of the checks' cost for every other tensor.
    if (dtype.kind is _COMPLEX and x.is_conj()) or x.is_neg():
        # The lazy conjugate/negation bits describe values that are not in memory.
        x = _materialised(x, copy)
        copied = True
    shape_t = tuple(x.shape)
    ndim = len(shape_t)
    if ndim > MAX_RANK:
        raise FormatError(
            f"torch tensor has rank {ndim}; a Hurray tensor has at most {MAX_RANK} "
            "dimensions (ADR-008); reshape it first", field="shape",
        )
    # (x.is_cpu/is_cuda cost a sixth of x.device.type.)
    on_gpu = False
    if x.is_cpu:
        # torch reports pinned host memory as kDLCUDAHost (torch Tensor.__dlpack_device__);
        # it is host memory all the same.
        device = Device(_PINNED_TYPE, 0) if CAN_PIN and x.is_pinned() else CPU
        source = None
    elif x.is_cuda:
        on_gpu = True
        device = Device(GPU_DEVICE_TYPE, x.get_device())
        source = x  # exports forward to torch, which synchronises with the consumer's stream
    else:
        return _other_device(x, copy, copied, tracked)
    if dtype is float4_e2m1fn:
        x, shape_t, fp4_copied = _fp4_unpacked(x, ndim, copy)
        copied = copied or fp4_copied
        strides = None
        source = None  # torch would export the x2 container, not this float4 view
    else:
        strides = None if x.is_contiguous() else x.stride()
    ptr = _data_ptr(x, obj)
    if copy and not copied:
        return _asked_copy(x, ptr, shape_t, dtype, strides, device, on_gpu, source)
    owner: Any = x
    if not (on_gpu or copied):
        # host memory shared from here on: resize_ must not free it, nor set_ drop it
        owner = hold_storage(x)
    if tracked and not copied:
        # Autograd's memory: read-only to every consumer, and marked for torch (from_hurray).
        return Tensor._dense(ptr, shape_t, dtype, strides=strides, padded=False, device=device,
                             owner=_Tracked(x), readonly=True, copied=False, source=source)
    return Tensor._dense(ptr, shape_t, dtype, strides=strides, padded=False, device=device,
                         owner=owner, readonly=False, copied=copied, source=source)


def special_kind(obj: Any) -> str | None:
    """Which kind converts a torch tensor this adapter refuses: ``"sharded"`` (a DTensor,
    ``.shards``), ``"sparse"`` (a non-strided layout), ``"quantized"`` (a quantized tensor,
    ``.quant``), or None (the refusal stands)."""
    if not isinstance(obj, torch.Tensor):
        return None
    dt = sys.modules.get("torch.distributed.tensor")  # imported only by DTensor users
    if dt is not None and isinstance(obj, dt.DTensor):
        return "sharded"
    if obj.layout is not torch.strided:
        return "sparse"
    if obj.is_quantized:
        return "quantized"
    return None


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type torch holds, with its dtype."""
    return dict(_DTYPES)


def _no_memory(obj: Any) -> str:
    dt = sys.modules.get("torch.distributed.tensor")
    if dt is not None and isinstance(obj, dt.DTensor):
        return ("a torch DTensor is a global tensor spread over processes; the dense adapter "
                "takes plain tensors: hb.asarray(x) gives this process's part as a partial "
                "hb.ShardedTensor (hurray_bridge.adapters.torch.shards), x.to_local() the "
                "local tensor")
    return (f"torch tensor of type {type(obj).__qualname__} reports no memory (data_ptr() is 0 "
            "for a non-empty tensor): a wrapper subclass has no data of its own to share")


def _sample(dt: torch.dtype) -> torch.Tensor | None:
    """A one-element tensor of ``dt`` (a byte view for the shell dtypes), or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # complex32 is "experimental"
        try:
            return torch.empty(1, dtype=dt)
        except (RuntimeError, TypeError):
            pass
        try:
            return torch.empty(8, dtype=torch.uint8).view(dt)
        except (RuntimeError, TypeError):
            return None


def _register_compiled() -> str | None:
    """Let the compiled import fronts (hb.asarray, to_hurray) read plain torch tensors
    through torch's DLPack C exchange API; None when they do, else why not.

    What they take is what the Python path above reads without a detach, copy or
    refusal, and they build the same hb.Tensor (owner: the tensor's storage). Everything
    else declines to the Python path: requires_grad (detached, read-only), conj/neg
    bits (the table hands over their memory raw), torch dtypes without a Hurray type
    or sharing a DLPack code with one (torch.int1 ... int7 export as int8: the dtype
    decides), the x2 fp4 container, other devices, subclasses (another type).
    """
    if getattr(torch.Tensor, "__dlpack_c_exchange_api__", None) is None:
        return "this torch publishes no DLPack C exchange API (torch >= 2.10 does)"
    samples = []
    for dt in sorted({getattr(torch, n) for n in dir(torch)
                      if isinstance(getattr(torch, n, None), torch.dtype)}, key=str):
        mapped = _FROM_TORCH.get(dt)
        samples.append((dt, _sample(dt), None if dt is _FP4_X2 else mapped))
    probe = torch.zeros(3, 1, 4)[:, :, ::2]  # a size-1 dimension whose stride is not 1
    return _exchange.register(
        torch.Tensor, samples=samples, probe=(probe, probe.stride()),
        decline_attrs=("requires_grad",), decline_methods=("is_neg",),
        complex_methods=("is_conj",), pinned_method="is_pinned" if CAN_PIN else None,
        pinned_device=Device(_PINNED_TYPE, 0), gpu_type=GPU_DEVICE_TYPE, max_rank=MAX_RANK,
        host_hold=("untyped_storage", "resizable", _freeze))


# The compiled front reads only exact torch.Tensor objects, and only when registered;
# every other call is the Python function (to_hurray.__wrapped__), under its public name
# (its argument errors say "to_hurray()").
_to_hurray.__name__ = _to_hurray.__qualname__ = "to_hurray"
to_hurray = _exchange.front(_to_hurray)
COMPILED_IMPORT = _exchange.compiled and _register_compiled() is None


class _Tracked:
    """The owner of an hb.Tensor over a torch tensor that requires grad (detached here).

    Its hb.Tensor is read-only; torch, which has no read-only tensors, gets a copy of
    it (:func:`from_hurray`) so that no write can change what autograd computes with.
    """

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _share_tracked(t: Tensor) -> Tensor:
    """Mark ``t``, a zero-copy view of memory autograd tracks, read-only and owned so."""
    t._readonly = True
    t._owner = _Tracked(t._owner)
    return t


def _tracked(t: Tensor) -> bool:
    """Whether ``t`` (or the hb.Tensor it is a view of) is memory autograd tracks."""
    o: Any = t
    for _ in range(16):  # views of views: rewraps, quantized and sparse parts
        o = o._owner
        if type(o) is _Tracked:
            return True
        if not isinstance(o, Tensor):
            return False
    return False


_DETACH = ("the source requires grad: its memory goes out read-only (a write would change "
           "what autograd computes with), and torch has no read-only tensors")


# ------------------------------------------------------------------- from Hurray
def _rewrap(t: Tensor, shape: tuple[int, ...], dtype: DType,
            strides: tuple[int, ...] | None, device: Device) -> Tensor:
    """Another hb.Tensor over ``t``'s memory (kept alive through ``t``), for torch to import."""
    return Tensor._dense(t.data_ptr, shape, dtype, strides=strides, padded=False, device=device,
                         owner=t, readonly=t.readonly, copied=t.copied)


def _sync_stream(t: Tensor) -> None:
    """Let a device producer order its work before torch's current stream.

    Used when torch imports a rewrapped view (which has no producer to forward to):
    asking the original for a capsule with torch's stream makes it synchronise,
    exactly as ``torch.from_dlpack`` would have; the capsule itself is dropped.
    """
    if t.dtype.dlpack is None:
        return
    stream = torch.cuda.current_stream(t.device.id).cuda_stream
    if stream == 0 and t.device.type == _KDL_CUDA:
        stream = 1  # the array API's number for CUDA's legacy default stream
    t.__dlpack__(stream=stream, max_version=(1, 3))


def _import(t: Tensor, host: bool) -> torch.Tensor:
    """``t``'s memory as a torch tensor of ``t``'s shape and strides (no copy)."""
    if host:
        if t.device.type != _KDL_CPU:
            # Pinned/managed host memory: torch imports kDLCUDAHost as "Unsupported
            # device_type: 3" (torch 2.13), so present it as the CPU memory it also is.
            t = _rewrap(t, t.shape, t.dtype, t.strides, CPU)
        # A capsule skips torch.from_dlpack's device and keyword negotiation (~3 us).
        return torch.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    return torch.from_dlpack(t)


def _byte_view(t: Tensor, host: bool, shape: tuple[int, ...],
               strides: tuple[int, ...] | None, target: torch.dtype) -> torch.Tensor:
    """Import ``t``'s bytes as uint8 of ``shape``/``strides`` and re-type them as ``target``."""
    device = CPU if host else t.device
    view = _rewrap(t, shape, uint8, strides, device)
    if not host:
        _sync_stream(t)
    raw = torch.from_dlpack(view.__dlpack__(max_version=(1, 0)))
    return raw.view(target)


def _torch_device_of(t: Tensor) -> torch.device | None:
    d = t.device
    if d.is_host_accessible:
        return _CPU_DEVICE
    if d.type in (_KDL_CUDA, _KDL_ROCM):
        return torch.device("cuda", d.id)
    return None  # another device type: whatever torch's DLPack import makes of it


def _parse_device(device: Any) -> torch.device | None:
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            return torch.device(device)
        except RuntimeError as exc:  # torch's own error for a bad name or index
            raise UnsupportedError(f"device={device!r} is not a torch device here ({exc}); "
                                   "use 'cpu', 'cuda:N' or a torch.device") from None
    if isinstance(device, tuple) and len(device) == 2:
        d = Device(*device)
        if d.is_host_accessible:
            return _CPU_DEVICE
        if d.type in (_KDL_CUDA, _KDL_ROCM):
            return torch.device("cuda", d.id)
        raise UnsupportedError(f"no torch device for DLPack device {d}")
    raise UnsupportedError(
        f"device must be None, a torch.device, a string such as 'cuda:0' or an hb.Device; "
        f"got {device!r}"
    )


_I64_MAX = (1 << 63) - 1


def _check_sizes(shape: tuple[int, ...]) -> None:
    """torch's own size arithmetic (c10), which tensors without elements meet too: int64
    sizes; the running product of the sizes, left to right, in 64 bits (its storage-size
    check); int64 contiguous strides, each the product of the later sizes (0 counted as 1)."""
    big = [d for d in shape if d > _I64_MAX]
    if big:
        raise UnsupportedError(
            f"torch cannot hold shape {list(shape)}: dimension {big[0]} is above 2**63 - 1 "
            "(torch sizes are int64)")
    n = 1
    for d in shape:
        n *= d
        if n >> 64:
            raise UnsupportedError(
                f"torch cannot hold shape {list(shape)}: the running product of its sizes "
                "overflows 64 bits before any zero (torch's storage-size check, which tensors "
                "without elements meet too)")
    if n > _I64_MAX:
        raise UnsupportedError(f"torch cannot hold shape {list(shape)}: {n} elements, above "
                               "2**63 - 1 (torch's numel is int64)")
    stride = 1
    for d in reversed(shape[1:]):
        stride *= d or 1
        if stride > _I64_MAX:
            raise UnsupportedError(
                f"torch cannot hold shape {list(shape)}: its contiguous strides exceed "
                "2**63 - 1 (torch's strides are int64)")


def _require_device(want: torch.device | None, here: torch.device | None, t: Tensor,
                    device: Any) -> None:
    """Refuse memory, or a target, that this torch cannot hold, before torch sees it.

    CUDA memory or a CUDA target without a CUDA device: torch itself raises a bare
    AssertionError ('Torch not compiled with CUDA enabled'). Device types the adapter
    does not map (OpenCL, Vulkan, Metal, WebGPU, ...; XPU unless torch has one): torch
    2.13's DLPack import raises internal errors on them, and for a legacy kDLOpenCL
    capsule calls the producer's deleter twice.
    """
    if here is None and not (t.device.type == _KDL_ONEAPI and _has_xpu()):
        raise UnsupportedError(
            f"a {t.device} tensor cannot become a torch tensor: the torch adapter takes host, "
            "CUDA and ROCm memory (and XPU where torch has it); copy it to the host in its "
            "own framework first")
    if (((want is None or want.type != "cuda") and (here is None or here.type != "cuda"))
            or torch.cuda.is_available()):
        return
    why = (f"torch {torch.__version__} runs without CUDA here (built without it, or no GPU "
           "is visible)")
    if here is not None and here.type == "cuda":
        raise UnsupportedError(
            f"a {t.device} tensor cannot become a torch tensor: {why}; copy it to the host in "
            "its own framework first, or convert it to a framework that reaches that device")
    raise UnsupportedError(f"device={device!r}: {why}; use device='cpu' (or None)")


def _has_xpu() -> bool:
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and bool(xpu.is_available())


def _same_device(a: torch.device, b: torch.device | None) -> bool:
    if b is None or a.type != b.type:
        return False
    if a.type == "cuda":
        ai = torch.cuda.current_device() if a.index is None else a.index
        bi = torch.cuda.current_device() if b.index is None else b.index
        return ai == bi
    return a.index == b.index or (a.index in (None, 0) and b.index in (None, 0))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _unpack_bits(t: Tensor, host: bool) -> torch.Tensor:
    """1-bit packed bool (LSB-first, row-major) as torch.bool: always a new tensor."""
    n = _numel(t.shape)
    raw = _byte_view(t, host, (t.nbytes,), None, torch.uint8)
    shifts = torch.tensor(_subbyte.lane_shifts(1), dtype=torch.uint8, device=raw.device)
    return _subbyte.unpack_lanes(raw, n, 1, shifts).to(torch.bool).reshape(t.shape)


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> torch.Tensor:
    """An hb.Tensor as a torch tensor: a view of its memory unless a copy is needed or asked.

    ``device`` (``"cpu"``, ``"cuda:1"``, a ``torch.device``) moves the result
    when it differs from the tensor's own device; a move is a copy.
    """
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if t._readonly and not copy and _tracked(t) and t._nbytes:
        require_copy(copy, NAME, f"{_DETACH}; pass x.detach() to share the memory instead",
                     refusal=f"{_DETACH}: a torch tensor of it needs a copy, but copy=False; "
                             "pass x.detach() to share the memory (writes to it then bypass "
                             "autograd)")
        copy = True
    if t._readonly and not copy and t._nbytes and write_protected(t._owner):
        require_copy(copy, NAME, _PROTECTED)
        copy = True
    if (device is None and not copy and t._strides is None and t._device.type == _KDL_CPU
            and (t._desc is None or t.is_dense)):
        # The common hand-off, compact CPU memory of a whole-byte type: torch takes it
        # through the buffer protocol of a ctypes array that holds ``t``. No DLPack
        # capsule, so no ctypes callbacks: torch releases the buffer itself (under the
        # GIL, exceptions in flight or not), and it is ~3x cheaper than our capsule.
        # Rank 1: torch.frombuffer. Other ranks: torch.from_numpy over a NumPy view of
        # that shape (frombuffer + view costs 1.6x that, and leaves a view tensor);
        # types NumPy lacks (bfloat16, float8) take frombuffer + view.
        # (Tensor's slots are read directly here, and this path is inline rather than a
        # function of its own: a property costs 2-3x a slot read, a call as much again.)
        nbytes = t._nbytes
        dtype = t._dtype
        if nbytes and dtype.bits >= 8:
            shape = t._shape
            tag = dtype.tag
            npdt = None if len(shape) == 1 else _NUMPY_ROUTE.get(tag)
            if npdt is not None:
                out = _from_numpy(_frombuffer(host_array(t._data, nbytes, t), npdt)
                                  .reshape(shape))
            else:
                target = _BY_TAG.get(tag)
                if target is None:
                    raise UnsupportedError(
                        f"torch {torch.__version__} has no dtype for {dtype.name}")
                out = _torch_frombuffer(host_array(t._data, nbytes, t), dtype=target)
                if len(shape) != 1:
                    out = out.view(shape)
            if t._readonly:
                warn_readonly()
            return out
    return _general_from_hurray(t, device, copy)


def _general_from_hurray(t: Tensor, device: Any, copy: bool | None) -> torch.Tensor:
    """Every hand-off but the compact host one: choose the device, route the dtype (packed,
    sub-byte, bool or whole-byte), then decide between view, copy and move."""
    if not t.is_dense:
        raise UnsupportedError(
            f"a {t.descriptor.layout.name} / quantized hb.Tensor cannot become a torch tensor "
            f"yet: {_LATER}"
        )
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    want, here, move = _target_device(t, device, copy)
    host = t.device.is_host_accessible  # torch sees it as CPU memory
    _check_sizes(t.shape)
    if t.dtype.is_subbyte:
        out, t, copied = _subbyte_tensor(t, host, here, copy)
    else:
        out, t, copied = _whole_byte_tensor(t, host, here, copy)
    if move:
        return out.to(want)
    if copy and not copied:
        return out.clone()
    if t.readonly and not copied and out.numel():
        warn_readonly()
    return out


def _target_device(t: Tensor, device: Any, copy: bool | None
                   ) -> tuple[torch.device | None, torch.device | None, bool]:
    """(the device asked for, the tensor's own torch device, whether the result moves).

    A move is a copy, so it is refused under copy=False.
    """
    want = _parse_device(device)
    here = _torch_device_of(t)
    _require_device(want, here, t, device)
    move = want is not None and not _same_device(want, here)
    if move and copy is False:
        raise CopyRequiredError(
            f"moving a {t.device} tensor to torch device {want} is a copy, but copy=False"
        )
    return want, here, move


def _subbyte_tensor(t: Tensor, host: bool, here: torch.device | None, copy: bool | None
                    ) -> tuple[torch.Tensor, Tensor, bool]:
    """A sub-byte type in torch: 1-bit bool unpacked (a copy), packed float4 as
    float4_e2m1fn_x2 (a view), the rest refused. Returns (out, t, whether out is new)."""
    dtype = t.dtype
    shape = t.shape
    strides = t.strides
    padded = t.descriptor.padded
    if dtype is bool_:
        require_copy(copy, NAME, "1-bit packed bool unpacked to torch.bool (one byte each)",
                     refusal="1-bit packed bool must be unpacked to torch.bool (one byte "
                             "per element), which is a copy, but copy=False")
        return _unpack_bits(t, host), t, True
    if dtype is not float4_e2m1fn or padded or _FP4_X2 is None:
        form = "padded (one element per byte)" if padded else "packed"
        raise UnsupportedError(
            f"torch has no dtype for {form} {dtype.name}: torch {torch.__version__} holds "
            "sub-byte data only as packed float4_e2m1fn_x2 (two fp4 per byte); "
            "convert to numpy (ml_dtypes) or jax instead"
        )
    # Packed float4: each row of an even length is whole bytes, two values each.
    if strides is not None or not shape or shape[-1] % 2:
        why = ("it is strided" if strides is not None else
               "it is rank 0" if not shape else f"its last dimension ({shape[-1]}) is odd")
        raise UnsupportedError(
            f"packed float4_e2m1fn of shape {list(shape)} cannot become "
            f"torch.float4_e2m1fn_x2: {why}, so its rows do not start on whole bytes "
            "(x2 holds two values per byte along the last dimension)"
        )
    shape = (*shape[:-1], shape[-1] // 2)
    if _numel(shape) == 0 and here is not None:
        return torch.empty(shape, dtype=_FP4_X2, device=here), t, False
    return _byte_view(t, host, shape, None, _FP4_X2), t, False


def _whole_byte_tensor(t: Tensor, host: bool, here: torch.device | None, copy: bool | None
                       ) -> tuple[torch.Tensor, Tensor, bool]:
    """A whole-byte type in torch: through DLPack, or as bytes re-typed where torch's DLPack
    import refuses the type. Returns (out, t, whether out is new)."""
    dtype = t.dtype
    shape = t.shape
    target = _TO_TORCH.get(dtype)
    if target is None:
        raise UnsupportedError(f"torch {torch.__version__} has no dtype for {dtype.name}")
    if _numel(shape) == 0 and here is not None:
        # No allocation: torch's empty storage has a NULL data pointer, as the hb side.
        return torch.empty(shape, dtype=target, device=here), t, False
    copied = False
    strides = t.strides
    if strides is not None and any(s < 0 for s in strides):
        t, copied = _without_negative_strides(t, strides, host, copy)
    if dtype in _BYTE_VIEW:
        return _byte_view(t, host, shape, t.strides, target), t, copied
    try:
        return _import(t, host), t, copied
    except BufferError:
        if dtype.itemsize != 1 or dtype in _BYTE_VIEW:
            raise
        # This torch refuses the type's DLPack code (float8 before it was
        # supported): hand over the bytes and re-type them.
        _BYTE_VIEW.add(dtype)
        return _byte_view(t, host, shape, t.strides, target), t, copied


def _without_negative_strides(t: Tensor, strides: tuple[int, ...], host: bool,
                              copy: bool | None) -> tuple[Tensor, bool]:
    """t without the negative strides torch cannot hold: (t, whether it is a copy).

    A negative stride on a size-1 dimension means nothing and is dropped (a view); any
    other is a compact copy of host memory, refused under copy=False and on devices.
    """
    shape = t.shape
    if any(s < 0 and d > 1 for d, s in zip(shape, strides, strict=True)):
        # torch cannot hold negative strides; its DLPack import aborts the process
        # on them (SIGABRT, pytorch/pytorch#188023, still so in 2.13.0).
        if copy is False:
            raise CopyRequiredError(
                f"torch cannot represent negative strides {list(strides)}: a "
                "compact copy is needed, but copy=False"
            )
        if not host:
            raise UnsupportedError(
                f"negative strides {list(strides)} on {t.device}: torch cannot "
                "hold them and the bridge copies host memory only; make the "
                "array contiguous in its own framework first"
            )
        if copy is None:
            warn_copy(NAME, f"torch cannot represent negative strides "
                            f"{list(strides)}; made a compact copy")
        return t.copy(), True
    # Rather than let torch's storage-size check see them.
    strides = tuple(1 if s < 0 else s for s in strides)
    if not host:
        _sync_stream(t)  # the rewrapped view has no producer to forward to
    return _rewrap(t, shape, t.dtype, strides, t.device), False


def warn_readonly() -> None:
    """Say once per process that a torch tensor over read-only memory was handed out.

    Shared with torch's fast export of read-only capsules (adapters/torch/shortcuts.py),
    which the JAX -> torch and Arrow -> torch shortcuts end in.
    """
    global _readonly_warned
    if not _readonly_warned:
        # Marked only once the warning went out: under -W error it raises instead, and
        # must raise again on the next call (the shortcut front retries the full path).
        warnings.warn(_READONLY_MESSAGE, UserWarning, stacklevel=user_stacklevel())
        _readonly_warned = True


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for torch tensors (``.shortcuts``)."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """hb.convert's fast export to torch tensors (``.shortcuts``)."""
    from .shortcuts import fast_export as hook

    return hook()
