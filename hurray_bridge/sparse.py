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

This module holds what every framework shares: the components (:class:`SparseParts`),
the index checks, assembly and the NumPy reference :func:`densify`. Each framework's
own objects are handled by its adapter's ``sparse`` module,
``hurray_bridge.adapters.<framework>.sparse``, found through the registry; every one
of them has the same three functions:

``to_hurray(obj, *, copy) -> Tensor``
    the framework's sparse object as a sparse hb.Tensor (its components converted by
    the adapter's own dense ``to_hurray``, the indices checked with :func:`check`,
    put together with :func:`assemble`);
``from_hurray(p, *, device, copy, checked) -> native``
    :class:`SparseParts` as the framework's sparse object; ``checked`` is False only for
    device memory, which the adapter checks itself (:func:`verify`, with its array
    library's :class:`ArrayOps`) once it holds the components as its own arrays;
``to_dense(native) -> native``
    the framework's own dense array of such an object (``densify=True`` of a device
    tensor: the framework densifies where the memory is).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from math import prod
from typing import Any

from ._copy_policy import require_copy
from ._memory import aligned_zeros  # also still imported from here by quant.py and matrix.py
from ._numpy import numpy
from ._registry import (
    _ALIASES,
    ADAPTERS,
    adapter_name_for_type,
    get_adapter,
    get_adapter_module,
    sparse_adapter_name_for_type,
    special_kind,
)
from .descriptor import Descriptor, Sparse, check_empty_nnz
from .dtypes import DType
from .errors import CopyRequiredError, CopyWarning, FormatError, UnsupportedError
from .layout import BufferRole, Layout
from .tensor import CPU, Buffer, Tensor, from_native

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
_HOST_DEVICES = (None, "cpu", CPU)

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
class ArrayOps:
    """The array operations validation needs beyond indexing and comparison, for the
    array library ``xp`` that holds the memory: NumPy's spelling, which CuPy and
    jax.numpy share. An adapter whose library spells them apart (torch) overrides them.
    """

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def first(self, mask: Any) -> int:
        """Position of the first True of a boolean vector that has one."""
        return int(self.xp.argmax(mask.astype("int8")))

    def major_ids(self, indptr: Any, nnz: int) -> Any:
        """The row (CSR) or column (CSC) of every entry, given a checked ``indptr``."""
        return self.xp.searchsorted(indptr, self.xp.arange(nnz, dtype=indptr.dtype),
                                    side="right") - 1


@cache
def host_ops() -> ArrayOps:
    """NumPy's operations, for host memory (NumPy is imported on first use)."""
    return ArrayOps(numpy())


def _check_range(ops: ArrayOps, idx: Any, size: int, dim: int, what: str) -> None:
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


def check(ops: ArrayOps, layout: Layout, shape: tuple[int, ...], nnz: int, indices: Any,
          indptr: Any, trust_canonical: bool = False) -> bool:
    """Check index contents (native arrays of ``ops``' library); return whether canonical.

    ``indices`` is ``(rank, nnz)`` for COO and ``(nnz,)`` for CSR/CSC.
    ``trust_canonical`` takes a framework's own "sorted and unique" flag instead of
    re-checking the order (the ranges are checked all the same).
    """
    check_empty_nnz(layout, shape, nnz)  # before the indices, to name the real defect
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
    check_indptr(ops, layout, indptr, nnz)
    if nnz == 0:
        return True
    _check_range(ops, indices, shape[minor], minor, f"{layout.name} INDICES")
    if trust_canonical or nnz == 1:
        return True
    return _lex_increasing([ops.major_ids(indptr, nnz), indices])


def check_indptr(ops: ArrayOps, layout: Layout, indptr: Any, nnz: int) -> None:
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


def verify(ops: ArrayOps, p: SparseParts, idx: Any, ptr: Any) -> bool:
    """Check ``p``'s indices (given as native arrays of ``ops``' library) and its
    canonical claim; return whether canonical."""
    canonical = check(ops, p.layout, p.shape, p.nnz, idx, ptr)
    if p.canonical and not canonical:
        raise FormatError(
            f"the descriptor claims canonical {p.layout.name} indices (sorted, no duplicates) "
            "but they are not; clear the flag, or sort and sum duplicates first",
            field="sparse.canonical",
        )
    return canonical


def _verify(p: SparseParts, idx: Any, ptr: Any) -> bool:
    """:func:`verify` of a host tensor's index arrays (from :func:`host_arrays`)."""
    return verify(host_ops(), p, idx, ptr)


def host_arrays(p: SparseParts) -> tuple[Any, Any]:
    """NumPy views of a host tensor's index buffers."""
    from . import _host  # NumPy, on use only

    idx = _host.from_hurray(p.indices, copy=False)
    return idx, None if p.indptr is None else _host.from_hurray(p.indptr, copy=False)


