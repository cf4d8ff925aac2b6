"""Dask adapter: ``dask.array.Array`` <-> ``hb.Tensor``, and files the workers write.

To Dask (``from_hurray``). A dense host tensor becomes a Dask array whose chunks are
NumPy views of its memory: the graph holds the views themselves, so computing a chunk
with the local schedulers copies nothing. A tensor that points into a file
``hb.load`` mapped becomes a lazy array instead: each chunk is read from the file
when it is computed, by mapping the file in the process that computes it (a
distributed worker maps it too; nothing is shipped from here). The chunk grid is
Dask's ``"auto"`` unless ``chunks=`` says otherwise. A sharded tensor's boxes become
the chunks when they form a grid (``shards.from_hurray``).

From Dask (``to_hurray``). ``hb.asarray(x)`` computes the array into one new NumPy
array: a copy by nature, so ``copy=False`` refuses it and the tensor says
``copied``. ``hb.save(path, {"x": x})`` does not compute it here: the file is planned
from ``x``'s shape and type, and each chunk is written into the file by the process
that computes it (``DEFERRED_SAVE``; docs/spec/container.md §8), so under a
``distributed.Client`` no process holds the whole array.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

import dask
import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from hurray_bridge import _host
from hurray_bridge._copy_policy import check_copy, require_copy
from hurray_bridge._deferred import FileTarget, Job, Run
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge.conversion import asarray
from hurray_bridge.descriptor import Descriptor
from hurray_bridge.dtypes import DType
from hurray_bridge.errors import FormatError, UnsupportedError, not_a_tensor
from hurray_bridge.files.mapping import file_stamp, mapped_file_origin
from hurray_bridge.files.writing import write_box
from hurray_bridge.tensor import CPU, Tensor

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "dask"
"""The target name: ``hb.convert(x, "dask")``."""
HOLDS = frozenset({"dense", "sharded"})
"""Dense Dask arrays; and a sharded tensor becomes one whose chunks are its boxes
(``.shards``)."""
DEVICES = frozenset({int(DLDeviceType.kDLCPU)})
"""The host only (kDLCPU): the chunks are NumPy arrays."""
LEGACY_EXPORTS_MUTABLE = False
"""Dask arrays export no DLPack capsule of their own; nothing to declare."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: a Dask array's chunks are NumPy arrays, which keep their memory."""


# Dask's chunks are NumPy arrays: their types and views are the core's host path
# (hurray_bridge._host), which every adapter shares for host memory.
def native_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype of a Hurray element type: the dtype of the Dask array's chunks."""
    return _host.native_dtype(dtype)


def native_dtypes() -> dict[DType, np.dtype]:
    """Its element-type table: the host path's (a Dask array's chunks are NumPy arrays)."""
    return _host.native_dtypes()


def dtype_of(dt: np.dtype) -> DType:
    """The Hurray element type of a Dask array's dtype (a NumPy dtype)."""
    return _host.dtype_of(np.dtype(dt))


def special_kind(obj: Any) -> str | None:
    """None: a Dask object ``to_hurray`` refuses stays refused."""
    return None


fast_import = None
"""No shortcut: converting a Dask array computes it, which only the full path does."""
fast_export = None
"""No shortcut: a Dask array is built from the tensor's memory by ``from_hurray``."""


def _known_shape(x: Any, what: str) -> tuple[int, ...]:
    """``x``'s shape, refused while a chunk's size is unknown (NaN)."""
    if any(np.isnan(c) for dim in x.chunks for c in dim):
        raise UnsupportedError(
            f"{what}: the Dask array has chunks of unknown size (shape {x.shape}); call "
            "x.compute_chunk_sizes() first")
    return tuple(int(n) for n in x.shape)


def _host_chunks(x: Any, what: str) -> None:
    meta = getattr(x, "_meta", None)
    if not isinstance(meta, np.ndarray):
        raise UnsupportedError(
            f"{what}: the Dask array's chunks are {type(meta).__module__}."
            f"{type(meta).__name__} objects, not NumPy arrays; Hurray reads host memory: "
            "map them to NumPy first (x.map_blocks(cupy.asnumpy) for CuPy chunks)")


