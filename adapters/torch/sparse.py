"""torch ``sparse_coo`` / ``sparse_csr`` / ``sparse_csc`` tensors <-> sparse hb.Tensor.

The interface (``to_hurray``, ``from_hurray``, ``to_dense``) is described in
``hurray_bridge/sparse.py``. Indices are checked with torch's own operations,
on the tensor's device.
"""

from __future__ import annotations

from typing import Any

import torch

from hurray_bridge._copy_policy import require_copy
from hurray_bridge.errors import UnsupportedError
from hurray_bridge.layout import Layout
from hurray_bridge.sparse import ArrayOps, SparseParts, assemble, check, verify
from hurray_bridge.tensor import Tensor

from . import _share_tracked
from . import from_hurray as dense_from_hurray
from . import to_hurray as dense_to_hurray

__all__ = ["from_hurray", "to_dense", "to_hurray"]

_COO, _CSR, _CSC = Layout.COO, Layout.CSR, Layout.CSC


class _TorchOps(ArrayOps):
    """torch spells the two operations apart from NumPy (no argmax of bool, ``right=``)."""

    def first(self, mask: Any) -> int:
        return int(mask.nonzero()[0, 0])

    def major_ids(self, indptr: Any, nnz: int) -> Any:
        pos = torch.arange(nnz, dtype=indptr.dtype, device=indptr.device)
        return torch.searchsorted(indptr, pos, right=True) - 1


_OPS = _TorchOps(torch)


def to_hurray(x: Any, *, copy: bool | None) -> Tensor:
    """A torch sparse COO, CSR or CSC tensor as a sparse hb.Tensor."""
    layout = x.layout
    tracked = x.requires_grad
    if tracked:
        # Same memory, no autograd history; the parts are shared read-only, as a dense
        # tensor's memory is (a write through them would change what autograd sees).
        x = x.detach()
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
        canonical = check(_OPS, _COO, shape, nnz, idx, None, x.is_coalesced())
        return assemble(_COO, shape, _component(vals, copy, tracked),
                        _component(idx, copy, tracked), None, canonical, copy=copy)
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
        canonical = check(_OPS, lay, shape, int(vals.shape[0]), idx, ptr)
        return assemble(lay, shape, _component(vals, copy, tracked),
                        _component(idx, copy, tracked), _component(ptr, copy, tracked),
                        canonical, copy=copy)
    raise UnsupportedError(
        f"torch layout {layout} has no Hurray layout (Hurray has COO, CSR and CSC); "
        "convert with x.to_sparse_csr() or x.to_sparse_coo() first"
    )


def _component(c: torch.Tensor, copy: bool | None, tracked: bool) -> Tensor:
    if not c.is_contiguous() and not c.is_cpu:
        # The bridge compacts host memory itself (on assembly); a device tensor is
        # compacted by torch, on its device.
        require_copy(copy, None, f"a strided torch sparse component (strides {c.stride()}) "
                                 "must be made compact")
        t = dense_to_hurray(c.contiguous())
        return Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=None, padded=False,
                             device=t.device, owner=t.owner, readonly=False, copied=True,
                             source=c.contiguous())
    t = dense_to_hurray(c, copy=copy)
    return _share_tracked(t) if tracked and not t.copied else t


def from_hurray(p: SparseParts, *, device: Any, copy: bool | None, checked: bool) -> Any:
    """A sparse tensor as a torch sparse COO, CSR or CSC tensor over its components."""
    # Component conversions report their own copies (CopyWarning / CopyRequiredError).
    vals = dense_from_hurray(p.values, device=device, copy=copy)
    idx = dense_from_hurray(p.indices, device=device, copy=copy)
    ptr = None if p.indptr is None else dense_from_hurray(p.indptr, device=device, copy=copy)
    if not checked:
        verify(_OPS, p, idx, ptr)
    if p.layout == _COO:
        if idx.dtype != torch.int64:
            require_copy(copy, "torch", f"torch COO indices are int64, not {p.index_dtype.name}")
            idx = idx.to(torch.int64)
        # Aliases idx and vals (no copy); the checks above replace torch's own.
        return torch.sparse_coo_tensor(idx, vals, p.shape, is_coalesced=p.canonical,
                                       check_invariants=False)
    assert ptr is not None
    if idx.dtype not in (torch.int32, torch.int64):
        require_copy(copy, "torch", "torch compressed indices are int32 or int64, not "
                                    f"{p.index_dtype.name}")
        idx = idx.to(torch.int64)
        ptr = ptr.to(torch.int64)
    make = torch.sparse_csr_tensor if p.layout == _CSR else torch.sparse_csc_tensor
    return make(ptr, idx, vals, p.shape, check_invariants=False)


def to_dense(x: Any) -> Any:
    """torch's own dense tensor of a sparse one (on its device)."""
    return x.to_dense()
