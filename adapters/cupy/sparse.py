"""``cupyx.scipy.sparse`` coo/csr/csc matrices <-> sparse hb.Tensor, on the device.

The interface (``to_hurray``, ``from_hurray``, ``to_dense``) is described in
``hurray_bridge/sparse.py``. Indices are checked with CuPy, on the matrix's device;
``cupyx`` is imported only when a matrix is built.
"""

from __future__ import annotations

from typing import Any

import cupy

from hurray_bridge._copy_policy import require_copy
from hurray_bridge.errors import UnsupportedError
from hurray_bridge.layout import Layout
from hurray_bridge.sparse import ArrayOps, SparseParts, assemble, check, report_if_copied, verify
from hurray_bridge.tensor import Tensor

from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_dense", "to_hurray"]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC
_FORMATS = {"coo": _COO, "csr": _CSR, "csc": _CSC}
_OPS = ArrayOps(cupy)


def to_hurray(m: Any, *, copy: bool | None) -> Tensor:
    """A cupyx.scipy.sparse coo/csr/csc matrix as a sparse hb.Tensor on its device."""
    fmt = getattr(m, "format", None)
    layout = _FORMATS.get(fmt)  # type: ignore[arg-type]
    if layout is None:
        raise UnsupportedError(f"cupyx.scipy.sparse format {fmt!r} has no Hurray layout; "
                               "convert it first with .tocsr(), .tocsc() or .tocoo()")
    shape = tuple(int(d) for d in m.shape)
    nnz = int(m.nnz)
    if layout == _COO:
        require_copy(copy, None, "cupyx COO keeps row and col apart and Hurray one (2, nnz) "
                                 "array, so they must be stacked")
        with m.data.device:
            idx = cupy.stack([m.row, m.col])
        canonical = check(_OPS, _COO, shape, nnz, idx, None,
                          bool(getattr(m, "has_canonical_format", False)))
        return assemble(_COO, shape, dense_to_hurray(m.data, copy=copy), dense_to_hurray(idx),
                        None, canonical, copy=copy, copied=True)
    data, indices, indptr = m.data[:nnz], m.indices[:nnz], m.indptr
    canonical = check(_OPS, layout, shape, nnz, indices, indptr)
    return assemble(layout, shape, dense_to_hurray(data, copy=copy),
                    dense_to_hurray(indices, copy=copy), dense_to_hurray(indptr, copy=copy),
                    canonical, copy=copy)


def _addr(a: Any) -> int:
    return int(a.data.ptr)


def from_hurray(p: SparseParts, *, device: Any, copy: bool | None, checked: bool) -> Any:
    """A sparse tensor as a cupyx.scipy.sparse coo/csr/csc matrix over its components."""
    from cupyx.scipy import sparse as csp

    vt = p.values.dtype.name
    if vt not in ("bool8", "float32", "float64", "complex64", "complex128"):
        raise UnsupportedError(
            f"cupyx.scipy.sparse holds bool, float32/64 and complex64/128 values, not {vt} "
            "(cupy/cupy#10148); convert with densify=True, or cast the values first"
        )
    if p.layout == _COO and len(p.shape) != 2:
        raise UnsupportedError(f"cupyx.scipy.sparse COO is rank 2; this tensor has rank "
                               f"{len(p.shape)}")
    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    data = dense_from_hurray(p.values, device=device, copy=copy)
    idx = dense_from_hurray(p.indices, device=device, copy=copy)
    ptr = None if p.indptr is None else dense_from_hurray(p.indptr, device=device, copy=copy)
    if not checked:
        verify(_OPS, p, idx, ptr)
    if idx.dtype != cupy.int32:
        # cupyx matrices hold int32 indices whenever the values fit: CuPy 13 narrows any
        # index array to int32 unchecked, newer CuPy picks int32 from the contents
        # (cupyx/scipy/sparse/_compressed.py). Narrow here, after the range check, and say so.
        if max((*p.shape, p.nnz), default=0) <= 2**31 - 1:
            wide = cupy.int32
        elif int(cupy.__version__.split(".")[0]) < 14:
            raise UnsupportedError(
                f"CuPy {cupy.__version__} holds int32 sparse indices only and this tensor "
                f"(shape {list(p.shape)}, nnz {p.nnz}) needs int64")
        else:
            wide = cupy.int64
        if idx.dtype != wide:
            require_copy(copy, "cupy", f"cupyx.scipy.sparse indices are {cupy.dtype(wide).name} "
                                       f"here, not {p.index_dtype.name}")
            idx = idx.astype(wide)
            ptr = None if ptr is None else ptr.astype(wide)
    with data.device:
        if p.layout == _COO:
            m = csp.coo_matrix((data, (idx[0], idx[1])), shape=p.shape)
            kept, given = [m.data], [data]
        else:
            cls = csp.csr_matrix if p.layout == _CSR else csp.csc_matrix
            # Older CuPy keeps int32 indices only: int64 ones are narrowed (a reported copy).
            m = cls((data, idx, ptr), shape=p.shape, copy=False)
            kept, given = [m.data, m.indices, m.indptr], [data, idx, ptr]
    if p.canonical:
        try:
            m.has_canonical_format = True
        except AttributeError:  # a CuPy without the setter
            pass
    report_if_copied("cupy", "cupyx.scipy.sparse", kept, given, copy, _addr)
    return m


def to_dense(m: Any) -> Any:
    """CuPy's own dense array of a sparse matrix (on its device)."""
    return m.toarray()
