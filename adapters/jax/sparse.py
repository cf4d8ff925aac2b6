"""``jax.experimental.sparse`` BCOO / BCSR (``n_batch = n_dense = 0``) <-> sparse hb.Tensor.

A CSC tensor becomes a BCOO (JAX has no CSC). The interface (``to_hurray``,
``from_hurray``, ``to_dense``) is described in ``hurray_bridge/sparse.py``.
Host arrays are checked with NumPy, device arrays with jax.numpy on their device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from hurray_bridge._copy_policy import require_copy
from hurray_bridge._host import from_hurray as host_from_hurray
from hurray_bridge._host import to_hurray as host_to_hurray
from hurray_bridge.errors import FormatError, UnsupportedError
from hurray_bridge.layout import Layout
from hurray_bridge.sparse import (
    ArrayOps,
    SparseParts,
    assemble,
    check,
    check_indptr,
    host_arrays,
    host_ops,
    prefix_view,
    verify,
)
from hurray_bridge.tensor import Tensor

from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_dense", "to_hurray"]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC
_OPS = ArrayOps(jnp)


def _oob_rows(xp: Any, coords: Any, shape: tuple[int, ...]) -> Any:
    """Entries (rows of an (nse, rank) array) with an index at or past its dimension."""
    out = None
    limit = xp.iinfo(coords.dtype).max
    for j, size in enumerate(shape):
        if size > limit:
            continue  # no index of this type can reach it
        col = coords[:, j] >= size
        out = col if out is None else out | col
    return out


@dataclass(frozen=True)
class _Reading:
    """What both layouts' readers share: the matrix shape, whether JAX vouches for sorted
    unique indices, where the arrays live, and the array library (NumPy on the host,
    jax.numpy on a device) with its checks and its converter to hb.Tensor."""

    shape: tuple[int, ...]
    trust: bool
    host: bool
    xp: Any
    ops: ArrayOps
    comp: Callable[[Any], Tensor]
    copy: bool | None


def to_hurray(x: Any, *, copy: bool | None) -> Tensor:
    """A BCOO or BCSR without batch or dense dimensions as a sparse hb.Tensor."""
    name = type(x).__name__
    if name not in ("BCOO", "BCSR"):
        raise UnsupportedError(f"jax.experimental.sparse.{name} has no Hurray layout; "
                               "convert it to BCOO or BCSR first")
    if x.n_batch or x.n_dense:
        raise UnsupportedError(
            f"{name} with n_batch={x.n_batch}, n_dense={x.n_dense}: Hurray sparse layouts have "
            "neither batch nor dense dimensions; use jax.experimental.sparse."
            "bcoo_update_layout(x, n_batch=0, n_dense=0) (or BCSR.to_bcoo()) first"
        )
    shape = tuple(int(d) for d in x.shape)
    trust = bool(x.indices_sorted and x.unique_indices)
    data_t, idx_t = dense_to_hurray(x.data, copy=copy), dense_to_hurray(x.indices, copy=copy)
    host = data_t.device.is_host_accessible
    # Host memory is read through NumPy views, device memory with jax.numpy where it is;
    # arrays made on the way are of the same library, and converted by its adapter.
    if host:
        r = _Reading(shape, trust, host, np, host_ops(), host_to_hurray, copy)
        data = host_from_hurray(data_t, copy=False)
        indices = host_from_hurray(idx_t, copy=False)
    else:
        r = _Reading(shape, trust, host, jnp, _OPS, dense_to_hurray, copy)
        data, indices = x.data, x.indices
    # JAX pads with out-of-range entries (index == shape: BCOO.fromdense(nse=...),
    # sum_duplicates, BCSR padding past indptr[-1]); its todense() drops every
    # out-of-range entry, so none of them is data. They are stripped, never passed on.
    xp = r.xp
    if xp.issubdtype(indices.dtype, xp.signedinteger) and indices.size and \
            bool((indices < 0).any()):
        raise FormatError(f"this {name} has a negative index, which is no stored entry",
                          field="indices")
    if name == "BCOO":
        return _bcoo(r, data, indices, data_t, idx_t)
    return _bcsr(r, x, data, indices, data_t, idx_t)


def _bcoo(r: _Reading, data: Any, indices: Any, data_t: Tensor, idx_t: Tensor) -> Tensor:
    """A BCOO as COO: its padding stripped (a copy), its (nnz, rank) coordinates
    transposed to Hurray's (rank, nnz) (a copy unless one of them is 1)."""
    shape, copy, xp, comp = r.shape, r.copy, r.xp, r.comp
    copied = False
    nse, rank = int(data.shape[0]), len(shape)
    oob = _oob_rows(xp, indices, shape) if nse and rank else None
    if oob is not None and bool(oob.any()):
        require_copy(copy, None, "this BCOO holds out-of-range padding entries, which are "
                                 "not data and must be stripped")
        keep = ~oob
        data, indices, copied = data[keep], indices[keep], True
        data_t = comp(data)
    nnz = int(data.shape[0])
    if rank == 1 or nnz <= 1:
        coo = indices.reshape(rank, nnz)  # the same memory: no transposition needed
        idx_t = (prefix_view(idx_t, (rank, nnz))
                 if r.host and not copied and idx_t.strides is None else comp(coo))
    else:
        require_copy(copy, None, "BCOO stores coordinates as (nnz, rank) and Hurray COO as "
                                 "(rank, nnz), so they must be transposed")
        coo = xp.ascontiguousarray(indices.T) if r.host else xp.transpose(indices)
        idx_t, copied = comp(coo), True
    canonical = check(r.ops, _COO, shape, nnz, coo, None, r.trust)
    return assemble(_COO, shape, data_t, idx_t, None, canonical, copy=copy, copied=copied)


