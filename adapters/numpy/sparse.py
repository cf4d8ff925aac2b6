"""``scipy.sparse`` coo/csr/csc <-> sparse hb.Tensor: the ``"numpy"`` sparse target
(NumPy has no sparse arrays). scipy is imported only when a conversion needs it.

The interface (``to_hurray``, ``from_hurray``, ``to_dense``) is described in
``hurray_bridge/sparse.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hurray_bridge._copy_policy import require_copy
from hurray_bridge.errors import BackendNotAvailableError, UnsupportedError
from hurray_bridge.layout import Layout
from hurray_bridge.sparse import (
    SparseParts,
    assemble,
    check,
    host_only,
    host_ops,
    prefix_view,
    report_if_copied,
)
from hurray_bridge.tensor import CPU, Tensor

from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_dense", "to_hurray"]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC
_FORMATS = {"coo": _COO, "csr": _CSR, "csc": _CSC}


def to_hurray(m: Any, *, copy: bool | None) -> Tensor:
    """A scipy.sparse coo/csr/csc array or matrix as a sparse hb.Tensor."""
    fmt = getattr(m, "format", None)
    layout = _FORMATS.get(fmt)  # type: ignore[arg-type]
    if layout is None:
        raise UnsupportedError(
            f"scipy.sparse format {fmt!r} has no Hurray layout; convert it first with "
            ".tocsr(), .tocsc() or .tocoo()"
        )
    ops = host_ops()
    shape = tuple(int(d) for d in m.shape)
    if layout == _COO:
        coords = tuple(m.coords) if hasattr(m, "coords") else (m.row, m.col)
        nnz = int(m.data.shape[0])
        idx_t = _stacked(coords, nnz)
        copied = idx_t is None
        if idx_t is None:
            require_copy(copy, None, "scipy COO keeps one coordinate vector per dimension and "
                                     "Hurray one (rank, nnz) array, so they must be stacked")
            idx_t = dense_to_hurray(np.stack(np.broadcast_arrays(*coords)).astype(
                np.result_type(*coords), copy=False))
        idx = dense_from_hurray(idx_t, copy=False)
        # scipy's COO flag is a plain attribute that sum_duplicates() sets, and older scipy
        # sorted column-major there (scipy/scipy#10050): the order is checked here instead.
        canonical = check(ops, _COO, shape, nnz, idx, None)
        return assemble(_COO, shape, dense_to_hurray(m.data, copy=copy),
                        idx_t.copy() if copy else idx_t, None, canonical, copy=copy,
                        copied=copied)
    indices, indptr, copied = m.indices, m.indptr, False
    if indices.dtype != indptr.dtype:
        require_copy(copy, None, f"scipy indices ({indices.dtype}) and indptr ({indptr.dtype}) "
                                 "differ and Hurray has one index type, so one must be converted")
        dt = np.promote_types(indices.dtype, indptr.dtype)
        indices, indptr, copied = indices.astype(dt), indptr.astype(dt), True
    nnz = int(indptr[-1])
    # scipy may keep data/indices longer than nnz: the prefix is the matrix.
    indices, data = indices[:nnz], m.data[:nnz]
    if len(shape) == 1:
        # A 1-D csr_array (scipy >= 1.15) is one row: its column indices are COO coordinates.
        idx = indices.reshape(1, nnz)
        canonical = check(ops, _COO, shape, nnz, idx, None)
        return assemble(_COO, shape, dense_to_hurray(data, copy=copy),
                        dense_to_hurray(idx, copy=copy), None, canonical, copy=copy,
                        copied=copied)
    # CSR/CSC has_canonical_format is computed by scipy itself (and cached).
    canonical = check(ops, layout, shape, nnz, indices, indptr, bool(m.has_canonical_format))
    return assemble(layout, shape, dense_to_hurray(data, copy=copy),
                    dense_to_hurray(indices, copy=copy), dense_to_hurray(indptr, copy=copy),
                    canonical, copy=copy, copied=copied)


def _stacked(coords: Sequence[Any], nnz: int) -> Tensor | None:
    """The coordinate vectors as one (rank, nnz) hb.Tensor when memory already holds them so.

    True when scipy was given the rows of one (rank, nnz) array (``coo_array((v,
    tuple(idx)))``, and what :func:`from_hurray` builds): no copy then.
    """
    if not coords:
        return None
    dt = coords[0].dtype
    if any(c.dtype != dt or c.shape != (nnz,) or not c.flags.c_contiguous for c in coords):
        return None
    head = dense_to_hurray(coords[0])
    if nnz == 0:
        return prefix_view(head, (len(coords), 0))
    base, step = head.data_ptr, nnz * dt.itemsize
    if any(_addr(c) != base + j * step for j, c in enumerate(coords)):
        return None
    ro = any(not c.flags.writeable for c in coords)
    return Tensor._dense(base, (len(coords), nnz), head.dtype, strides=None, padded=False,
                         device=CPU, owner=tuple(coords), readonly=ro, copied=False)


def _addr(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def from_hurray(p: SparseParts, *, device: Any, copy: bool | None, checked: bool) -> Any:
    """A host sparse tensor as a scipy.sparse coo/csr/csc *array*, sharing its components."""
    host_only("scipy.sparse", p, device)
    try:
        import scipy.sparse as sps
    except ImportError as exc:
        raise BackendNotAvailableError(
            "scipy", "test", "a sparse tensor converts to numpy as a scipy.sparse array; pass "
            "densify=True for a dense NumPy array instead") from exc
    from scipy.sparse import _sputils

    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    data = dense_from_hurray(p.values, copy=copy)
    if data.dtype not in [np.dtype(d) for d in _sputils.supported_dtypes]:
        raise UnsupportedError(
            f"scipy.sparse cannot hold {p.values.dtype.name} values (it holds bool, integers, "
            "float32/64 and complex); convert with densify=True, or cast the values first"
        )
    idx = dense_from_hurray(p.indices, copy=copy)
    ptr = None if p.indptr is None else dense_from_hurray(p.indptr, copy=copy)
    if idx.dtype not in (np.int32, np.int64):
        wide = np.int32 if idx.dtype.itemsize <= 2 else np.int64
        require_copy(copy, "numpy", f"scipy.sparse indices are int32 or int64, not {idx.dtype}")
        idx = idx.astype(wide)
        ptr = None if ptr is None else ptr.astype(wide)
    if p.layout == _COO:
        m = sps.coo_array((data, tuple(idx)), shape=p.shape, copy=False)
        m.has_canonical_format = p.canonical
        report_if_copied("numpy", "scipy.sparse", [m.data, *m.coords], [data, *tuple(idx)],
                         copy, _addr)
        return m
    cls = sps.csr_array if p.layout == _CSR else sps.csc_array
    m = cls((data, idx, ptr), shape=p.shape, copy=False)
    if p.canonical:
        m.has_canonical_format = True  # verified: spares scipy its own pass
    report_if_copied("numpy", "scipy.sparse", [m.data, m.indices, m.indptr], [data, idx, ptr],
                     copy, _addr)
    return m


def to_dense(m: Any) -> Any:
    """scipy's own dense array of a sparse one."""
    return m.toarray()
