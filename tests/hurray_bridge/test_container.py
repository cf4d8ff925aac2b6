"""Hurray files: save/load/dumps/loads, zero-copy mmap, lifetime, atomic writes, golden files.

The format is docs/spec/container.md; the golden files are docs/impl/compliance.md §4.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import struct
import sys
import weakref
import zlib
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge._memory import buffer_address
from hurray_bridge.container import HEADER_SIZE, TensorFile
from hurray_bridge.files import checksums, engine, writing
from hurray_bridge.files import format as file_format
from hurray_bridge.files import plan as planning

np = pytest.importorskip("numpy")

from tests.frameworks import need  # noqa: E402
from tests.vectors.generate_files import HERE as VECTORS  # noqa: E402
from tests.vectors.generate_files import fields, pattern, tensor, vectors  # noqa: E402

LINUX = sys.platform.startswith("linux")


def raw(t: hb.Tensor) -> list[bytes]:
    """Every buffer of a tensor, as bytes (NaN-safe comparison)."""
    return [bytes(t.memoryview(b.role)) for b in t.buffers]


def native_bytes(a: Any) -> bytes:
    """The bytes a NumPy array's buffer span holds (what a file must reproduce)."""
    t = hb.asarray(a)
    return bytes(t.memoryview())


def mapped(path: pathlib.Path) -> bool:
    with open("/proc/self/maps") as f:
        return str(path) in f.read()


def open_fds(path: pathlib.Path) -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                n += 1
        except OSError:
            pass
    return n


# ------------------------------------------------------------------ dtypes x shapes
NUMPY_TYPES = [d for d in hb.dtypes.all_dtypes() if d.numpy is not None]
SHAPES = [(0,), (3, 0, 5), (), (7,), (2, 3, 4), (1,) * 63 + (2,)]


def sample(dtype: hb.DType, shape: tuple[int, ...]) -> Any:
    if (dtype.numpy or "").startswith("ml_dtypes:"):
        need("ml_dtypes")  # NumPy holds bfloat16, float8, int4... only through ml_dtypes
    nd = hb.get_adapter("numpy").native_dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    raw_bytes = pattern(n * nd.itemsize, dtype.tag)
    if dtype.name == "bool8":
        raw_bytes = bytes(b & 1 for b in raw_bytes)
    elif dtype.is_subbyte:  # padded ml_dtypes form: the high bits must be zero
        raw_bytes = bytes(b & ((1 << dtype.bits) - 1) for b in raw_bytes)
    return np.frombuffer(raw_bytes, nd).reshape(shape).copy()


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("dtype", NUMPY_TYPES, ids=str)
def test_round_trip_every_dtype_and_shape(tmp_path: pathlib.Path, dtype: hb.DType,
                                          shape: tuple[int, ...]) -> None:
    a = sample(dtype, shape)
    path = tmp_path / "t.hurray"
    hb.save(path, {"a": a})
    for out in (hb.load(path), hb.load(path, mmap=False), hb.loads(path.read_bytes())):
        t = out["a"]
        assert t.shape == shape and t.dtype == dtype
        assert t.descriptor == hb.asarray(a).descriptor
        assert raw(t) == [a.tobytes()]
        if not a.size:
            assert t.buffers[0].ptr == 0 and t.buffers[0].nbytes == 0


VIEWS = {
    "transposed": lambda a: a.T,
    "negative": lambda a: a[::-1],
    "step": lambda a: a[:, ::2],
    "both": lambda a: a[::-2, ::-3],
    "broadcast": lambda a: np.broadcast_to(a[:1], (4, 6)),
}


@pytest.mark.parametrize("view", VIEWS)
def test_strided_views_keep_their_strides_and_span(tmp_path: pathlib.Path, view: str) -> None:
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = VIEWS[view](base)
    path = tmp_path / "v.hurray"
    hb.save(path, {"v": a})
    t = hb.load(path)["v"]
    src = hb.asarray(a)
    assert t.descriptor == src.descriptor
    assert t.layout == hb.Layout.STRIDED
    assert raw(t) == [native_bytes(a)]  # the DATA buffer is the span, as in memory
    np.testing.assert_array_equal(np.asarray(t), a)


