"""JAX adapter: ``jax.Array`` <-> ``hb.Tensor``.

Export (``to_hurray``). A CPU array is described from its own buffer, no copy:

* Types the Python buffer protocol knows (bool, ints, uints, float16/32/64,
  complex) are pinned with ``memoryview(x)``. That waits for the value (JAX
  dispatch is asynchronous) and takes a PjRt *external reference*: while it
  lives, ``x.delete()`` and buffer donation cannot free or reuse the memory
  (JAX copies instead of donating). A bare ``unsafe_buffer_pointer()`` takes no
  such hold and reads freed memory after ``x.delete()`` (a segfault with
  jax 0.10.2). ~2.7 us per call, against ~13 us for ``hb.from_dlpack(x)``.
* bfloat16, float8 and float4_e2m1fn have no buffer-protocol format; they go
  through JAX's DLPack export, which takes the same hold.
* int4/uint4/int2/uint2 have neither (XLA "S4 has no DLPack equivalent"), so
  the tensor points at ``x.unsafe_buffer_pointer()`` with ``x`` as its owner:
  garbage collection is safe, but **donating or deleting ``x`` while the
  tensor lives leaves it dangling** (no API exists to pin such a buffer).

XLA:CPU stores int4/uint4/int2/uint2/float4_e2m1fn **packed** (LSB first,
across the whole tensor: Hurray's packed form), not one element per byte as
ml_dtypes does; JAX's own ``nbytes`` still counts one byte per element. The
adapter checks this once per type with a probe array instead of assuming it.
Arrays JAX gives a non-default layout (``jax.experimental.layout``) are
exported with the matching strides. GPU arrays go through
JAX's DLPack export and keep the array as the tensor's *source*, so consumers'
``__dlpack__(stream=...)`` requests are forwarded to JAX, which synchronises.

Import (``from_hurray``). ``jax.numpy.from_dlpack(t)`` aliases host memory only
when the pointer is aligned (64 bytes on XLA:CPU, openxla/xla#16505) and the
strides are compact or a permutation of compact (xla ``StridesToLayout``);
otherwise JAX copies silently or fails. The adapter predicts both before it
calls JAX, so every copy is reported (``CopyWarning``) or refused
(``copy=False``). JAX cannot import the sub-byte types over DLPack at all
(int4 family: no mapping; float4: "PjRt CPU buffers only support default
layout" even for JAX's own export), so those take an explicit copy through
ml_dtypes and ``jax.device_put``; 1-bit bool is unpacked to bool the same way.
64-bit types are refused while ``jax_enable_x64`` is off, because JAX would
narrow them silently (jax-ml/jax#11895). JAX reads a bool8 byte other than 0x00 and
0x01 as neither false nor true, so host bool8 memory is scanned first and, when it
holds such a byte, JAX gets a normalised copy (reported as every copy is;
element-types.md §2).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hurray_bridge import _capsule
from hurray_bridge._copy_policy import alignment_note, check_copy, require_copy, warn_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._host import bool8_dirty, clean_bool8
from hurray_bridge._host import check_sizes as check_numpy_sizes
from hurray_bridge._subbyte import pack as pack_subbyte
from hurray_bridge._subbyte import unpack as unpack_subbyte
from hurray_bridge.descriptor import MAX_RANK
from hurray_bridge.dtypes import DType, bool8, native_types
from hurray_bridge.errors import CopyRequiredError, FormatError, UnsupportedError, not_a_tensor
from hurray_bridge.tensor import CPU, Device, Tensor, for_immutable_consumer

# jnp.from_dlpack of CPU memory (jax 0.10.2: ~40-100 us) spends most of its time
# around the import itself: it asks the CPU device for a stream, which raises
# UNIMPLEMENTED (a C++ error turned into a Python exception, on every call), and
# passes the result through jnp.asarray(x, dtype=canonical), which hands back the same
# array unless jax_enable_x64 is off and the type is 64-bit (refused earlier here). The
# import is jaxlib's dlpack_managed_tensor_to_buffer, called here directly with the
# arguments jnp.from_dlpack gives it on CPU: ~10x less per hand-off. CUDA/ROCm memory
# takes the same call with JAX's stream for external ready events, which the producer
# is asked to synchronise with, exactly as jnp.from_dlpack does (checked on CPU with a
# fake backend; not yet timed on a GPU). Private API, so only with the signature it
# has since jaxlib extension version 467; anything else (or any error) goes through
# jnp.from_dlpack. See _import.
try:
    from jax._src import xla_bridge as _xla_bridge
    from jax._src.lib import _jax as _jaxlib
    from jax._src.lib import jaxlib_extension_version as _JAXLIB_EXT
except ImportError:  # pragma: no cover - a JAX that moved its internals
    _RAW_IMPORT: Any = None
else:
    _RAW_IMPORT = (getattr(_jaxlib, "dlpack_managed_tensor_to_buffer", None)
                   if _JAXLIB_EXT >= 467 else None)
# (DLPack device type, hardware id) -> (backend, its JAX device); each value is
# replaced whole, so threads read a consistent pair.
_raw_devices: dict[tuple[int, int], tuple[Any, Any]] = {}

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "jax"
"""The target name: ``hb.convert(x, "jax")``."""
# DLPack device types as plain ints: the import routes compare them on every call,
# where an enum comparison costs more.
_CPU, _CUDA, _ROCM = (int(DLDeviceType.kDLCPU), int(DLDeviceType.kDLCUDA),
                      int(DLDeviceType.kDLROCM))
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. JAX arrays are immutable (and JAX answers
# legacy capsules only).
LEGACY_EXPORTS_MUTABLE = False
"""Whether JAX's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory this framework exports stays valid while the export lives."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""
HOLDS = frozenset({"dense", "sparse", "sharded"})
"""Dense arrays, BCOO/BCSR arrays (``.sparse``) and arrays sharded over devices (``.shards``)."""
DEVICES = frozenset({_CPU, _CUDA, _ROCM})
"""The host, CUDA and ROCm devices (kDLCPU, kDLCUDA, kDLROCM)."""


