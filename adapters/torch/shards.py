"""torch ``DTensor`` <-> :class:`~hurray_bridge.ShardedTensor`, one process at a time.

A DTensor is a global tensor whose pieces live in several processes; each process
holds its local tensor and knows, from the placements and its place in the device
mesh, which box of the global index space that is. :func:`to_hurray` (what
``hb.asarray(dtensor)`` calls) describes the local tensor as a *partial*
ShardedTensor of that one box, without a copy; :func:`to_dtensor` goes back, each
process handing over the shard of its own box. No function here communicates:
everything a box needs is the mesh coordinate of this process.

Placements: ``Shard(dim)`` splits a dimension as ``torch.chunk`` does (pieces of
``ceil(size / n)``, shorter or empty at the end), applied mesh dimension by mesh
dimension, left to right; ``Replicate()`` copies the box, the replica id counting
the coordinates along the replicated mesh dimensions. ``Partial`` (a pending
reduction) and the strided shards of nested parallelism are not boxes and are
refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor import Shard as TorchShard

from hurray_bridge._copy_policy import require_copy, warn_copy
from hurray_bridge.descriptor import Descriptor, Shard, compact_strides
from hurray_bridge.errors import FormatError, UnsupportedError
from hurray_bridge.shards import (
    Box,
    ShardedTensor,
    _extract_dense,
    _pieces_for,
    _replica,
    _strided_tensor,
)
from hurray_bridge.tensor import Tensor

from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_hurray"]


def _partial_refusal(where: str, p: Any) -> UnsupportedError:
    return UnsupportedError(
        f"{where} is {p!r}: a pending reduction, not a piece of the tensor, so it has no box "
        "(docs/spec/sharding.md §4); reduce it first with x.redistribute(x.device_mesh, "
        "[Replicate()]) (Replicate() in place of each Partial) or take x.full_tensor()"
    )


def local_box(shape: Sequence[int], device_mesh: Any, placements: Sequence[Any]) -> tuple[Box,
                                                                                         int]:
    """This process's box of a global ``shape``, and its replica id, under ``placements``."""
    placements = tuple(placements)
    if len(placements) != device_mesh.ndim:
        raise UnsupportedError(f"{len(placements)} placements for a {device_mesh.ndim}-d device "
                               "mesh; give one per mesh dimension")
    coordinate = device_mesh.get_coordinate()
    if coordinate is None:
        raise UnsupportedError("this process is not part of the device mesh, so it holds no "
                               "shard of the tensor")
    rank = len(shape)
    offsets, sizes, replica = [0] * rank, [int(g) for g in shape], 0
    for mesh_dim, p in enumerate(placements):
        n, c = device_mesh.size(mesh_dim), int(coordinate[mesh_dim])
        where = f"placements[{mesh_dim}]"
        if isinstance(p, TorchShard):
            d = p.dim + rank if p.dim < 0 else p.dim
            if not 0 <= d < rank:
                raise UnsupportedError(f"{where} is {p!r} for a tensor of rank {rank}")
            step = -(-sizes[d] // n)  # torch.chunk: pieces of ceil(size / n)
            lo = min(c * step, sizes[d])
            offsets[d] += lo
            sizes[d] = min(step, sizes[d] - lo)
        elif isinstance(p, Replicate):
            replica = replica * n + c
        elif isinstance(p, Partial):
            raise _partial_refusal(where, p)
        else:
            raise UnsupportedError(
                f"{where} is {p!r}, whose pieces are not boxes of the tensor (only Shard(dim) and "
                "Replicate() are); redistribute to those placements first")
    return Box(tuple(offsets), tuple(sizes)), replica


def to_hurray(obj: Any, *, copy: bool | None = None) -> ShardedTensor:
    """This process's part of a ``DTensor``: a partial ShardedTensor of one shard.

    The shard is the local tensor itself (``to_local()``, the same memory; the
    dense adapter's rules apply: autograd never travels, ``copy=True`` copies).
    Its shard section holds the box and replica id the placements give this
    process's mesh coordinate, and the local tensor's device. The local shape
    must be the one the placements give (a DTensor built with
    ``DTensor.from_local(..., shape=...)`` from other sizes is refused).
    """
    if not isinstance(obj, DTensor):
        raise UnsupportedError(f"expected a torch DTensor, got {type(obj).__qualname__}")
    mesh = obj.device_mesh
    for i, p in enumerate(obj.placements):
        if isinstance(p, Partial):  # the fix first, before any other complaint
            raise _partial_refusal(f"the DTensor's placements[{i}]", p)
    shape = tuple(int(g) for g in obj.shape)
    box, replica = local_box(shape, mesh, obj.placements)
    local = obj.to_local()
    if tuple(local.shape) != box.sizes:
        raise UnsupportedError(
            f"the local tensor has shape {list(local.shape)}, but placements "
            f"{list(obj.placements)} of global shape {list(shape)} give this rank box {box} "
            "(torch.chunk sizes); a DTensor with other local sizes has no box form here")
    t = dense_to_hurray(local, copy=copy)
    if t.shape != box.sizes:  # float4_e2m1fn_x2: two values per torch element
        raise UnsupportedError(f"a DTensor of {local.dtype} has no box form (its elements "
                               "are pairs of values)")
    dev = t.device
    shard = Shard(shape, box.offsets, replica, dev.type, dev.id)
    st = _strided_tensor(t.data_ptr, box.sizes, t.dtype, t.strides, t.descriptor.padded, shard,
                         dev, t, t.readonly, t.copied)
    st._source = t._source  # device memory: DLPack export forwards to torch for stream sync
    return ShardedTensor(Descriptor(shape, t.dtype, padded=t.descriptor.padded), [st],
                         partial=True)


def from_hurray(sharded: ShardedTensor, *, device: Any = None,
                copy: bool | None = None) -> Any:
    """``hb.convert(sharded, "torch")``: NotImplemented, so the core assembles the shards
    into one tensor (a copy under the copy policy).

    torch's sharded tensor is a ``DTensor``, which needs a device mesh and placements
    that a ShardedTensor does not carry: :func:`to_dtensor` (``hb.to_dtensor``) takes
    them and builds this process's DTensor over its shard without a copy.
    """
    return NotImplemented


def to_dtensor(sharded: ShardedTensor, device_mesh: Any, placements: Sequence[Any], *,
               copy: bool | None = None) -> DTensor:
    """A ``DTensor`` on ``device_mesh`` with ``placements``; call it in every process.

    Each process passes the shards it has (a partial set is enough: its own
    box). Its local tensor is the shard with the box the placements give it
    (the lowest replica id), handed to torch without a copy
    (``DTensor.from_local(..., run_check=False)``: nothing is communicated or
    checked across processes; the global shape and strides are passed, so
    uneven splits work). When no shard has that box (other placements or another
    mesh than the shards came from: resharding), the box is copied out of the
    shards that cover it, with :class:`hb.CopyWarning`; ``copy=False`` raises
    instead and ``copy=True`` always copies. Read-only shards (a mapped file) stay
    read-only memory under torch, as ``hb.convert`` warns; ``copy=True`` gives
    writable ones. On a mesh of another device type than the shards' memory the
    dense adapter moves the local tensor (``device=`` of ``hb.convert``).
    """
    if not isinstance(sharded, ShardedTensor):
        raise UnsupportedError(
            f"to_dtensor() takes an hb.ShardedTensor, got {type(sharded).__name__}")
    placements = tuple(placements)
    box, _ = local_box(sharded.shape, device_mesh, placements)
    dtype, padded = sharded.dtype, sharded.descriptor.padded
    device = None if device_mesh.device_type == "cpu" else torch.device(device_mesh.device_type)
    found = sorted((t for b, t in zip(sharded.boxes, sharded.shards)
                    if b == box and t.is_dense), key=_replica)
    if found and not copy:
        t: Tensor = found[0]
        # The same memory without the shard section: torch takes a plain dense tensor.
        plain = _strided_tensor(t.data_ptr, t.shape, dtype, t.strides, padded, None, t.device,
                                t, t.readonly, t.copied)
        local = dense_from_hurray(plain, device=device, copy=copy)
    else:
        why = ("copy=True" if copy else
               f"box {box} of this rank is not a box of the shards (resharding)")
        pieces = _pieces_for(sharded, box)  # a box these shards do not cover: FormatError
        require_copy(copy, None, why, refusal=f"to_dtensor(copy=False) needs a copy: {why}")
        dense = _extract_dense(pieces, box, dtype, padded)
        local = dense_from_hurray(dense, device=device)
        if copy is None:
            warn_copy("torch", why)
    if tuple(local.shape) != box.sizes:
        raise FormatError(f"a {dtype.name} shard of box {box} became a torch tensor of shape "
                          f"{list(local.shape)}; torch has no DTensor of such elements",
                          field="dtype")
    return DTensor.from_local(local, device_mesh, placements, run_check=False,
                              shape=torch.Size(sharded.shape),
                              stride=compact_strides(sharded.shape))
