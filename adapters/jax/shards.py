"""Sharded ``jax.Array`` <-> :class:`~hurray_bridge.ShardedTensor`, without copying shards.

``hurray_bridge.shards.from_jax`` / ``to_jax`` forward here; the set model, its
checks and the host copies (assembly, resharding) are the core's
(``hurray_bridge.shards``), used from here.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from hurray_bridge import _capsule
from hurray_bridge._copy_policy import require_copy, warn_copy
from hurray_bridge.descriptor import Descriptor, Shard
from hurray_bridge.dtypes import DType
from hurray_bridge.errors import UnsupportedError
from hurray_bridge.shards import (
    Box,
    ShardedTensor,
    _as_box,
    _extract_dense,
    _pieces,
    _replica,
    _strided_tensor,
    _volume,
)
from hurray_bridge.tensor import Device, Tensor, for_immutable_consumer, from_dlview

from ..numpy import dtype_of as numpy_dtype_of
from ..numpy import from_hurray as numpy_from_hurray
from ..numpy import native_dtype as numpy_native_dtype
from . import host_subbyte_packed

__all__ = ["from_jax", "to_jax"]


def _jax_device(dev: Any) -> Device:
    """The DLPack device of a JAX device."""
    platform = dev.platform
    if platform == "cpu":
        # JAX's __dlpack_device__ reports id 0 for every CPU device (jax 0.10); the
        # device's own id is the one its DLPack capsules carry.
        return Device(1, dev.id)
    if platform in ("gpu", "cuda"):
        return Device(2, getattr(dev, "local_hardware_id", None) or 0)
    if platform == "rocm":
        return Device(10, getattr(dev, "local_hardware_id", None) or 0)
    raise UnsupportedError(
        f"JAX {platform} device {dev} has no DLPack device type; shards on it cannot be "
        "described (only cpu, cuda and rocm devices can)"
    )


def _jax_box(index: tuple[Any, ...], shape: tuple[int, ...]) -> Box:
    return _as_box(tuple(index), shape, "jax shard index")


def _packs_subbyte(platform: str, dtype: DType) -> bool:
    """Whether JAX stores ``dtype`` (a sub-byte type) packed on ``platform``."""
    # XLA's GPU backend packs S4/U4 two per byte; device memory is not probed.
    return platform != "cpu" or host_subbyte_packed(dtype)


def _from_jax_shard(data: Any, dtype: DType, padded: bool) -> Tensor:
    """A zero-copy hb.Tensor over one single-device jax.Array."""
    dev = _jax_device(next(iter(data.devices())))
    if not dtype.is_subbyte:
        # DLPack: the capsule holds a reference that keeps JAX from freeing or
        # donating the buffer while we look at it.
        view = _capsule.consume_capsule(_capsule.request_capsule(data))
        return from_dlview(view, data if not dev.is_host_accessible else None)
    # JAX has no DLPack form for int4 and the other sub-byte types ("XLA type S4 has
    # no DLPack equivalent", jax 0.10): take the buffer pointer, keep the array as owner.
    n = _volume(data.shape)
    ptr = data.unsafe_buffer_pointer() if n else 0
    return Tensor._dense(ptr, tuple(data.shape), dtype, strides=None, padded=padded, device=dev,
                         owner=data, readonly=True, copied=False,
                         source=data if not dev.is_host_accessible else None)


def from_jax(x: Any) -> ShardedTensor:
    """A ``jax.Array`` (sharded over any number of devices) as a :class:`ShardedTensor`.

    One shard per addressable shard of ``x``, zero-copy: each shard's buffer is
    the device buffer of ``x.addressable_shards[i].data`` (its pointer), its
    box comes from the shard's index, its replica id and device from JAX. The
    shards are read-only (JAX arrays are immutable) and keep the JAX buffers
    alive; do not ``delete()`` or donate ``x`` while they are in use.
    """
    if not isinstance(x, jax.Array):
        raise UnsupportedError(f"from_jax() takes a jax.Array, got {type(x).__name__}")
    if not x.is_fully_addressable:
        raise UnsupportedError(
            "this jax.Array spans several processes; a ShardedTensor needs every shard in "
            "this process (convert x.addressable_shards one by one instead)"
        )
    dtype = numpy_dtype_of(np.dtype(x.dtype))
    platform = next(iter(x.devices())).platform
    padded = dtype.is_subbyte and not _packs_subbyte(platform, dtype)
    shape = tuple(int(d) for d in x.shape)
    shards, origin = [], []
    for s in x.addressable_shards:
        box = _jax_box(s.index, shape)
        t = _from_jax_shard(s.data, dtype, padded)
        dev = _jax_device(s.device)
        shard = Shard(shape, box.offsets, int(s.replica_id), dev.type, dev.id)
        st = _strided_tensor(t.data_ptr, box.sizes, dtype, t.strides, padded, shard, dev, t,
                             True, False)
        if not dev.is_host_accessible:
            st._source = s.data  # device memory: DLPack export forwards to JAX for stream sync
        shards.append(st)
        origin.append(s.data)
    out = ShardedTensor(Descriptor(shape, dtype, padded=padded), shards)
    out._origin = tuple(origin)
    return out


def to_jax(sharded: ShardedTensor, sharding: Any, *, copy: bool | None = None) -> Any:
    """A ``jax.Array`` with ``sharding`` (any ``jax.sharding.Sharding``) over the shards.

    Built with ``jax.make_array_from_single_device_arrays``. For each device
    the sharding names, the shard with the same box is handed to JAX without a
    copy when it can be: the original JAX buffer when ``sharded`` came from
    :func:`from_jax` and the device matches, else a DLPack import onto that
    device (zero-copy on CPU for 64-byte aligned, row-major memory). A copy is
    made, and reported with :class:`hb.CopyWarning`, when JAX would copy
    (unaligned or strided memory, sub-byte types), when a box of the target
    sharding is not a box of ``sharded`` (resharding), or when one buffer would
    back two devices. ``copy=False`` raises instead; ``copy=True`` always copies.
    """
    if not isinstance(sharded, ShardedTensor):
        raise UnsupportedError(
            f"to_jax() takes an hb.ShardedTensor, got {type(sharded).__name__}")
    shape = sharded.shape
    dtype = sharded.dtype
    x64 = jax.config.jax_enable_x64  # type: ignore[attr-defined]  # a config flag
    if dtype.itemsize == 8 and not x64 and not dtype.is_subbyte:
        raise UnsupportedError(
            f"JAX would truncate {dtype.name} to 32 bits because 64-bit types are disabled; "
            "enable them with jax.config.update('jax_enable_x64', True)"
        )
    numpy_native_dtype(dtype)  # a type NumPy (and so JAX) lacks fails here, by name
    by_box: dict[Box, list[int]] = {}
    for i, b in enumerate(sharded.boxes):
        by_box.setdefault(b, []).append(i)
    used: set[int] = set()  # buffers already handed to JAX without a copy
    arrays = []
    copies: list[str] = []
    for jdev, index in sharding.addressable_devices_indices_map(shape).items():
        box = _jax_box(index, shape)
        want = _jax_device(jdev)
        # Prefer the shard that already lives on this device, then the lowest replica id.
        candidates = sorted(by_box.get(box, []), key=lambda i: (
            sharded.shards[i].device != want, _replica(sharded.shards[i])))
        reason = None if candidates else (
            f"box {box} of the target sharding is not a box of the shards (resharding)")
        arr = None
        for i in candidates if not copy else ():
            t = sharded.shards[i]
            origin = sharded._origin[i] if sharded._origin is not None else None
            if origin is not None and next(iter(origin.devices())) == jdev and (
                    not t.nbytes or origin.unsafe_buffer_pointer() == t.data_ptr):
                # The very array from_jax() took: no import at all. (JAX on CPU may
                # itself back two replicas with one host buffer; that is its choice.)
                arr = origin
            elif t.nbytes and t.buffers[0].ptr in used:
                reason = (f"box {box} would back two devices with one buffer; JAX needs "
                          "one buffer per device")
                continue
            else:
                arr, reason = _import_zero_copy(t, jdev, want)
            if arr is not None:
                if t.nbytes:
                    used.add(t.buffers[0].ptr)
                break
        if arr is None:
            why = reason or "copy=True"
            # No warning per shard: the copies are reported together below.
            require_copy(copy, None, why, refusal=f"to_jax(copy=False) needs a copy: {reason}")
            copies.append(why)
            pieces = ([(sharded.boxes[candidates[0]], sharded.shards[candidates[0]])]
                      if candidates else _pieces(sharded))
            dense = _extract_dense(pieces, box, dtype, sharded.descriptor.padded)
            # NumPy holds sub-byte elements one per byte: a packed box is unpacked here.
            native = numpy_from_hurray(
                dense, copy=True if dtype.is_subbyte and not sharded.descriptor.padded else False)
            arr = jax.device_put(native, jdev)
        arrays.append(arr)
    if copies and copy is None:
        warn_copy("jax", f"{len(copies)} of {len(arrays)} shards: "
                  + "; ".join(sorted(set(copies))))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _import_zero_copy(t: Tensor, jdev: Any, want: Device) -> tuple[Any, str | None]:
    """Hand one dense shard to JAX on ``jdev`` without a copy: (array, None) or (None, why)."""
    if not t.is_dense:
        return None, f"a {t.descriptor.layout.name} shard has no JAX form without a copy"
    if t.dtype.is_subbyte:
        return None, f"JAX has no zero-copy import for {t.dtype.name}"
    if t.strides is not None:
        return None, f"JAX imports row-major memory only; the shard has strides {list(t.strides)}"
    if t.device != want and not (t.device.is_host_accessible and want.type == 1):
        return None, f"the shard is on {t.device}, the sharding puts its box on {want}"
    if t.nbytes and want.type == 1 and t.data_ptr % 64:
        return None, "JAX copies CPU memory that is not 64-byte aligned"
    # Relabel host memory with the target CPU device: JAX places a DLPack import on
    # the device its capsule names (it reports every CPU device as id 0 itself), by its
    # local hardware id: in a multi-process run process 1's first CPU device has id 2048
    # and local id 0.
    local = getattr(jdev, "local_hardware_id", None)
    label = Device(1, local) if want.type == 1 and local is not None else want
    view = Tensor(Descriptor(t.shape, t.dtype, padded=t.descriptor.padded), t.buffers,
                  device=label, owner=t, readonly=t.readonly)
    # JAX arrays are immutable: a read-only shard may go in the legacy capsule JAX asks for.
    arr = jax.dlpack.from_dlpack(for_immutable_consumer(view), device=jdev)
    if t.nbytes and arr.unsafe_buffer_pointer() != t.data_ptr:
        return None, "JAX copied the buffer on import"
    return arr, None
