"""TensorFlow adapter: eager ``tf.Tensor`` (and ``tf.Variable``) <-> ``hb.Tensor``.

Both directions go through TensorFlow's DLPack (``tf.experimental.dlpack``), whose
rules on tensorflow 2.21 were measured, not assumed:

* **Export** hands out legacy ``dltensor`` capsules only (``Tensor.__dlpack__`` ignores
  ``max_version`` and raises ``RuntimeError`` for any ``stream``, ``dl_device`` or
  ``copy=True``), over the tensor's own buffer: a write through one changes the
  ``tf.constant`` it came from. So ``LEGACY_EXPORTS_MUTABLE`` is False and every export
  is read-only. Types it has no Hurray type for are refused before it is asked: a string
  tensor makes ``to_dlpack`` abort the interpreter (``Check failed: DataTypeCanUseMemcpy``).
  Its float8, int4, int2 and float4 types its DLPack refuses: they leave through its
  ``__array__`` (a view of the buffer) and arrive through ``tf.constant`` (a copy,
  reported; see :func:`by_value`).
  CPU tensors are read through TensorFlow's buffer protocol instead where it has a format
  (every type here but bfloat16): the same buffer, read-only, pinned by a memoryview, at
  a third of the cost of reading a capsule.
* **Import** (``from_dlpack``) takes legacy capsules of compact memory only ("Invalid
  strides array from DLPack" for any other strides, transposes included), and aliases
  whatever address it is given, but TensorFlow's kernels then abort the interpreter on
  memory that is not aligned to ``EIGEN_MAX_ALIGN_BYTES`` (64 in this wheel's compile
  flags: ``Check failed: IsAligned()`` in ``reduce_sum``). NumPy aligns to 16. The
  adapter copies strided and unaligned host memory to a compact 64-byte aligned block
  first (reported; refused under ``copy=False``).
* **Read-only memory** (a loaded file, another framework's immutable array) is copied
  too: TensorFlow's tensors are immutable to its users, but its in-place ops
  (``tf.raw_ops.InplaceUpdate``, ``InplaceAdd``) write into the buffer they are given,
  imported memory included. (``hb.loads`` copies the bytes it is given: its tensors are
  writable, and shared.)
* TensorFlow reads a ``bool`` byte other than 0x00 and 0x01 inconsistently (``Where``
  fails, ``count_nonzero`` counts the byte's value): such memory is imported as a copy
  with those bytes made 0x01.

It holds dense tensors only: ``tf.SparseTensor`` and ``tf.RaggedTensor`` are refused by
name, as are symbolic tensors inside ``tf.function`` (they have no memory). A
``tf.Variable`` converts to a read-only hb.Tensor over its current value, zero-copy:
a later ``assign`` copies on write, so the hb.Tensor keeps the value it was given.
``hb.convert``'s shortcuts to and from eager tensors are in ``.shortcuts``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import numpy as np
import tensorflow as tf

from hurray_bridge import _capsule, _subbyte
from hurray_bridge._copy_policy import alignment_note, check_copy, require_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import bool8_dirty, clean_bool8
from hurray_bridge._host import from_hurray as host_from_hurray
from hurray_bridge._host import native_dtype as host_native_dtype
from hurray_bridge.descriptor import compact_strides, form_name
from hurray_bridge.dtypes import DLPACK_CODE, DType, all_dtypes, bfloat16, bool8
from hurray_bridge.errors import (
    BackendNotAvailableError,
    CopyRequiredError,
    UnsupportedError,
    not_a_tensor,
)
from hurray_bridge.tensor import CPU, Device, Tensor, from_dlview

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "tensorflow"
"""The target name: ``hb.convert(x, "tensorflow")``."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. TensorFlow exports the buffer of a tensor
# its users cannot write (measured: a write through the capsule changes the constant).
LEGACY_EXPORTS_MUTABLE = False
"""Whether TensorFlow's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: a TensorFlow capsule keeps its tensor's buffer while it lives."""
DEFERRED_SAVE = None
"""Saves of its tensors are written by the saving process (nothing deferred)."""
HOLDS = frozenset({"dense"})
"""Dense eager tensors and variables; TensorFlow's sparse and ragged tensors are refused."""
_CPU, _CUDA = int(DLDeviceType.kDLCPU), int(DLDeviceType.kDLCUDA)
DEVICES = frozenset({_CPU, _CUDA})
"""The host and CUDA devices (kDLCPU, kDLCUDA; a GPU build of TensorFlow exports CUDA
memory, which this adapter passes through untested: CI has no GPU)."""

