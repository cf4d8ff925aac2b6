"""Dask adapter, on Dask's local schedulers: chunks that are views, file entries read
lazily, sharded tensors as chunk grids, hb.asarray's copy, and hb.save written chunk by
chunk (byte-identical to a save of the computed array). The distributed save is in
test_distributed.py.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
da = pytest.importorskip("dask.array", reason="dask is not installed: pip install "
                                              "'hurray-bridge[dask]'")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge.adapters import dask as D  # noqa: E402
from hurray_bridge.adapters.dask.shards import from_hurray, grid_of  # noqa: E402
from hurray_bridge.container import verify  # noqa: E402
from hurray_bridge.shards import Box  # noqa: E402


def chunk_arrays(x: da.Array) -> list[np.ndarray]:
    """Each chunk as the local scheduler computes it, alone (no concatenation)."""
    return [d.compute(scheduler="sync") for d in x.to_delayed().ravel()]


class DeviceChunk:
    """Stands for a chunk type that is not NumPy's (CuPy's, say) as a Dask array's meta."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)

    def __getitem__(self, key: object) -> DeviceChunk:
        return self


# ------------------------------------------------------------------ to Dask
def test_dense_tensor_chunks_are_views_of_its_memory() -> None:
    a = np.arange(240, dtype=np.float32).reshape(12, 20)
    t = hb.asarray(a)
    x = D.from_hurray(t, chunks=(5, 8))
    assert x.chunks == ((5, 5, 2), (8, 8, 4))
    chunks = chunk_arrays(x)
    assert len(chunks) == 9
    assert all(np.shares_memory(c, a) for c in chunks)
    np.testing.assert_array_equal(x.compute(), a)
    # Writing through the tensor's memory shows in the chunks: they are views, not copies.
    a[0, 0] = -7
    assert chunk_arrays(x)[0][0, 0] == -7


def test_convert_to_dask_default_chunks_share_memory() -> None:
    a = np.arange(1000, dtype=np.int64)
    x = hb.convert(a, "dask")
    assert isinstance(x, da.Array) and x.dtype == a.dtype
    assert all(np.shares_memory(c, a) for c in chunk_arrays(x))


def test_convert_passes_chunks_to_the_adapter() -> None:
    a = np.arange(240, dtype=np.float32).reshape(12, 20)
    x = hb.convert(a, "dask", chunks=(5, -1))
    assert x.chunks == ((5, 5, 2), (20,))
    assert all(np.shares_memory(c, a) for c in chunk_arrays(x))
    np.testing.assert_array_equal(x.compute(), a)


def test_convert_of_a_file_entry_with_chunks_reads_it_lazily(tmp_path: Path) -> None:
    a = np.arange(64 * 32, dtype=np.float64).reshape(64, 32)
    path = tmp_path / "a.hurray"
    hb.save(path, {"a": a})
    x = hb.convert(hb.load(path)["a"], "dask", chunks=(16, 32))
    assert x.chunks == ((16,) * 4, (32,))
    assert all(not isinstance(v, np.ndarray) for v in dict(x.dask).values())
    np.testing.assert_array_equal(x.compute(), a)


def test_convert_refuses_chunks_for_a_sharded_tensor_and_a_misspelled_keyword() -> None:
    st = sharded(np.arange(120, dtype=np.float32).reshape(12, 10), (3, 2))
    with pytest.raises(hb.UnsupportedError, match=r"chunks=\(6, 10\) applies to a dense "
                       r"tensor, and this one is sharded.*rechunk"):
        hb.convert(st, "dask", chunks=(6, 10))
    with pytest.raises(hb.UnsupportedError, match=r"takes no chunk=: dask's from_hurray takes "
                       r"chunks="):
        hb.convert(np.arange(4), "dask", chunk=2)


def test_copy_true_gives_views_of_a_fresh_copy() -> None:
    a = np.arange(10.0)
    x = hb.convert(a, "dask", copy=True)
    assert not any(np.shares_memory(c, a) for c in chunk_arrays(x))
    np.testing.assert_array_equal(x.compute(), a)


