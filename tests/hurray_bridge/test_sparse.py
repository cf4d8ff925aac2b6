"""Sparse layouts (COO, CSR, CSC) through the buffer table: every framework pair.

Sources: scipy.sparse (arrays and matrices), torch sparse COO/CSR/CSC,
jax.experimental.sparse BCOO/BCSR (padded too) and pyarrow SparseCOOTensor /
SparseCSRMatrix / SparseCSCMatrix. Targets: "numpy" (scipy.sparse), "torch",
"jax", "arrow". Checked: values bit-exact, index dtypes, the canonical flag,
pointer identity where zero-copy is promised, copies reported, nnz = 0, and
bad indices refused with a FormatError naming the field.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import pickle
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import sparse as hs

np = pytest.importorskip("numpy", reason="numpy is not installed")

sps = pytest.importorskip("scipy.sparse")
torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.experimental import sparse as jsparse  # noqa: E402

COO, CSR, CSC = hb.Layout.COO, hb.Layout.CSR, hb.Layout.CSC
TARGETS = ("numpy", "torch", "jax", "arrow")

# A 4 x 6 matrix with an empty row, empty columns and a NaN with a payload.
NAN_PAYLOAD = np.array([0x7FF8_0000_DEAD_BEEF], np.uint64).view(np.float64)[0]
DENSE = np.zeros((4, 6), np.float64)
DENSE[0, 1], DENSE[0, 4], DENSE[2, 0], DENSE[2, 5], DENSE[3, 3] = 1.5, -0.5, -2.25, NAN_PAYLOAD, 7.0
NNZ_MASK = np.zeros((4, 6), bool)
NNZ_MASK[0, 1] = NNZ_MASK[0, 4] = NNZ_MASK[2, 0] = NNZ_MASK[2, 5] = NNZ_MASK[3, 3] = True


@pytest.fixture(autouse=True)
def _x64() -> Any:
    # float64 values and int64 indices reach JAX unnarrowed only with x64 on; restored after
    # each test so that other modules see JAX's default.
    before = jax.config.read("jax_enable_x64")
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        # torch's "sparse invariant checks are implicitly disabled" notice, on first use.
        warnings.filterwarnings("ignore", message="Sparse invariant checks", category=UserWarning)
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support", category=UserWarning)
        # JAX copies host memory that is not 64-byte aligned (the JAX adapter's own report,
        # tested with that adapter); NumPy and scipy arrays are often 16-byte aligned.
        warnings.filterwarnings("ignore", message=".*not 64-byte aligned", category=hb.CopyWarning)
        yield


def _coo_parts(order: str = "C") -> tuple[np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(NNZ_MASK) if order == "C" else np.nonzero(NNZ_MASK.T)[::-1]
    return DENSE[rows, cols], np.stack([rows, cols])


def _scipy_coo_from_one_array(kind: str) -> Any:
    vals, idx = _coo_parts()
    idx = np.ascontiguousarray(idx)
    cls = sps.coo_array if kind == "array" else sps.coo_matrix
    return cls((vals, (idx[0], idx[1])), shape=DENSE.shape, copy=False)


def _scipy_coo_separate() -> Any:
    vals, idx = _coo_parts()
    rows, cols = idx[0].astype(np.int32), idx[1].astype(np.int32)  # two separate arrays
    return sps.coo_array((vals, (rows, cols)), shape=DENSE.shape)


def _csr_from_mask(cls: Any, dtype: Any = np.int32) -> Any:
    vals, idx = _coo_parts()
    counts = np.bincount(idx[0], minlength=4)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(dtype)
    return cls((vals, idx[1].astype(dtype), indptr), shape=DENSE.shape, copy=False)


def _csc_from_mask(cls: Any) -> Any:
    rows, cols = np.nonzero(NNZ_MASK.T)[::-1]
    order = np.lexsort((rows, cols))
    rows, cols = rows[order], cols[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=6))]).astype(np.int32)
    return cls((DENSE[rows, cols], rows.astype(np.int32), indptr), shape=DENSE.shape, copy=False)


def _torch_coo(coalesced: bool) -> Any:
    vals, idx = _coo_parts()
    if not coalesced:
        perm = [3, 0, 4, 2, 1]  # same entries, shuffled: not sorted
        vals, idx = vals[perm], np.ascontiguousarray(idx[:, perm])
    return torch.sparse_coo_tensor(torch.from_numpy(idx), torch.from_numpy(vals), DENSE.shape,
                                   is_coalesced=coalesced)


def _arrow_coo() -> Any:
    vals, idx = _coo_parts()
    return pa.SparseCOOTensor.from_numpy(vals.reshape(-1, 1), np.ascontiguousarray(idx.T),
                                         shape=DENSE.shape)


def _bcoo(nse: int | None = None) -> Any:
    vals, idx = _coo_parts()
    data, ind = jnp.asarray(vals), jnp.asarray(idx.T.astype(np.int32))
    if nse is not None:  # JAX's own padding: out-of-range index == shape, data 0
        pad = nse - vals.size
        data = jnp.concatenate([data, jnp.zeros(pad)])
        ind = jnp.concatenate([ind, jnp.tile(jnp.asarray([[4, 6]], jnp.int32), (pad, 1))])
    return jsparse.BCOO((data, ind), shape=DENSE.shape, indices_sorted=True, unique_indices=True)


def _bcsr(nse: int | None = None) -> Any:
    m = _csr_from_mask(sps.csr_array)
    data, ind, ptr = jnp.asarray(m.data), jnp.asarray(m.indices), jnp.asarray(m.indptr)
    if nse is not None:  # padding past indptr[-1], as BCSR.fromdense(nse=...) writes it
        pad = nse - m.nnz
        data = jnp.concatenate([data, jnp.zeros(pad)])
        ind = jnp.concatenate([ind, jnp.full(pad, 6, jnp.int32)])
    return jsparse.BCSR((data, ind, ptr), shape=DENSE.shape)


# name -> (factory, layout, index dtype, canonical, zero-copy to Hurray)
SOURCES: dict[str, tuple[Callable[[], Any], hb.Layout, hb.DType, bool, bool]] = {
    "scipy_csr_array": (lambda: _csr_from_mask(sps.csr_array), CSR, hb.int32, True, True),
    "scipy_csr_matrix": (lambda: _csr_from_mask(sps.csr_matrix), CSR, hb.int32, True, True),
    "scipy_csr_int64": (lambda: _csr_from_mask(sps.csr_array, np.int64), CSR, hb.int64, True,
                        True),
    "scipy_csc_array": (lambda: _csc_from_mask(sps.csc_array), CSC, hb.int32, True, True),
    "scipy_csc_matrix": (lambda: _csc_from_mask(sps.csc_matrix), CSC, hb.int32, True, True),
    "scipy_coo_array": (lambda: _scipy_coo_separate(), COO, hb.int32, True, False),
    "scipy_coo_one_array": (lambda: _scipy_coo_from_one_array("array"), COO, hb.int64, True,
                            True),
    # coo_matrix narrows int64 coordinates to int32 itself (into separate arrays).
    "scipy_coo_matrix": (lambda: _scipy_coo_from_one_array("matrix"), COO, hb.int32, True, False),
    "torch_coo": (lambda: _torch_coo(True), COO, hb.int64, True, True),
    "torch_coo_uncoalesced": (lambda: _torch_coo(False), COO, hb.int64, False, True),
    "torch_csr": (lambda: torch.from_numpy(DENSE).to_sparse_csr(), CSR, hb.int64, True, True),
    "torch_csr_int32": (lambda: torch.sparse_csr_tensor(
        torch.from_numpy(_csr_from_mask(sps.csr_array).indptr),
        torch.from_numpy(_csr_from_mask(sps.csr_array).indices),
        torch.from_numpy(_csr_from_mask(sps.csr_array).data), DENSE.shape), CSR, hb.int32, True,
        True),
    "torch_csc": (lambda: torch.from_numpy(DENSE).to_sparse_csc(), CSC, hb.int64, True, True),
    "jax_bcoo": (lambda: _bcoo(), COO, hb.int32, True, False),
    "jax_bcoo_padded": (lambda: _bcoo(nse=9), COO, hb.int32, True, False),
    "jax_bcsr": (lambda: _bcsr(), CSR, hb.int32, True, True),
    "jax_bcsr_padded": (lambda: _bcsr(nse=8), CSR, hb.int32, True, True),
    "arrow_coo": (_arrow_coo, COO, hb.int64, True, False),
    "arrow_csr": (lambda: pa.SparseCSRMatrix.from_scipy(_csr_from_mask(sps.csr_matrix)), CSR,
                  hb.int64, True, True),
    "arrow_csc": (lambda: pa.SparseCSCMatrix.from_scipy(_csc_from_mask(sps.csc_matrix)), CSC,
                  hb.int64, True, True),
}


def dense_of(x: Any) -> np.ndarray:
    """The dense matrix a native sparse object (or hb.Tensor) stands for, via its framework."""
    if isinstance(x, hb.Tensor):
        return np.asarray(hb.densify(x))
    if isinstance(x, torch.Tensor):
        return x.to_dense().numpy()
    mod = type(x).__module__
    if mod.startswith("scipy.sparse"):
        return np.asarray(x.toarray())
    if mod.startswith("jax"):
        return np.asarray(x.todense())
    if mod == "pyarrow.lib":
        return x.to_tensor().to_numpy()
    return np.asarray(x)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def addr(a: Any) -> int:
    if isinstance(a, np.ndarray):
        return int(a.__array_interface__["data"][0])
    if isinstance(a, torch.Tensor):
        return int(a.data_ptr())
    return int(a.unsafe_buffer_pointer())


def roles(t: hb.Tensor) -> dict[hb.BufferRole, hb.Buffer]:
    return {b.role: b for b in t.buffers}


@contextlib.contextmanager
def no_copy_warnings() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        yield


# ==================================================================== to Hurray
@pytest.mark.parametrize("name", SOURCES)
def test_to_hurray_descriptor(name: str) -> None:
    make, layout, idx_dtype, canonical, zero_copy = SOURCES[name]
    x = make()
    t = hb.asarray(x)
    d = t.descriptor
    assert d.layout == layout and d.shape == DENSE.shape and d.dtype is hb.float64
    assert d.sparse is not None and d.sparse.nnz == 5
    assert d.sparse.index_dtype is idx_dtype  # index dtypes are preserved
    assert d.sparse.canonical is canonical
    assert t.copied is (not zero_copy)
    assert same_bits(dense_of(t), DENSE)
    assert hs.validate(t) is canonical


def test_scipy_components_are_shared() -> None:
    for m in (_csr_from_mask(sps.csr_array), _csc_from_mask(sps.csc_matrix)):
        t = hb.asarray(m)
        r = roles(t)
        assert r[hb.BufferRole.VALUES].ptr == addr(m.data)
        assert r[hb.BufferRole.INDICES].ptr == addr(m.indices)
        assert r[hb.BufferRole.INDPTR].ptr == addr(m.indptr)
    m = _scipy_coo_from_one_array("array")
    t = hb.asarray(m, copy=False)
    assert roles(t)[hb.BufferRole.INDICES].ptr == addr(m.coords[0])
    assert roles(t)[hb.BufferRole.VALUES].ptr == addr(m.data)


def test_torch_components_are_shared() -> None:
    x = _torch_coo(False)
    t = hb.asarray(x, copy=False)
    assert roles(t)[hb.BufferRole.INDICES].ptr == x._indices().data_ptr()
    assert roles(t)[hb.BufferRole.VALUES].ptr == x._values().data_ptr()
    for y, ptr_of, idx_of in (
        (torch.from_numpy(DENSE).to_sparse_csr(), "crow_indices", "col_indices"),
        (torch.from_numpy(DENSE).to_sparse_csc(), "ccol_indices", "row_indices"),
    ):
        t = hb.asarray(y, copy=False)
        r = roles(t)
        assert r[hb.BufferRole.INDPTR].ptr == getattr(y, ptr_of)().data_ptr()
        assert r[hb.BufferRole.INDICES].ptr == getattr(y, idx_of)().data_ptr()
        assert r[hb.BufferRole.VALUES].ptr == y.values().data_ptr()


def test_arrow_and_jax_components_are_shared() -> None:
    m = SOURCES["arrow_csr"][0]()
    data, indptr, indices = m.to_numpy()
    t = hb.asarray(m, copy=False)
    r = roles(t)
    assert (r[hb.BufferRole.VALUES].ptr, r[hb.BufferRole.INDPTR].ptr,
            r[hb.BufferRole.INDICES].ptr) == (addr(data), addr(indptr), addr(indices))
    assert t.readonly  # Arrow memory is immutable
    b = _bcsr(nse=8)  # padding past indptr[-1]: the prefix is shared
    t = hb.asarray(b, copy=False)
    r = roles(t)
    assert r[hb.BufferRole.VALUES].ptr == addr(b.data)
    assert r[hb.BufferRole.INDICES].ptr == addr(b.indices)
    assert r[hb.BufferRole.INDICES].nbytes == 5 * 4
    assert r[hb.BufferRole.INDPTR].ptr == addr(b.indptr)


@pytest.mark.parametrize("name", ["jax_bcoo", "arrow_coo", "scipy_coo_array", "jax_bcoo_padded"])
def test_rearranging_copies_are_refused_with_copy_false(name: str) -> None:
    # (nnz, rank) coordinates must be transposed, separate vectors stacked, padding stripped.
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        hb.asarray(SOURCES[name][0](), copy=False)


def test_strided_components_are_compacted_and_reported() -> None:
    vals, idx = _coo_parts()
    idx_f = np.asfortranarray(idx)  # torch keeps these strides: (1, 2)
    x = torch.sparse_coo_tensor(torch.from_numpy(idx_f), torch.from_numpy(vals), DENSE.shape)
    assert not x._indices().is_contiguous()
    t = hb.asarray(x)
    assert t.copied and same_bits(dense_of(t), DENSE)
    assert roles(t)[hb.BufferRole.VALUES].ptr == x._values().data_ptr()  # values still shared
    with pytest.raises(hb.CopyRequiredError, match="strided"):
        hb.asarray(x, copy=False)


def test_copy_true_copies_every_component() -> None:
    m = _csr_from_mask(sps.csr_array)
    t = hb.asarray(m, copy=True)
    assert t.copied
    r = roles(t)
    assert r[hb.BufferRole.VALUES].ptr != addr(m.data)
    assert r[hb.BufferRole.INDPTR].ptr != addr(m.indptr)
    assert same_bits(dense_of(t), DENSE)


# =================================================================== round trips
@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("name", SOURCES)
def test_every_source_reaches_every_target(name: str, to: str) -> None:
    x = SOURCES[name][0]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)  # reported copies are tested below
        y = hb.convert(x, to)
    out = dense_of(y)
    assert same_bits(out, DENSE), (name, to)
    expected_type = {
        "numpy": lambda v: isinstance(v, sps.sparray),
        "torch": lambda v: isinstance(v, torch.Tensor) and v.layout != torch.strided,
        "jax": lambda v: isinstance(v, (jsparse.BCOO, jsparse.BCSR)),
        "arrow": lambda v: type(v).__name__.startswith("Sparse"),
    }[to]
    assert expected_type(y)
    # ... and back: the same descriptor (index type can widen only where the target requires).
    t = hb.asarray(y)
    assert t.shape == DENSE.shape and t.descriptor.sparse.nnz == 5
    assert same_bits(dense_of(t), DENSE)


def test_layouts_are_kept() -> None:
    csc = _csc_from_mask(sps.csc_array)
    assert hb.convert(csc, "torch").layout == torch.sparse_csc
    assert hb.convert(csc, "numpy").format == "csc"
    with pytest.warns(hb.CopyWarning, match="int64, not int32"):
        assert type(hb.convert(csc, "arrow")).__name__ == "SparseCSCMatrix"
    csr = _csr_from_mask(sps.csr_array)
    assert hb.convert(csr, "torch").layout == torch.sparse_csr
    assert isinstance(hb.convert(csr, "jax"), jsparse.BCSR)
    assert hb.convert(_torch_coo(True), "numpy").format == "coo"


def test_csc_to_jax_becomes_bcoo_and_says_so() -> None:
    with pytest.warns(hb.CopyWarning, match="no CSC"):
        y = hb.convert(_csc_from_mask(sps.csc_array), "jax")
    assert isinstance(y, jsparse.BCOO) and not y.indices_sorted
    assert same_bits(np.asarray(y.todense()), DENSE)
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(_csc_from_mask(sps.csc_array), "jax", copy=False)


def test_zero_copy_out_of_hurray() -> None:
    m = _csr_from_mask(sps.csr_array, np.int64)
    with no_copy_warnings():
        y = hb.convert(m, "torch", copy=False)
    assert y.values().data_ptr() == addr(m.data)
    assert y.crow_indices().data_ptr() == addr(m.indptr)
    assert y.col_indices().data_ptr() == addr(m.indices)
    x = _torch_coo(False)
    with no_copy_warnings():
        back = hb.convert(x, "torch", copy=False)
    assert back._indices().data_ptr() == x._indices().data_ptr()
    assert back._values().data_ptr() == x._values().data_ptr()
    assert not back.is_coalesced()
    with no_copy_warnings():
        s = hb.convert(x, "numpy", copy=False)
    assert addr(s.data) == x._values().data_ptr()
    assert addr(s.coords[0]) == x._indices().data_ptr()
    assert addr(s.coords[1]) == x._indices().data_ptr() + 5 * 8
    with no_copy_warnings():
        s2 = hb.convert(m, "numpy", copy=False)
    assert addr(s2.data) == addr(m.data) and addr(s2.indptr) == addr(m.indptr)
    with no_copy_warnings():
        a = hb.convert(m, "arrow", copy=False)
    assert [addr(v) for v in a.to_numpy()] == [addr(m.data), addr(m.indptr), addr(m.indices)]


def test_copies_out_of_hurray_are_reported() -> None:
    x = _torch_coo(True)
    with pytest.warns(hb.CopyWarning, match=r"\(nnz, rank\)"):
        hb.convert(x, "jax")
    with pytest.warns(hb.CopyWarning, match=r"\(nnz, rank\)"):
        hb.convert(x, "arrow")
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(x, "arrow", copy=False)
    m = _csr_from_mask(sps.csr_array)  # int32 indices: Arrow holds int64 only
    with pytest.warns(hb.CopyWarning, match="int64, not int32"):
        hb.convert(m, "arrow")
    idx32 = np.array([[0, 1], [1, 0]], np.int32)
    coo32 = sps.coo_array((np.ones(2), (idx32[0], idx32[1])), copy=False)
    with pytest.raises(hb.CopyRequiredError, match="int64, not int32"):
        hb.convert(coo32, "torch", copy=False)
    with pytest.warns(hb.CopyWarning, match="int64, not int32"):
        hb.convert(coo32, "torch")


def test_copy_true_out_of_hurray() -> None:
    m = _csr_from_mask(sps.csr_array, np.int64)
    y = hb.convert(m, "torch", copy=True)
    assert y.values().data_ptr() != addr(m.data)
    assert same_bits(y.to_dense().numpy(), DENSE)


# ============================================================== canonical flag
def test_canonical_flag_is_computed_when_the_framework_has_none() -> None:
    # Unique and sorted but not flagged: found canonical.
    vals, idx = _coo_parts()
    m = sps.coo_array((vals, (idx[0], idx[1])), shape=DENSE.shape)
    m.has_canonical_format = False
    assert hb.asarray(m).descriptor.sparse.canonical
    # Duplicates: not canonical, and densify sums them.
    rows, cols = np.array([1, 0, 1]), np.array([2, 0, 2])
    dup = sps.coo_array((np.array([1.0, 2.0, 4.0]), (rows, cols)), shape=(3, 3))
    t = hb.asarray(dup)
    assert not t.descriptor.sparse.canonical
    expected = np.zeros((3, 3))
    expected[1, 2], expected[0, 0] = 5.0, 2.0
    assert same_bits(dense_of(t), expected)
    for to in TARGETS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", hb.CopyWarning)
            assert same_bits(dense_of(hb.convert(t, to)), expected), to
    # CSR with columns out of order inside a row: not canonical.
    csr = sps.csr_array((np.array([1.0, 2.0]), np.array([3, 1]), np.array([0, 2, 2])),
                        shape=(2, 4))
    assert not hb.asarray(csr).descriptor.sparse.canonical
    csr.sort_indices()
    assert hb.asarray(csr).descriptor.sparse.canonical


def test_canonical_flag_reaches_the_frameworks() -> None:
    t = hb.asarray(_torch_coo(True))
    assert hb.convert(t, "torch").is_coalesced()
    assert hb.convert(t, "numpy").has_canonical_format
    with pytest.warns(hb.CopyWarning):
        b = hb.convert(t, "jax")
    assert b.indices_sorted and b.unique_indices
    u = hb.asarray(_torch_coo(False))
    assert not hb.convert(u, "torch").is_coalesced()
    with pytest.warns(hb.CopyWarning):
        b = hb.convert(u, "jax")
    assert not b.indices_sorted and not b.unique_indices
    assert hb.asarray(_torch_coo(False).coalesce()).descriptor.sparse.canonical


def test_false_canonical_claim_is_refused() -> None:
    t = _raw(COO, (3, 3), np.array([1.0, 2.0]), np.array([[2, 0], [0, 0]], np.int64),
             canonical=True)
    with pytest.raises(hb.FormatError) as e:
        hb.convert(t, "torch")
    assert e.value.field == "sparse.canonical"


# ======================================================================= nnz = 0
EMPTY_SHAPES = [(3, 5), (0, 5), (4, 0), (0, 0)]


@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize("to", TARGETS)
def test_empty_csr_round_trips_through_every_adapter(shape: tuple[int, int], to: str) -> None:
    m = sps.csr_array(shape, dtype=np.float32)
    t = hb.asarray(m)
    r = roles(t)
    assert t.descriptor.sparse.nnz == 0
    assert r[hb.BufferRole.VALUES] == hb.Buffer(hb.BufferRole.VALUES, 0, 0)
    assert r[hb.BufferRole.INDICES] == hb.Buffer(hb.BufferRole.INDICES, 0, 0)
    assert r[hb.BufferRole.INDPTR].nbytes == (shape[0] + 1) * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        y = hb.convert(t, to)
        back = hb.asarray(y)
    assert back.descriptor.layout == CSR and back.shape == shape
    assert back.descriptor.sparse.nnz == 0 and back.dtype is hb.float32
    assert same_bits(dense_of(y).astype(np.float32), np.zeros(shape, np.float32))


@pytest.mark.parametrize("layout", [COO, CSC])
@pytest.mark.parametrize("to", TARGETS)
def test_empty_coo_and_csc_round_trip(layout: hb.Layout, to: str) -> None:
    shape = (2, 0, 3) if layout == COO else (3, 4)
    t = hs.make_sparse(layout, shape, np.zeros(0, np.float64),
                       np.zeros((len(shape), 0), np.int64) if layout == COO
                       else np.zeros(0, np.int64),
                       None if layout == COO else np.zeros(5, np.int64))
    assert t.descriptor.sparse.canonical  # vacuously: no entries
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        y = hb.convert(t, to)
        back = hb.asarray(y)
    assert back.shape == shape and back.descriptor.sparse.nnz == 0
    assert same_bits(dense_of(y), np.zeros(shape))


def test_empty_torch_and_jax_sources() -> None:
    e = torch.sparse_coo_tensor(torch.empty(2, 0, dtype=torch.long), torch.empty(0), (3, 4))
    t = hb.asarray(e)
    assert t.descriptor.sparse.nnz == 0 and t.descriptor.sparse.canonical
    b = jsparse.BCOO((jnp.zeros(0), jnp.zeros((0, 2), jnp.int32)), shape=(3, 4))
    assert hb.asarray(b).descriptor.sparse.nnz == 0
    # All padding: nnz 0 after stripping.
    p = jsparse.BCOO((jnp.zeros(2), jnp.asarray([[3, 4], [3, 4]], jnp.int32)), shape=(3, 4))
    assert hb.asarray(p).descriptor.sparse.nnz == 0


# ================================================================= JAX padding
def test_jax_padding_is_stripped_not_passed_on() -> None:
    b = jsparse.BCOO.fromdense(jnp.asarray(DENSE), nse=12)
    real = int((np.asarray(b.indices) < np.array(DENSE.shape)).all(axis=1).sum())
    assert b.nse == 12 and real < 12
    t = hb.asarray(b)
    assert t.descriptor.sparse.nnz == real
    assert same_bits(dense_of(t), np.asarray(b.todense()))
    assert hs.validate(t)  # no out-of-range entry survived
    r = jsparse.BCSR.fromdense(jnp.asarray(DENSE), nse=9)
    t = hb.asarray(r)
    assert t.descriptor.sparse.nnz == int(r.indptr[-1])
    assert same_bits(dense_of(t), np.asarray(r.todense()))


def test_jax_out_of_range_entries_inside_indptr_are_stripped() -> None:
    r = jsparse.BCSR((jnp.asarray([1.0, 2.0, 9.0]), jnp.asarray([0, 1, 3], jnp.int32),
                      jnp.asarray([0, 1, 3], jnp.int32)), shape=(2, 3))
    t = hb.asarray(r)
    assert t.copied and t.descriptor.sparse.nnz == 2
    assert same_bits(dense_of(t), np.asarray(r.todense()))
    with pytest.raises(hb.CopyRequiredError):
        hb.asarray(r, copy=False)


def test_jax_negative_index_is_refused() -> None:
    b = jsparse.BCOO((jnp.asarray([1.0]), jnp.asarray([[-1, 0]], jnp.int32)), shape=(2, 2))
    with pytest.raises(hb.FormatError, match="negative") as e:
        hb.asarray(b)
    assert e.value.field == "indices"


def test_jax_batched_bcoo_is_refused() -> None:
    b = jsparse.BCOO.fromdense(jnp.ones((2, 3, 4)), n_batch=1)
    with pytest.raises(hb.UnsupportedError, match="n_batch=1"):
        hb.asarray(b)


# ================================================================== validation
def _raw(layout: hb.Layout, shape: tuple[int, ...], values: np.ndarray, indices: np.ndarray,
         indptr: np.ndarray | None = None, canonical: bool = False) -> hb.Tensor:
    """A sparse hb.Tensor over hand-written buffers, unchecked (as from a file or the wire)."""
    idt = hb.get_adapter("numpy").dtype_of(indices.dtype)
    d = hb.Descriptor(shape, hb.get_adapter("numpy").dtype_of(values.dtype), layout,
                      sparse=hb.Sparse(values.size, idt, canonical))
    arrays = {hb.BufferRole.VALUES: values, hb.BufferRole.INDICES: indices,
              hb.BufferRole.INDPTR: indptr}
    bufs = []
    for spec in d.buffer_layout():
        a = np.ascontiguousarray(arrays[spec.role])
        arrays[spec.role] = a
        bufs.append(hb.Buffer(spec.role, addr(a) if a.nbytes else 0, a.nbytes))
    return hb.Tensor(d, bufs, owner=tuple(arrays.values()))


BAD: dict[str, tuple[Callable[[], hb.Tensor], str, str]] = {
    "coo_index_too_large": (lambda: _raw(COO, (3, 3), np.ones(2), np.array([[0, 3], [1, 1]])),
                            "indices", "index 3 along dimension 0"),
    "coo_negative_index": (lambda: _raw(COO, (3, 3), np.ones(2), np.array([[0, 1], [1, -1]])),
                           "indices", "index -1 along dimension 1"),
    "csr_column_too_large": (lambda: _raw(CSR, (2, 3), np.ones(2), np.array([0, 3]),
                                          np.array([0, 1, 2])), "indices", "index 3"),
    "csr_indptr_not_monotonic": (lambda: _raw(CSR, (3, 3), np.ones(2), np.array([0, 1]),
                                              np.array([0, 2, 1, 2])), "indptr", "decreases"),
    "csr_indptr_not_from_zero": (lambda: _raw(CSR, (2, 3), np.ones(2), np.array([0, 1]),
                                              np.array([1, 1, 2])), "indptr", "start at 0"),
    "csr_indptr_not_to_nnz": (lambda: _raw(CSR, (2, 3), np.ones(2), np.array([0, 1]),
                                           np.array([0, 1, 1])), "indptr", "end at nnz"),
    "csc_indptr_past_nnz": (lambda: _raw(CSC, (2, 3), np.ones(2), np.array([0, 1]),
                                         np.array([0, 1, 2, 7])), "indptr", "ends at 7"),
    "csc_row_too_large": (lambda: _raw(CSC, (2, 3), np.ones(1), np.array([2]),
                                       np.array([0, 0, 1, 1])), "indices", "index 2"),
    # Dimension 1's size (256) is beyond uint8 (a check in uint8 would see 0), its last
    # index 255 is not: uint8 may describe it; dimension 0 (3) is the one 255 exceeds.
    "uint_index_too_large": (lambda: _raw(COO, (3, 256), np.ones(1, np.float32),
                                          np.array([[255], [254]], np.uint8)), "indices",
                             "index 255 along dimension 0"),
}


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("case", BAD)
def test_bad_indices_are_refused_by_every_target(case: str, to: str) -> None:
    make, field, message = BAD[case]
    t = make()
    with pytest.raises(hb.FormatError, match=message) as e:
        hb.convert(t, to)
    assert e.value.field == field
    with pytest.raises(hb.FormatError):
        hb.convert(t, to, densify=True)
    with pytest.raises(hb.FormatError):
        hb.densify(t)


@pytest.mark.parametrize("case", BAD)
def test_bad_indices_are_refused_by_make_sparse(case: str) -> None:
    t = BAD[case][0]()
    p = hs.parts(t)
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse(t.descriptor.layout, t.shape, p.values, p.indices, p.indptr)
    assert e.value.field == BAD[case][1]


def test_nnz_disagreeing_with_component_lengths() -> None:
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse("coo", (3, 3), np.ones(3), np.array([[0, 1], [0, 1]]))
    assert e.value.field == "sparse.nnz"
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse("csr", (2, 3), np.ones(3), np.array([0, 1]), np.array([0, 1, 2]))
    assert e.value.field in ("sparse.nnz", "indptr")
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse("csr", (2, 3), np.ones(2), np.array([0, 1]), np.array([0, 2]))
    assert e.value.field == "indptr"  # shape[0] + 1 entries expected
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse("csr", (2, 3), np.ones(2), np.array([0, 1], np.int32),
                       np.array([0, 1, 2], np.int64))
    assert e.value.field == "sparse.index_dtype"
    # Buffers shorter than the descriptor says: refused when the tensor is built.
    d = hb.Descriptor((3, 3), hb.float64, COO, sparse=hb.Sparse(2, hb.int64))
    v = np.ones(1)
    with pytest.raises(hb.FormatError, match="buffer 0"):
        hb.Tensor(d, [hb.Buffer(hb.BufferRole.VALUES, addr(v), 8),
                      hb.Buffer(hb.BufferRole.INDICES, addr(v), 32)], owner=v)


def test_invalid_natives_are_refused() -> None:
    # scipy accepts these; the bridge does not pass them on.
    bad_col = sps.csr_array((np.ones(2), np.array([0, 9]), np.array([0, 1, 2])), shape=(2, 3))
    with pytest.raises(hb.FormatError, match="index 9") as e:
        hb.asarray(bad_col)
    assert e.value.field == "indices"
    bad_ptr = sps.csr_array((np.ones(2), np.array([0, 1]), np.array([0, 2, 1, 2])), shape=(3, 3))
    with pytest.raises(hb.FormatError, match="decreases"):
        hb.asarray(bad_ptr)
    # torch without invariant checks accepts an out-of-range index; the bridge does not.
    x = torch.sparse_coo_tensor(torch.tensor([[0, 5]]), torch.ones(2), (3,),
                                check_invariants=False)
    with pytest.raises(hb.FormatError, match="index 5"):
        hb.asarray(x)
    y = torch.sparse_csr_tensor(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.ones(2),
                                (2, 2), check_invariants=False)
    with pytest.raises(hb.FormatError, match="decreases"):
        hb.asarray(y)
    # Arrow accepts out-of-range coordinates too.
    z = pa.SparseCOOTensor.from_numpy(np.ones((1, 1)), np.array([[0, 9]]), shape=(2, 3))
    with pytest.raises(hb.FormatError, match="index 9"):
        hb.asarray(z)


def test_validated_tensors_are_not_checked_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    t = hb.asarray(_csr_from_mask(sps.csr_array, np.int64))
    calls = []
    real = hs._verify
    monkeypatch.setattr(hs, "_verify", lambda *a: calls.append(1) or real(*a))
    hb.convert(t, "torch")
    assert calls == []
    raw = _raw(CSR, (2, 3), np.ones(2), np.array([0, 1]), np.array([0, 1, 2]))
    hb.convert(raw, "torch")
    assert calls == [1]


# ===================================================================== densify
def test_dense_result_only_with_densify() -> None:
    m = _csr_from_mask(sps.csr_array)
    s = hb.convert(m, "numpy")
    assert isinstance(s, sps.sparray)  # never a silent dense array
    a = hb.convert(m, "numpy", densify=True)
    assert isinstance(a, np.ndarray) and same_bits(a, DENSE)
    assert same_bits(hb.convert(m, "torch", densify=True).numpy(), DENSE)
    assert same_bits(np.asarray(hb.convert(m, "jax", densify=True)), DENSE)
    arr = hb.convert(hb.asarray(m), "arrow", densify=True)
    assert isinstance(arr, pa.Tensor) and same_bits(arr.to_numpy(), DENSE)
    with pytest.raises(hb.CopyRequiredError, match="densify"):
        hb.convert(m, "numpy", densify=True, copy=False)


def test_densify_is_keyword_only_and_ignored_for_dense() -> None:
    a = np.arange(6.0)
    with pytest.raises(TypeError):
        hb.convert(a, "numpy", None, None, True)  # type: ignore[misc]
    assert hb.convert(a, "numpy", densify=True) is not None


def test_numpy_target_without_scipy_needs_densify(monkeypatch: pytest.MonkeyPatch) -> None:
    t = hb.asarray(_torch_coo(True))
    monkeypatch.setitem(sys.modules, "scipy.sparse", None)
    with pytest.raises(hb.BackendNotAvailableError, match="densify=True"):
        hb.convert(t, "numpy")
    assert same_bits(hb.convert(t, "numpy", densify=True), DENSE)


@pytest.mark.parametrize("layout", [COO, CSR, CSC])
def test_hb_densify(layout: hb.Layout) -> None:
    x = {COO: _torch_coo(False), CSR: _csr_from_mask(sps.csr_array),
         CSC: _csc_from_mask(sps.csc_array)}[layout]
    d = hb.densify(x)
    assert d.copied and d.is_dense and same_bits(np.asarray(d), DENSE)
    assert d.data_ptr % 64 == 0  # memory the bridge allocates is 64-byte aligned


# ============================================================ index dtypes
def test_index_dtypes_are_preserved_where_the_target_allows() -> None:
    m32 = _csr_from_mask(sps.csr_array)
    with no_copy_warnings():
        y = hb.convert(m32, "torch")
    assert y.crow_indices().dtype == torch.int32
    with no_copy_warnings():
        assert hb.convert(y, "numpy").indices.dtype == np.int32
    m64 = _csr_from_mask(sps.csr_array, np.int64)
    with no_copy_warnings():
        assert hb.convert(m64, "numpy").indices.dtype == np.int64
        warnings.filterwarnings("ignore", message=".*aligned", category=hb.CopyWarning)
        assert hb.convert(m64, "jax").indices.dtype == jnp.int64


@pytest.mark.parametrize("idx_dtype", [np.uint8, np.int16, np.uint16, np.uint32, np.uint64])
def test_unusual_index_types_are_converted_with_a_report(idx_dtype: Any) -> None:
    t = hs.make_sparse("csr", (2, 3), np.array([1.0, 2.0]), np.array([2, 0], idx_dtype),
                       np.array([0, 1, 2], idx_dtype))
    assert t.descriptor.sparse.index_dtype.name == np.dtype(idx_dtype).name
    for to, expect in (("numpy", ("int32", "int64")), ("torch", ("int64",)),
                       ("arrow", ("int64",))):
        with pytest.warns(hb.CopyWarning, match="indices are"):
            y = hb.convert(t, to)
        back = hb.asarray(y)
        assert back.descriptor.sparse.index_dtype.name in expect
        assert same_bits(dense_of(back), np.array([[0, 0, 1.0], [2.0, 0, 0]]))
        with pytest.raises(hb.CopyRequiredError):
            hb.convert(t, to, copy=False)


def test_jax_without_x64_narrows_64_bit_indices() -> None:
    t = hb.asarray(_csr_from_mask(sps.csr_array, np.int64).astype(np.float32))
    with jax.enable_x64(False):
        with pytest.warns(hb.CopyWarning, match="narrowed to int32"):
            y = hb.convert(t, "jax")
        assert y.indices.dtype == jnp.int32


# =========================================================== other ranks
@pytest.mark.parametrize("to", TARGETS)
def test_rank_3_and_rank_1_coo(to: str) -> None:
    rng = np.random.default_rng(5)
    dense = np.zeros((3, 4, 5), np.float32)
    dense[rng.integers(0, 3, 7), rng.integers(0, 4, 7), rng.integers(0, 5, 7)] = \
        rng.standard_normal(7).astype(np.float32)
    x = torch.from_numpy(dense).to_sparse()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        y = hb.convert(x, to)
    assert same_bits(dense_of(y), dense)
    v = torch.sparse_coo_tensor(torch.tensor([[4, 1]]), torch.tensor([1, 2], dtype=torch.int16),
                                (6,))
    with warnings.catch_warnings():
        # Rank 1: (1, nnz) and (nnz, 1) are the same memory, so the coordinates need no
        # transposition for JAX or Arrow (only JAX's alignment rule may still copy).
        warnings.simplefilter("error", hb.CopyWarning)
        warnings.filterwarnings("ignore", message=".*aligned", category=hb.CopyWarning)
        z = hb.convert(v, to)
    assert same_bits(dense_of(z).astype(np.int16), v.to_dense().numpy())


# ========================================================= refusals, misc
def test_unsupported_sparse_natives() -> None:
    with pytest.raises(hb.UnsupportedError, match="sparse_bsr"):
        hb.asarray(torch.eye(4).to_sparse_bsr((2, 2)))
    with pytest.raises(hb.UnsupportedError, match="hybrid"):
        hb.asarray(torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2, 3), (2, 3)))
    with pytest.raises(hb.UnsupportedError, match="batched"):
        hb.asarray(torch.eye(3).expand(2, 3, 3).to_sparse_csr())
    with pytest.raises(hb.UnsupportedError, match="dia"):
        hb.asarray(sps.dia_array(np.eye(3)))
    csf = pa.SparseCSFTensor.from_dense_numpy(np.eye(3))
    with pytest.raises(hb.UnsupportedError, match="SparseCSFTensor"):
        hb.asarray(csf)


def test_values_a_target_cannot_hold_are_refused() -> None:
    b = hs.make_sparse("coo", (3,), np.array([True, False]), np.array([[0, 2]]))
    with pytest.raises(hb.UnsupportedError, match="Arrow sparse tensors hold"):
        hb.convert(b, "arrow")
    ml = pytest.importorskip("ml_dtypes")
    bf = hs.make_sparse("coo", (3,), np.array([1, 2], ml.bfloat16), np.array([[0, 2]]))
    with pytest.raises(hb.UnsupportedError, match=r"scipy\.sparse cannot hold bfloat16"):
        hb.convert(bf, "numpy")
    assert hb.convert(bf, "torch").dtype == torch.bfloat16  # torch can
    assert same_bits(np.asarray(hb.densify(bf)), np.array([1, 0, 2], ml.bfloat16))


def test_quantized_sparse_tensor_is_refused() -> None:
    d = hb.Descriptor((2, 2), hb.int8, COO, sparse=hb.Sparse(0),
                      quantization=hb.Quantization(hb.QuantScheme.PER_TENSOR))
    keep = (ctypes.c_float * 1)(0.5)
    bufs = [hb.Buffer(s.role, ctypes.addressof(keep) if s.nbytes else 0, s.nbytes)
            for s in d.buffer_layout()]
    t = hb.Tensor(d, bufs, owner=keep)
    with pytest.raises(hb.UnsupportedError, match="quantized sparse"):
        hb.convert(t, "torch")


def test_dense_adapters_refuse_sparse_and_make_no_dense_array() -> None:
    t = hb.asarray(_csr_from_mask(sps.csr_array))
    with pytest.raises(hb.UnsupportedError):
        np.asarray(t)  # no silent densification through __array__
    with pytest.raises(hb.UnsupportedError):
        t.__dlpack__()


def test_sparse_tensors_pickle_and_copy() -> None:
    t = hb.asarray(_torch_coo(False))
    u = pickle.loads(pickle.dumps(t, protocol=5))
    assert u.descriptor == t.descriptor
    assert same_bits(dense_of(u), DENSE)
    assert same_bits(hb.convert(u, "torch").to_dense().numpy(), DENSE)
    c = t.copy()
    assert c.copied and same_bits(dense_of(c), DENSE)


def test_source_lives_as_long_as_the_tensor() -> None:
    data = np.array([1.0, 2.0])
    ref = weakref.ref(data)
    m = sps.csr_array((data, np.array([1, 0]), np.array([0, 1, 2])), shape=(2, 2), copy=False)
    t = hb.asarray(m)
    y = hb.convert(t, "torch")
    del data, m, t
    gc.collect()
    assert ref() is not None  # the torch tensor still uses the memory
    assert y.to_dense().tolist() == [[0.0, 1.0], [2.0, 0.0]]
    del y
    gc.collect()
    assert ref() is None


def test_requires_grad_torch_sparse() -> None:
    x = torch.from_numpy(DENSE).to_sparse().requires_grad_(True)
    t = hb.asarray(x)
    assert same_bits(dense_of(t), DENSE)


def test_make_sparse_from_torch_components_and_canonical_argument() -> None:
    idx = torch.tensor([[1, 0], [0, 2]])
    vals = torch.tensor([3.0, 4.0])
    t = hs.make_sparse(COO, (2, 3), vals, idx)
    assert not t.descriptor.sparse.canonical  # (1,0) then (0,2): not sorted
    assert roles(t)[hb.BufferRole.INDICES].ptr == idx.data_ptr()
    with pytest.raises(hb.FormatError) as e:
        hs.make_sparse(COO, (2, 3), vals, idx, canonical=True)
    assert e.value.field == "sparse.canonical"
    assert not hs.make_sparse(COO, (2, 3), vals, idx.flip(1), canonical=False) \
        .descriptor.sparse.canonical
    with pytest.raises(hb.FormatError, match="indptr"):
        hs.make_sparse(CSR, (2, 3), vals, idx[0])
    assert hs.is_sparse_native(torch.eye(2).to_sparse())
    assert not hs.is_sparse_native(torch.eye(2))
    assert not hs.is_sparse_native(np.eye(2))


# ============================================ an empty shape stores no entries
def _empty_shape_bytes(layout: hb.Layout, empty_dim: int) -> bytes:
    """The wire bytes of a (0, 5) or (5, 0) sparse descriptor claiming nnz = 3.

    Encoded from the valid (1, 5) / (5, 1) descriptor, then the shape and the buffer
    lengths patched to what the empty shape implies, so that nnz is the only defect.
    """
    import struct

    shape = [5, 5]
    shape[empty_dim] = 1
    d = hb.Descriptor(tuple(shape), hb.float32, layout, sparse=hb.Sparse(3))
    raw = bytearray(d.to_bytes())
    struct.pack_into("<Q", raw, 32 + 8 * empty_dim, 0)
    specs = d.buffer_layout()
    table = len(raw) - 24 * len(specs)
    for i, spec in enumerate(specs):
        length = spec.nbytes
        if spec.role == hb.BufferRole.VALUES:
            length = 0  # what the pre-fix descriptor computed for an empty shape
        elif spec.role == hb.BufferRole.INDPTR and empty_dim == (0 if layout == CSR else 1):
            length = 8  # one INDPTR entry for zero rows (CSR) / columns (CSC)
        struct.pack_into("<Q", raw, table + 24 * i + 16, length)
    return bytes(raw)


@pytest.mark.parametrize("layout", [COO, CSR, CSC])
@pytest.mark.parametrize("empty_dim", [0, 1])
def test_an_empty_shape_admits_only_nnz_0_on_build_and_decode(layout: hb.Layout,
                                                              empty_dim: int) -> None:
    shape = [0, 5] if empty_dim == 0 else [5, 0]
    with pytest.raises(hb.FormatError) as e:
        hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(3))
    assert e.value.field == "sparse.nnz"
    assert str(shape) in str(e.value) and "nnz = 3" in str(e.value)
    # Whatever the other dimension: a dynamic one does not make room for entries.
    with pytest.raises(hb.FormatError) as e:
        hb.Descriptor([0, hb.DYNAMIC], hb.float32, layout, sparse=hb.Sparse(1))
    assert e.value.field == "sparse.nnz"
    # nnz = 0 stays valid (ADR-007 §6).
    ok = hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(0))
    assert hb.Descriptor.from_bytes(ok.to_bytes()) == ok
    raw = _empty_shape_bytes(layout, empty_dim)
    for decode in (hb.Descriptor.from_bytes, hb.wire.decode_prefix):
        with pytest.raises(hb.FormatError, match="nnz") as e:
            decode(raw)
        assert e.value.field == "sparse.nnz"


def test_an_empty_shape_admits_only_nnz_0_on_import() -> None:
    """Natives that claim entries in an empty shape: refused naming nnz and the shape."""
    cases = {
        "torch COO": lambda: torch.sparse_coo_tensor(
            torch.tensor([[0, 0, 0], [1, 2, 3]]), torch.ones(3), (0, 5), check_invariants=False),
        "torch CSR": lambda: torch.sparse_csr_tensor(
            torch.tensor([0]), torch.tensor([1, 2, 3]), torch.ones(3), (0, 5),
            check_invariants=False),
        "arrow COO": lambda: pa.SparseCOOTensor.from_numpy(
            np.ones((3, 1), np.float32), np.array([[0, 1], [0, 2], [0, 3]]), shape=(0, 5)),
        "arrow CSR": lambda: pa.SparseCSRMatrix.from_numpy(
            np.ones((3, 1), np.float32), np.array([0, 3]), np.array([1, 2, 3]), shape=(1, 0)),
    }
    for name, make in cases.items():
        with pytest.raises(hb.FormatError, match=r"nnz") as e:
            hb.asarray(make())
        assert e.value.field == "sparse.nnz", name
        assert "[0, 5]" in str(e.value) or "[1, 0]" in str(e.value), name
    with pytest.raises(hb.FormatError, match=r"\[0, 5\]") as e:
        hs.make_sparse("coo", (0, 5), np.ones(3, np.float32), np.array([[0, 0, 0], [1, 2, 3]]))
    assert e.value.field == "sparse.nnz"
    with pytest.raises(hb.FormatError, match=r"\[1, 0\]") as e:
        hs.make_sparse("csr", (1, 0), np.ones(3, np.float32), np.array([0, 1, 2]),
                       np.array([0, 3]))
    assert e.value.field == "sparse.nnz"


def test_the_c_decoder_refuses_entries_in_an_empty_shape_too(c_build: Any) -> None:
    """The C library (compiled into _speedups as well) applies the same rule, same field."""
    from tests.c.test_c_library import _ok, _run

    cases = [_empty_shape_bytes(layout, dim) for layout in (COO, CSR, CSC) for dim in (0, 1)]
    ok = hb.Descriptor([0, 5], hb.float32, CSR, sparse=hb.Sparse(0)).to_bytes()
    out = _ok(_run(c_build / "test_hurray", "decode",
                   stdin="".join(raw.hex() + "\n" for raw in [*cases, ok]))).splitlines()
    assert out[:-1] == ["err sparse.nnz"] * len(cases)
    assert out[-1].startswith("ok ")


def test_the_index_type_holds_nnz_and_every_index_at_the_boundary() -> None:
    # memory-layout.md §5.1: int8 components hold nnz = 127 and column indices up to 127
    vals = np.ones(127, np.float32)
    cols = np.arange(127, dtype=np.int8)
    t = hs.make_sparse("csr", (1, 128), vals, cols, np.array([0, 127], np.int8))
    assert t.descriptor.sparse is not None and t.descriptor.sparse.index_dtype == hb.int8
    assert hb.loads(hb.dumps({"m": t}))["m"].descriptor == t.descriptor
    # one column more and the type cannot hold every index the shape admits
    with pytest.raises(hb.FormatError, match=r"int8 holds values up to 127.*int16") as e:
        hs.make_sparse("csr", (1, 129), vals, cols, np.array([0, 127], np.int8))
    assert e.value.field == "sparse.index_dtype"
    # SciPy's own objects carry a type that holds them: 128 entries in int32 or int64
    m = sps.csr_array((np.ones(128), (np.zeros(128, int), np.arange(128))), shape=(1, 300))
    d = hb.asarray(m).descriptor
    assert d.sparse is not None and d.sparse.nnz == 128
    assert d.sparse.index_dtype in (hb.int32, hb.int64)
    assert hb.loads(hb.dumps({"m": hb.asarray(m)}))["m"].descriptor == d