# DLPack type codes TensorFlow's DLPack maps (tensorflow/c/eager/dlpack.cc): its float8,
# int4 and int2 types exist but are "not supported by dlpack".
_C = DLPACK_CODE
_TF_CODES = frozenset({_C.kDLInt, _C.kDLUInt, _C.kDLFloat, _C.kDLBfloat, _C.kDLComplex,
                       _C.kDLBool})
_BOOL8_TAG = bool8.tag
_BFLOAT16 = bfloat16
_asarray = np.asarray
_EAGER = type(tf.constant(0.0))
_READ_ONLY_WHY = ("the memory is read-only, and TensorFlow's in-place ops "
                  "(tf.raw_ops.InplaceUpdate, InplaceAdd) write into the buffer they are given")


@lru_cache(maxsize=1)
def _alignment() -> int:
    """The alignment TensorFlow's kernels check imported memory against.

    ``EIGEN_MAX_ALIGN_BYTES`` from the installed wheel's compile flags (64 for
    tensorflow-cpu 2.21); 64 when the flags do not say. Not probed by importing
    unaligned memory: a kernel that meets it aborts the process.
    """
    try:
        flags = tf.sysconfig.get_compile_flags()
    except Exception:  # a build without sysconfig data: the value every build uses
        flags = []
    for flag in flags:
        m = re.fullmatch(r"-DEIGEN_MAX_ALIGN_BYTES=(\d+)", flag)
        if m:
            return max(1, int(m.group(1)))
    return 64


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, Any], dict[Any, DType]]:
    """Every Hurray type TensorFlow holds: those its DLPack carries, and those it holds
    outside it (:func:`by_value`), each found through ml_dtypes' NumPy type."""
    to_tf: dict[DType, Any] = {}
    for d in all_dtypes():
        if d.dlpack is None or (d.is_subbyte and d.bits == 1):
            continue
        try:
            to_tf[d] = tf.as_dtype(host_native_dtype(d))
        except (TypeError, UnsupportedError, BackendNotAvailableError):
            continue  # float8_e8m0fnu: "Cannot convert ... to a TensorFlow DType"
    return to_tf, {v: k for k, v in to_tf.items()}


@lru_cache(maxsize=1)
def by_value() -> frozenset[DType]:
    """The types TensorFlow holds but its DLPack refuses ("DT_FLOAT8_E4M3FN is not
    supported by dlpack"; int4, int2 and float4 too): read through its ``__array__`` (a
    view of the tensor's buffer), built with ``tf.constant`` from the values (a copy).
    TensorFlow keeps sub-byte types one element per byte: Hurray's padded form."""
    return frozenset(d for d in _tables()[0]
                     if d.is_subbyte or d.dlpack is None or d.dlpack[0] not in _TF_CODES)


def _supported_names() -> str:
    return ", ".join(d.name for d in _tables()[0])


def native_dtype(dtype: DType) -> Any:
    """The ``tf.DType`` of a Hurray element type."""
    try:
        return _tables()[0][dtype]
    except KeyError:
        raise UnsupportedError(
            f"TensorFlow has no type for {dtype.name} (it holds {_supported_names()}); "
            "convert to numpy or jax"
        ) from None