def validate(t: Tensor) -> bool:
    """Check a sparse host tensor's indices and canonical claim; return whether canonical.

    Raises FormatError (field ``indices``, ``indptr``, ``sparse.nnz`` or
    ``sparse.canonical``) on the first defect. (Device tensors are checked by
    :func:`from_hurray`, with their framework's operations.)
    """
    p = parts(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(f"validate() reads host memory; this tensor is on {t.device}")
    return _verify(p, *host_arrays(p))


# ========================================================================== assembly
def _compact(c: Tensor, copy: bool | None, what: str) -> Tensor:
    if c.strides is None:
        return c
    require_copy(copy, None, f"the {what} component is strided {list(c.strides)} and a "
                             "Hurray buffer is compact, so it must be compacted")
    return c.copy()


def assemble(layout: Layout, shape: Sequence[int], values: Tensor, indices: Tensor,
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
    v = from_native(values, copy)
    i = _compact(from_native(indices, copy), copy, "INDICES")
    p = None if indptr is None else _compact(from_native(indptr, copy), copy, "INDPTR")
    if v.ndim != 1:
        raise FormatError(f"values must have shape (nnz,), got {list(v.shape)}", field="values")
    if p is not None and p.dtype != i.dtype:
        raise FormatError(f"indptr is {p.dtype.name} but indices are {i.dtype.name}; a Hurray "
                          "sparse tensor has one index type", field="sparse.index_dtype")
    if not v.device.is_host_accessible:
        # Checked (with the framework's own operations) when a framework imports it.
        return assemble(lay, shape, v, i, p, bool(canonical), copy=copy, checked=False)
    parts_ = SparseParts(lay, shape, v, i, p, bool(canonical))
    real = _verify(parts_, *host_arrays(parts_))
    return assemble(lay, shape, v, i, p, real if canonical is None else bool(canonical),
                    copy=copy)


def prefix_view(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The first elements of a compact host tensor under another shape (no copy)."""
    n = prod(shape)
    return Tensor._dense(t.data_ptr if n else 0, shape, t.dtype, strides=None,
                         padded=t.descriptor.padded, device=t.device, owner=t, readonly=t.readonly,
                         copied=t.copied)


def host_only(who: str, p: SparseParts, device: Any) -> None:
    """Refuse a target device, or a tensor, that is not host memory, for host-only ``who``."""
    if device not in _HOST_DEVICES:
        raise UnsupportedError(f"{who} lives on the CPU; device={device!r} is not possible")
    if not p.device.is_host_accessible:
        raise UnsupportedError(f"this sparse tensor is on {p.device} and {who} reads host "
                               "memory; convert it to its own framework (e.g. 'cupy') instead")


def report_if_copied(name: str, who: str, kept: Sequence[Any], given: Sequence[Any],
                     copy: bool | None, addr: Callable[[Any], int]) -> None:
    """A framework constructor copied a component after all: say so, never silently.

    ``kept`` are the arrays the constructed object holds, ``given`` those it was given
    (None for an absent component); ``addr`` is the address of such an array.
    """
    moved = sum(1 for k, g in zip(kept, given, strict=True)
                if g is not None and g.size and addr(k) != addr(g))
    if moved and not copy:
        require_copy(copy, name, f"{who} copied {moved} component(s) on construction")


# ========================================================================= to Hurray
def is_sparse_native(obj: Any) -> bool:
    """Whether ``obj`` is a sparse object of a supported framework (imports nothing)."""
    return _kind(obj) is not None


def native_type_adapter(tp: type) -> str | None:
    """The adapter whose sparse module takes objects of type ``tp``, told by the type's
    module and name alone (imports nothing; the registry keeps the table); None for
    torch, whose sparse tensors share ``torch.Tensor`` with the dense ones (the torch
    adapter's ``special_kind`` tells them)."""
    return sparse_adapter_name_for_type(tp)


def _kind(obj: Any) -> str | None:
    """The adapter whose sparse module takes ``obj`` (imports nothing)."""
    name = native_type_adapter(type(obj))
    if name is not None:
        return name
    # A framework whose sparse objects share its dense type (torch's layouts) tells them
    # apart itself; its adapter is loaded already, as an object of its type exists.
    name = adapter_name_for_type(type(obj))  # type: ignore[arg-type]
    if name is not None and special_kind(name, obj) == "sparse":
        return name
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
    t: Tensor = get_adapter_module(kind, "sparse").to_hurray(obj, copy=copy)
    return t


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
        _verify(p, *host_arrays(p))
        checked = True
    return get_adapter_module(name, "sparse").from_hurray(p, device=device, copy=copy,
                                                          checked=checked)


# =========================================================================== densify
def densify(t: Any) -> Tensor:
    """The dense (row-major) form of a sparse tensor or sparse native, as a new hb.Tensor.

    Repeated indices are summed (the SciPy and PyTorch meaning). A host (NumPy)
    reference: a device tensor densifies with ``hb.convert(t, fw, densify=True)``.
    """
    if not isinstance(t, Tensor):
        t = to_hurray(t) if is_sparse_native(t) else from_native(t)
    d = _require_sparse(t)
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"hb.densify() is a host (NumPy) reference and this tensor is on {t.device}; use "
            "hb.convert(t, '<framework>', densify=True), which densifies on the device"
        )
    np = numpy()
    p = parts(t)
    idx, ptr = host_arrays(p)
    if t not in _VALIDATED:
        _verify(p, idx, ptr)
    from . import _host  # NumPy, on use only

    with warnings.catch_warnings():
        # Packed sub-byte values are unpacked on purpose: densify makes new memory anyway.
        warnings.simplefilter("ignore", CopyWarning)
        vals = _host.from_hurray(p.values, copy=None)
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
    res = _host.to_hurray(out)
    return Tensor._dense(res.data_ptr, res.shape, res.dtype, strides=None,
                         padded=res.descriptor.padded, device=CPU, owner=res.owner, readonly=False,
                         copied=True)


def _unique(coords: tuple[Any, ...], shape: tuple[int, ...]) -> bool:
    np = numpy()
    flat = np.ravel_multi_index(coords, shape)
    return bool(np.unique(flat).size == flat.size)


def _densify_to(t: Tensor, name: str, device: Any, copy: bool | None) -> Any:
    if copy is False:
        raise CopyRequiredError("densify=True builds a new dense array (a copy), but copy=False")
    if t.device.is_host_accessible:
        return get_adapter(name).from_hurray(densify(t), device=device, copy=None)
    # Device memory: build the framework's own sparse object there and let it densify.
    native = from_hurray(t, name, device=device, copy=None)
    return get_adapter_module(name, "sparse").to_dense(native)