def _bcsr(r: _Reading, x: Any, data: Any, indices: Any, data_t: Tensor, idx_t: Tensor
          ) -> Tensor:
    """A BCSR as CSR: entries past indptr[-1] sliced off (a view on the host), out-of-range
    padding inside it stripped and indptr recounted (a copy), one index type for both."""
    shape, copy, xp, comp = r.shape, r.copy, r.xp, r.comp
    copied = False
    ptr_t = dense_to_hurray(x.indptr, copy=copy)
    indptr = host_from_hurray(ptr_t, copy=False) if r.host else x.indptr
    nnz, nse = int(indptr[-1]), int(data.shape[0])
    if not 0 <= nnz <= nse:
        raise FormatError(f"BCSR indptr ends at {nnz}, outside its {nse} stored entries",
                          field="indptr")
    inner = indices[:nnz]
    bad = ((inner >= shape[1]) if shape[1] <= xp.iinfo(inner.dtype).max else None) if nnz else None
    if bad is not None and bool(bad.any()):
        require_copy(copy, None, "this BCSR holds out-of-range padding entries inside indptr, "
                                 "which must be stripped")
        check_indptr(r.ops, _CSR, indptr, nnz)  # before searchsorted relies on it
        keep = ~bad
        major = xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1
        counts = xp.bincount(major[keep], minlength=shape[0]).astype(indptr.dtype)
        indptr = xp.concatenate([xp.zeros(1, indptr.dtype), xp.cumsum(counts).astype(indptr.dtype)])
        data, inner = data[:nnz][keep], inner[keep]
        nnz = int(inner.shape[0])
        data_t, idx_t, ptr_t, copied = comp(data), comp(inner), comp(indptr), True
    elif nnz < nse:
        # Padding past indptr[-1] only: the stored prefix is the matrix (a view on the host;
        # JAX slices on a device are new arrays).
        if r.host and data_t.strides is None and idx_t.strides is None:
            data_t, idx_t = prefix_view(data_t, (nnz,)), prefix_view(idx_t, (nnz,))
        else:
            require_copy(copy, None, "this BCSR holds padding entries past indptr[-1], which "
                                     "must be sliced off")
            data_t, idx_t, copied = comp(data[:nnz]), comp(inner), True
    canonical = check(r.ops, _CSR, shape, nnz, inner, indptr, r.trust)
    if idx_t.dtype != ptr_t.dtype:
        require_copy(copy, None, f"BCSR indices ({idx_t.dtype.name}) and indptr "
                                 f"({ptr_t.dtype.name}) differ and Hurray has one index type")
        wide = xp.promote_types(inner.dtype, indptr.dtype)
        idx_t, ptr_t, copied = comp(inner.astype(wide)), comp(indptr.astype(wide)), True
    return assemble(_CSR, shape, data_t, idx_t, ptr_t, canonical, copy=copy, copied=copied)