# --------------------------------------------------------------------- to Hurray
def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A Dask array as an hb.Tensor: computed into one new host array (a copy, so
    ``copy=False`` refuses it)."""
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if not isinstance(obj, da.Array):
        raise UnsupportedError(f"expected a dask.array.Array, got {type(obj).__name__}")
    _known_shape(obj, "hb.asarray")
    _host_chunks(obj, "hb.asarray")
    why = "computing a Dask array gathers its chunks into one new array"
    require_copy(copy, None, why, refusal=(
        f"{why}, which is a copy, but copy=False; pass copy=None, or save it with "
        "hb.save, which has each chunk written where it is computed"))
    # Not np.ascontiguousarray: it makes a rank-0 result rank 1.
    t = asarray(np.asarray(obj.compute(), order="C"))
    assert isinstance(t, Tensor)  # a NumPy array is one tensor
    t._copied = True
    return t


def _chunk_bounds(chunks: tuple[tuple[int, ...], ...]) -> list[list[int]]:
    """Per axis, where each chunk starts, and the axis's end: a chunk's index ``i`` spans
    ``bounds[axis][i]`` to ``bounds[axis][i + 1]``."""
    return [np.cumsum((0, *c)).tolist() for c in chunks]


# ------------------------------------------------------------------- from Hurray
def _view_chunks(arr: np.ndarray, chunks: Any = "auto") -> da.Array:
    """A Dask array whose chunks are views of ``arr`` (the graph holds the views)."""
    grid = da.core.normalize_chunks(chunks, arr.shape, dtype=arr.dtype)
    name = f"hurray-view-{secrets.token_hex(8)}"
    bounds = _chunk_bounds(grid)
    layer: dict[Any, Any] = {}
    for idx in np.ndindex(*(len(c) for c in grid)):
        box = tuple(slice(b[i], b[i + 1]) for b, i in zip(bounds, idx, strict=True))
        layer[(name, *idx)] = arr[box]
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return da.Array(graph, name, grid, meta=arr[tuple(slice(0, 0) for _ in arr.shape)])


class _FileSlices:
    """The array of one file entry, read from the file where it is sliced.

    Dask slices it once per chunk, in the process that computes the chunk, which maps
    the file there: so a chunk is a view of a map in the worker that holds it. The
    file must still be the one ``hb.load`` mapped (same device, inode, size and
    modification time as then); a replaced or rewritten file is refused.
    """

    def __init__(self, path: str, offset: int, shape: tuple[int, ...], dtype: np.dtype,
                 stamp: tuple[int, int, int, int]) -> None:
        self.path, self.offset, self.shape, self.dtype = path, offset, shape, dtype
        self.stamp = stamp
        self.ndim = len(shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        if file_stamp(os.stat(self.path)) != self.stamp:
            raise FormatError(
                f"{self.path!r} changed after it was loaded (device, inode, size or "
                "modification time differ), so a chunk of its entry cannot be read as it "
                "was; load the file again and convert its entry again", field="file")
        whole = np.memmap(self.path, self.dtype, "r", self.offset, self.shape)
        return np.asarray(whole[key])


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None,
                chunks: Any = "auto") -> da.Array:
    """An hb.Tensor as a Dask array of NumPy chunks: views of its memory, or, for an
    entry of a loaded file, chunks read from the file when computed (see the module
    docstring). ``copy=True`` gives views of one fresh copy."""
    if not isinstance(t, Tensor):
        raise not_a_tensor(t, NAME)
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if device is not None and device not in ("cpu", CPU):
        raise UnsupportedError(
            f"Dask arrays here hold NumPy chunks, in host memory; device={device!r} is not "
            "possible")
    origin = mapped_file_origin(t) if not copy else None
    if (origin is not None and t.is_dense and t.strides is None
            and (t.dtype.bits >= 8 or t.descriptor.padded)):
        path, offset, stamp = origin
        dt = native_dtype(t.dtype)
        src = _FileSlices(path, offset, t.shape, dt, stamp)
        return da.from_array(src, chunks=chunks, lock=False, asarray=False,
                             inline_array=True, meta=np.empty((0,) * t.ndim, dt))
    arr = _host.from_hurray(t, copy=copy)
    return _view_chunks(arr, chunks)


# ------------------------------------------------------------- saves by the workers
def _write_chunk(chunk: Any, target: FileTarget, job: Job, start: tuple[int, ...],
                 stop: tuple[int, ...], dtype: np.dtype, checksums: bool) -> list[Run]:
    """Write one computed chunk into the save's temporary (in the process computing it)."""
    want = tuple(b - a for a, b in zip(start, stop, strict=True))
    if not isinstance(chunk, np.ndarray) or chunk.dtype != dtype or chunk.shape != want:
        got = (f"{type(chunk).__name__} of {chunk.dtype} {chunk.shape}"
               if isinstance(chunk, np.ndarray) else type(chunk).__name__)
        raise FormatError(
            f"entry {job.name!r}: a chunk at {list(start)} computed as {got}, but the file was "
            f"planned from the Dask array's metadata, {dtype} {want}: the array's dtype or "
            "chunks are not what its graph computes (fix the map_blocks dtype=/chunks=, or "
            "compute it first)", field="chunk")
    flat = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
    return write_box(target, job, start, stop, flat, checksums)


class _DeferredSave:
    """``hb.save`` of Dask arrays: every chunk is written by the process computing it."""

    def describe(self, obj: Any) -> Descriptor:
        shape = _known_shape(obj, "hb.save")
        _host_chunks(obj, "hb.save")
        dtype = dtype_of(obj.dtype)
        return Descriptor(shape, dtype, padded=dtype.bits < 8)

    def write(self, target: FileTarget, jobs: list[Job], checksums: bool) -> list[list[Run]]:
        tasks, counts = [], []
        write = dask.delayed(_write_chunk, pure=False)
        for job in jobs:
            x = job.value
            bounds = _chunk_bounds(x.chunks)
            blocks = x.to_delayed()
            name = f"hurray-write-{x.name}"
            # What travels with each task: the job without the array (the task has its chunk).
            small = job._replace(value=None)
            for idx in np.ndindex(*blocks.shape):
                start = tuple(b[i] for b, i in zip(bounds, idx, strict=True))
                stop = tuple(b[i + 1] for b, i in zip(bounds, idx, strict=True))
                # Named after the chunk's own key: the scheduler runs it where the chunk is.
                tasks.append(write(blocks[idx], target, small, start, stop, x.dtype, checksums,
                                   dask_key_name=(name, *idx)))
            counts.append(blocks.size)
        done = dask.compute(*tasks)
        out, at = [], 0
        for n in counts:
            out.append([Run(*r) for runs in done[at:at + n] for r in runs])
            at += n
        return out


DEFERRED_SAVE = _DeferredSave()
"""How ``hb.save`` writes a Dask array: planned here, each chunk written by the
process that computes it (see the module docstring)."""
