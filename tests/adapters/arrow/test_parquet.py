"""Tensors in Parquet: a fixed_shape_tensor column written with pyarrow.parquet and read back
hands the whole column (rank + 1) and each row's tensor to torch and JAX.

Reading Parquet decodes into fresh Arrow buffers (that is the reader's one copy, whatever
the consumer); from those buffers on, nothing is copied where the memory allows, which
the tests prove by comparing addresses. Where it does not (JAX aliases CPU memory only on
64-byte boundaries), the copy is reported, and refused under ``copy=False``.
"""

from __future__ import annotations

import pathlib
import warnings
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge.errors import CopyRequiredError, CopyWarning

np = pytest.importorskip("numpy", reason="numpy is not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow was built without Parquet")


def _write_and_read(tmp_path: pathlib.Path, src: Any, **write: Any) -> Any:
    table = pa.table({"id": pa.array(np.arange(len(src))), "x": hb.asarray(src)})
    assert isinstance(table.column("x").type, pa.FixedShapeTensorType)
    path = tmp_path / "tensors.parquet"
    pq.write_table(table, path, **write)
    return pq.read_table(path).column("x")


def _values_address(chunk: Any) -> int:
    return int(chunk.storage.values.buffers()[1].address)


def test_the_column_comes_back_with_its_type_and_values(tmp_path: pathlib.Path) -> None:
    src = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    col = _write_and_read(tmp_path, src)
    assert col.type == pa.fixed_shape_tensor(pa.float32(), [2, 3])
    t = hb.asarray(col)
    assert t.shape == (5, 2, 3) and not t.copied
    assert t.data_ptr == _values_address(col.chunk(0))  # the read buffer, shared
    np.testing.assert_array_equal(np.from_dlpack(t), src)


def test_whole_column_and_rows_to_torch_without_a_copy(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    src = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)
    col = _write_and_read(tmp_path, src)
    chunk = col.chunk(0)
    base = _values_address(chunk)
    # Arrow memory is read-only and torch cannot mark a tensor read-only: the torch
    # adapter says so once (a UserWarning), which is not what this test is about.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("error", CopyWarning)
        whole = hb.convert(col, "torch", copy=False)
    assert whole.shape == (4, 2, 3) and whole.data_ptr() == base
    row_bytes = 2 * 3 * 4
    for i in range(len(chunk)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("error", CopyWarning)
            row = hb.convert(chunk[i].to_tensor(), "torch", copy=False)
        assert row.shape == (2, 3) and row.data_ptr() == base + i * row_bytes
        assert torch.equal(row, torch.from_numpy(src[i]))


def test_whole_column_and_aligned_rows_to_jax_without_a_copy(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("jax", reason="jax is not installed")
    src = np.arange(3 * 4 * 4, dtype=np.float32).reshape(3, 4, 4)  # 64-byte rows
    col = _write_and_read(tmp_path, src)
    chunk = col.chunk(0)
    base = _values_address(chunk)
    assert base % 64 == 0  # Arrow allocates on 64-byte boundaries
    with warnings.catch_warnings():
        warnings.simplefilter("error", CopyWarning)
        whole = hb.convert(col, "jax", copy=False)
        assert whole.shape == (3, 4, 4) and whole.unsafe_buffer_pointer() == base
        for i in range(len(chunk)):
            row = hb.convert(chunk[i].to_tensor(), "jax", copy=False)
            assert row.unsafe_buffer_pointer() == base + i * 64
            np.testing.assert_array_equal(np.asarray(row), src[i])


def test_rows_off_a_64_byte_boundary_are_copied_for_jax_and_say_so(
        tmp_path: pathlib.Path) -> None:
    pytest.importorskip("jax", reason="jax is not installed")
    src = np.arange(4 * 2 * 3, dtype=np.float32).reshape(4, 2, 3)  # 24-byte rows
    chunk = _write_and_read(tmp_path, src).chunk(0)
    with pytest.warns(CopyWarning, match="64-byte"):
        row = hb.convert(chunk[1].to_tensor(), "jax")
    np.testing.assert_array_equal(np.asarray(row), src[1])
    with pytest.raises(CopyRequiredError):
        hb.convert(chunk[1].to_tensor(), "jax", copy=False)


def test_several_row_groups_are_chunks_each_shared(tmp_path: pathlib.Path) -> None:
    src = np.arange(6 * 8, dtype=np.int64).reshape(6, 8)
    col = _write_and_read(tmp_path, src, row_group_size=2)
    assert col.num_chunks == 3
    for k, chunk in enumerate(col.chunks):
        t = hb.asarray(chunk)
        assert not t.copied and t.data_ptr == _values_address(chunk)
        np.testing.assert_array_equal(np.from_dlpack(t), src[2 * k:2 * k + 2])
    # The whole column is one tensor only by joining the chunks: a copy, reported.
    assert hb.asarray(col).copied
    with pytest.raises(CopyRequiredError):
        hb.asarray(col, copy=False)