def test_file_entry_is_read_lazily_chunk_by_chunk(tmp_path: Path) -> None:
    a = np.arange(4096 * 4, dtype=np.float64).reshape(64, 256)
    path = tmp_path / "a.hurray"
    hb.save(path, {"a": a})
    f = hb.load(path)
    x = D.from_hurray(f["a"], chunks=(16, 256))
    # The graph holds the file's path and offset, not the bytes: small, and meaningful in
    # any process that sees the file.
    assert all(not isinstance(v, np.ndarray) for v in dict(x.dask).values())
    chunks = chunk_arrays(x)
    # Each chunk is a view of a map of the file (np.memmap's buffer), at its rows.
    for k, c in enumerate(chunks):
        assert isinstance(c.base, np.memmap) or isinstance(c.base.base, np.memmap)
        np.testing.assert_array_equal(c, a[16 * k:16 * (k + 1)])
    np.testing.assert_array_equal(x.compute(), a)


def test_safetensors_entry_is_read_from_its_file_too(tmp_path: Path) -> None:
    from hurray_bridge import safetensors_io

    a = np.arange(300, dtype=np.float16).reshape(30, 10)
    path = tmp_path / "m.safetensors"
    safetensors_io.save(path, {"w": a})
    x = D.from_hurray(hb.load(path)["w"], chunks=(7, 10))
    assert all(not isinstance(v, np.ndarray) for v in dict(x.dask).values())
    np.testing.assert_array_equal(x.compute(), a)


def test_file_entry_refused_once_the_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "a.hurray"
    hb.save(path, {"a": np.zeros(1000)})
    x = hb.convert(hb.load(path)["a"], "dask")
    hb.save(path, {"a": np.ones(1000)})  # a new inode under the same name
    with pytest.raises(hb.FormatError, match="changed after it was loaded"):
        x.compute()


def test_file_replaced_between_load_and_convert_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "a.hurray"
    hb.save(path, {"a": np.zeros(1000)})
    f = hb.load(path)
    hb.save(path, {"a": np.ones(1000)})  # before the conversion: the map still holds zeros
    x = hb.convert(f["a"], "dask")
    with pytest.raises(hb.FormatError, match="changed after it was loaded"):
        x.compute()


def test_asarray_computes_a_copy_and_copy_false_refuses() -> None:
    a = np.arange(100, dtype=np.int32).reshape(10, 10)
    x = da.from_array(a, chunks=3)
    t = hb.asarray(x)
    assert t.copied and t.shape == (10, 10)
    np.testing.assert_array_equal(hb.convert(t, "numpy"), a)
    with pytest.raises(hb.CopyRequiredError, match="gathers its chunks"):
        hb.asarray(x, copy=False)
    with pytest.warns(hb.CopyWarning, match="dask source could not be read in place"):
        hb.convert(x, "numpy")


def test_unknown_chunk_sizes_and_device_chunks_are_refused(tmp_path: Path) -> None:
    x = da.arange(10, chunks=5)
    y = x[x > 3]  # chunk sizes unknown until computed
    with pytest.raises(hb.UnsupportedError, match="compute_chunk_sizes"):
        hb.asarray(y)
    with pytest.raises(hb.UnsupportedError, match="compute_chunk_sizes"):
        hb.save(tmp_path / "y.hurray", {"y": y})
    assert not os.listdir(tmp_path)
    odd = da.Array(x.dask, x.name, x.chunks, meta=DeviceChunk((0,), x.dtype))
    with pytest.raises(hb.UnsupportedError, match="not NumPy arrays"):
        hb.save(tmp_path / "z.hurray", {"z": odd})


# ------------------------------------------------------------------ shards
def sharded(a: np.ndarray, parts: tuple[int, ...]) -> hb.ShardedTensor:
    return hb.split(a, hb.grid_boxes(a.shape, parts))


