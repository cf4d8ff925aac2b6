"""``pa.SparseCOOTensor`` / ``SparseCSRMatrix`` / ``SparseCSCMatrix`` <-> sparse hb.Tensor.

Arrow's sparse tensors live in host memory, read through NumPy views. The interface
(``to_hurray``, ``from_hurray``, ``to_dense``) is described in ``hurray_bridge/sparse.py``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from hurray_bridge._copy_policy import require_copy
from hurray_bridge._host import from_hurray as host_from_hurray
from hurray_bridge._host import to_hurray as host_to_hurray
from hurray_bridge.dtypes import Kind
from hurray_bridge.errors import UnsupportedError
from hurray_bridge.layout import Layout
from hurray_bridge.sparse import SparseParts, assemble, check, host_only, host_ops
from hurray_bridge.tensor import Tensor

__all__ = ["from_hurray", "to_dense", "to_hurray"]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC
_CLASSES = {"SparseCOOTensor": _COO, "SparseCSRMatrix": _CSR, "SparseCSCMatrix": _CSC}


def to_hurray(obj: Any, *, copy: bool | None) -> Tensor:
    """An Arrow sparse COO tensor or CSR/CSC matrix as a sparse hb.Tensor (read-only)."""
    name = type(obj).__name__
    layout = _CLASSES.get(name)
    if layout is None:
        raise UnsupportedError(
            f"pyarrow {name} (compressed sparse fibre) has no Hurray layout; convert it with "
            "to_tensor() (dense) or to a SparseCOOTensor first"
        )
    ops = host_ops()
    shape = tuple(int(d) for d in obj.shape)
    arrays = obj.to_numpy()  # zero-copy views of the Arrow buffers; data is (nnz, 1)
    data = arrays[0].reshape(-1)
    nnz = int(data.shape[0])
    if layout == _COO:
        coords, rank = arrays[1], len(shape)  # (nnz, rank), row-major
        if rank == 1 or nnz <= 1:
            idx, copied = coords.reshape(rank, nnz), False
        else:
            require_copy(copy, None, "Arrow COO stores coordinates as (nnz, rank) and Hurray "
                                     "COO as (rank, nnz), so they must be transposed")
            idx, copied = np.ascontiguousarray(coords.T), True
        canonical = check(ops, _COO, shape, nnz, idx, None, bool(obj.has_canonical_format))
        return assemble(_COO, shape, _component(data, copy), _component(idx, copy), None,
                        canonical, copy=copy, copied=copied)
    indptr, indices = arrays[1], arrays[2]
    canonical = check(ops, layout, shape, nnz, indices, indptr)
    return assemble(layout, shape, _component(data, copy), _component(indices, copy),
                    _component(indptr, copy), canonical, copy=copy)


def _component(a: np.ndarray, copy: bool | None) -> Tensor:
    t = host_to_hurray(a, copy=copy)
    if copy or t.readonly:
        return t
    # Arrow memory is immutable: read-only, as the dense Arrow adapter marks it.
    return Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=t.strides,
                         padded=t.descriptor.padded, device=t.device, owner=t.owner, readonly=True,
                         copied=t.copied)


def from_hurray(p: SparseParts, *, device: Any, copy: bool | None, checked: bool) -> Any:
    """A host sparse tensor as an Arrow SparseCOOTensor or SparseCSR/CSCMatrix."""
    host_only("Arrow", p, device)
    vt = p.values.dtype
    if vt.kind not in (Kind.INT, Kind.UINT, Kind.FLOAT) or vt.is_subbyte or (
            vt.kind == Kind.FLOAT and vt.name not in ("float16", "float32", "float64")):
        raise UnsupportedError(
            f"Arrow sparse tensors hold int8..int64, uint8..uint64 and float16/32/64 values, "
            f"not {vt.name}; convert with densify=True, or cast the values first"
        )
    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    data = host_from_hurray(p.values, copy=copy)
    idx = host_from_hurray(p.indices, copy=copy)
    ptr = None if p.indptr is None else host_from_hurray(p.indptr, copy=copy)
    if idx.dtype != np.int64:
        # pyarrow's from_numpy would convert any other index type to int64 itself (tensor.pxi).
        require_copy(copy, "arrow", f"Arrow sparse indices are int64, not {p.index_dtype.name}")
        idx = idx.astype(np.int64)
        ptr = None if ptr is None else ptr.astype(np.int64)
    if not p.canonical:
        summed = _summed_duplicates(p.layout, p.shape, data, idx, ptr)
        if summed is not None:
            # A repeated index means the sum of its values (memory-layout.md §5.5, as in
            # SciPy, torch and JAX), but Arrow's to_tensor() keeps one of them (pyarrow
            # 26.0.1): hand Arrow the summed entries instead.
            require_copy(copy, "arrow", "Arrow does not sum repeated indices; they are summed "
                                        "first")
            data, idx, ptr = summed
    nnz = int(data.shape[0])
    values = data.reshape(nnz, 1)  # Arrow's sparse data has shape (nnz, 1)
    if p.layout == _COO:
        rank = len(p.shape)
        if nnz == 0:
            # pyarrow 26.0.1 refuses an empty (0, rank) coordinate array unless its strides are
            # (8, 8): "SparseCOOIndex indices must be contiguous" (its own from_scipy of an
            # empty matrix fails the same way).
            coords = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), (0, rank), (8, 8))
        elif rank == 1 or nnz == 1:
            coords = idx.reshape(nnz, rank)
        else:
            require_copy(copy, "arrow", "Arrow COO stores coordinates as (nnz, rank) and "
                                        "Hurray COO as (rank, nnz), so they are transposed")
            coords = np.ascontiguousarray(idx.T)
        return pa.SparseCOOTensor.from_numpy(values, coords, shape=p.shape)
    cls = pa.SparseCSRMatrix if p.layout == _CSR else pa.SparseCSCMatrix
    return cls.from_numpy(values, ptr, idx, shape=p.shape)


def _summed_duplicates(layout: Layout, shape: tuple[int, ...], data: Any, idx: Any,
                       ptr: Any) -> tuple[Any, Any, Any] | None:
    """Host arrays with repeated indices summed (canonical order), or None if none repeat."""
    nnz = int(data.shape[0])
    if nnz < 2:
        return None
    dims: tuple[int, ...]
    if layout == _COO:
        dims, keys = shape, tuple(idx.astype(np.intp))
    else:
        n_major = shape[0] if layout == _CSR else shape[1]
        dims = (n_major, shape[1] if layout == _CSR else shape[0])
        keys = (np.repeat(np.arange(n_major, dtype=np.intp), np.diff(ptr.astype(np.intp))),
                idx.astype(np.intp))
    flat = np.ravel_multi_index(keys, dims)
    order = np.argsort(flat, kind="stable")  # stable: values are summed in storage order
    flat = flat[order]
    first = np.concatenate([[True], flat[1:] != flat[:-1]])
    if first.all():
        return None
    starts = np.flatnonzero(first)
    vals = np.add.reduceat(data[order], starts)
    coords = np.unravel_index(flat[starts], dims)
    if layout == _COO:
        return vals, np.stack(coords).astype(idx.dtype), None
    counts = np.bincount(coords[0], minlength=dims[0])
    new_ptr = np.concatenate([[0], np.cumsum(counts)]).astype(ptr.dtype)
    return vals, coords[1].astype(idx.dtype), new_ptr


def to_dense(obj: Any) -> Any:
    """Arrow's own dense tensor of a sparse one (repeated indices were summed on the way in)."""
    return obj.to_tensor()