# Element types the Python buffer protocol of a jax.Array accepts (jaxlib refuses
# BF16, F8*, F4 and S4/U4/S2/U2 with "not supported by the Python buffer protocol").
_BUFFER_PROTOCOL = frozenset({
    "bool8", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
})
# Types XLA has no DLPack code for (xla/python/dlpack_types: S4, U4, S2, U2 unmapped).
_NO_DLPACK = frozenset({"int4", "uint4", "int2", "uint2"})
# Types jax.numpy.from_dlpack cannot import on this JAX (see the module docstring).
_IMPORT_BY_COPY = frozenset({"bool", "int4", "uint4", "int2", "uint2", "float4_e2m1fn"})
# Types JAX narrows to 32 bits while jax_enable_x64 is off.
_X64 = frozenset({"int64", "uint64", "float64", "complex128"})

# DLPack device type -> the JAX backend that imports it (mirrors jax/_src/dlpack.py).
_DL_TO_BACKEND = {_CPU: "cpu", _CUDA: "cuda", int(DLDeviceType.kDLCUDAHost): "cuda",
                  _ROCM: "rocm", int(DLDeviceType.kDLROCMHost): "rocm",
                  int(DLDeviceType.kDLCUDAManaged): "cuda"}
_GPU_NAMES = {"gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}


def _resolve(name: str) -> Any:
    t = getattr(jnp, name, None)
    return None if t is None else np.dtype(t)


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, np.dtype], dict[np.dtype, DType]]:
    to_jax = native_types("jax", _resolve)
    return to_jax, {v: k for k, v in to_jax.items()}


def native_dtype(dtype: DType) -> np.dtype:
    """The dtype a JAX array of Hurray element type ``dtype`` has."""
    try:
        return _tables()[0][dtype]
    except KeyError:
        raise UnsupportedError(f"JAX has no dtype for {dtype.name}") from None


_from_jax: dict[Any, DType] = {}


def dtype_of(dt: Any) -> DType:
    """The Hurray element type of a JAX dtype."""
    try:
        return _from_jax[dt]
    except (KeyError, TypeError):
        pass
    try:
        d = _from_jax[dt] = _tables()[1][dt]
        return d
    except (KeyError, TypeError):
        raise UnsupportedError(
            f"JAX dtype {dt} has no Hurray element type (supported: "
            f"{', '.join(sorted(d.name for d in _tables()[0]))})"
        ) from None


class _JaxOwner:
    """Keeps an exported jax.Array alive, and the PjRt hold on its buffer when there is one."""

    __slots__ = ("__weakref__", "array", "hold")

    def __init__(self, array: jax.Array, hold: object) -> None:
        self.array = array
        self.hold = hold

    def __repr__(self) -> str:
        kind = "unpinned" if self.hold is None else type(self.hold).__name__
        return f"<jax.Array hold ({kind}) {self.array.dtype}{list(self.array.shape)}>"


# ------------------------------------------------------------------ probes (cached)
_packed_on_host: dict[str, bool] = {}


def host_subbyte_packed(dtype: DType) -> bool:
    """Whether XLA:CPU stores sub-byte ``dtype`` packed (True) or one element per byte (False).

    jax 0.10.2 packs all of them although ``nbytes`` and the layout's
    ``sub_byte_element_size_in_bits`` (0) suggest otherwise: read it back once per
    type (the one probe; ``hurray_bridge.adapters.jax.shards`` asks it too).
    """
    packed = _packed_on_host.get(dtype.name)
    if packed is None:
        packed = _packed_on_host[dtype.name] = _probe_subbyte(dtype)
    return packed