def test_sharded_grid_boxes_become_chunks_without_copies() -> None:
    a = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    st = sharded(a, (3, 2))
    x = hb.convert(st, "dask")
    assert x.chunks == ((4, 4, 4), (5, 5))
    for c in chunk_arrays(x):
        assert any(np.shares_memory(c, hb.convert(s, "numpy")) for s in st.shards)
    np.testing.assert_array_equal(x.compute(), a)


def test_grid_of_accepts_grids_only() -> None:
    grid = [Box((0, 0), (2, 3)), Box((0, 3), (2, 1)), Box((2, 0), (1, 3)), Box((2, 3), (1, 1))]
    assert grid_of(grid, (3, 4)) == ((2, 1), (3, 1))
    # Two rows cut at different columns: no common cut along axis 1.
    bricks = [Box((0, 0), (1, 3)), Box((0, 3), (1, 1)), Box((1, 0), (1, 1)), Box((1, 1), (1, 3))]
    assert grid_of(bricks, (2, 4)) is None


def test_sharded_without_a_grid_is_assembled_as_a_reported_copy() -> None:
    a = np.arange(8, dtype=np.int16).reshape(2, 4)
    boxes = [Box((0, 0), (1, 3)), Box((0, 3), (1, 1)), Box((1, 0), (1, 1)), Box((1, 1), (1, 3))]
    st = hb.split(a, boxes)
    assert from_hurray(st) is NotImplemented
    with pytest.raises(hb.CopyRequiredError, match="assembled into one array"):
        hb.convert(st, "dask", copy=False)
    with pytest.warns(hb.CopyWarning):
        x = hb.convert(st, "dask")
    np.testing.assert_array_equal(x.compute(), a)


# ------------------------------------------------------------------ saves
@pytest.mark.parametrize("chunks", [(4, 16), (3, 5), (16, 1), (1, 16)],
                         ids=["rows", "blocks", "columns", "single-rows"])
def test_save_is_byte_identical_to_a_save_of_the_computed_array(tmp_path: Path,
                                                                chunks: tuple[int, int]) -> None:
    a = np.arange(16 * 16, dtype=np.float32).reshape(16, 16) / 3
    x = da.from_array(a, chunks=chunks)
    meta = {"source": "dask"}
    hb.save(tmp_path / "d.hurray", {"small": np.arange(3, dtype=np.uint8), "x": x,
                                    "after": np.ones(5)}, meta)
    hb.save(tmp_path / "n.hurray", {"small": np.arange(3, dtype=np.uint8), "x": a,
                                    "after": np.ones(5)}, meta)
    assert (tmp_path / "d.hurray").read_bytes() == (tmp_path / "n.hurray").read_bytes()
    verify(tmp_path / "d.hurray")  # the per-entry CRC-32, combined from the chunks' runs
    assert sorted(os.listdir(tmp_path)) == ["d.hurray", "n.hurray"]  # no temporary left


@pytest.mark.parametrize("dtype", ["bool", "int8", "float64", "complex64", "bfloat16", "int4"])
def test_save_of_each_kind_of_element_type(tmp_path: Path, dtype: str) -> None:
    if dtype in ("bfloat16", "int4"):
        ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
        dt = np.dtype(getattr(ml, dtype))
    else:
        dt = np.dtype(dtype)
    a = (np.arange(7 * 9) % 5).astype(dt).reshape(7, 9)
    hb.save(tmp_path / "d.hurray", {"x": da.from_array(a, chunks=(3, 4))}, checksums=True)
    hb.save(tmp_path / "n.hurray", {"x": a}, checksums=True)
    assert (tmp_path / "d.hurray").read_bytes() == (tmp_path / "n.hurray").read_bytes()


def test_save_of_empty_and_rank_zero_arrays(tmp_path: Path) -> None:
    values = {"empty": np.zeros((0, 4), np.float32), "scalar": np.float64(2.5) * np.ones(())}
    hb.save(tmp_path / "d.hurray", {k: da.from_array(v) for k, v in values.items()})
    hb.save(tmp_path / "n.hurray", values)
    assert (tmp_path / "d.hurray").read_bytes() == (tmp_path / "n.hurray").read_bytes()