def dtype_of(native: Any) -> DType:
    """The Hurray element type of a ``tf.DType`` (or anything ``tf.as_dtype`` takes)."""
    try:
        return _tables()[1][tf.as_dtype(native)]
    except (KeyError, TypeError):
        raise UnsupportedError(
            f"TensorFlow dtype {native} has no Hurray element type (supported: "
            f"{_supported_names()})"
        ) from None


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type TensorFlow holds, with its ``tf.DType`` (those of
    :func:`by_value` are copied into TensorFlow: its DLPack refuses them)."""
    return dict(_tables()[0])


def special_kind(obj: Any) -> str | None:
    """None: TensorFlow's sparse and ragged tensors are not held here, and every refusal
    of ``to_hurray`` stands."""
    return None


# --------------------------------------------------------------------- to Hurray
def _qualname(obj: Any) -> str:
    tp = type(obj)
    return f"{tp.__module__}.{tp.__qualname__}"


def _eager(obj: Any) -> Any:
    """The eager tensor whose memory ``obj`` is; refuses what has none here."""
    if type(obj) is _EAGER:
        return obj
    if isinstance(obj, tf.Variable):
        # The variable's current buffer: assign later copies on write (the buffer is
        # then shared with this read), so the export keeps the value it was given.
        return obj.read_value()
    if isinstance(obj, tf.SparseTensor):
        raise UnsupportedError(
            "tf.SparseTensor is not held by the TensorFlow adapter (HOLDS is dense only); "
            "densify it first (tf.sparse.to_dense) or pass its indices and values separately")
    if isinstance(obj, tf.RaggedTensor):
        raise UnsupportedError(
            "tf.RaggedTensor has rows of different lengths, which no dense tensor holds; "
            "convert x.to_tensor() (padded) or x.flat_values and x.row_splits")
    if not isinstance(obj, tf.Tensor):
        raise UnsupportedError(f"the TensorFlow adapter converts eager tf.Tensor and "
                               f"tf.Variable, got {_qualname(obj)}")
    if not hasattr(obj, "__dlpack__"):
        raise UnsupportedError(
            f"{_qualname(obj)} is a symbolic tensor (inside tf.function or a graph): it has no "
            "memory yet; convert the eager tensor the function returns")
    return obj


class _TfOwner:
    """Keeps an exported eager tensor, and the capsule's hold on its buffer, alive; and
    lets ``from_hurray`` hand that tensor back as it is."""

    __slots__ = ("__weakref__", "hold", "tensor")

    def __init__(self, tensor: Any, hold: object) -> None:
        self.tensor = tensor
        self.hold = hold

    def __repr__(self) -> str:
        return f"<tf.Tensor hold {self.tensor.dtype.name}{list(self.tensor.shape)}>"


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """An eager ``tf.Tensor`` or ``tf.Variable`` as a read-only hb.Tensor over its memory
    (zero-copy unless ``copy=True``, which gives a writable copy)."""
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    x = _eager(obj)
    dtype = _tables()[1].get(x.dtype)
    if dtype is None:
        # Checked before TensorFlow is asked: to_dlpack of a string tensor aborts the
        # interpreter, and of the others raises its own InvalidArgumentError.
        what = "a string tensor" if x.dtype == tf.string else f"dtype {x.dtype.name}"
        raise UnsupportedError(
            f"TensorFlow cannot hand {what} over DLPack, and it has no Hurray element type "
            f"this adapter carries (supported: {_supported_names()}); cast it first "
            "(tf.cast) or, for strings, keep them out of the tensor exchange")
    if dtype in by_value():
        return _from_values(x, dtype, copy)
    if dtype is not _BFLOAT16 and x.device.endswith("CPU:0"):
        # TensorFlow's buffer protocol: a read-only view of the same buffer that pins the
        # tensor, with no capsule and no deleter (a third of the capsule's cost; bfloat16
        # has no buffer format, and a GPU tensor's buffer would be a host copy).
        a = _asarray(memoryview(x))
        ptr = a.__array_interface__["data"][0] if a.size else 0
        t = Tensor._dense(ptr, a.shape, dtype, strides=None, padded=False, device=CPU,
                          owner=_TfOwner(x, a), readonly=True, copied=False)
        return t.copy() if copy else t
    view = _capsule.consume_capsule(x.__dlpack__())
    shape = view.shape
    if view.strides is not None and view.strides != compact_strides(shape) and 0 not in shape:
        # TensorFlow exports compact tensors; anything else takes the core's general reading.
        t = from_dlview(view, legacy_mutable=LEGACY_EXPORTS_MUTABLE)  # pragma: no cover
    else:
        empty = 0 in shape
        t = Tensor._dense(0 if empty else view.data, shape, dtype, strides=None, padded=False,
                          device=Device(view.device_type, view.device_id),
                          owner=_TfOwner(x, view.owner), readonly=True, copied=False)
    return t.copy() if copy else t


def _from_values(x: Any, dtype: DType, copy: bool | None) -> Tensor:
    """A tensor of a type TensorFlow's DLPack refuses, through its ``__array__``: on the
    CPU a view of the tensor's own buffer (writable as NumPy gets it, read-only here, as
    every TensorFlow export), elsewhere a host copy."""
    on_host = x.device.endswith("CPU:0")
    # Of a rank-0 tensor of these types TensorFlow's __array__ returns a scalar, which
    # NumPy refuses ("__array__ method not producing an array"): read it as shape [1]
    # (a reshape shares the buffer) and view that as rank 0.
    src = x if x.shape.rank else tf.reshape(x, [1])
    a = _asarray(src) if on_host else src.numpy()
    if not x.shape.rank:
        a = a.reshape(())
    if not a.flags.c_contiguous:  # pragma: no cover - TensorFlow's arrays are compact
        a = np.ascontiguousarray(a)
        on_host = False
    ptr = a.__array_interface__["data"][0] if a.size else 0
    t = Tensor._dense(ptr, a.shape, dtype, strides=None, padded=dtype.is_subbyte, device=CPU,
                      owner=_TfOwner(x, (src, a)), readonly=on_host, copied=not on_host)
    return t.copy() if copy else t


# ------------------------------------------------------------------- from Hurray
def _target(device: Any) -> Device | None:
    """The DLPack device a ``device=`` argument names; None for "where the tensor is"."""
    if device is None:
        return None
    if isinstance(device, tuple) and len(device) == 2:
        return Device(*device)
    if isinstance(device, str):
        spec = device.rsplit("/device:", 1)[-1].lstrip("/")
        kind, _, index = spec.partition(":")
        if index == "" or index.isdigit():
            n = int(index or 0)
            if kind.lower() == "cpu":
                return Device(_CPU, 0)
            if kind.lower() in ("gpu", "cuda"):
                return Device(_CUDA, n)
    raise UnsupportedError(
        f"device={device!r} is not a TensorFlow device here; pass 'CPU', 'GPU:1' "
        "('/device:GPU:1') or a DLPack (device_type, id) pair")


def _copy_reasons(t: Tensor) -> list[str]:
    """Why TensorFlow cannot alias ``t``'s host memory as it is (empty: it can)."""
    reasons = []
    if t._strides is not None:
        reasons.append(f"TensorFlow imports compact memory only, and strides {t.strides} for "
                       f"shape {t.shape} are not compact")
    align = _alignment()
    if t.data_ptr % align:
        reasons.append(f"the data pointer is not {align}-byte aligned, and TensorFlow's kernels "
                       f"abort on such memory{alignment_note(t)}")
    if t.readonly:
        reasons.append(_READ_ONLY_WHY)
    return reasons