_host_subbyte_packed = host_subbyte_packed  # the name this module's own code uses


def _probe_subbyte(dtype: DType) -> bool:
    per = 8 // dtype.bits
    codes = np.array([(i % ((1 << dtype.bits) - 1)) + 1 for i in range(per)], np.uint8)
    probe = jax.device_put(codes.view(native_dtype(dtype)), jax.local_devices(backend="cpu")[0])
    probe.block_until_ready()
    first = ctypes.string_at(probe.unsafe_buffer_pointer(), 1)[0]
    if first == int(pack_subbyte(codes, dtype.bits)[0]):
        return True
    if first == int(codes[0]):
        return False
    raise UnsupportedError(
        f"cannot tell how this JAX stores {dtype.name} on the CPU (first byte 0x{first:02x} "
        "is neither the packed nor the padded encoding); please report it"
    )


_cpu_align = 0  # _cpu_alignment() once measured: import_obstacle reads it per hand-off


@lru_cache(maxsize=1)
def _cpu_alignment() -> int:
    """The pointer alignment below which JAX's CPU DLPack import copies (64 on jax 0.10).

    Measured once with ``copy=False`` imports (which fail rather than copy) at
    pointers with exactly 1, 2, 4 ... 256 bytes of alignment.
    """
    global _cpu_align
    _cpu_align = _measure_alignment()
    return _cpu_align


def _measure_alignment() -> int:
    from hurray_bridge._host import to_hurray as np_to_hurray

    raw = np.zeros(1024, np.uint8)
    base = -raw.ctypes.data % 512  # offset of a 512-aligned address inside raw
    for align in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        t = np_to_hurray(raw[base + align : base + align + 1])
        try:
            jnp.from_dlpack(t, copy=False)
        except ValueError:
            continue
        return align
    return 512


