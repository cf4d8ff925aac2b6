"""Sparse layouts (COO, CSR, CSC) through the buffer table.

DLPack carries dense tensors only, so a sparse tensor crosses frameworks as a
record of dense *components* (``VALUES``, ``INDICES`` and, for CSR/CSC,
``INDPTR``) plus the sparse section of the descriptor (``nnz``, index type,
canonical flag). Each component is a dense array that the dense adapters move
zero-copy; this module takes sparse objects apart and puts them together.

==========  =============================================  ==========================
target      native sparse object                           layouts
==========  =============================================  ==========================
``numpy``   ``scipy.sparse`` coo/csr/csc (arrays and        COO (any rank), CSR, CSC
            matrices in; sparse *arrays* out)
``torch``   ``torch.sparse_coo`` / ``sparse_csr`` /         COO (any rank), CSR, CSC
            ``sparse_csc`` tensors
``jax``     ``jax.experimental.sparse`` BCOO / BCSR with    COO (any rank), CSR;
            ``n_batch = n_dense = 0``                      CSC becomes a BCOO (copy)
``arrow``   ``pa.SparseCOOTensor`` / ``SparseCSRMatrix`` /  COO (any rank), CSR, CSC
            ``SparseCSCMatrix``
``cupy``    ``cupyx.scipy.sparse`` coo/csr/csc matrices     COO (rank 2), CSR, CSC
==========  =============================================  ==========================

``"numpy"`` as a sparse target means ``scipy.sparse``: NumPy has no sparse
arrays. A dense result is made only on request, ``hb.convert(x, to,
densify=True)`` or :func:`densify`, never silently.

Index contents are untrusted (memory-layout.md §5.6): before a framework sees
them, every index is checked to lie below its dimension's size, ``INDPTR`` to
start at 0, never decrease and end at ``nnz``, and a canonical claim to hold —
with vectorised operations of whichever framework holds the memory (NumPy for
host memory, CuPy, JAX or torch on a device). A defect raises FormatError
naming the field. A tensor this module assembled itself is not checked twice.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from ._copy_policy import warn_copy
from ._memory import alloc_aligned, host_view
from ._registry import _ALIASES, ADAPTERS, get_adapter
from .conversion import asarray
from .descriptor import Descriptor, Sparse, check_empty_nnz
from .dtypes import DType, Kind
from .errors import (
    BackendNotAvailableError,
    CopyRequiredError,
    CopyWarning,
    FormatError,
    UnsupportedError,
)
from .layout import BufferRole, Layout
from .tensor import CPU, Buffer, Tensor

__all__ = [
    "SparseParts",
    "densify",
    "from_hurray",
    "is_sparse_native",
    "make_sparse",
    "parts",
    "to_hurray",
    "validate",
]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC
_ARROW_CLASSES = {"SparseCOOTensor": _COO, "SparseCSRMatrix": _CSR, "SparseCSCMatrix": _CSC}
_SCIPY_LAYOUTS = {"coo": _COO, "csr": _CSR, "csc": _CSC}
_HOST_DEVICES = (None, "cpu", CPU, (1, 0))

# Tensors assembled here (so already checked): from_hurray does not check them again.
_VALIDATED: weakref.WeakSet[Tensor] = weakref.WeakSet()


# ============================================================================= parts
@dataclass(frozen=True)
class SparseParts:
    """The components of a sparse hb.Tensor, each a dense hb.Tensor over one buffer.

    ``values``: ``(nnz,)``. ``indices``: ``(rank, nnz)`` for COO, ``(nnz,)`` for
    CSR/CSC. ``indptr``: ``(shape[0] + 1,)`` for CSR, ``(shape[1] + 1,)`` for CSC,
    ``None`` for COO.
    """

    layout: Layout
    shape: tuple[int, ...]
    values: Tensor
    indices: Tensor
    indptr: Tensor | None
    canonical: bool

    @property
    def nnz(self) -> int:
        return self.values.shape[0]

    @property
    def index_dtype(self) -> DType:
        return self.indices.dtype

    @property
    def device(self) -> Any:
        return self.values.device


class _Components:
    """Owner of an assembled sparse tensor: holds the component tensors (and through them
    the producers' memory and, on a device, the producers for stream synchronisation)."""

    __slots__ = ("__weakref__", "indices", "indptr", "values")

    def __init__(self, values: Tensor, indices: Tensor, indptr: Tensor | None) -> None:
        self.values = values
        self.indices = indices
        self.indptr = indptr

    def __repr__(self) -> str:
        return f"<sparse components {self.values!r}, {self.indices!r}, {self.indptr!r}>"


def _require_sparse(t: Tensor) -> Descriptor:
    d = t.descriptor
    if not d.layout.is_sparse:
        raise UnsupportedError(f"expected a COO, CSR or CSC hb.Tensor, got a {d.layout.name} one")
    if d.quantization is not None:
        raise UnsupportedError(
            "a quantized sparse tensor has no native form in any framework; read its "
            "buffers with t.buffer(role) (VALUES, INDICES, INDPTR, SCALES, ZERO_POINTS)"
        )
    return d


def parts(t: Tensor) -> SparseParts:
    """The components of a sparse hb.Tensor (no copy; each keeps ``t`` alive)."""
    d = _require_sparse(t)
    sp = d.sparse
    assert sp is not None
    by_role = {b.role: b for b in t.buffers}
    own = t.owner
    if (isinstance(own, _Components)
            and own.values.buffers[0].ptr == by_role[BufferRole.VALUES].ptr
            and own.indices.buffers[0].ptr == by_role[BufferRole.INDICES].ptr):
        return SparseParts(d.layout, d.shape, own.values, own.indices, own.indptr, sp.canonical)
    nnz, idt = sp.nnz, sp.index_dtype

    def view(role: BufferRole, shape: tuple[int, ...], dtype: DType, padded: bool) -> Tensor:
        return Tensor._dense(by_role[role].ptr, shape, dtype, strides=None, padded=padded,
                             device=t.device, owner=t, readonly=t.readonly, copied=t.copied)

    values = view(BufferRole.VALUES, (nnz,), d.dtype, d.padded)
    if d.layout == _COO:
        return SparseParts(_COO, d.shape, values,
                           view(BufferRole.INDICES, (d.rank, nnz), idt, False), None, sp.canonical)
    n_ptr = (d.shape[0] if d.layout == _CSR else d.shape[1]) + 1
    return SparseParts(d.layout, d.shape, values, view(BufferRole.INDICES, (nnz,), idt, False),
                       view(BufferRole.INDPTR, (n_ptr,), idt, False), sp.canonical)


# ======================================================================== validation
class _Ops:
    """The array operations validation needs that NumPy, CuPy, JAX and torch spell apart."""

    def __init__(self, arr: Any) -> None:
        top = type(arr).__module__.partition(".")[0]
        self.is_torch = top == "torch"
        if self.is_torch:
            import torch

            self.m: Any = torch
        elif top == "cupy":
            import cupy

            self.m = cupy
        elif top in ("jax", "jaxlib"):
            import jax.numpy as jnp

            self.m = jnp
        else:
            import numpy

            self.m = numpy

    def first(self, mask: Any) -> int:
        """Position of the first True of a boolean vector that has one."""
        if self.is_torch:
            return int(mask.nonzero()[0, 0])
        return int(self.m.argmax(mask.astype("int8")))

    def major_ids(self, indptr: Any, nnz: int) -> Any:
        """The row (CSR) or column (CSC) of every entry, given a checked ``indptr``."""
        if self.is_torch:
            pos = self.m.arange(nnz, dtype=indptr.dtype, device=indptr.device)
            return self.m.searchsorted(indptr, pos, right=True) - 1
        return self.m.searchsorted(indptr, self.m.arange(nnz, dtype=indptr.dtype),
                                   side="right") - 1


def _check_range(ops: _Ops, idx: Any, size: int, dim: int, what: str) -> None:
    """Every entry of the non-empty vector ``idx`` lies in ``[0, size)``."""
    lo, hi = int(idx.min()), int(idx.max())
    if lo >= 0 and hi < size:
        return
    # hi >= size means size fits the index type, so the comparison below is exact.
    bad = (idx < 0) | (idx >= size) if hi >= size else idx < 0
    e = ops.first(bad)
    raise FormatError(
        f"{what}: entry {e} has index {int(idx[e])} along dimension {dim}, outside "
        f"[0, {size}); every stored index must be non-negative and below its dimension's size",
        field="indices",
    )


def _lex_increasing(rows: Sequence[Any]) -> bool:
    """Consecutive index tuples strictly increase in row-major (lexicographic) order."""
    a, b = rows[0][:-1], rows[0][1:]
    lt, eq = a < b, a == b
    for r in rows[1:]:
        a, b = r[:-1], r[1:]
        lt = lt | (eq & (a < b))
        eq = eq & (a == b)
    return bool(lt.all())


def _check(layout: Layout, shape: tuple[int, ...], nnz: int, indices: Any, indptr: Any,
           trust_canonical: bool = False) -> bool:
    """Check index contents (native arrays of any framework); return whether canonical.

    ``indices`` is ``(rank, nnz)`` for COO and ``(nnz,)`` for CSR/CSC.
    ``trust_canonical`` takes a framework's own "sorted and unique" flag instead of
    re-checking the order (the ranges are checked all the same).
    """
    check_empty_nnz(layout, shape, nnz)  # before the indices, to name the real defect
    ops = _Ops(indices)
    if layout == _COO:
        rank = len(shape)
        if tuple(indices.shape) != (rank, nnz):
            raise FormatError(f"COO INDICES has shape {tuple(indices.shape)}, expected "
                              f"(rank, nnz) = ({rank}, {nnz})", field="sparse.nnz")
        if nnz == 0:
            return True
        rows = [indices[j] for j in range(rank)]
        for j, r in enumerate(rows):
            _check_range(ops, r, shape[j], j, "COO INDICES")
        return True if trust_canonical or nnz == 1 else _lex_increasing(rows)
    major, minor = (0, 1) if layout == _CSR else (1, 0)
    n = shape[major]
    if tuple(indptr.shape) != (n + 1,):
        raise FormatError(f"{layout.name} INDPTR has shape {tuple(indptr.shape)}, expected "
                          f"(shape[{major}] + 1,) = ({n + 1},)", field="indptr")
    if tuple(indices.shape) != (nnz,):
        raise FormatError(f"{layout.name} INDICES has shape {tuple(indices.shape)} but nnz is "
                          f"{nnz}", field="sparse.nnz")
    _check_indptr(ops, layout, indptr, nnz)
    if nnz == 0:
        return True
    _check_range(ops, indices, shape[minor], minor, f"{layout.name} INDICES")
    if trust_canonical or nnz == 1:
        return True
    return _lex_increasing([ops.major_ids(indptr, nnz), indices])


def _check_indptr(ops: _Ops, layout: Layout, indptr: Any, nnz: int) -> None:
    """INDPTR starts at 0, never decreases and ends at ``nnz``."""
    n = int(indptr.shape[0]) - 1
    first = int(indptr[0])
    if first != 0:
        raise FormatError(f"{layout.name} INDPTR starts at {first}; it must start at 0",
                          field="indptr")
    if n:
        dec = indptr[1:] < indptr[:-1]
        if bool(dec.any()):
            p = ops.first(dec)
            raise FormatError(
                f"{layout.name} INDPTR decreases at position {p + 1} ({int(indptr[p])} -> "
                f"{int(indptr[p + 1])}); it must be non-decreasing", field="indptr")
    last = int(indptr[n])
    if last != nnz:
        raise FormatError(f"{layout.name} INDPTR ends at {last} but there are nnz = {nnz} "
                          "stored entries; it must end at nnz", field="indptr")


def _verify(p: SparseParts, idx: Any, ptr: Any) -> bool:
    """Check ``p``'s indices (given as native arrays) and its canonical claim."""
    canonical = _check(p.layout, p.shape, p.nnz, idx, ptr)
    if p.canonical and not canonical:
        raise FormatError(
            f"the descriptor claims canonical {p.layout.name} indices (sorted, no duplicates) "
            "but they are not; clear the flag, or sort and sum duplicates first",
            field="sparse.canonical",
        )
    return canonical


def _host_arrays(p: SparseParts) -> tuple[Any, Any]:
    """NumPy views of a host tensor's index buffers."""
    np_ad = get_adapter("numpy")
    idx = np_ad.from_hurray(p.indices, copy=False)
    return idx, None if p.indptr is None else np_ad.from_hurray(p.indptr, copy=False)


def validate(t: Tensor) -> bool:
    """Check a sparse host tensor's indices and canonical claim; return whether canonical.

    Raises FormatError (field ``indices``, ``indptr``, ``sparse.nnz`` or
    ``sparse.canonical``) on the first defect. (Device tensors are checked by
    :func:`from_hurray`, with their framework's operations.)
    """
    p = parts(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"validate() reads host memory; this tensor is on {t.device}")
    return _verify(p, *_host_arrays(p))


# ========================================================================== assembly
def _need_copy(copy: bool | None, why: str) -> None:
    if copy is False:
        raise CopyRequiredError(f"{why}, which is a copy, but copy=False")


def _compact(c: Tensor, copy: bool | None, what: str) -> Tensor:
    if c.strides is None:
        return c
    _need_copy(copy, f"the {what} component is strided {list(c.strides)} and a Hurray buffer "
                     "is compact, so it must be compacted")
    return c.copy()


def _assemble(layout: Layout, shape: Sequence[int], values: Tensor, indices: Tensor,
              indptr: Tensor | None, canonical: bool, *, copy: bool | None = None,
              copied: bool = False, checked: bool = True) -> Tensor:
    """A sparse hb.Tensor over dense components (whose index contents were checked)."""
    values = _compact(values, copy, "VALUES")
    indices = _compact(indices, copy, "INDICES")
    if indptr is not None:
        indptr = _compact(indptr, copy, "INDPTR")
        if indptr.dtype != indices.dtype:
            raise FormatError(
                f"INDPTR is {indptr.dtype.name} but INDICES is {indices.dtype.name}; a Hurray "
                "sparse tensor has one index type", field="sparse.index_dtype")
    comps = [c for c in (values, indices, indptr) if c is not None]
    if len({c.device for c in comps}) != 1:
        raise UnsupportedError("sparse components on different devices: "
                               f"{', '.join(str(c.device) for c in comps)}")
    if values.ndim != 1:
        raise FormatError(f"VALUES must be a vector of nnz entries, got shape "
                          f"{list(values.shape)}", field="values")
    nnz = values.shape[0]
    desc = Descriptor(tuple(shape), values.dtype, layout,
                      sparse=Sparse(nnz, indices.dtype, canonical),
                      padded=values.descriptor.padded)
    by_role = {BufferRole.VALUES: values, BufferRole.INDICES: indices}
    if indptr is not None:
        by_role[BufferRole.INDPTR] = indptr
    bufs = []
    for spec in desc.buffer_layout():
        b = by_role[spec.role].buffers[0]
        if b.nbytes != spec.nbytes:
            raise FormatError(
                f"the {spec.role.name} component has {b.nbytes} bytes where nnz = {nnz} and "
                f"shape {list(shape)} call for {spec.nbytes}; the components disagree on nnz",
                field="sparse.nnz")
        bufs.append(Buffer(spec.role, b.ptr, b.nbytes))
    t = Tensor(desc, bufs, device=values.device, owner=_Components(values, indices, indptr),
               readonly=any(c.readonly for c in comps),
               copied=copied or any(c.copied for c in comps))
    if checked:
        _VALIDATED.add(t)
    return t


def make_sparse(layout: Layout | str, shape: Sequence[int], values: Any, indices: Any,
                indptr: Any = None, *, canonical: bool | None = None,
                copy: bool | None = None) -> Tensor:
    """A sparse hb.Tensor from its components (native arrays or hb.Tensors), zero-copy.

    ``values``: ``(nnz,)``. ``indices``: ``(rank, nnz)`` for COO, ``(nnz,)`` for
    CSR/CSC. ``indptr``: ``(shape[0] + 1,)`` for CSR, ``(shape[1] + 1,)`` for
    CSC. Host components are checked at once (FormatError on a defect);
    ``canonical=None`` computes the flag, ``True`` verifies the claim.
    """
    lay = Layout[layout.upper()] if isinstance(layout, str) else Layout(layout)
    if not lay.is_sparse:
        raise FormatError(f"make_sparse builds COO, CSR or CSC tensors, not {lay.name}",
                          field="layout")
    if (indptr is None) != (lay == _COO):
        raise FormatError(f"{lay.name} {'takes no' if lay == _COO else 'needs an'} indptr",
                          field="indptr")
    shape = tuple(int(d) for d in shape)
    v = asarray(values, copy=copy)
    i = _compact(asarray(indices, copy=copy), copy, "INDICES")
    p = None if indptr is None else _compact(asarray(indptr, copy=copy), copy, "INDPTR")
    if v.ndim != 1:
        raise FormatError(f"values must have shape (nnz,), got {list(v.shape)}", field="values")
    if p is not None and p.dtype != i.dtype:
        raise FormatError(f"indptr is {p.dtype.name} but indices are {i.dtype.name}; a Hurray "
                          "sparse tensor has one index type", field="sparse.index_dtype")
    if not v.device.is_host_accessible:
        # Checked (with the framework's own operations) when a framework imports it.
        return _assemble(lay, shape, v, i, p, bool(canonical), copy=copy, checked=False)
    parts_ = SparseParts(lay, shape, v, i, p, bool(canonical))
    real = _verify(parts_, *_host_arrays(parts_))
    return _assemble(lay, shape, v, i, p, real if canonical is None else bool(canonical),
                     copy=copy)


def _view(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The first elements of a compact host tensor under another shape (no copy)."""
    n = prod(shape)
    return Tensor._dense(t.data_ptr if n else 0, shape, t.dtype, strides=None,
                         padded=t.descriptor.padded, device=t.device, owner=t, readonly=t.readonly,
                         copied=t.copied)


def _readonly(t: Tensor) -> Tensor:
    if t.readonly:
        return t
    return Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=t.strides,
                         padded=t.descriptor.padded, device=t.device, owner=t.owner, readonly=True,
                         copied=t.copied)


# ========================================================================= to Hurray
def is_sparse_native(obj: Any) -> bool:
    """Whether ``obj`` is a sparse object of a supported framework (imports nothing)."""
    return _kind(obj) is not None


def _kind(obj: Any) -> str | None:
    for tp in type(obj).__mro__:
        mod = tp.__module__
        if mod.startswith("scipy.sparse"):
            return "scipy"
        if mod.startswith("cupyx.scipy.sparse"):
            return "cupyx"
        if mod.startswith("jax.experimental.sparse"):
            return "jax"
        if mod == "pyarrow.lib" and tp.__name__ in (*_ARROW_CLASSES, "SparseCSFTensor"):
            return "arrow"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.layout is not torch.strided:
        return "torch"
    return None


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A sparse native object as a sparse hb.Tensor, sharing component memory where it can.

    ``copy=None`` copies (and sets ``t.copied``) only what must be rearranged:
    COO coordinates that a framework stores ``(nnz, rank)`` (JAX, Arrow) or as
    separate vectors (SciPy, CuPy) are stacked as ``(rank, nnz)``; JAX's
    out-of-range padding entries are stripped; a strided component is compacted.
    ``copy=False`` raises CopyRequiredError instead; ``copy=True`` copies all.
    """
    kind = _kind(obj)
    if kind is None:
        raise UnsupportedError(
            f"{type(obj).__module__}.{type(obj).__qualname__} is not a sparse array of "
            "scipy.sparse, torch, jax.experimental.sparse, pyarrow or cupyx.scipy.sparse"
        )
    return _FROM[kind](obj, copy)


def _from_scipy(m: Any, copy: bool | None) -> Tensor:
    fmt = getattr(m, "format", None)
    layout = _SCIPY_LAYOUTS.get(fmt)  # type: ignore[arg-type]
    if layout is None:
        raise UnsupportedError(
            f"scipy.sparse format {fmt!r} has no Hurray layout; convert it first with "
            ".tocsr(), .tocsc() or .tocoo()"
        )
    import numpy as np

    shape = tuple(int(d) for d in m.shape)
    if layout == _COO:
        coords = tuple(m.coords) if hasattr(m, "coords") else (m.row, m.col)
        nnz = int(m.data.shape[0])
        idx_t = _stacked(coords, nnz)
        copied = idx_t is None
        if idx_t is None:
            _need_copy(copy, "scipy COO keeps one coordinate vector per dimension and Hurray "
                             "one (rank, nnz) array, so they must be stacked")
            idx_t = asarray(np.stack(np.broadcast_arrays(*coords)).astype(
                np.result_type(*coords), copy=False))
        idx = get_adapter("numpy").from_hurray(idx_t, copy=False)
        # scipy's COO flag is a plain attribute that sum_duplicates() sets, and older scipy
        # sorted column-major there (scipy/scipy#10050): the order is checked here instead.
        canonical = _check(_COO, shape, nnz, idx, None)
        return _assemble(_COO, shape, asarray(m.data, copy=copy),
                         idx_t.copy() if copy else idx_t, None, canonical, copy=copy,
                         copied=copied)
    indices, indptr, copied = m.indices, m.indptr, False
    if indices.dtype != indptr.dtype:
        _need_copy(copy, f"scipy indices ({indices.dtype}) and indptr ({indptr.dtype}) differ "
                         "and Hurray has one index type, so one must be converted")
        dt = np.promote_types(indices.dtype, indptr.dtype)
        indices, indptr, copied = indices.astype(dt), indptr.astype(dt), True
    nnz = int(indptr[-1])
    # scipy may keep data/indices longer than nnz: the prefix is the matrix.
    indices, data = indices[:nnz], m.data[:nnz]
    if len(shape) == 1:
        # A 1-D csr_array (scipy >= 1.15) is one row: its column indices are COO coordinates.
        idx = indices.reshape(1, nnz)
        canonical = _check(_COO, shape, nnz, idx, None)
        return _assemble(_COO, shape, asarray(data, copy=copy), asarray(idx, copy=copy), None,
                         canonical, copy=copy, copied=copied)
    # CSR/CSC has_canonical_format is computed by scipy itself (and cached).
    canonical = _check(layout, shape, nnz, indices, indptr, bool(m.has_canonical_format))
    return _assemble(layout, shape, asarray(data, copy=copy), asarray(indices, copy=copy),
                     asarray(indptr, copy=copy), canonical, copy=copy, copied=copied)


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
    head = asarray(coords[0])
    if nnz == 0:
        return _view(head, (len(coords), 0))
    base, step = head.data_ptr, nnz * dt.itemsize
    if any(c.__array_interface__["data"][0] != base + j * step for j, c in enumerate(coords)):
        return None
    ro = any(not c.flags.writeable for c in coords)
    return Tensor._dense(base, (len(coords), nnz), head.dtype, strides=None, padded=False,
                         device=CPU, owner=tuple(coords), readonly=ro, copied=False)


def _from_torch(x: Any, copy: bool | None) -> Tensor:
    import torch

    layout = x.layout
    if x.requires_grad:
        x = x.detach()  # same memory, no autograd history
    shape = tuple(x.shape)
    if layout == torch.sparse_coo:
        if x.dense_dim():
            raise UnsupportedError(
                f"hybrid torch COO tensor (sparse_dim {x.sparse_dim()}, dense_dim "
                f"{x.dense_dim()}): Hurray COO stores one scalar per entry; convert with "
                "x.to_dense().to_sparse() first"
            )
        # indices()/values() refuse uncoalesced tensors; the underscored ones do not.
        idx, vals = x._indices(), x._values()
        nnz = int(vals.shape[0])
        # torch's is_coalesced() means sorted (row-major) and unique: kept when it says so.
        canonical = _check(_COO, shape, nnz, idx, None, x.is_coalesced())
        return _assemble(_COO, shape, _torch_comp(vals, copy), _torch_comp(idx, copy), None,
                         canonical, copy=copy)
    if layout in (torch.sparse_csr, torch.sparse_csc):
        csr = layout == torch.sparse_csr
        if x.dim() != 2:
            raise UnsupportedError(
                f"batched torch {layout} tensor of shape {list(shape)}: Hurray CSR/CSC is "
                "rank 2; convert each matrix of the batch separately"
            )
        vals = x.values()
        if vals.dim() != 1:
            raise UnsupportedError(f"hybrid torch {layout} tensor (values of shape "
                                   f"{list(vals.shape)}): Hurray stores one scalar per entry")
        ptr, idx = ((x.crow_indices(), x.col_indices()) if csr
                    else (x.ccol_indices(), x.row_indices()))
        lay = _CSR if csr else _CSC
        # torch does not enforce sorted, unique indices unless its invariant checks are on.
        canonical = _check(lay, shape, int(vals.shape[0]), idx, ptr)
        return _assemble(lay, shape, _torch_comp(vals, copy), _torch_comp(idx, copy),
                         _torch_comp(ptr, copy), canonical, copy=copy)
    raise UnsupportedError(
        f"torch layout {layout} has no Hurray layout (Hurray has COO, CSR and CSC); "
        "convert with x.to_sparse_csr() or x.to_sparse_coo() first"
    )


def _torch_comp(c: Any, copy: bool | None) -> Tensor:
    if not c.is_contiguous() and not c.is_cpu:
        # The bridge compacts host memory itself (_compact); a device tensor is compacted
        # by torch, on its device.
        _need_copy(copy, f"a strided torch sparse component (strides {c.stride()}) must be "
                         "made compact")
        t = asarray(c.contiguous())
        return Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=None, padded=False,
                             device=t.device, owner=t.owner, readonly=False, copied=True,
                             source=c.contiguous())
    return asarray(c, copy=copy)


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


def _from_jax(x: Any, copy: bool | None) -> Tensor:
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
    data_t, idx_t = asarray(x.data, copy=copy), asarray(x.indices, copy=copy)
    host = data_t.device.is_host_accessible
    xp: Any
    if host:
        import numpy

        xp = numpy
        np_ad = get_adapter("numpy")
        data, indices = np_ad.from_hurray(data_t, copy=False), np_ad.from_hurray(idx_t, copy=False)
    else:
        import jax.numpy

        xp = jax.numpy
        data, indices = x.data, x.indices
    # JAX pads with out-of-range entries (index == shape: BCOO.fromdense(nse=...),
    # sum_duplicates, BCSR padding past indptr[-1]); its todense() drops every
    # out-of-range entry, so none of them is data. They are stripped, never passed on.
    if xp.issubdtype(indices.dtype, xp.signedinteger) and indices.size and \
            bool((indices < 0).any()):
        raise FormatError(f"this {name} has a negative index, which is no stored entry",
                          field="indices")
    copied = False
    if name == "BCOO":
        nse, rank = int(data.shape[0]), len(shape)
        oob = _oob_rows(xp, indices, shape) if nse and rank else None
        if oob is not None and bool(oob.any()):
            _need_copy(copy, "this BCOO holds out-of-range padding entries, which are not data "
                             "and must be stripped")
            keep = ~oob
            data, indices, copied = data[keep], indices[keep], True
            data_t = asarray(data)
        nnz = int(data.shape[0])
        if rank == 1 or nnz <= 1:
            coo = indices.reshape(rank, nnz)  # the same memory: no transposition needed
            idx_t = (_view(idx_t, (rank, nnz)) if host and not copied and idx_t.strides is None
                     else asarray(coo))
        else:
            _need_copy(copy, "BCOO stores coordinates as (nnz, rank) and Hurray COO as "
                             "(rank, nnz), so they must be transposed")
            coo = xp.ascontiguousarray(indices.T) if host else xp.transpose(indices)
            idx_t, copied = asarray(coo), True
        canonical = _check(_COO, shape, nnz, coo, None, trust)
        return _assemble(_COO, shape, data_t, idx_t, None, canonical, copy=copy,
                         copied=copied)

    ptr_t = asarray(x.indptr, copy=copy)
    indptr = get_adapter("numpy").from_hurray(ptr_t, copy=False) if host else x.indptr
    nnz, nse = int(indptr[-1]), int(data.shape[0])
    if not 0 <= nnz <= nse:
        raise FormatError(f"BCSR indptr ends at {nnz}, outside its {nse} stored entries",
                          field="indptr")
    inner = indices[:nnz]
    bad = ((inner >= shape[1]) if shape[1] <= xp.iinfo(inner.dtype).max else None) if nnz else None
    if bad is not None and bool(bad.any()):
        _need_copy(copy, "this BCSR holds out-of-range padding entries inside indptr, which "
                         "must be stripped")
        _check_indptr(_Ops(indptr), _CSR, indptr, nnz)  # before searchsorted relies on it
        keep = ~bad
        major = xp.searchsorted(indptr, xp.arange(nnz, dtype=indptr.dtype), side="right") - 1
        counts = xp.bincount(major[keep], minlength=shape[0]).astype(indptr.dtype)
        indptr = xp.concatenate([xp.zeros(1, indptr.dtype), xp.cumsum(counts).astype(indptr.dtype)])
        data, inner = data[:nnz][keep], inner[keep]
        nnz = int(inner.shape[0])
        data_t, idx_t, ptr_t, copied = asarray(data), asarray(inner), asarray(indptr), True
    elif nnz < nse:
        # Padding past indptr[-1] only: the stored prefix is the matrix (a view on the host;
        # JAX slices on a device are new arrays).
        if host and data_t.strides is None and idx_t.strides is None:
            data_t, idx_t = _view(data_t, (nnz,)), _view(idx_t, (nnz,))
        else:
            _need_copy(copy, "this BCSR holds padding entries past indptr[-1], which must be "
                             "sliced off")
            data_t, idx_t, copied = asarray(data[:nnz]), asarray(inner), True
    canonical = _check(_CSR, shape, nnz, inner, indptr, trust)
    if idx_t.dtype != ptr_t.dtype:
        _need_copy(copy, f"BCSR indices ({idx_t.dtype.name}) and indptr ({ptr_t.dtype.name}) "
                         "differ and Hurray has one index type")
        wide = xp.promote_types(inner.dtype, indptr.dtype)
        idx_t, ptr_t, copied = asarray(inner.astype(wide)), asarray(indptr.astype(wide)), True
    return _assemble(_CSR, shape, data_t, idx_t, ptr_t, canonical, copy=copy, copied=copied)


def _from_arrow(obj: Any, copy: bool | None) -> Tensor:
    name = type(obj).__name__
    layout = _ARROW_CLASSES.get(name)
    if layout is None:
        raise UnsupportedError(
            f"pyarrow {name} (compressed sparse fibre) has no Hurray layout; convert it with "
            "to_tensor() (dense) or to a SparseCOOTensor first"
        )
    import numpy as np

    shape = tuple(int(d) for d in obj.shape)
    arrays = obj.to_numpy()  # zero-copy views of the Arrow buffers; data is (nnz, 1)
    data = arrays[0].reshape(-1)
    nnz = int(data.shape[0])
    if layout == _COO:
        coords, rank = arrays[1], len(shape)  # (nnz, rank), row-major
        if rank == 1 or nnz <= 1:
            idx, copied = coords.reshape(rank, nnz), False
        else:
            _need_copy(copy, "Arrow COO stores coordinates as (nnz, rank) and Hurray COO as "
                             "(rank, nnz), so they must be transposed")
            idx, copied = np.ascontiguousarray(coords.T), True
        canonical = _check(_COO, shape, nnz, idx, None, bool(obj.has_canonical_format))
        return _assemble(_COO, shape, _arrow_comp(data, copy), _arrow_comp(idx, copy), None,
                         canonical, copy=copy, copied=copied)
    indptr, indices = arrays[1], arrays[2]
    canonical = _check(layout, shape, nnz, indices, indptr)
    return _assemble(layout, shape, _arrow_comp(data, copy), _arrow_comp(indices, copy),
                     _arrow_comp(indptr, copy), canonical, copy=copy)


def _arrow_comp(a: Any, copy: bool | None) -> Tensor:
    t = asarray(a, copy=copy)
    # Arrow memory is immutable: read-only, as the dense Arrow adapter marks it.
    return t if copy else _readonly(t)


def _from_cupyx(m: Any, copy: bool | None) -> Tensor:
    import cupy

    fmt = getattr(m, "format", None)
    layout = _SCIPY_LAYOUTS.get(fmt)  # type: ignore[arg-type]
    if layout is None:
        raise UnsupportedError(f"cupyx.scipy.sparse format {fmt!r} has no Hurray layout; "
                               "convert it first with .tocsr(), .tocsc() or .tocoo()")
    shape = tuple(int(d) for d in m.shape)
    nnz = int(m.nnz)
    if layout == _COO:
        _need_copy(copy, "cupyx COO keeps row and col apart and Hurray one (2, nnz) array, so "
                         "they must be stacked")
        with m.data.device:
            idx = cupy.stack([m.row, m.col])
        canonical = _check(_COO, shape, nnz, idx, None,
                           bool(getattr(m, "has_canonical_format", False)))
        return _assemble(_COO, shape, asarray(m.data, copy=copy), asarray(idx), None,
                         canonical, copy=copy, copied=True)
    data, indices, indptr = m.data[:nnz], m.indices[:nnz], m.indptr
    canonical = _check(layout, shape, nnz, indices, indptr)
    return _assemble(layout, shape, asarray(data, copy=copy), asarray(indices, copy=copy),
                     asarray(indptr, copy=copy), canonical, copy=copy)


_FROM = {"scipy": _from_scipy, "torch": _from_torch, "jax": _from_jax, "arrow": _from_arrow,
         "cupyx": _from_cupyx}


# ======================================================================= from Hurray
def _target_name(to: str) -> str:
    key = _ALIASES.get(to, to) if isinstance(to, str) else to
    if key not in ADAPTERS:
        raise UnsupportedError(f"unknown target {to!r}; choose one of {', '.join(ADAPTERS)}")
    return str(key)


def from_hurray(t: Tensor, to: str, *, device: Any = None, copy: bool | None = None,
                densify: bool = False) -> Any:
    """A sparse hb.Tensor as framework ``to``'s sparse object, sharing component memory.

    ``to="numpy"`` gives a ``scipy.sparse`` array (NumPy has no sparse arrays).
    ``densify=True`` gives the framework's dense array instead (new memory).
    Index contents are checked first (FormatError naming the defect), unless
    this module assembled ``t`` itself.
    """
    name = _target_name(to)
    _require_sparse(t)
    if densify:
        return _densify_to(t, name, device, copy)
    if copy and t.device.is_host_accessible:
        checked_before = t in _VALIDATED
        t = t.copy()
        if checked_before:  # the same bytes: no need to check them again
            _VALIDATED.add(t)
        copy = None  # that was the copy
    p = parts(t)
    checked = t in _VALIDATED
    if not checked and t.device.is_host_accessible:
        _verify(p, *_host_arrays(p))
        checked = True
    return _TO[name](p, device, copy, checked)


def _comp(name: str, c: Tensor, device: Any, copy: bool | None) -> Any:
    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    return get_adapter(name).from_hurray(c, device=device, copy=copy)


def _cast(name: str, arr: Any, dtype: Any, copy: bool | None, why: str) -> Any:
    _report(name, copy, why)
    if type(arr).__module__.partition(".")[0] == "torch":
        return arr.to(dtype)
    return arr.astype(dtype)


def _report(name: str, copy: bool | None, why: str) -> None:
    if copy is False:
        raise CopyRequiredError(f"{why}, which is a copy, but copy=False")
    if copy is None:
        warn_copy(name, why)


def _report_if_copied(name: str, who: str, kept: Sequence[Any], given: Sequence[Any],
                      copy: bool | None) -> None:
    """A framework constructor copied a component after all: say so, never silently."""

    def addr(a: Any) -> int:
        if hasattr(a, "data_ptr"):
            return int(a.data_ptr())
        if hasattr(a, "__array_interface__"):
            return int(a.__array_interface__["data"][0])
        return int(a.data.ptr)  # cupy

    moved = sum(1 for k, g in zip(kept, given, strict=True)
                if g is not None and g.size and addr(k) != addr(g))
    if moved and not copy:
        _report(name, copy, f"{who} copied {moved} component(s) on construction")


def _host_only(who: str, p: SparseParts, device: Any) -> None:
    if device not in _HOST_DEVICES:
        raise UnsupportedError(f"{who} lives on the CPU; device={device!r} is not possible")
    if not p.device.is_host_accessible:
        raise UnsupportedError(f"this sparse tensor is on {p.device} and {who} reads host "
                               "memory; convert it to its own framework (e.g. 'cupy') instead")


def _to_scipy(p: SparseParts, device: Any, copy: bool | None, checked: bool) -> Any:
    _host_only("scipy.sparse", p, device)
    try:
        import scipy.sparse as sps
    except ImportError as exc:
        raise BackendNotAvailableError(
            "scipy", "test", "a sparse tensor converts to numpy as a scipy.sparse array; pass "
            "densify=True for a dense NumPy array instead") from exc
    import numpy as np
    from scipy.sparse import _sputils

    data = _comp("numpy", p.values, None, copy)
    if data.dtype not in [np.dtype(d) for d in _sputils.supported_dtypes]:
        raise UnsupportedError(
            f"scipy.sparse cannot hold {p.values.dtype.name} values (it holds bool, integers, "
            "float32/64 and complex); convert with densify=True, or cast the values first"
        )
    idx = _comp("numpy", p.indices, None, copy)
    ptr = None if p.indptr is None else _comp("numpy", p.indptr, None, copy)
    if idx.dtype not in (np.int32, np.int64):
        wide = np.int32 if idx.dtype.itemsize <= 2 else np.int64
        idx = _cast("numpy", idx, wide, copy,
                    f"scipy.sparse indices are int32 or int64, not {idx.dtype}")
        ptr = None if ptr is None else ptr.astype(wide)
    if p.layout == _COO:
        m = sps.coo_array((data, tuple(idx)), shape=p.shape, copy=False)
        m.has_canonical_format = p.canonical
        _report_if_copied("numpy", "scipy.sparse", [m.data, *m.coords], [data, *tuple(idx)],
                          copy)
        return m
    cls = sps.csr_array if p.layout == _CSR else sps.csc_array
    m = cls((data, idx, ptr), shape=p.shape, copy=False)
    if p.canonical:
        m.has_canonical_format = True  # verified: spares scipy its own pass
    _report_if_copied("numpy", "scipy.sparse", [m.data, m.indices, m.indptr], [data, idx, ptr],
                      copy)
    return m


def _to_torch(p: SparseParts, device: Any, copy: bool | None, checked: bool) -> Any:
    import torch

    vals = _comp("torch", p.values, device, copy)
    idx = _comp("torch", p.indices, device, copy)
    ptr = None if p.indptr is None else _comp("torch", p.indptr, device, copy)
    if not checked:
        _verify(p, idx, ptr)
    if p.layout == _COO:
        if idx.dtype != torch.int64:
            idx = _cast("torch", idx, torch.int64, copy,
                        f"torch COO indices are int64, not {p.index_dtype.name}")
        # Aliases idx and vals (no copy); the checks above replace torch's own.
        return torch.sparse_coo_tensor(idx, vals, p.shape, is_coalesced=p.canonical,
                                       check_invariants=False)
    assert ptr is not None
    if idx.dtype not in (torch.int32, torch.int64):
        idx = _cast("torch", idx, torch.int64, copy,
                    f"torch compressed indices are int32 or int64, not {p.index_dtype.name}")
        ptr = ptr.to(torch.int64)
    make = torch.sparse_csr_tensor if p.layout == _CSR else torch.sparse_csc_tensor
    return make(ptr, idx, vals, p.shape, check_invariants=False)


def _to_jax(p: SparseParts, device: Any, copy: bool | None, checked: bool) -> Any:
    import jax
    import jax.numpy as jnp
    from jax.experimental import sparse as jsparse

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
        _report("jax", copy, f"JAX without jax_enable_x64 holds 32-bit indices; the "
                             f"{p.index_dtype.name} indices are narrowed to int32")
        idx_n, ptr_n = _host_arrays(p)
        idx_t = asarray(idx_n.astype("int32"))
        ptr_t = None if ptr_n is None else asarray(ptr_n.astype("int32"))
        reported = True
    vals = _comp("jax", p.values, device, copy)
    if p.layout == _CSR:
        assert ptr_t is not None
        idx = _comp("jax", idx_t, device, copy)
        ptr = _comp("jax", ptr_t, device, copy)
        if not checked:
            _verify(p, idx, ptr)
        return jsparse.BCSR((vals, idx, ptr), shape=p.shape, indices_sorted=p.canonical,
                            unique_indices=p.canonical)
    if p.layout == _CSC:
        assert ptr_t is not None
        if not reported:
            _report("jax", copy, "JAX has no CSC layout; the matrix becomes a BCOO whose "
                                 "column coordinates are computed from INDPTR")
        rows = _comp("jax", idx_t, device, None)
        ptr = _comp("jax", ptr_t, device, None)
        if not checked:
            _verify(p, rows, ptr)
        cols = jnp.repeat(jnp.arange(p.shape[1], dtype=rows.dtype), ptr[1:] - ptr[:-1],
                          total_repeat_length=p.nnz)
        # Column-major order: not "sorted" in BCOO's (row-major) sense; unique if canonical.
        return jsparse.BCOO((vals, jnp.stack([rows, cols], axis=1)), shape=p.shape,
                            indices_sorted=False, unique_indices=p.canonical)
    rank, nnz = len(p.shape), p.nnz
    if (rank == 1 or nnz <= 1) and host:
        idx = _comp("jax", _view(idx_t, (nnz, rank)), device, copy)  # the same memory
    else:
        idx_rm = _comp("jax", idx_t, device, copy)
        if not checked:
            _verify(p, idx_rm, None)
        if not reported:
            _report("jax", copy, "BCOO stores coordinates as (nnz, rank) and Hurray COO as "
                                 "(rank, nnz), so they are transposed")
        idx = jnp.transpose(idx_rm)
    return jsparse.BCOO((vals, idx), shape=p.shape, indices_sorted=p.canonical,
                        unique_indices=p.canonical)


def _to_arrow(p: SparseParts, device: Any, copy: bool | None, checked: bool) -> Any:
    _host_only("Arrow", p, device)
    import numpy as np
    import pyarrow as pa

    vt = p.values.dtype
    if vt.kind not in (Kind.INT, Kind.UINT, Kind.FLOAT) or vt.is_subbyte or (
            vt.kind == Kind.FLOAT and vt.name not in ("float16", "float32", "float64")):
        raise UnsupportedError(
            f"Arrow sparse tensors hold int8..int64, uint8..uint64 and float16/32/64 values, "
            f"not {vt.name}; convert with densify=True, or cast the values first"
        )
    data = _comp("numpy", p.values, None, copy)
    idx = _comp("numpy", p.indices, None, copy)
    ptr = None if p.indptr is None else _comp("numpy", p.indptr, None, copy)
    if idx.dtype != np.int64:
        # pyarrow's from_numpy would convert any other index type to int64 itself (tensor.pxi).
        idx = _cast("arrow", idx, np.int64, copy,
                    f"Arrow sparse indices are int64, not {p.index_dtype.name}")
        ptr = None if ptr is None else ptr.astype(np.int64)
    if not p.canonical:
        summed = _summed_duplicates(p.layout, p.shape, data, idx, ptr)
        if summed is not None:
            # A repeated index means the sum of its values (memory-layout.md §5.5, as in
            # SciPy, torch and JAX), but Arrow's to_tensor() keeps one of them (pyarrow
            # 26.0.1): hand Arrow the summed entries instead.
            _report("arrow", copy, "Arrow does not sum repeated indices; they are summed first")
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
            _report("arrow", copy, "Arrow COO stores coordinates as (nnz, rank) and Hurray COO "
                                   "as (rank, nnz), so they are transposed")
            coords = np.ascontiguousarray(idx.T)
        return pa.SparseCOOTensor.from_numpy(values, coords, shape=p.shape)
    cls = pa.SparseCSRMatrix if p.layout == _CSR else pa.SparseCSCMatrix
    return cls.from_numpy(values, ptr, idx, shape=p.shape)


def _summed_duplicates(layout: Layout, shape: tuple[int, ...], data: Any, idx: Any,
                       ptr: Any) -> tuple[Any, Any, Any] | None:
    """Host arrays with repeated indices summed (canonical order), or None if none repeat."""
    import numpy as np

    nnz = int(data.shape[0])
    if nnz < 2:
        return None
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


def _to_cupyx(p: SparseParts, device: Any, copy: bool | None, checked: bool) -> Any:
    import cupy
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
    data = _comp("cupy", p.values, device, copy)
    idx = _comp("cupy", p.indices, device, copy)
    ptr = None if p.indptr is None else _comp("cupy", p.indptr, device, copy)
    if not checked:
        _verify(p, idx, ptr)
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
            idx = _cast("cupy", idx, wide, copy,
                        f"cupyx.scipy.sparse indices are {cupy.dtype(wide).name} here, not "
                        f"{p.index_dtype.name}")
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
    _report_if_copied("cupy", "cupyx.scipy.sparse", kept, given, copy)
    return m


_TO = {"numpy": _to_scipy, "torch": _to_torch, "jax": _to_jax, "arrow": _to_arrow,
       "cupy": _to_cupyx}


# =========================================================================== densify
def densify(t: Any) -> Tensor:
    """The dense (row-major) form of a sparse tensor or sparse native, as a new hb.Tensor.

    Repeated indices are summed (the SciPy and PyTorch meaning). A host (NumPy)
    reference: a device tensor densifies with ``hb.convert(t, fw, densify=True)``.
    """
    if not isinstance(t, Tensor):
        t = asarray(t)
    d = _require_sparse(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"hb.densify() is a host (NumPy) reference and this tensor is on {t.device}; use "
            "hb.convert(t, '<framework>', densify=True), which densifies on the device"
        )
    import numpy as np

    p = parts(t)
    idx, ptr = _host_arrays(p)
    if t not in _VALIDATED:
        _verify(p, idx, ptr)
    with warnings.catch_warnings():
        # Packed sub-byte values are unpacked on purpose: densify makes new memory anyway.
        warnings.simplefilter("ignore", CopyWarning)
        vals = get_adapter("numpy").from_hurray(p.values, copy=None)
    if p.layout == _COO:
        coords = tuple(idx.astype(np.intp))
    else:
        n_major = d.shape[0] if p.layout == _CSR else d.shape[1]
        major = np.repeat(np.arange(n_major, dtype=np.intp), np.diff(ptr.astype(np.intp)))
        minor = idx.astype(np.intp)
        coords = (major, minor) if p.layout == _CSR else (minor, major)
    out = aligned_zeros(d.shape, vals.dtype)
    if p.canonical or p.nnz < 2 or _unique(coords, d.shape):
        out[coords] = vals
    else:
        try:
            np.add.at(out, coords, vals)
        except TypeError as exc:
            raise UnsupportedError(
                f"this {d.layout.name} tensor repeats indices, whose values must be summed, "
                f"but NumPy cannot add {d.dtype.name} values ({exc})") from exc
    res = asarray(out)
    return Tensor._dense(res.data_ptr, res.shape, res.dtype, strides=None,
                         padded=res.descriptor.padded, device=CPU, owner=res.owner, readonly=False,
                         copied=True)


def aligned_zeros(shape: Sequence[int], dtype: Any) -> Any:
    """A zeroed NumPy array in fresh 64-byte aligned memory (none at all when empty).

    Memory the bridge allocates is 64-byte aligned (DESIGN.md), which is also what
    JAX needs to alias host memory instead of copying it again.
    """
    import numpy as np

    dt = np.dtype(dtype)
    n = prod(int(s) for s in shape)
    alloc = alloc_aligned(n * dt.itemsize)
    if alloc is None:
        return np.zeros(tuple(shape), dt)  # zero bytes: nothing is allocated
    return np.ndarray(tuple(shape), dt, buffer=host_view(alloc.ptr, alloc.nbytes, alloc))


def _unique(coords: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    import numpy as np

    flat = np.ravel_multi_index(coords, shape)
    return bool(np.unique(flat).size == flat.size)


def _densify_to(t: Tensor, name: str, device: Any, copy: bool | None) -> Any:
    if copy is False:
        raise CopyRequiredError("densify=True builds a new dense array (a copy), but copy=False")
    if t.device.is_host_accessible:
        return get_adapter(name).from_hurray(densify(t), device=device, copy=None)
    # Device memory: build the framework's own sparse object there and let it densify.
    native = from_hurray(t, name, device=device, copy=None)
    if name == "torch":
        return native.to_dense()
    if name == "cupy":
        return native.toarray()
    if name == "jax":
        return native.todense()
    raise UnsupportedError(f"a {t.device} sparse tensor cannot be densified for {name}; "
                           "densify it in its own framework first")