def _normalise_bool8(t: Tensor, src: Tensor, copy: bool | None) -> Tensor:
    """``src`` (compact host bool8) with every byte other than 0x00 and 0x01 made 0x01,
    in a copy when ``src`` is ``t`` itself (TensorFlow misreads such bytes)."""
    if not bool8_dirty(src.data_ptr, src.nbytes, src):
        return src
    if src is t:
        why = ("bool bytes other than 0x00 and 0x01, which TensorFlow reads inconsistently "
               "(count_nonzero counts the byte, Where fails), are made 0x01 in a copy")
        require_copy(copy, NAME, why, refusal=f"{why}, but copy=False")
        src = t.copy()
    return clean_bool8(src)


def _built_from_values(t: Tensor, copy: bool | None) -> Any:
    """A tensor of a :func:`by_value` type: ``tf.constant`` of its values (a copy)."""
    dtype = t.dtype
    why = (f"TensorFlow's DLPack has no {dtype.name}: tf.constant builds the tensor from "
           "the values")
    require_copy(copy, NAME, why, refusal=f"{why}, which is a copy, but copy=False")
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"{dtype.name} on {t.device} cannot reach TensorFlow: its DLPack "
                               "does not take the type and the bridge reads host memory only")
    n = 1
    for d in t.shape:
        n *= d
    nd = host_native_dtype(dtype)
    if not dtype.is_subbyte:
        host = host_from_hurray(t, copy=False)  # a view; tf.constant copies it
    elif not n:
        host = np.zeros(t.shape, nd)
    elif not t.descriptor.padded:
        raw = np.frombuffer(t.memoryview(), np.uint8)
        host = _subbyte.unpack(raw, n, dtype.bits).reshape(t.shape).view(nd)
    else:
        # Padded form: the high bits of each byte are to be ignored (element-types.md
        # §4.3), and TensorFlow keeps whatever they hold.
        codes = host_from_hurray(t, copy=False).view(np.uint8)
        host = np.bitwise_and(codes, np.uint8((1 << dtype.bits) - 1)).view(nd)
    return tf.constant(host)


