"""Sharded ``jax.Array`` <-> :class:`~hurray_bridge.ShardedTensor`, without copying shards.

``hurray_bridge.shards.from_jax`` / ``to_jax`` forward here, and ``hb.asarray`` /
``hb.convert`` come here through ``to_hurray`` / ``from_hurray`` (the names every
adapter's ``shards`` module exports) for a jax.Array on several devices (the dense
adapter refuses those, and its ``special_kind`` names them ``"sharded"``) and for a
sharded tensor going to JAX. The set model, its checks and the host copies (assembly,
resharding) are the core's (``hurray_bridge.shards``), used from here.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import jax
import numpy as np

from hurray_bridge._copy_policy import require_copy, warn_copy
from hurray_bridge._host import dtype_of as numpy_dtype_of
from hurray_bridge._host import from_hurray as numpy_from_hurray
from hurray_bridge._host import native_dtype as numpy_native_dtype
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
    _shard_view,
    _strided_tensor,
    _volume,
    copy_shards,
    describe,
)
from hurray_bridge.tensor import Device, Tensor

from . import _CPU, _CUDA, _ROCM, _on_several_devices, host_subbyte_packed
from . import _import as dense_import
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_hurray"]

# The jax.Array each from_jax() result was taken from: hb.convert(st, "jax") hands
# that array back (its own sharding, mesh and axis names) instead of rebuilding one.
_sources: weakref.WeakKeyDictionary[ShardedTensor, Any] = weakref.WeakKeyDictionary()


def _jax_device(dev: Any) -> Device:
    """The DLPack device of a JAX device."""
    platform = dev.platform
    if platform == "cpu":
        # JAX's __dlpack_device__ reports id 0 for every CPU device (jax 0.10); the
        # device's own id is the one its DLPack capsules carry.
        return Device(_CPU, dev.id)
    if platform in ("gpu", "cuda"):
        return Device(_CUDA, getattr(dev, "local_hardware_id", None) or 0)
    if platform == "rocm":
        return Device(_ROCM, getattr(dev, "local_hardware_id", None) or 0)
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
    if not dtype.is_subbyte:
        # The dense adapter's export: its pin keeps JAX from freeing or donating the
        # buffer while we look at it (and GPU arrays keep their stream handshake).
        return dense_to_hurray(data)
    # JAX has no DLPack form for int4 and the other sub-byte types ("XLA type S4 has
    # no DLPack equivalent", jax 0.10): take the buffer pointer, keep the array as owner.
    dev = _jax_device(next(iter(data.devices())))
    n = _volume(data.shape)
    ptr = data.unsafe_buffer_pointer() if n else 0
    return Tensor._dense(ptr, tuple(data.shape), dtype, strides=None, padded=padded, device=dev,
                         owner=data, readonly=True, copied=False,
                         source=data if not dev.is_host_accessible else None)


class _Layout(NamedTuple):
    """What a sharding makes of one global shape and type, built and checked once."""

    descriptor: Descriptor  # the global one
    shards: dict[Any, tuple[Descriptor, Box, Device]]  # JAX device -> its shard's


# (sharding, shape, dtype, padded) -> _Layout. A program hands over arrays of a few
# layouts again and again (every step's outputs); describing a shard set from scratch
# (boxes, shard sections, descriptors, the set rules) cost ~80 % of hb.asarray(x).
_layouts: dict[tuple[Any, ...], _Layout] = {}


def _layout(x: Any, shape: tuple[int, ...], dtype: DType, padded: bool) -> _Layout | None:
    key = (x.sharding, shape, x.dtype, padded)
    found = _layouts.get(key)
    if found is not None:
        return found
    if len(_layouts) > 256:
        _layouts.clear()
    per: dict[Any, tuple[Descriptor, Box, Device]] = {}
    for s in x.addressable_shards:
        box = _jax_box(s.index, shape)
        dev = _jax_device(s.device)
        shard = Shard(shape, box.offsets, int(s.replica_id), dev.type, dev.id)
        per[s.device] = (Descriptor(box.sizes, dtype, shard=shard, padded=padded), box, dev)
    _layouts[key] = _Layout(Descriptor(shape, dtype, padded=padded), per)
    return None  # the first set of a layout is built and checked in full


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
    layout = _layout(x, shape, dtype, padded)
    known = layout is not None
    shards, origin, boxes = [], [], []
    for s in x.addressable_shards:
        data = s.data
        t = _from_jax_shard(data, dtype, padded)
        if layout is not None and t.strides is None:
            d, box, dev = layout.shards[s.device]
            source = None if dev.is_host_accessible else data
            st = _shard_view(d, t.data_ptr, dev, t, True, t.copied, source)
        else:
            known = False  # a device layout with strides: described (and checked) in full
            box = _jax_box(s.index, shape)
            dev = _jax_device(s.device)
            shard = Shard(shape, box.offsets, int(s.replica_id), dev.type, dev.id)
            st = _strided_tensor(t.data_ptr, box.sizes, dtype, t.strides, padded, shard, dev, t,
                                 True, t.copied)
            if not dev.is_host_accessible:
                st._source = data  # device memory: DLPack export forwards to JAX for stream sync
        shards.append(st)
        origin.append(data)
        boxes.append(box)
    if known:
        assert layout is not None
        out = ShardedTensor._trusted(layout.descriptor, tuple(shards), tuple(boxes))
    else:
        out = ShardedTensor(Descriptor(shape, dtype, padded=padded), shards)
    out._origin = tuple(origin)
    _sources[out] = x
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
    if t.device != want and not (t.device.is_host_accessible and want.type == _CPU):
        return None, f"the shard is on {t.device}, the sharding puts its box on {want}"
    if t.nbytes and want.type == _CPU and t.data_ptr % 64:
        return None, "JAX copies CPU memory that is not 64-byte aligned"
    # Relabel host memory with the target CPU device: JAX places a DLPack import on
    # the device its capsule names (it reports every CPU device as id 0 itself), by its
    # local hardware id: in a multi-process run process 1's first CPU device has id 2048
    # and local id 0.
    local = getattr(jdev, "local_hardware_id", None)
    label = Device(_CPU, local) if want.type == _CPU and local is not None else want
    view = Tensor(Descriptor(t.shape, t.dtype, padded=t.descriptor.padded), t.buffers,
                  device=label, owner=t, readonly=t.readonly)
    # The dense adapter's import: jnp.from_dlpack's own calls without its per-call cost
    # (a tenth of it), onto the device the relabelled capsule names.
    arr = dense_import(view)
    if t.nbytes and arr.unsafe_buffer_pointer() != t.data_ptr:
        return None, "JAX copied the buffer on import"
    return arr, None


# ------------------------------------------------------ hb.asarray / hb.convert
def to_hurray(x: Any, *, copy: bool | None = None) -> ShardedTensor:
    """``hb.asarray(x)`` for a jax.Array on several devices: an hb.ShardedTensor
    (:func:`from_jax`, shards copied with ``copy=True``)."""
    if not _on_several_devices(x):
        raise UnsupportedError(
            f"{type(x).__name__} is not a live jax.Array on several devices, so it has no "
            "shards: hb.asarray takes a one-device array as one tensor")
    st = from_jax(x)
    return copy_shards(st) if copy else st


def from_hurray(sharded: ShardedTensor, *, device: Any = None,
                copy: bool | None = None) -> Any:
    """``hb.convert(sharded, "jax", device=..., copy=...)``.

    * ``device`` a ``jax.sharding.Sharding``: :func:`to_jax` with it (resharding
      copies, reported).
    * ``device`` None: the jax.Array the shards came from when :func:`from_jax`
      made them (itself, no new array); else a sharding rebuilt from the shard
      sections (:func:`sharding_for`) and :func:`to_jax` with it. Shards that all
      name one device give NotImplemented: the caller assembles them into one
      array, as for ``device`` naming one device.
    """
    if isinstance(device, jax.sharding.Sharding):
        return to_jax(sharded, device, copy=copy)
    if device is not None:
        return NotImplemented
    source = _sources.get(sharded)
    if source is not None and not source.is_deleted():
        if not copy:
            return source
        sharding = source.sharding
    else:
        sharding = sharding_for(sharded)
        if sharding is None:
            return NotImplemented
    return to_jax(sharded, sharding, copy=copy)


def sharding_for(sharded: ShardedTensor) -> Any:
    """A ``NamedSharding`` that puts every shard's box on the device its shard section
    names, or None when all of them name one device.

    The boxes must form an even grid (JAX splits a dimension into equal parts) with
    as many replicas of every box, one shard per device. The mesh has an axis
    ``d<k>`` for each split dimension ``k`` and an axis ``replicas`` when boxes are
    replicated; :class:`UnsupportedError` says which rule a set breaks.
    """
    keys = []
    for t in sharded.shards:
        sh = t.descriptor.shard
        assert sh is not None  # checked when the set was built
        keys.append((sh.device_type, sh.device_id))
    if len(set(keys)) < 2:
        return None
    signature = (sharded.shape, sharded.boxes, tuple(keys),
                 tuple(_replica(t) for t in sharded.shards))
    found = _rebuilt.get(signature)
    if found is None:
        if len(_rebuilt) > 256:
            _rebuilt.clear()
        found = _rebuilt[signature] = _build_sharding(sharded, keys)
    return found


# Shard set signature (shape, boxes, devices, replica ids) -> the NamedSharding rebuilt
# for it: a new Mesh per call cost more than handing the shards to JAX.
_rebuilt: dict[tuple[Any, ...], Any] = {}


def _build_sharding(sharded: ShardedTensor, keys: list[tuple[int, int]]) -> Any:

    def refuse(why: str) -> UnsupportedError:
        return UnsupportedError(
            f"no JAX sharding places this sharded tensor ({describe(sharded)}) as it is: "
            f"{why}; name one: hb.convert(st, 'jax', device=sharding) or "
            "hb.shards.to_jax(st, sharding) (boxes it does not have are copied)"
        )

    if len(set(keys)) != len(keys):
        raise refuse("a device holds more than one shard (JAX puts one shard on each device)")
    if any(b.is_empty for b in sharded.boxes):
        raise refuse("a shard is empty (JAX splits every dimension into equal parts)")
    devices = [_device_from_section(Device(*k)) for k in keys]
    shape = sharded.shape
    starts = [sorted({b.offsets[k] for b in sharded.boxes}) for k in range(len(shape))]
    parts = [len(s) for s in starts]
    replicas: dict[Box, list[int]] = {}
    for box, t in zip(sharded.boxes, sharded.shards):
        replicas.setdefault(box, []).append(_replica(t))
    counts = {len(r) for r in replicas.values()}
    if len(counts) != 1:
        raise refuse(f"boxes have different replica counts ({sorted(counts)})")
    if len(replicas) != _volume(parts):
        raise refuse("the boxes do not form a grid")
    (n_rep,) = counts
    split = [k for k, p in enumerate(parts) if p > 1]
    mesh_shape = [parts[k] for k in split] + ([n_rep] if n_rep > 1 else [])
    grid = np.empty(mesh_shape, dtype=object)
    for box, t, dev in zip(sharded.boxes, sharded.shards, devices):
        pos = [starts[k].index(box.offsets[k]) for k in split]
        if n_rep > 1:
            pos.append(sorted(replicas[box]).index(_replica(t)))
        grid[tuple(pos)] = dev
    names = tuple(f"d{k}" for k in split) + (("replicas",) if n_rep > 1 else ())
    spec = jax.sharding.PartitionSpec(*(f"d{k}" if parts[k] > 1 else None
                                        for k in range(len(shape))))
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(grid, names), spec)
    try:
        placed = sharding.devices_indices_map(shape)
    except ValueError:
        raise refuse("the boxes split a dimension into unequal parts") from None
    for box, dev in zip(sharded.boxes, devices):
        if _jax_box(placed[dev], shape) != box:
            raise refuse(f"box {box} is not one of equal parts of the global shape")
    return sharding


def _device_from_section(dev: Device) -> Any:
    """The JAX device a shard section's (device type, id) names: the inverse of
    ``_jax_device`` (CPU devices by id, GPUs by local hardware id)."""
    platform = {_CPU: "cpu", _CUDA: "gpu", _ROCM: "gpu"}.get(dev.type)
    if platform is not None:
        try:
            for d in jax.local_devices(backend=platform):
                if (d.id if dev.type == _CPU else d.local_hardware_id) == dev.id:
                    return d
        except RuntimeError:
            pass  # no such backend here: said below
    raise UnsupportedError(
        f"a shard belongs to {dev}, which is no JAX device of this process; pass a "
        "sharding: hb.convert(st, 'jax', device=sharding) or hb.shards.to_jax(st, sharding)"
    )


def __getattr__(name: str) -> Any:
    # The names this module had before every adapter's shards module said the same ones.
    if name in ("to_sharded", "from_sharded"):
        import warnings

        new = {"to_sharded": "to_hurray", "from_sharded": "from_hurray"}[name]
        warnings.warn(f"hurray_bridge.adapters.jax.shards.{name} is deprecated; use {new}",
                      DeprecationWarning, stacklevel=2)
        if name == "to_sharded":
            return lambda x, *, copy=None: (to_hurray(x, copy=copy)
                                            if _on_several_devices(x) else None)
        return from_hurray
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