def test_non_dense_tensors_round_trip() -> None:
    """Sparse, quantized and packed sub-byte tensors: every buffer, bit for bit."""
    tensors = {}
    for name, (ts, _, _) in vectors().items():
        for k, t in ts.items():
            tensors[f"{name}/{k}"] = t
    out = hb.loads(hb.dumps(tensors))
    assert list(out) == list(tensors)
    for k, t in tensors.items():
        assert out[k].descriptor == t.descriptor, k
        assert raw(out[k]) == raw(t), k


# --------------------------------------------------------------------- zero copy
def test_load_maps_one_read_only_region(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.hurray"
    arrays = {f"w{i}": np.full((i + 1, 5), i, np.float32) for i in range(8)}
    arrays["empty"] = np.zeros((3, 0, 5), np.float32)
    hb.save(path, arrays)
    out = hb.load(path)
    assert isinstance(out, TensorFile) and out.alignment == 64
    owners = {id(t.owner) for k, t in out.items() if k != "empty"}
    assert len(owners) == 1  # one map for the whole file
    owner = out["w0"].owner
    size = path.stat().st_size
    for k, t in out.items():
        assert t.readonly and not t.copied
        b = t.buffers[0]
        if k == "empty":
            assert b.ptr == 0
            continue
        assert b.ptr % 64 == 0
        assert owner.address <= b.ptr and b.ptr + b.nbytes <= owner.address + size  # type: ignore[attr-defined]
    view = np.asarray(out["w3"])
    assert not view.flags.writeable
    assert view.ctypes.data == out["w3"].buffers[0].ptr  # NumPy sees the map itself
    np.testing.assert_array_equal(view, arrays["w3"])


def test_load_without_mmap_gives_aligned_writable_copies(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.hurray"
    hb.save(path, {"a": np.arange(10, dtype=np.int64), "e": np.zeros(0)})
    out = hb.load(path, mmap=False)
    t = out["a"]
    assert not t.readonly and t.buffers[0].ptr % 64 == 0
    arr = np.asarray(t)
    arr[0] = 42  # our own memory
    assert np.asarray(hb.load(path)["a"])[0] == 0
    assert out["e"].buffers[0].ptr == 0 and out["e"].owner == ()


@pytest.mark.skipif(not LINUX, reason="reads /proc/self/maps and /proc/self/fd")
def test_map_and_fd_released_when_last_tensor_dies(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "life.hurray"
    hb.save(path, {"a": np.arange(1000, dtype=np.float64), "b": np.ones(7, np.int8)})
    out = hb.load(path)
    owner_ref = weakref.ref(out["a"].owner)
    # open()'s handle is closed already; the one descriptor left is the map's own.
    assert mapped(path) and open_fds(path) == 1
    keep = np.asarray(out["b"])  # a NumPy view keeps the tensor, and so the map, alive
    del out
    gc.collect()
    assert owner_ref() is not None and mapped(path)
    assert keep.sum() == 7
    del keep
    gc.collect()
    assert owner_ref() is None
    assert not mapped(path) and open_fds(path) == 0


def test_tensor_outlives_the_dict_and_an_overwrite(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "o.hurray"
    hb.save(path, {"a": np.arange(4, dtype=np.int32)})
    t = hb.load(path)["a"]
    gc.collect()
    hb.save(path, {"a": np.full(4, 9, np.int32)})  # a new inode: the old map stays valid
    assert np.asarray(t).tolist() == [0, 1, 2, 3]
    assert np.asarray(hb.load(path)["a"]).tolist() == [9] * 4


def test_empty_file_maps_nothing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "e.hurray"
    hb.save(path, {"a": np.zeros((0, 3)), "b": np.zeros((2, 0, 1), np.int8)}, {"k": "v"})
    raw_file = path.read_bytes()
    assert len(raw_file) < 4096  # no padding to a page when there is no data
    out = hb.load(path)
    assert out.metadata == {"k": "v"}
    assert all(t.owner is None and t.buffers[0].ptr == 0 for t in out.values())


# --------------------------------------------------------------- dumps / loads
def test_dumps_equals_save(tmp_path: pathlib.Path) -> None:
    m = {"a": np.arange(5, dtype=np.float32), "b": np.eye(3)[::-1]}
    path = tmp_path / "d.hurray"
    hb.save(path, m, {"x": "y"})
    assert path.read_bytes() == hb.dumps(m, {"x": "y"})


def test_loads_is_zero_copy_and_reports_alignment() -> None:
    data = bytearray(hb.dumps({"a": np.arange(6, dtype=np.int16)}))
    out = hb.loads(data)
    t = out["a"]
    base, _, _, _view = buffer_address(data)
    assert t.buffers[0].ptr == base + 4096  # points into the bytearray itself
    assert out.alignment == min(64, (base + 4096) & -(base + 4096))
    assert t.buffers[0].ptr % out.alignment == 0
    ref = weakref.ref(t.owner)
    del out
    gc.collect()
    assert ref() is not None and np.asarray(t).tolist() == list(range(6))


def test_loads_of_bytes_is_a_private_aligned_copy() -> None:
    # A bytes object is immutable: torch, which ignores read-only, must never get it.
    data = hb.dumps({"a": np.arange(6, dtype=np.int16)})
    out = hb.loads(data)
    t = out["a"]
    base, n, _, _view = buffer_address(data)
    assert not base <= t.buffers[0].ptr < base + n
    assert not t.readonly and out.alignment == 64 and t.buffers[0].ptr % 64 == 0
    assert np.asarray(t).tolist() == list(range(6))
    with pytest.raises(hb.CopyRequiredError, match="read-only bytes"):
        hb.loads(data, copy=False)


def test_loads_over_bytearray_is_writable_and_pins_it() -> None:
    buf = bytearray(hb.dumps({"a": np.zeros(4, np.uint8)}))
    out = hb.loads(buf)
    assert not out["a"].readonly
    np.asarray(out["a"])[:] = 7
    assert buf[4096:4100] == b"\x07" * 4  # shared memory
    with pytest.raises(BufferError):
        buf.extend(b"x")  # cannot move while a tensor points into it
    del out
    gc.collect()
    buf.extend(b"x")


def test_loads_copy_gives_aligned_memory_and_accepts_memoryview_and_mmap(
        tmp_path: pathlib.Path) -> None:
    import mmap

    data = hb.dumps({"a": np.arange(3, dtype=np.float64)})
    padded = b"\x00" + data
    out = hb.loads(memoryview(padded)[1:], copy=True)  # a misaligned start
    assert out["a"].buffers[0].ptr % 64 == 0 and out.alignment == 64
    assert np.asarray(out["a"]).tolist() == [0, 1, 2]
    path = tmp_path / "m.hurray"
    path.write_bytes(data)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cow = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    t = hb.loads(mm)["a"]  # a read-only map is copied, never handed out
    assert not t.readonly and np.asarray(t).tolist() == [0, 1, 2]
    assert t.buffers[0].ptr != buffer_address(mm)[0] + 4096
    u = hb.loads(cow)["a"]  # a private map is shared: a write stays in this process
    assert not u.readonly and u.buffers[0].ptr == buffer_address(cow)[0] + 4096
    assert np.asarray(u).tolist() == [0, 1, 2]


def test_loads_rejects_non_buffers() -> None:
    with pytest.raises(hb.FormatError) as e:
        hb.loads("not bytes")
    assert e.value.field == "input"
    with pytest.raises(hb.FormatError):
        hb.loads(memoryview(b"x" * 256)[::2])


# ---------------------------------------------------------------- metadata & names
def test_metadata_round_trip() -> None:
    meta = {"format": "pt", "grüße": "✓ ok", "empty": "", "nul in value": "a\x00b",
            "long": "x" * 100_000}
    out = hb.loads(hb.dumps({"a": np.ones(1)}, meta))
    assert out.metadata == meta and list(out.metadata) == list(meta)


def test_load_metadata_and_read_index(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "i.hurray"
    hb.save(path, {"a": np.ones((2, 2), np.float16)}, {"k": "v"})
    assert container.load_metadata(path) == {"k": "v"}
    idx = container.read_index(path)
    assert idx.has_checksums and idx.alignment == 64 and idx.data_offset == 4096
    (e,) = idx.entries
    assert e.name == "a" and e.descriptor == hb.Descriptor([2, 2], hb.float16)
    assert e.nbytes == 8 and e.checksum == zlib.crc32(np.ones((2, 2), np.float16).tobytes())


@pytest.mark.parametrize("meta, kind", [
    ({"k": 1}, hb.UnsupportedError),
    ({1: "v"}, hb.UnsupportedError),
    ({"": "v"}, hb.FormatError),
    ({"a\x00": "v"}, hb.FormatError),
    ({"k" * 4097: "v"}, hb.FormatError),
    ({"k": "v" * (16 << 20)}, hb.FormatError),
    ({"k": "\ud800"}, hb.FormatError),
    (["k", "v"], hb.UnsupportedError),
])
def test_bad_metadata_is_refused(meta: Any, kind: type) -> None:
    with pytest.raises(kind):
        hb.dumps({"a": np.ones(1)}, meta)


def test_names_are_opaque() -> None:
    names = ["../../etc/passwd", "C:\\x", "a/b.c", "名前", " ", "x" * 4096]
    out = hb.loads(hb.dumps({n: np.ones(1) for n in names}))
    assert list(out) == names


@pytest.mark.parametrize("name, kind", [
    ("", hb.FormatError), ("a\x00b", hb.FormatError), ("x" * 4097, hb.FormatError),
    ("\udcff", hb.FormatError), (3, hb.UnsupportedError),
])
def test_bad_names_are_refused(name: Any, kind: type) -> None:
    with pytest.raises(kind):
        hb.dumps({name: np.ones(1)})


def test_values_must_be_host_tensors() -> None:
    with pytest.raises(hb.UnsupportedError, match="entry 'l'"):
        hb.dumps({"l": [1, 2, 3]})
    dev = hb.Tensor(hb.Descriptor([4], hb.float32), [hb.Buffer(hb.BufferRole.DATA, 4096, 16)],
                    device=(2, 0))
    with pytest.raises(hb.UnsupportedError, match=r"entry 'g' lives on cuda:0.*CPU"):
        hb.dumps({"g": dev})
    with pytest.raises(hb.UnsupportedError):
        hb.dumps([("a", np.ones(1))])  # type: ignore[arg-type]


def test_torch_values_when_the_adapter_exists() -> None:
    torch = pytest.importorskip("torch")
    try:
        hb.get_adapter("torch")
    except (hb.BackendNotAvailableError, hb.UnsupportedError):
        pytest.skip("the torch adapter is not in this tree yet")
    x = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    out = hb.loads(hb.dumps({"x": x, "t": x.t()}))
    assert raw(out["x"]) == [x.view(torch.int16).numpy().tobytes()]
    assert out["t"].layout == hb.Layout.STRIDED


# ----------------------------------------------------------------- options
def test_alignment_option(tmp_path: pathlib.Path) -> None:
    data = hb.dumps({"a": np.ones(3, np.int8), "b": np.ones(5, np.int8)}, alignment=4096)
    idx_entries = hb.loads(bytearray(data))  # shared: the offsets are the file's
    assert [t.buffers[0].ptr - idx_entries["a"].buffers[0].ptr
            for t in idx_entries.values()] == [0, 4096]
    for bad in (32, 100, 1 << 22, True):
        with pytest.raises(hb.FormatError):
            hb.dumps({"a": np.ones(1)}, alignment=bad)


def test_checksums_can_be_turned_off(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "n.hurray"
    hb.save(path, {"a": np.ones(3)}, checksums=False, fsync=False)
    idx = container.verify(path)
    assert not idx.has_checksums and idx.entries[0].checksum is None


def test_verify_detects_a_data_flip(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "v.hurray"
    hb.save(path, {"a": np.ones(3), "b": np.arange(100, dtype=np.uint8)})
    container.verify(path)
    data = bytearray(path.read_bytes())
    data[4096 + 64 + 10] ^= 0x01  # inside "b"
    path.write_bytes(data)
    hb.load(path)  # a default load does not read the data
    for call in (lambda: container.verify(path), lambda: hb.load(path, verify=True),
                 lambda: hb.load(path, mmap=False, verify=True),
                 lambda: hb.loads(bytes(data), verify=True)):
        with pytest.raises(hb.FormatError) as e:
            call()
        assert e.value.field == "entries[1].checksum" and "'b'" in str(e.value)


# ------------------------------------------------------------------ atomic writes
@pytest.mark.parametrize("size, fail_at", [(1000, 1), (600_000, 2)])
def test_save_is_atomic_when_the_write_fails(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch, size: int,
                                             fail_at: int) -> None:
    path = tmp_path / "a.hurray"
    hb.save(path, {"old": np.ones(3)})
    before = path.read_bytes()
    calls = []
    real_write, real_writev = os.write, os.writev

    def failing(real: Any) -> Any:
        def write(fd: int, data: Any) -> int:
            calls.append(real)
            if len(calls) == fail_at:
                raise OSError(28, "No space left on device")
            return int(real(fd, data))
        return write

    # A small file is written in one call (head and data), a larger one in several (its
    # data, then the head alone): the only call fails, or the second, whichever it is.
    monkeypatch.setattr(os, "write", failing(real_write))
    monkeypatch.setattr(os, "writev", failing(real_writev))
    with pytest.raises(OSError, match="No space"):
        hb.save(path, {"new": np.zeros(size), "more": np.zeros(10)})
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.hurray"]  # no temporary left


def test_save_refusal_leaves_nothing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.hurray"
    with pytest.raises(hb.UnsupportedError):
        hb.save(path, {"a": np.ones(1), "b": object()})
    assert list(tmp_path.iterdir()) == []


def test_save_fsyncs_file_and_directory(tmp_path: pathlib.Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    hb.save(tmp_path / "f.hurray", {"a": np.ones(1)})
    assert len(synced) == (2 if os.name == "posix" else 1)
    synced.clear()
    hb.save(tmp_path / "f.hurray", {"a": np.ones(1)}, fsync=False)
    assert synced == []


def test_save_uses_the_umask_not_0600(tmp_path: pathlib.Path) -> None:
    if os.name != "posix":
        pytest.skip("POSIX permissions")
    path = tmp_path / "p.hurray"
    hb.save(path, {"a": np.ones(1)})
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# ------------------------------------------------------------------ golden files
VECTOR_NAMES = sorted(p.stem for p in VECTORS.glob("*.hurray"))
REQUIRED = {"shape_0", "shape_3_0_5", "empty_csr_nnz_0", "rank_0", "rank_64", "every_dtype",
            "per_axis_quant", "sparse_coo"}


def test_required_file_vectors_exist() -> None:
    assert REQUIRED <= set(VECTOR_NAMES)
    assert set(VECTOR_NAMES) == set(vectors())


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_writer_reproduces_file_vector_byte_for_byte(tmp_path: pathlib.Path, name: str) -> None:
    tensors, metadata, options = vectors()[name]
    golden = (VECTORS / f"{name}.hurray").read_bytes()
    assert hb.dumps(tensors, metadata, **options) == golden
    hb.save(tmp_path / "x.hurray", tensors, metadata, **options)
    assert (tmp_path / "x.hurray").read_bytes() == golden


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_file_vector_fields(name: str) -> None:
    golden = (VECTORS / f"{name}.hurray").read_bytes()
    expected = json.loads((VECTORS / f"{name}.json").read_text())
    assert fields(golden) == expected
    # The same facts through the public API, for every way of reading.
    tensors, metadata, _ = vectors()[name]
    for out in (hb.load(VECTORS / f"{name}.hurray"),
                hb.load(VECTORS / f"{name}.hurray", mmap=False),
                hb.loads(golden), hb.loads(golden, copy=True)):
        assert out.metadata == expected["metadata"] == (metadata or {})
        assert list(out) == [e["name"] for e in expected["entries"]] == list(tensors)
        for e in expected["entries"]:
            t = out[e["name"]]
            d = t.descriptor
            assert d == tensors[e["name"]].descriptor
            assert d.dtype.name == e["dtype"] and d.dtype.tag == e["type_tag"]
            assert list(d.shape) == e["shape"] and d.layout.name == e["layout"]
            assert int(d.flags) == e["descriptor_flags"]
            assert hb.wire.encode(d, [b[1] for b in e["buffers"]]).hex() == e["descriptor"]
            assert [[b.role.name, b.nbytes] for b in t.buffers] == \
                [[b[0], b[2]] for b in e["buffers"]]
            assert [x.hex() for x in raw(t)] == [b[3] for b in e["buffers"]]
            assert raw(t) == raw(tensors[e["name"]])
            for b in t.buffers:
                if b.nbytes == 0:
                    assert b.ptr == 0
    container.verify(VECTORS / f"{name}.hurray")


def test_file_vector_values() -> None:
    """Spot checks of what the bytes mean, through NumPy."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    load = lambda n: hb.load(VECTORS / f"{n}.hurray")  # noqa: E731
    assert np.asarray(load("rank_0")["x"]).item() == -1.25
    assert np.asarray(load("rank_64")["x"]).reshape(-1).tolist() == [7, -8]
    assert np.asarray(load("strided_negative")["x"]).tolist() == [[3, 4, 5], [0, 1, 2]]
    coo = load("sparse_coo")["x"]
    assert np.frombuffer(coo.memoryview(hb.BufferRole.VALUES), np.float32).tolist() == \
        [1.5, -2.0, 3.25]
    assert np.frombuffer(coo.memoryview(hb.BufferRole.INDICES), np.int64).reshape(2, 3).tolist() \
        == [[0, 1, 3], [2, 0, 4]]
    q = load("per_axis_quant")["w"]
    assert np.frombuffer(q.memoryview(hb.BufferRole.SCALES), np.float32).tolist() == \
        [0.5, 0.25, 2.0]
    assert np.frombuffer(q.memoryview(hb.BufferRole.ZERO_POINTS), np.int8).tolist() == [0, -1, 3]
    every = load("every_dtype")
    assert len(every) == len(hb.dtypes.all_dtypes()) + 5
    # bool codes (i*5 + 1) & 1 = 1, 0, 1, 0, 1, 0: bits 0..5 of one byte, bits 6-7 zero
    assert bytes(every["bool"].memoryview()) == bytes([0b010101])
    # int4 codes (i*5 + 23) & 15 for i in 0..5 = 7, 12, 1, 6, 11, 0 -> packed LSB-first
    assert bytes(every["int4"].memoryview()) == bytes([0xC7, 0x61, 0x0B])
    assert np.asarray(every["int4.padded"]).tolist() == \
        np.array([(i * 3 + 23) & 15 for i in range(6)], np.uint8).view(ml_dtypes.int4)\
        .reshape(2, 3).tolist()
    csr = load("empty_csr_nnz_0")["x"]
    assert [b.nbytes for b in csr.buffers] == [0, 20, 0]


def test_worked_example_of_the_spec() -> None:
    data = hb.dumps({"x": np.array([1, 2, 3], np.float32)})
    assert len(data) == 4108
    assert data[:16].hex() == "48525946010001000100000000000000"
    assert struct.unpack_from("<QQQQQQQI", data, 16) == (128, 88, 216, 0, 4096, 12, 4108, 64)
    assert data[0x4C:0x50].hex() == "aa2af4c0" and data[0x7C:0x80].hex() == "446daa96"
    assert data[0x80:0x90].hex() == "0100000040000000b1960eb200000000"
    assert data[0x1000:].hex() == "0000803f0000004000004040"
    assert (VECTORS / "metadata.hurray").read_bytes()[0x1000:] == data[0x1000:]


def test_header_is_128_bytes_with_fields_where_the_spec_says() -> None:
    assert file_format.HEADER.size == HEADER_SIZE == 128
    data = hb.dumps({}, {"k": "v"})
    assert len(data) == 128 + 16  # no entries, one metadata item, no data, no padding
    assert data[:4] == b"HRYF"
    assert zlib.crc32(data[:124]) == struct.unpack_from("<I", data, 124)[0]
    assert zlib.crc32(data[128:]) == struct.unpack_from("<I", data, 76)[0]


# ------------------------------------------------------------------ more layouts & scale
def test_tiled_and_sharded_entries() -> None:
    tiled = hb.Descriptor([3, 5], hb.float32, hb.Layout.TILED, tile=(2, 4))  # padded to 4 x 8
    shard = hb.Descriptor([2, 3], hb.float16, shard=hb.Shard([4, 3], [2, 0], replica_id=1))
    tensors = {"tiled": tensor(tiled, pattern(tiled.nbytes, 1)),
               "shard": tensor(shard, pattern(12, 2))}
    out = hb.loads(hb.dumps(tensors))
    for k, t in tensors.items():
        assert out[k].descriptor == t.descriptor and raw(out[k]) == raw(t)
    assert out["tiled"].buffers[0].nbytes == 128


@pytest.mark.parametrize("threads", ["crc thread", "read thread", "one thread"])
@pytest.mark.parametrize("crc", ["zlib", "as built"])
def test_large_file_checksums_are_those_of_zlib(tmp_path: pathlib.Path, threads: str, crc: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Above 16 MiB a helper thread computes the CRC while the data is written (its own, or
    the reading one), by zlib's or the compiled CRC-32, or the caller's thread does it all:
    the checksums are zlib.crc32's and the file is dumps' every way."""
    assert engine._THREADED_CRC_BYTES is not None
    assert engine._THREADED_CRC_BYTES <= 24 << 20
    if threads == "one thread":
        monkeypatch.setattr(engine, "_THREADED_CRC_BYTES", None)
    monkeypatch.setattr(engine, "_CRC_THREAD", threads == "crc thread")
    if crc == "zlib":
        monkeypatch.setattr(engine, "crc32", zlib.crc32)
    big = np.frombuffer(pattern(1 << 20, 3) * 24, np.uint8)
    small = np.arange(100, dtype=np.int32)
    path = tmp_path / "big.hurray"
    hb.save(path, {"big": big, "small": small})
    idx = container.verify(path)
    assert [e.checksum for e in idx.entries] == [zlib.crc32(big), zlib.crc32(small)]
    assert path.read_bytes() == hb.dumps({"big": big, "small": small})


def test_the_data_crc32_is_the_compiled_one_only_where_it_folds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without _speedups, or where the CPU cannot multiply without carries (the compiled
    table is slower than zlib's), the checksums are zlib.crc32's; and only zlib's, slow
    enough to be worth it, gets a thread of its own."""
    import types

    monkeypatch.setitem(sys.modules, "hurray_bridge._speedups", None)  # import fails
    monkeypatch.delattr(hb, "_speedups", raising=False)
    assert checksums._fast_crc32() is zlib.crc32
    table_only = types.ModuleType("hurray_bridge._speedups")
    table_only.CRC32_CLMUL = False  # type: ignore[attr-defined]
    table_only.crc32 = lambda data, value=0: 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hurray_bridge._speedups", table_only)
    monkeypatch.setattr(hb, "_speedups", table_only, raising=False)
    assert checksums._fast_crc32() is zlib.crc32
    table_only.CRC32_CLMUL = True  # type: ignore[attr-defined]
    assert checksums._fast_crc32() is table_only.crc32  # type: ignore[attr-defined]
    monkeypatch.undo()
    assert engine._CRC_THREAD == (engine.crc32 is zlib.crc32)


def test_progress_reports_bytes_written(tmp_path: pathlib.Path) -> None:
    calls: list[tuple[int, int]] = []
    plan = planning.plan_tensors({"a": np.ones(3 << 20, np.uint8), "b": np.ones(10)}, None, 64,
                                   True)
    writing.write_plan(tmp_path / "p.hurray", plan, fsync=False,
                          progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (plan.data_length, plan.data_length)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


@pytest.mark.skipif(not LINUX, reason="reads RssFile from /proc/self/status")
def test_resident_memory_grows_only_as_data_is_touched(tmp_path: pathlib.Path) -> None:
    def rss_file() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no RssFile")

    path = tmp_path / "r.hurray"
    n = 64 << 20
    hb.save(path, {f"t{i}": np.full(n // 8, i, np.uint8) for i in range(8)}, fsync=False)
    before = rss_file()
    out = hb.load(path)
    firsts = [t.memoryview()[0] for t in out.values()]
    touched = rss_file() - before
    assert firsts == list(range(8))
    assert touched < n // 8  # eight first elements: a few pages each, not the tensors
    total = sum(int(np.asarray(t).sum(dtype=np.uint64)) for t in out.values())
    assert total == sum(i * (n // 8) for i in range(8))
    assert rss_file() - before > n // 2  # reading every byte maps the file in


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL")
def test_a_killed_save_leaves_the_old_file(tmp_path: pathlib.Path) -> None:
    import signal
    import subprocess

    path = tmp_path / "k.hurray"
    hb.save(path, {"old": np.arange(10)})
    before = path.read_bytes()
    from tests.hurray_bridge.test_container_files import (
        SLOW_SAVE,  # the same slow child the temp-file tests use
    )

    with subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(path)],
                          stdout=subprocess.PIPE, text=True) as proc:  # closes the pipe
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert path.read_bytes() == before  # never half-written under the target name
    assert np.asarray(hb.load(path)["old"]).tolist() == list(range(10))
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "k.hurray"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".k.hurray.")  # the dead temporary


def test_save_into_a_missing_directory_names_the_target(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "nope" / "x.hurray"
    with pytest.raises(FileNotFoundError) as e:
        hb.save(target, {"a": np.ones(1)})
    assert e.value.filename == str(target)


def assert_data_region_rule(raw: bytes) -> None:
    """container.md §2.1 and metadata.md §8, one rule: a data region that holds bytes starts
    at the index end rounded up to max(4096, alignment), a multiple of 64; one of no bytes
    starts at the index end, which need not be a multiple of 64 (no buffer lives there)."""
    t_len, m_off, m_len, d_off, d_len = (struct.unpack_from("<Q", raw, at)[0]
                                         for at in (24, 32, 40, 48, 56))
    align = struct.unpack_from("<I", raw, 72)[0]
    index_end = m_off + m_len
    assert index_end == HEADER_SIZE + t_len + m_len and index_end % 8 == 0
    if d_len:
        page = max(4096, align)
        assert d_off == -(-index_end // page) * page and d_off % 64 == 0
    else:
        assert d_off == index_end == len(raw)


def test_every_file_written_starts_its_data_region_where_the_spec_says() -> None:
    np = pytest.importorskip("numpy")
    cases: list[tuple[dict[str, Any], int]] = [
        ({}, 64), ({"e": np.zeros((0, 3), np.float32)}, 64),
        ({"e": np.zeros(0, np.int8), "long name " * 5: np.zeros((2, 0))}, 64),
        ({"x": np.arange(3, dtype=np.float32)}, 64), ({"x": np.arange(3.0)}, 8192),
        ({"x": np.zeros(0), "y": np.ones(1000)}, 64),
    ]
    unaligned = 0
    for mapping, alignment in cases:
        raw = hb.dumps(mapping, alignment=alignment)
        assert_data_region_rule(raw)
        unaligned += struct.unpack_from("<Q", raw, 48)[0] % 64 != 0
    for path in sorted(VECTORS.glob("*.hurray")):
        assert_data_region_rule(path.read_bytes())
    assert unaligned  # files without data bytes do have offsets that are no multiple of 64


# ------------------------------------------------------- the older module paths
def test_container_and_safetensors_io_reexport_the_files_modules_names() -> None:
    """The split into files/ keeps every name users import from the older modules: the same
    objects, not copies (a TensorFile from hb.load is container.TensorFile)."""
    from hurray_bridge import safetensors_io
    from hurray_bridge.files import convert, disk, mapping, reading, safetensors, tensor_file
    from hurray_bridge.files import format as fmt

    homes = {"load": reading, "loads": reading, "verify": reading, "save": writing,
             "dumps": writing, "rewrite": convert, "read_index": fmt, "TensorFile": tensor_file,
             "check_suffix": disk, "atomic_output": disk, "stale_temporaries": disk,
             "SUFFIX_FORMATS": disk}  # and the format's constants and index types
    for name in container.__all__:
        assert getattr(container, name) is getattr(homes.get(name, fmt), name), name
    for name in ("load_metadata", "MAX_BUFFER_ALIGNMENT", "MAX_NAME_BYTES", "MAX_KEY_BYTES",
                 "MAX_METADATA_BYTES", "FLAG_DATA_CHECKSUMS"):
        assert getattr(container, name) is getattr(fmt, name)
    for name in ("file_stamp", "mapped_file_origin"):
        assert getattr(container, name) is getattr(mapping, name)
    assert container.write_box is writing.write_box
    for name in safetensors_io.__all__:
        assert getattr(safetensors_io, name) is getattr(safetensors, name), name
    assert hb.load is reading.load and hb.save is writing.save
    assert type(hb.loads(hb.dumps({"a": np.ones(2)}))) is container.TensorFile


def test_hb_container_resolves_before_any_load() -> None:
    """``hb.container.read_index(...)`` worked once hb.load had imported container; hb.load
    imports files/ now, so the package resolves the older modules by name, on first use."""
    code = ("import hurray_bridge as hb, sys\n"
            "assert 'hurray_bridge.container' not in sys.modules\n"
            "print(hb.container.read_index.__module__, hb.safetensors_io.save.__module__,\n"
            "      hb.checkpoint_dir.is_checkpoint_path.__module__)\n")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["hurray_bridge.files.format", "hurray_bridge.files.safetensors",
                                  "hurray_bridge.checkpoint_dir"]