def from_hurray(p: SparseParts, *, device: Any, copy: bool | None, checked: bool) -> Any:
    """A sparse tensor as a BCSR (CSR) or BCOO (COO, and CSC with computed columns)."""
    host = p.device.is_host_accessible
    idx_t, ptr_t = p.indices, p.indptr
    reported = False
    if p.index_dtype.bits == 64 and not jax.config.read("jax_enable_x64"):
        # JAX narrows 64-bit arrays silently without x64 (jax-ml/jax#11895); narrow the
        # indices here instead, after the range check, and say so.
        if not host:
            raise UnsupportedError("64-bit sparse indices on a device need jax_enable_x64")
        if max((*p.shape, p.nnz), default=0) > 2**31 - 1:
            raise UnsupportedError(f"{p.index_dtype.name} indices of shape {list(p.shape)} do "
                                   "not fit int32; enable jax_enable_x64")
        require_copy(copy, "jax", f"JAX without jax_enable_x64 holds 32-bit indices; the "
                                  f"{p.index_dtype.name} indices are narrowed to int32")
        idx_n, ptr_n = host_arrays(p)
        idx_t = host_to_hurray(idx_n.astype("int32"))
        ptr_t = None if ptr_n is None else host_to_hurray(ptr_n.astype("int32"))
        reported = True
    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    vals = dense_from_hurray(p.values, device=device, copy=copy)
    if p.layout == _CSR:
        assert ptr_t is not None
        idx = dense_from_hurray(idx_t, device=device, copy=copy)
        ptr = dense_from_hurray(ptr_t, device=device, copy=copy)
        if not checked:
            verify(_OPS, p, idx, ptr)
        return jsparse.BCSR((vals, idx, ptr), shape=p.shape, indices_sorted=p.canonical,
                            unique_indices=p.canonical)
    if p.layout == _CSC:
        assert ptr_t is not None
        if not reported:
            require_copy(copy, "jax", "JAX has no CSC layout; the matrix becomes a BCOO whose "
                                      "column coordinates are computed from INDPTR")
        rows = dense_from_hurray(idx_t, device=device, copy=None)
        ptr = dense_from_hurray(ptr_t, device=device, copy=None)
        if not checked:
            verify(_OPS, p, rows, ptr)
        cols = jnp.repeat(jnp.arange(p.shape[1], dtype=rows.dtype), ptr[1:] - ptr[:-1],
                          total_repeat_length=p.nnz)
        # Column-major order: not "sorted" in BCOO's (row-major) sense; unique if canonical.
        return jsparse.BCOO((vals, jnp.stack([rows, cols], axis=1)), shape=p.shape,
                            indices_sorted=False, unique_indices=p.canonical)
    rank, nnz = len(p.shape), p.nnz
    if (rank == 1 or nnz <= 1) and host:
        # The same memory under the (nnz, rank) shape BCOO wants.
        idx = dense_from_hurray(prefix_view(idx_t, (nnz, rank)), device=device, copy=copy)
    else:
        idx_rm = dense_from_hurray(idx_t, device=device, copy=copy)
        if not checked:
            verify(_OPS, p, idx_rm, None)
        if not reported:
            require_copy(copy, "jax", "BCOO stores coordinates as (nnz, rank) and Hurray COO "
                                      "as (rank, nnz), so they are transposed")
        idx = jnp.transpose(idx_rm)
    return jsparse.BCOO((vals, idx), shape=p.shape, indices_sorted=p.canonical,
                        unique_indices=p.canonical)


def to_dense(x: Any) -> Any:
    """JAX's own dense array of a BCOO or BCSR (on its device)."""
    return x.todense()