def _unpacked_bool(t: Tensor, copy: bool | None) -> Any:
    """1-bit packed bool as ``tf.bool``: TensorFlow has no bit-packed type, so unpacked."""
    require_copy(copy, NAME, "1-bit packed bool unpacked to tf.bool (one byte per element)",
                 refusal="1-bit packed bool must be unpacked to tf.bool (one byte per element), "
                         "which is a copy, but copy=False")
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"1-bit bool on {t.device} cannot be unpacked by the bridge, "
                               "which reads host memory only")
    n = 1
    for d in t.shape:
        n *= d
    raw = np.frombuffer(t.memoryview(), np.uint8) if t.nbytes else np.zeros(0, np.uint8)
    return tf.constant(_subbyte.unpack(raw, n, 1).astype(np.bool_).reshape(t.shape))


def _is_whole_view(t: Tensor, x: Any) -> bool:
    """Whether ``t`` is all of eager tensor ``x``, as ``to_hurray`` exported it (not a copy)."""
    return (not t.copied and t.strides is None and t.shape == tuple(x.shape)
            and t.dtype == _tables()[1].get(x.dtype))


def _import(src: Tensor) -> Any:
    return tf.experimental.dlpack.from_dlpack(src.__dlpack__())


def _move(x: Any, target: Device) -> Any:
    if target.type == _CPU:
        name = "CPU:0"
    else:
        gpus = tf.config.list_logical_devices("GPU")
        if target.id >= len(gpus):
            # tf.device would place the copy on the CPU instead, without a word.
            raise UnsupportedError(
                f"TensorFlow has {len(gpus)} GPU(s) here, so it cannot place a tensor on "
                f"GPU:{target.id}; pass device='CPU' or one of its GPUs")
        name = f"GPU:{target.id}"
    with tf.device(name):
        return tf.identity(x)


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """An hb.Tensor as an eager ``tf.Tensor``, over its memory where TensorFlow can take it.

    Strided, unaligned and read-only host memory, and bool bytes other than 0/1, reach
    TensorFlow as a compact aligned copy (reported; ``copy=False`` refuses: see the
    module docstring). ``device`` (``"CPU"``, ``"GPU:1"``, a DLPack pair) places it
    there, a copy unless it is where the tensor is.
    """
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if not t.is_dense:
        raise UnsupportedError(
            f"TensorFlow's DLPack takes dense tensors; a {form_name(t.descriptor)} tensor goes "
            "to numpy or torch, or hb.convert(..., densify=True)")
    target = _target(device)
    dev = t.device
    move = None if target is None or target == dev or (
        target.type == _CPU and dev.is_host_accessible) else target
    if move is not None and copy is False:
        raise CopyRequiredError(f"placing a {dev} tensor on {target} is a copy, but copy=False")
    if t.dtype.bits == 1:
        out = _unpacked_bool(t, copy)
        return out if move is None else _move(out, move)
    native_dtype(t.dtype)  # the refusal naming the type, before any exchange
    if t.dtype in by_value() and not (type(t.owner) is _TfOwner and not copy
                                      and _is_whole_view(t, t.owner.tensor)):
        out = _built_from_values(t, copy)
        return out if move is None else _move(out, move)
    owner = t.owner
    if type(owner) is _TfOwner and not copy and _is_whole_view(t, owner.tensor):
        # One of to_hurray's exports, whole: the tensor it came from (TensorFlow's own
        # memory, which needs none of the copies below).
        return owner.tensor if move is None else _move(owner.tensor, move)
    src = t
    if dev.is_host_accessible:
        reasons = _copy_reasons(t) if t.nbytes else []
        if reasons:
            why = "; ".join(reasons)
            require_copy(copy, NAME, why, refusal=(
                f"TensorFlow would need a copy: {why}; copy=False forbids it. Pass copy=None "
                "(a reported copy), or hand it compact, 64-byte aligned, writable memory"))
        if reasons or copy:
            src = t.copy()  # compact, 64-byte aligned, writable, ours
        if t.dtype.tag == _BOOL8_TAG and t.nbytes:
            src = _normalise_bool8(t, src, copy)
    elif t.readonly and t.nbytes:
        raise UnsupportedError(
            f"read-only {dev} memory cannot go to TensorFlow, whose in-place ops write into "
            "the buffer they are given, and the bridge cannot copy device memory; copy it in "
            "its own framework first")
    out = _import(src)
    if move is not None:
        return _move(out, move)
    if copy and src is t:
        out = tf.raw_ops.DeepCopy(x=out)  # device memory: TensorFlow copies it
    return out


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for eager tensors (``.shortcuts``)."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """hb.convert's fast export to eager tensors (``.shortcuts``)."""
    from .shortcuts import fast_export as hook

    return hook()