def _strides_importable(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether JAX's DLPack import takes these strides without copying.

    xla/python/dlpack_strides.cc (StridesToLayout): the strides, sorted, must be
    exactly compact for the dimensions larger than 1 - a permutation of row-major
    is fine; gaps, broadcast (0) and negative strides are refused.
    """
    if strides is None:
        return True
    expected = 1
    for s, d in sorted((s, d) for d, s in zip(shape, strides, strict=True) if d != 1):
        if s != expected:
            return False
        expected *= d
    return True


# What JAX imports without a copy, said once for from_hurray and for the torch -> JAX
# shortcut (adapters/torch/shortcuts.py), which must answer exactly as from_hurray does.
@lru_cache(maxsize=1)
def raw_import_types() -> frozenset[DType]:
    """The element types ``from_hurray`` hands to JAX's import as they are.

    Not the sub-byte ones and 1-bit bool (imported through a copy), not the 64-bit ones
    (refused, or left to ``jnp.from_dlpack``, by ``jax_enable_x64``), none JAX lacks.
    """
    return frozenset(d for d in _tables()[0]
                     if d.name not in _IMPORT_BY_COPY and d.name not in _X64)


STRIDES = "strides"
"""What :func:`import_obstacle` returns when the strides keep JAX from aliasing memory."""
ALIGNMENT = "alignment"
"""What :func:`import_obstacle` returns when the address is below JAX's CPU alignment."""


def import_obstacle(shape: tuple[int, ...], strides: tuple[int, ...] | None,
                    device_type: int, data: int = 0) -> str | None:
    """What makes JAX's DLPack import copy memory that holds bytes, or None when it aliases it.

    ``STRIDES``: strides (None: compact) that are not compact nor a permutation of
    compact. ``ALIGNMENT``: CPU memory (DLPack ``device_type`` 1) whose ``data`` pointer
    is below JAX's alignment; only CPU memory needs ``data``. Memory without bytes has
    nothing to alias: callers ask only for memory that has some.
    """
    if strides is not None and not _strides_importable(shape, strides):
        return STRIDES
    if device_type == _CPU and data % (_cpu_align or _cpu_alignment()):
        return ALIGNMENT
    return None


def raw_route(device_type: int, device_id: int) -> tuple[Any, Any, Any] | None:
    """How ``from_hurray`` imports memory on DLPack device ``(device_type, device_id)``
    without ``jnp.from_dlpack``'s per-call overhead (see the top of this module).

    ``(raw, device, stream)``: ask the producer for a capsule with ``stream`` (None on
    the CPU), then ``raw(capsule, device, stream, None, device_type)`` is the import
    ``jnp.from_dlpack`` makes. None where the public API must do it: a jaxlib without
    the raw import (or whose signature changed), a device type other than CPU, CUDA
    and ROCm, or a device that cannot name its stream. Element types outside
    :func:`raw_import_types` take the public API too.
    """
    raw = _RAW_IMPORT
    if raw is None or (device_type != _CPU and device_type != _CUDA and device_type != _ROCM):
        return None
    device = _raw_device(device_type, device_id)
    if device_type == _CPU:
        return raw, device, None  # jnp.from_dlpack asks the CPU device: UNIMPLEMENTED
    # Asked per import, as jnp.from_dlpack does: the producer makes its pending work
    # visible on this stream before handing the memory over (DLPack's stream rule).
    try:
        stream = device.get_stream_for_external_ready_events()
    except Exception:
        return None
    return raw, device, stream


# ----------------------------------------------------------------------- to Hurray
_checked_types: set[type] = set()
_sharding_platform: dict[Any, str] = {}
_layout_perm: dict[Any, tuple[tuple[int, ...], bool, bool]] = {}


def _check_array(x: Any) -> None:
    tp = type(x)
    if tp in _checked_types:
        return
    if not isinstance(x, jax.Array):
        raise UnsupportedError(
            f"expected a jax.Array, got {tp.__module__}.{tp.__qualname__}; "
            "use hb.asarray() for other objects"
        )
    if isinstance(x, jax.core.Tracer):
        raise UnsupportedError(
            "cannot export a traced JAX value (inside jit/grad/vmap it has no memory); "
            "export the concrete array outside the transformation"
        )
    _checked_types.add(tp)


_SingleDeviceSharding = jax.sharding.SingleDeviceSharding
_device_platform: dict[Any, str] = {}  # device of a single-device sharding -> platform


def _platform_of(x: jax.Array) -> str:
    sharding = x.sharding
    device = None
    if type(sharding) is _SingleDeviceSharding:
        # Keyed by the device (hashed in C): every array JAX imports over DLPack has its
        # own sharding object, equal to the others, and their Python-level __eq__ made a
        # cache hit cost 3x a miss-free lookup. One device means its platform and
        # addressability are the device's own, so the answer is the device's.
        device = getattr(sharding, "_device", None)
        platform = _device_platform.get(device) if device is not None else None
        if platform is not None:
            return platform
    platform = _sharding_platform.get(sharding)
    if platform is None:
        devices = sharding.device_set
        if len(devices) != 1:
            raise UnsupportedError(
                f"this jax.Array lives on {len(devices)} devices ({sharding}); one hb.Tensor "
                "describes one device's memory: hb.asarray(x) gives an hb.ShardedTensor of its "
                "shards without a copy, hb.convert(x, 'numpy') assembles it (a copy), or "
                "gather it first with jax.device_put(x, jax.devices()[0])"
            )
        if not x.is_fully_addressable:
            raise UnsupportedError(
                "this jax.Array is not fully addressable from this process (multi-process "
                "sharding); export the local shards (x.addressable_shards) one by one"
            )
        platform = next(iter(devices)).platform  # type: ignore[attr-defined]
        if len(_sharding_platform) > 256:
            _sharding_platform.clear()
        _sharding_platform[sharding] = platform
    if device is not None:
        _device_platform[device] = platform
    return platform


def _layout_strides(x: jax.Array) -> tuple[int, ...] | bool | None:
    """Element strides of x's device layout: None when row-major, False when untileable.

    The PjRt layout object is cached (reading ``x.format`` costs ~1.5 us).
    """
    key = getattr(x, "_pjrt_layout", None)  # private but cheap; the public path is x.format
    entry = _layout_perm.get(key) if key is not None else None
    if entry is None:
        layout = x.format.layout  # type: ignore[attr-defined]  # (missing from jax's stubs)
        m2m = tuple(layout.major_to_minor)
        entry = (m2m, not layout.tiling, m2m == tuple(range(len(m2m))))
        if key is not None:
            if len(_layout_perm) > 256:
                _layout_perm.clear()
            _layout_perm[key] = entry
    m2m, untiled, row_major = entry
    if not untiled:
        return False
    if row_major:
        return None
    shape = x.shape
    strides = [0] * len(shape)
    step = 1
    for axis in reversed(m2m):
        strides[axis] = step
        step *= shape[axis]
    return tuple(strides)


def _normalise(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> tuple[int, ...] | None:
    if strides is None:
        return None
    expected = 1
    for d, s in zip(reversed(shape), reversed(strides), strict=True):
        if d != 1 and s != expected:
            return strides
        expected *= d
    return None


def _host_copy(x: jax.Array, dtype: DType, why: str, copy: bool | None) -> Tensor:
    """A compact host copy of ``x`` (sub-byte types padded, as NumPy holds them)."""
    # No warning here: hb.convert reports a source that was copied (t.copied).
    require_copy(copy, None, why, refusal=f"exporting this {dtype.name} jax.Array needs a copy "
                                          f"({why}); copy=False")
    # np.asarray keeps a permuted device layout as NumPy strides: make it row-major.
    a = np.ascontiguousarray(np.asarray(x))  # sub-byte types come out padded (ml_dtypes)
    ptr = a.__array_interface__["data"][0] if a.size else 0
    return Tensor._dense(ptr, a.shape, dtype, strides=None, padded=dtype.is_subbyte, device=CPU,
                         owner=a, readonly=not a.flags.writeable, copied=True)


def _to_hurray_gpu(x: jax.Array, dtype: DType, copy: bool | None) -> Tensor:
    if dtype.name in _NO_DLPACK:
        device = next(iter(x.devices()))
        raise UnsupportedError(
            f"JAX cannot export {dtype.name} from {device} over DLPack (XLA has no DLPack code "
            "for it) and the bridge cannot read device memory; convert on the device first "
            "(x.astype(jnp.int8)) or copy to the host (jax.device_get(x))"
        )
    src = x.copy() if copy else x
    # Not hb.from_dlpack(src): it asks for stream=-1 ("no sync"), which jaxlib does not
    # treat specially - it hands -1 to WaitUntilBufferReadyOnStream as a stream handle.
    # stream=None makes JAX wait on the host until the value is ready; consumers of the
    # tensor still get their own stream synchronisation: src is the tensor's source, so
    # their __dlpack__(stream=...) requests are forwarded to JAX.
    view = _capsule.consume_capsule(src.__dlpack__())
    dev = Device(view.device_type, view.device_id)
    shape = x.shape
    strides = _normalise(shape, view.strides)
    if strides is not None and dtype.is_subbyte:
        raise UnsupportedError(f"packed {dtype.name} on {dev} in a non-row-major layout cannot "
                               "be described; make it row-major on the device first")
    # JAX exports legacy capsules, which cannot say read-only; its arrays are immutable.
    return Tensor._dense(view.data if view.data else 0, shape, dtype, strides=strides,
                         padded=False, device=dev, owner=_JaxOwner(src, view.owner), readonly=True,
                         copied=bool(copy), source=None if dev.is_host_accessible else src)


def to_hurray(x: Any, *, copy: bool | None = None) -> Tensor:
    """A single-device jax.Array as a read-only hb.Tensor; zero-copy unless ``copy=True``."""
    if type(x) not in _checked_types:
        _check_array(x)
    if x.is_deleted():
        raise UnsupportedError(
            "this jax.Array has been deleted (x.delete(), or donated to a jit call with "
            "donate_argnums), so its memory is gone; export it before donating it"
        )
    platform = _platform_of(x)
    jdt = x.dtype
    dtype = _from_jax.get(jdt) or dtype_of(jdt)
    shape = x.shape
    if len(shape) > MAX_RANK:
        raise FormatError(
            f"rank {len(shape)} exceeds the maximum rank {MAX_RANK} (ADR-008); XLA itself "
            "has no such limit, reshape the array first", field="shape",
        )
    if platform != "cpu":
        return _to_hurray_gpu(x, dtype, copy)

    name = dtype.name
    t: Tensor
    if name in _BUFFER_PROTOCOL:
        try:
            # Waits for the value and pins the buffer (see the module docstring).
            hold = memoryview(x)
        except BufferError:
            hold = None  # a non-default layout: jaxlib's buffer protocol refuses it
        if hold is not None:
            ptr = x.unsafe_buffer_pointer() if hold.nbytes else 0
            t = Tensor._dense(ptr, shape, dtype, strides=None, padded=False, device=CPU,
                              owner=_JaxOwner(x, hold), readonly=True, copied=False)
            return t.copy() if copy else t
    if name not in _NO_DLPACK:
        # JAX's __dlpack__ with stream=None blocks until the value is ready.
        view = _capsule.consume_capsule(x.__dlpack__())
        strides = _normalise(shape, view.strides)
        if strides is not None and dtype.is_subbyte:
            t = _host_copy(x, dtype, f"packed {name} in a non-row-major layout", copy)
            return t
        t = Tensor._dense(view.data if view.data else 0, shape, dtype, strides=strides,
                          padded=False, device=CPU, owner=_JaxOwner(x, view.owner), readonly=True,
                          copied=False)
        return t.copy() if copy else t

    # int4/uint4/int2/uint2: no way to pin the buffer; x itself is the owner.
    layout = _layout_strides(x) if len(shape) > 1 else None
    if layout is not None:
        why = "a tiled device layout" if layout is False else f"packed {name} in a permuted layout"
        return _host_copy(x, dtype, why, copy)
    x.block_until_ready()
    n = 1
    for d in shape:
        n *= d
    padded = not _host_subbyte_packed(dtype)
    ptr = x.unsafe_buffer_pointer() if n else 0
    t = Tensor._dense(ptr, shape, dtype, strides=None, padded=padded, device=CPU,
                      owner=_JaxOwner(x, None), readonly=True, copied=False)
    return t.copy() if copy else t


# --------------------------------------------------------------------- from Hurray
def _backend_devices(platform: str) -> list[Any]:
    try:
        return jax.local_devices(backend=platform)
    except RuntimeError as exc:
        raise UnsupportedError(f"JAX has no {platform} backend here: {exc}") from None


def _target_device(device: Any) -> Any:
    """A jax.Device from ``device`` (jax.Device, "cpu", "gpu:1", hb.Device / (type, id))."""
    if isinstance(device, jax.Device):
        return device
    if isinstance(device, str):
        platform, _, index = device.partition(":")
        platform = _GPU_NAMES.get(platform, platform)
        devices = _backend_devices(platform)
        try:
            return devices[int(index or 0)]
        except (ValueError, IndexError):
            raise UnsupportedError(
                f"device {device!r}: this process has {len(devices)} {platform} device(s)"
            ) from None
    if isinstance(device, tuple) and len(device) == 2:
        return _home_device(Device(*device))
    raise UnsupportedError(
        f"device={device!r} is not a JAX device; pass a jax.Device, a platform name "
        "('cpu', 'gpu', 'cuda:1') or a DLPack (device_type, id) pair"
    )


def _home_device(dev: Device) -> Any:
    """The JAX device a DLPack import of memory on ``dev`` lands on."""
    platform = _DL_TO_BACKEND.get(dev.type)
    if platform is None:
        raise UnsupportedError(f"JAX cannot import memory on {dev}")
    if _RAW_IMPORT is not None:
        # The raw import's cached lookup: a tenth of jax.local_devices, per hand-off.
        try:
            return _raw_device(dev.type, dev.id)
        except Exception:
            # No such backend or device, or an id jaxlib cannot take (a TypeError):
            # the search below says which, in our words.
            pass
    for d in _backend_devices(platform):
        if d.local_hardware_id == dev.id:
            return d
    raise UnsupportedError(f"JAX has no {platform} device with hardware id {dev.id}")


def x64_enabled() -> bool:
    """Whether JAX keeps 64-bit types (``jax_enable_x64``), as a conversion now sees it:
    the thread-local ``with jax.enable_x64(...)`` context included."""
    return bool(jax.config.read("jax_enable_x64"))


_x64_enabled = x64_enabled


def _by_copy(t: Tensor, target: Any, copy: bool | None) -> jax.Array:
    """Sub-byte and 1-bit bool: JAX cannot import them, so copy through NumPy."""
    dtype = t.dtype
    form = "packed" if not t.descriptor.padded else "padded"
    if copy is False:
        raise CopyRequiredError(
            f"JAX cannot import {form} {dtype.name} without a copy (its DLPack import has no "
            f"zero-copy path for it); copy=False"
        )
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"{dtype.name} on {t.device} cannot reach JAX: its DLPack import does not take the "
            "type and the bridge cannot read device memory"
        )
    n = 1
    for d in t.shape:
        n *= d
    bits = dtype.bits
    if n == 0:
        codes = np.zeros(t.shape, np.uint8)
    elif form == "packed":
        codes = unpack_subbyte(np.frombuffer(t.memoryview(), np.uint8), n, bits).reshape(t.shape)
    else:
        from hurray_bridge._host import from_hurray as np_from_hurray

        # Padded form: the high bits are to be ignored (element-types.md §4.3);
        # ml_dtypes float4 reads them (0x37 is -6, not 6), so mask.
        codes = np.bitwise_and(np_from_hurray(t, copy=False).view(np.uint8),
                               np.uint8((1 << bits) - 1))
    if copy is None:
        what = "unpacked to bool" if bits == 1 else f"re-laid out by jax.device_put ({form} input)"
        warn_copy(NAME, f"{dtype.name} has no zero-copy JAX import; {what}")
    host = codes.astype(np.bool_) if bits == 1 else codes.view(native_dtype(dtype))
    if target is None:
        target = jax.local_devices(backend="cpu")[0]
    return jax.device_put(host, target)


_I64_MAX = (1 << 63) - 1


def _check_sizes(shape: tuple[int, ...], itemsize: int) -> None:
    """XLA's own size arithmetic, which arrays without elements meet too: the item size
    times the dimensions, multiplied left to right, stays within int64 until a zero
    (jaxlib 0.10.2: "overflow in static extent product"; measured, see
    tests/cross/test_bad_input.py)."""
    n = itemsize
    for d in shape:
        if not d:
            return
        n *= d
        if n > _I64_MAX:
            raise UnsupportedError(
                f"JAX cannot hold shape {list(shape)} of {itemsize}-byte elements: XLA "
                "multiplies the item size by the dimensions, left to right, in int64, and "
                f"passes 2**63 - 1 before any zero (arrays without elements too)")


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> jax.Array:
    """An hb.Tensor as a jax.Array, aliasing its memory when JAX can.

    ``device``: None keeps the tensor's device; a jax.Device, a platform name
    (``"cpu"``, ``"gpu:1"``) or a DLPack ``(type, id)`` pair places it there
    (a copy unless it is where the tensor already is).
    """
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if not t.is_dense:
        raise UnsupportedError(
            f"JAX has no {t.descriptor.layout.name} arrays in its DLPack import; densify the "
            "tensor first (jax.experimental.sparse takes the component arrays)"
        )
    dtype = t.dtype
    name = dtype.name
    target = None if device is None else _target_device(device)
    owner = t.owner
    if type(owner) is _JaxOwner and not copy and _is_whole_view(t, owner.array):
        return _own_export(owner.array, target, copy)
    if (name in _X64 and not _x64_enabled()) or (dtype.jax is None and name != "bool"):
        raise _dtype_refusal(name)
    home = None
    if target is not None:
        home = _home_device(t.device)
        if target == home:
            target = None
    elif t.device.type != _CPU or t.device.id:
        _home_device(t.device)  # a clear error when JAX has no backend (or device) for it

    _check_sizes(t.shape, (dtype.bits + 7) >> 3)
    if name in _IMPORT_BY_COPY:
        check_numpy_sizes(t.shape, 1)  # the copy goes through NumPy (one byte per element)
        return _by_copy(t, target if target is not None else home, copy)

    src: Any = t
    # (The common hand-off meets no obstacle and no move: no call beyond this test.)
    obstacle = (import_obstacle(t.shape, t.strides, t.device.type, t.data_ptr) if t.nbytes
                else None)
    if (obstacle is not None or target is not None) and _needs_copy(t, obstacle, target, copy):
        src = None
    if src is None or (copy and t.device.is_host_accessible and target is None):
        # A compact, 64-byte aligned host copy, which JAX then aliases: the one copy.
        # (copy=True cannot be left to JAX: jax 0.10.2's from_dlpack(copy=True) aliases
        # CPU memory all the same.)
        src = t.copy()
    if dtype.tag == _BOOL8_TAG and t._nbytes and t.device.is_host_accessible:
        src = _normalised_bool8(t, src, copy)
    y = _import(src)
    if target is not None:
        return _move(y, target)
    if copy and src is t:
        y = y.copy()  # a device copy made by XLA, for the reason above
    return y


def _own_export(x: jax.Array, target: Any, copy: bool | None) -> jax.Array:
    """The original array behind one of our own exports (no x64 question either: that
    array exists already), moved to ``target`` if it is elsewhere (a copy)."""
    if target is None or target in x.devices():
        return x
    why = f"moving the array to {target}"
    require_copy(copy, NAME, why, refusal=f"JAX would have to copy: {why}; copy=False")
    return jax.device_put(x, target)


def _dtype_refusal(name: str) -> UnsupportedError:
    """Why JAX cannot hold a type: 64-bit with x64 off (JAX would narrow it silently), or
    no JAX dtype at all."""
    if name in _X64 and not _x64_enabled():
        return UnsupportedError(
            f"{name} needs 64-bit JAX: with jax_enable_x64 off JAX narrows it to 32 bits "
            "silently. Enable it first: jax.config.update('jax_enable_x64', True) (or "
            "JAX_ENABLE_X64=1), or cast the data to a 32-bit type before converting"
        )
    return UnsupportedError(f"JAX has no dtype for {name}")


def _needs_copy(t: Tensor, obstacle: object, target: Any, copy: bool | None) -> bool:
    """Whether JAX must be handed a copy rather than t's memory (strides it rejects, a
    misaligned pointer), after warning or refusing by ``copy`` for every reason to copy,
    a move to ``target`` included (which XLA makes, not the bridge)."""
    reasons = []
    where = ""
    if target is not None:
        reasons.append(f"moving from {t.device} to {target}")
    if obstacle == STRIDES:
        if not t.device.is_host_accessible:
            raise UnsupportedError(
                f"JAX imports only compact (or transposed) strides and cannot take strides "
                f"{t.strides} for shape {t.shape} on {t.device}; the bridge cannot copy device "
                "memory: make it contiguous in the producing framework first"
            )
        reasons.append(f"strides {t.strides} for shape {t.shape} are not compact nor a "
                       "permutation of compact (JAX rejects gaps, broadcast and negative strides)")
    elif obstacle == ALIGNMENT:
        align = _cpu_alignment()
        # The warning names the reason only: an address (or its remainder) in the text
        # would make each copy a new warning and defeat the once-per-line filter. The
        # error, raised once, says where the pointer is.
        reasons.append(f"the data pointer is not {align}-byte aligned; JAX aliases CPU "
                       f"memory only when it is{alignment_note(t)}")
        where = f" (pointer 0x{t.data_ptr:x}, pointer % {align} = {t.data_ptr % align})"
    if reasons and not copy:
        why = "; ".join(reasons)
        require_copy(copy, NAME, why, refusal=f"JAX would have to copy: {why}{where}; copy=False")
    return obstacle is not None


_BOOL8_TAG = bool8.tag
_BOOL8_WHY = ("bool8 bytes other than 0x00 and 0x01, which JAX reads as neither false nor "
              "true (its sum of [0, 1, 2, 255] is 2), are made 0x01 in a copy")


def _normalised_bool8(t: Tensor, src: Tensor, copy: bool | None) -> Tensor:
    """``src`` (``t`` itself, or a host copy of it made here) as JAX may import it: when a
    byte is neither 0x00 nor 0x01, a copy with every such byte made 0x01 (the truth value
    NumPy's ``a != 0`` gives), reported under the copy policy when ``t`` was to be shared.
    ``src`` has no gaps: JAX takes no other strides, and copies are compact."""
    if not bool8_dirty(src.data_ptr, src._nbytes, src):
        return src
    if src is t:
        require_copy(copy, NAME, _BOOL8_WHY,
                     refusal=f"JAX would have to copy: {_BOOL8_WHY}; copy=False")
        src = t.copy()
    return clean_bool8(src)


def _import(src: Tensor) -> jax.Array:
    """``jnp.from_dlpack(src)``, without its per-call overhead (see the top).

    CPU memory, and CUDA/ROCm device memory: the same calls jnp.from_dlpack makes,
    with the same arguments, minus its ``__dlpack_device__`` query, the TensorFlow
    check and the ``jnp.asarray`` that returns the same array. Pinned and managed
    host memory (and 64-bit types) take the public API.
    """
    dev = src.device
    kind = dev.type
    # JAX arrays are immutable: read-only memory may go to JAX in the legacy capsule
    # it asks for (Tensor.__dlpack__ refuses that capsule to everyone else).
    prod = for_immutable_consumer(src)
    # Of the types that reach here, the 64-bit ones are outside raw_import_types() (by
    # name: cheaper than hashing a DType).
    route = None if src.dtype.name in _X64 else raw_route(kind, dev.id)
    if route is None:
        return jnp.from_dlpack(prod)
    raw, device, stream = route
    capsule = prod.__dlpack__(stream=stream)
    try:
        return raw(capsule, device, stream, None, kind)
    except TypeError:
        # A jaxlib whose private signature changed: use the public API from now on.
        globals()["_RAW_IMPORT"] = None
        return jnp.from_dlpack(prod)
    except Exception:
        # Whatever JAX refuses, it refuses through its own API, with its own message.
        return jnp.from_dlpack(prod)


def _raw_device(kind: int, hardware_id: int) -> Any:
    """The device jnp.from_dlpack imports memory of DLPack device ``(kind, hardware_id)``
    to: that backend's device of that hardware id (looked up again when JAX made a new
    backend, e.g. after jax.clear_backends()). For the raw import only."""
    backend = _xla_bridge.get_backend(_DL_TO_BACKEND[kind])
    key = (kind, hardware_id)
    cached = _raw_devices.get(key)
    if cached is None or cached[0] is not backend:
        cached = _raw_devices[key] = (backend, backend.device_from_local_hardware_id(hardware_id))
    return cached[1]


def _move(y: jax.Array, target: Any) -> jax.Array:
    """``y`` (aliasing foreign memory) copied to ``target``, the alias released here.

    Not ``jnp.from_dlpack(..., device=target)``: that leaves the alias to be freed by
    an XLA thread once the transfer ends, and a process exiting meanwhile aborts
    ("terminate called without an active exception"; jax 0.10.2, with NumPy and
    torch producers alike, ~10% of runs). Waiting for the copy and deleting the
    alias here releases the producer's memory on this thread.
    """
    z = jax.device_put(y, target)
    z.block_until_ready()
    y.delete()
    return z


def _is_whole_view(t: Tensor, x: jax.Array) -> bool:
    """Whether ``t`` describes all of ``x`` as it is (one of ``to_hurray``'s zero-copy exports)."""
    if t.shape != x.shape or t.copied or x.is_deleted():
        return False
    try:
        ptr = x.unsafe_buffer_pointer() if x.size else 0
    except Exception:  # a device that exposes no pointers: trust the owner link
        return True
    return ptr == t.data_ptr


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type JAX holds, with its dtype."""
    return dict(_tables()[0])


def special_kind(obj: Any) -> str | None:
    """``"sharded"`` for a live jax.Array on several devices (``.shards`` converts it);
    every other refusal stands."""
    return "sharded" if _on_several_devices(obj) else None


def _on_several_devices(x: Any) -> bool:
    """Whether ``x`` is a live jax.Array on several devices: a sharded one."""
    return (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            and not x.is_deleted() and len(x.sharding.device_set) >= 2)


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for jax.Array (``.shortcuts``)."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """hb.convert's fast export to jax.Array (``.shortcuts``)."""
    from .shortcuts import fast_export as hook

    return hook()
