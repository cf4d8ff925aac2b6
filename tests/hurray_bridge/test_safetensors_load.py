"""``hb.load`` opens safetensors files directly (container.md §8): the same TensorFile,
read-only zero-copy tensors over one memory map, the file's metadata; files close."""

from __future__ import annotations

import gc
import pathlib

import pytest

import hurray_bridge as hb

np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")


@pytest.fixture
def st_file(tmp_path: pathlib.Path) -> pathlib.Path:
    from safetensors.numpy import save_file

    path = tmp_path / "model.safetensors"
    save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4),
               "b": np.arange(5, dtype=np.int8),
               "e": np.zeros((0, 3), np.float64),
               "s": np.array(7, np.int64)}, path, metadata={"format": "np", "k": "v"})
    return path


def test_load_opens_safetensors_zero_copy_over_a_map(st_file: pathlib.Path) -> None:
    from safetensors.numpy import load_file

    want = load_file(st_file)
    f = hb.load(st_file)
    assert isinstance(f, hb.container.TensorFile)
    assert sorted(f) == sorted(want) and f.metadata == {"format": "np", "k": "v"}
    for name, a in want.items():
        t = f[name]
        assert t.readonly and t.shape == a.shape
        np.testing.assert_array_equal(np.asarray(t), a)
    view = np.asarray(f["w"])
    assert not view.flags.writeable
    # one map: the distance between two tensors' data is their distance in the file
    from hurray_bridge.safetensors_io import read_header

    idx = read_header(st_file)
    begin = {e.name: e.begin for e in idx.entries}
    assert f["w"].data_ptr - f["b"].data_ptr == begin["w"] - begin["b"]
    assert f["e"].data_ptr == 0  # empty: points nowhere
    assert f.alignment >= 1 and all(
        t.data_ptr % f.alignment == 0 for t in f.values() if t.nbytes)


def test_load_safetensors_whatever_the_suffix_and_with_bfloat16(tmp_path: pathlib.Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    x = torch.arange(6, dtype=torch.float32).to(torch.bfloat16)
    path = tmp_path / "weights.bin"
    save_file({"x": x}, path)
    f = hb.load(path)
    assert f["x"].dtype == hb.bfloat16
    assert torch.equal(hb.convert(f["x"], "torch"), x)


def test_load_safetensors_without_mmap_copies(st_file: pathlib.Path) -> None:
    f = hb.load(st_file, mmap=False)
    t = f["w"]
    assert not t.readonly and t.data_ptr % 64 == 0
    np.testing.assert_array_equal(np.asarray(t), np.arange(12, dtype=np.float32).reshape(3, 4))
    assert hb.load(st_file, verify=True).metadata["k"] == "v"


def test_a_truncated_safetensors_file_is_called_truncated(st_file: pathlib.Path) -> None:
    raw = st_file.read_bytes()
    st_file.write_bytes(raw[:-8])
    with pytest.raises(hb.FormatError, match="truncated"):
        hb.load(st_file)


@pytest.mark.parametrize("kind", ["safetensors", "hurray"])
def test_loaded_files_close_and_work_as_context_managers(tmp_path: pathlib.Path,
                                                         st_file: pathlib.Path,
                                                         kind: str) -> None:
    path = st_file
    if kind == "hurray":
        path = tmp_path / "m.hurray"
        hb.save(path, {"w": np.arange(12, dtype=np.float32).reshape(3, 4)})
    with hb.load(path) as f:
        kept = f["w"]
        assert len(f) >= 1
    assert len(f) == 0  # closed: the file object holds nothing any more
    # a tensor taken out before the close keeps its memory: still readable
    gc.collect()
    np.testing.assert_array_equal(np.asarray(kept), np.arange(12, dtype=np.float32).reshape(3, 4))
    f.close()  # twice is fine
    g = hb.load(path)
    g.close()
    assert len(g) == 0


@pytest.mark.parametrize("kind", ["safetensors", "hurray", "loads"])
def test_a_closed_file_says_it_was_closed(tmp_path: pathlib.Path, st_file: pathlib.Path,
                                          kind: str) -> None:
    # A lookup after close() was a bare KeyError('w') and print(f) showed {}.
    path = st_file
    if kind != "safetensors":
        path = tmp_path / "m.hurray"
        hb.save(path, {"w": np.ones(3, np.float32), "b": np.zeros(2, np.int8)})
    f = hb.loads(path.read_bytes()) if kind == "loads" else hb.load(path)
    n = len(f)
    assert "closed" not in repr(f)
    f.close()
    with pytest.raises(hb.ClosedFileError) as info:
        f["w"]
    assert isinstance(info.value, hb.HurrayError) and isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "'w'" in msg and "closed" in msg and "hb.load" in msg, msg
    assert repr(f) == str(f) == f"<hb.TensorFile, closed (it held {n} tensor{'s' * (n != 1)})>"
    f.close()  # twice is fine, and says the same
    assert repr(f).startswith("<hb.TensorFile, closed")
    with hb.load(path) as g:
        with pytest.raises(KeyError) as missing:  # an open file: a missing name stays a KeyError
            g["nope"]
        assert not isinstance(missing.value, hb.ClosedFileError)
