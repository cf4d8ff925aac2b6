"""A sharded tensor as a Dask array whose chunks are its shards, without copying them.

Dask's chunks form a regular grid: along each axis, one list of chunk lengths that
every chunk of that column shares. A sharded tensor whose distinct boxes form such a
grid (each axis cut at the same points for every box, every cell covered once)
becomes a Dask array with one chunk per box, each a view of its shard's memory (the
lowest replica of a replicated box). Any other set (boxes of uneven cuts, an
incomplete set) gives ``NotImplemented``: the caller assembles it into one array,
a copy under the copy policy, and chunks that (``hb.convert``'s
``convert_sharded``).
"""

from __future__ import annotations

import secrets
from typing import Any

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph

from hurray_bridge import _host
from hurray_bridge.shards import Box, ShardedTensor, split
from hurray_bridge.tensor import Tensor

from . import _chunk_bounds
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_hurray"]


def grid_of(boxes: list[Box], shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | None:
    """The chunk lengths per axis when ``boxes`` tile ``shape`` as a grid, else ``None``."""
    grid: list[tuple[int, ...]] = []
    for ax, n in enumerate(shape):
        cuts = sorted({(b.offsets[ax], b.sizes[ax]) for b in boxes})
        pos, lengths = 0, []
        for start, size in cuts:
            if start != pos:
                return None  # overlapping or uneven cuts along this axis
            lengths.append(size)
            pos += size
        if pos != n:
            return None
        grid.append(tuple(lengths))
    cells = 1
    for axis in grid:
        cells *= len(axis)
    return tuple(grid) if cells == len(set(boxes)) else None


def from_hurray(st: ShardedTensor, *, device: Any = None, copy: bool | None = None) -> Any:
    """A Dask array with one chunk per box of ``st`` (views of the shards), or
    ``NotImplemented`` when the boxes form no grid (see the module docstring)."""
    if not st.is_complete or device not in (None, "cpu"):
        return NotImplemented
    primary = {id(t) for t in st.primary_shards()}
    by_box: dict[Box, Tensor] = {b: t for b, t in zip(st.boxes, st.shards, strict=True)
                                 if id(t) in primary}
    shape = tuple(st.shape)
    if not by_box or any(b.is_empty for b in by_box):
        return NotImplemented
    grid = grid_of(list(by_box), shape)
    if grid is None:
        return NotImplemented
    to_numpy = _host.from_hurray
    starts = [b[:-1] for b in _chunk_bounds(grid)]
    name = f"hurray-shards-{secrets.token_hex(8)}"
    layer: dict[Any, Any] = {}
    meta = None
    for box, t in by_box.items():
        idx = tuple(s.index(o) for s, o in zip(starts, box.offsets, strict=True))
        view = to_numpy(t, copy=copy)
        layer[(name, *idx)] = view.reshape(box.sizes)
        meta = view
    assert meta is not None
    graph = HighLevelGraph.from_collections(name, layer, dependencies=())
    return da.Array(graph, name, grid, meta=meta[tuple(slice(0, 0) for _ in shape)])


def to_hurray(x: Any, *, copy: bool | None = None) -> ShardedTensor:
    """A Dask array as an hb.ShardedTensor whose boxes are its chunks.

    The array is computed into one new host array, as ``hb.asarray`` of it is (a copy:
    ``copy=False`` refuses), and each shard is a view of its chunk's box there, so the
    chunk layout travels with the tensor (a sharded save records it).
    """
    t = dense_to_hurray(x, copy=copy)
    starts = [b[:-1] for b in _chunk_bounds(x.chunks)]
    boxes = [Box(tuple(s[i] for s, i in zip(starts, idx, strict=True)),
                 tuple(c[i] for c, i in zip(x.chunks, idx, strict=True)))
             for idx in np.ndindex(*(len(c) for c in x.chunks))]
    return split(t, boxes)


def __getattr__(name: str) -> Any:
    # The name this module had before every adapter's shards module said the same ones.
    if name == "from_sharded":
        import warnings

        warnings.warn("hurray_bridge.adapters.dask.shards.from_sharded is deprecated; use "
                      "from_hurray", DeprecationWarning, stacklevel=2)
        return from_hurray
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