def test_chunk_that_computes_another_dtype_is_refused_and_nothing_replaced(
        tmp_path: Path) -> None:
    path = tmp_path / "x.hurray"
    hb.save(path, {"old": np.arange(3)})
    before = path.read_bytes()
    x = da.ones((4, 4), chunks=2, dtype=np.float32)
    liar = x.map_blocks(lambda b: b.astype(np.float64), dtype=np.float32)  # says float32
    with pytest.raises(hb.FormatError, match="planned from the Dask array's metadata"):
        hb.save(path, {"x": liar})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["x.hurray"]


def test_padded_high_bits_are_cleared_as_every_save_clears_them(tmp_path: Path) -> None:
    ml = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    # int4 held one per byte, from the bytes of -8..23: most have bits above the element's
    # set, which every save clears (the raw bytes are not in the file).
    a = np.arange(-8, 24, dtype=np.int8).view(ml.int4).reshape(4, 8)
    hb.save(tmp_path / "d.hurray", {"x": da.from_array(a, chunks=(3, 5))})
    hb.save(tmp_path / "n.hurray", {"x": a})
    data = (tmp_path / "d.hurray").read_bytes()
    assert data == (tmp_path / "n.hurray").read_bytes()
    assert a.view(np.uint8).tobytes() not in data
    verify(tmp_path / "d.hurray")


def test_a_bool8_byte_that_is_no_bool8_value_is_refused(tmp_path: Path) -> None:
    a = np.frombuffer(bytes([0, 1, 1, 0, 2, 1]), np.bool_).reshape(2, 3)
    with pytest.raises(hb.FormatError, match=r"'x \(the chunk at \[1, 0\]\)'.*0x02"):
        hb.save(tmp_path / "d.hurray", {"x": da.from_array(a, chunks=(1, 3))})
    assert os.listdir(tmp_path) == []


def test_dumps_computes_the_array() -> None:
    a = np.arange(10, dtype=np.int16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # dumps builds bytes here: no copy to report
        assert hb.dumps({"x": da.from_array(a, chunks=4)}) == hb.dumps({"x": a})


def test_several_dask_entries_are_written_in_one_computation(tmp_path: Path) -> None:
    a = np.arange(40, dtype=np.int64).reshape(8, 5)
    b = np.linspace(0, 1, 33, dtype=np.float32)
    x, y = da.from_array(a, chunks=(3, 2)), da.from_array(b, chunks=10)
    hb.save(tmp_path / "d.hurray", {"x": x, "mid": b[:3], "y": y}, checksums=False)
    hb.save(tmp_path / "n.hurray", {"x": a, "mid": b[:3], "y": b}, checksums=False)
    assert (tmp_path / "d.hurray").read_bytes() == (tmp_path / "n.hurray").read_bytes()


def test_shards_to_hurray_gives_one_box_per_chunk() -> None:
    from hurray_bridge.adapters.dask.shards import to_hurray

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = da.from_array(a, chunks=(2, (1, 5)))
    st = to_hurray(x)
    assert sorted((b.offsets, b.sizes) for b in st.boxes) == [
        ((0, 0), (2, 1)), ((0, 1), (2, 5)), ((2, 0), (2, 1)), ((2, 1), (2, 5))]
    with pytest.warns(hb.CopyWarning):
        assert np.array_equal(hb.convert(st, "numpy"), a)
    with pytest.raises(hb.CopyRequiredError):
        to_hurray(x, copy=False)  # computing is a copy


def test_the_old_shards_name_still_works_with_a_deprecation() -> None:
    from hurray_bridge.adapters.dask import shards

    with pytest.warns(DeprecationWarning, match="from_hurray"):
        assert shards.from_sharded is shards.from_hurray
