"""Sub-byte types: packed (LSB first, row-major) and padded forms, and the conversions.

hb.pack_subbyte / hb.unpack_subbyte against a bit-by-bit reference for int4,
uint4, int2, uint2, float4_e2m1fn and 1-bit bool over empty, scalar, odd and
multi-dimensional shapes; round trips with ml_dtypes arrays, torch's
float4_e2m1fn_x2, JAX int4 (through hb.convert) and Arrow booleans; empty
sub-byte tensors occupy 0 bytes.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import hurray_bridge as hb

np = pytest.importorskip("numpy", reason="numpy is not installed")

ml_dtypes = pytest.importorskip("ml_dtypes")

SUBBYTE = [hb.int4, hb.uint4, hb.int2, hb.uint2, hb.float4_e2m1fn, hb.bool]
SHAPES = [(0,), (3, 0, 5), (), (1,), (7,), (3, 5), (2, 3, 4), (17,), (4, 9)]


def np_dtype(d: hb.DType) -> Any:
    return np.bool_ if d is hb.bool else getattr(ml_dtypes, d.name)


def random_codes(d: hb.DType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << d.bits, size=shape).astype(np.uint8)


def reference_pack(codes: np.ndarray, bits: int) -> bytes:
    """LSB-first packing, one bit at a time (ADR-011): the slow, obvious reference."""
    flat = codes.reshape(-1)
    out = bytearray(-(-flat.size * bits // 8))
    for i, c in enumerate(flat.tolist()):
        for b in range(bits):
            if (c >> b) & 1:
                pos = i * bits + b
                out[pos // 8] |= 1 << (pos % 8)
    return bytes(out)


def padded_tensor(d: hb.DType, codes: np.ndarray) -> hb.Tensor:
    """A padded hb.Tensor over ``codes`` (one element per byte)."""
    if d is hb.bool:
        return hb.asarray(codes.astype(np.bool_))  # bool8: the padded form of 1-bit bool
    return hb.asarray(codes.view(np_dtype(d)))


def raw(t: hb.Tensor) -> bytes:
    return bytes(t.memoryview())


# ==================================================================== pack / unpack
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("d", SUBBYTE, ids=str)
def test_pack_matches_the_reference(d: hb.DType, shape: tuple[int, ...]) -> None:
    codes = random_codes(d, shape)
    src = padded_tensor(d, codes)
    assert src.descriptor.padded or d is hb.bool
    p = hb.pack_subbyte(src)
    assert p.dtype is d and not p.descriptor.padded and p.shape == shape and p.copied
    n = int(np.prod(shape, dtype=np.int64))
    assert p.nbytes == -(-n * d.bits // 8) == p.descriptor.nbytes
    assert raw(p) == reference_pack(codes, d.bits)  # trailing bits are zero
    if n == 0:
        assert p.buffers[0] == hb.Buffer(hb.BufferRole.DATA, 0, 0)  # 0 bytes, NULL
    else:
        assert p.buffers[0].ptr % 64 == 0
    u = hb.unpack_subbyte(p)
    assert u.shape == shape and u.copied
    if d is hb.bool:
        assert u.dtype is hb.bool8 and not u.descriptor.padded
        assert np.asarray(u).view(np.uint8).tobytes() == codes.tobytes()
    else:
        assert u.dtype is d and u.descriptor.padded
        assert raw(u) == codes.tobytes()
        assert np.array_equal(np.asarray(hb.convert(u, "numpy")).view(np.uint8), codes)
    assert u.nbytes == n


@pytest.mark.parametrize("d", SUBBYTE, ids=str)
def test_large_tensors_are_vectorised(d: hb.DType) -> None:
    codes = random_codes(d, (1 << 20) + 3, seed=1)
    p = hb.pack_subbyte(padded_tensor(d, codes))
    head = codes[: 64 * 8 // d.bits]
    assert raw(p)[:64] == reference_pack(head, d.bits)
    back = hb.unpack_subbyte(p)
    assert np.asarray(hb.convert(back, "numpy")).view(np.uint8).tobytes() == codes.tobytes()


def test_high_bits_of_padded_elements_are_ignored() -> None:
    # ADR-011: in the padded form only the low bits count.
    junk = np.array([0xF3, 0x1C, 0xA5], np.uint8)
    t = hb.asarray(junk.view(ml_dtypes.uint4))
    assert raw(hb.pack_subbyte(t)) == bytes([0x3 | (0xC << 4), 0x5])
    t2 = hb.asarray(junk.view(ml_dtypes.int2))
    assert raw(hb.pack_subbyte(t2)) == bytes([0x3 | (0x0 << 2) | (0x1 << 4)])


def test_strided_padded_input() -> None:
    a = np.arange(-8, 8, dtype=np.int8).reshape(4, 4).astype(ml_dtypes.int4)
    v = a[:, ::-2]
    t = hb.asarray(v)
    assert t.strides is not None
    p = hb.pack_subbyte(t)
    assert raw(p) == reference_pack(np.ascontiguousarray(v).view(np.uint8) & 0xF, 4)


def test_already_in_the_asked_form_is_returned_as_is() -> None:
    a = np.zeros(5, ml_dtypes.int4)
    t = hb.asarray(a)
    assert hb.unpack_subbyte(t) is t
    p = hb.pack_subbyte(t)
    assert hb.pack_subbyte(p) is p
    b8 = hb.asarray(np.zeros(3, np.bool_))
    assert hb.unpack_subbyte(b8) is b8


def test_pack_refuses_other_types() -> None:
    with pytest.raises(hb.UnsupportedError, match="float32"):
        hb.pack_subbyte(np.zeros(3, np.float32))
    with pytest.raises(hb.UnsupportedError, match="int8"):
        hb.unpack_subbyte(np.zeros(3, np.int8))


def test_bool8_with_other_true_bytes_packs_as_true() -> None:
    b = hb.asarray(np.array([0, 2, 255, 1], np.uint8).view(np.bool_))
    assert raw(hb.pack_subbyte(b)) == bytes([0b1110])


# ===================================================================== ml_dtypes
@pytest.mark.parametrize("d", [hb.int4, hb.uint4, hb.int2, hb.uint2, hb.float4_e2m1fn], ids=str)
def test_ml_dtypes_round_trip(d: hb.DType) -> None:
    rng = np.random.default_rng(3)
    info = ml_dtypes.finfo if d.kind == hb.dtypes.Kind.FLOAT else ml_dtypes.iinfo
    lo, hi = float(info(np_dtype(d)).min), float(info(np_dtype(d)).max)
    a = rng.uniform(lo, hi, size=(5, 7)).astype(np_dtype(d))
    t = hb.asarray(a)
    assert t.descriptor.padded and t.data_ptr == a.ctypes.data  # zero-copy
    p = hb.pack_subbyte(t)
    with pytest.warns(hb.CopyWarning, match="unpacked"):
        b = hb.convert(p, "numpy")  # the NumPy adapter unpacks packed data itself
    assert b.dtype == a.dtype and b.tobytes() == a.tobytes()
    c = hb.convert(hb.unpack_subbyte(p), "numpy", copy=False)
    assert c.tobytes() == a.tobytes()
    assert np.array_equal(a.astype(np.float32), c.astype(np.float32))  # the values too


def test_empty_subbyte_tensors_occupy_zero_bytes() -> None:
    for d in SUBBYTE:
        t = padded_tensor(d, np.zeros((3, 0, 5), np.uint8))
        for form in (hb.pack_subbyte(t), hb.unpack_subbyte(hb.pack_subbyte(t))):
            assert form.nbytes == 0 and form.buffers[0].ptr == 0
            assert form.shape == (3, 0, 5)
        assert hb.Descriptor((0,), d).nbytes == 0


# ========================================================================= torch
def test_torch_float4_x2_round_trip() -> None:
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2")
    raw_bytes = torch.tensor([[0x21, 0xF7], [0x0A, 0x90]], dtype=torch.uint8)
    x = raw_bytes.view(torch.float4_e2m1fn_x2)
    t = hb.asarray(x)
    assert t.dtype is hb.float4_e2m1fn and t.shape == (2, 4) and not t.descriptor.padded
    assert t.data_ptr == x.data_ptr()
    u = hb.unpack_subbyte(t)
    vals = np.asarray(hb.convert(u, "numpy"))
    # Low nibble first: byte 0x21 holds element 0 = 0x1 (0.5) and element 1 = 0x2 (1.0).
    expected = np.array([[0x1, 0x2, 0x7, 0xF], [0xA, 0x0, 0x0, 0x9]], np.uint8)
    assert vals.view(np.uint8).tolist() == expected.tolist()
    assert vals.astype(np.float32).tolist() == [[0.5, 1.0, 6.0, -6.0], [-1.0, 0.0, 0.0, -0.5]]
    # ... and back: ml_dtypes float4 (padded) -> pack -> torch x2, byte for byte.
    back = hb.convert(hb.pack_subbyte(hb.asarray(vals)), "torch")
    assert back.dtype == torch.float4_e2m1fn_x2
    assert back.view(torch.uint8).tolist() == raw_bytes.tolist()


def test_torch_refuses_padded_float4_and_int4() -> None:
    pytest.importorskip("torch")
    with pytest.raises(hb.UnsupportedError, match="padded"):
        hb.convert(np.zeros(4, ml_dtypes.float4_e2m1fn), "torch")
    with pytest.raises(hb.UnsupportedError, match="int4"):
        hb.convert(hb.pack_subbyte(np.zeros(4, ml_dtypes.int4)), "torch")


# =========================================================================== JAX
@pytest.mark.parametrize("d", [hb.int4, hb.uint4, hb.int2, hb.uint2, hb.float4_e2m1fn], ids=str)
def test_jax_subbyte_round_trip(d: hb.DType) -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if getattr(jnp, d.name, None) is None:
        pytest.skip(f"this JAX has no {d.name}")
    codes = random_codes(d, (6, 5), seed=4)
    a = codes.view(np_dtype(d))
    x = jax.device_put(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)  # the reported copies are JAX's own
        t = hb.asarray(x)
        from_jax = hb.convert(x, "numpy")
        packed = hb.pack_subbyte(t) if t.descriptor.padded else t
        to_jax = hb.convert(packed, "jax")
        padded_to_jax = hb.convert(hb.unpack_subbyte(packed), "jax")
    assert from_jax.tobytes() == a.tobytes()
    assert raw(packed) == reference_pack(codes, d.bits)
    assert str(to_jax.dtype) == d.name and np.asarray(to_jax).tobytes() == a.tobytes()
    assert np.asarray(padded_to_jax).tobytes() == a.tobytes()


# ========================================================================= Arrow
@pytest.mark.parametrize("offset", [0, 3, 8])
def test_arrow_booleans_round_trip(offset: int) -> None:
    pa = pytest.importorskip("pyarrow")
    rng = np.random.default_rng(offset)
    values = rng.integers(0, 2, 29).astype(bool)
    arr = pa.array(values)[offset:]
    t = hb.asarray(arr)
    assert t.dtype is hb.bool and t.shape == (29 - offset,)
    u = hb.unpack_subbyte(t)
    assert u.dtype is hb.bool8
    assert np.asarray(u).tolist() == arr.to_pylist()
    # NumPy bool -> 1-bit packed -> Arrow BooleanArray, zero-copy into Arrow.
    p = hb.pack_subbyte(values[offset:])
    back = hb.convert(p, "arrow", copy=False)
    assert back.type == pa.bool_() and back.to_pylist() == arr.to_pylist()
    assert back.buffers()[1].address == p.data_ptr


def test_empty_arrow_boolean() -> None:
    pa = pytest.importorskip("pyarrow")
    t = hb.asarray(pa.array([], pa.bool_()))
    u = hb.unpack_subbyte(t)
    assert u.nbytes == 0 and u.buffers[0].ptr == 0 and u.dtype is hb.bool8
    p = hb.pack_subbyte(np.zeros(0, np.bool_))
    assert len(hb.convert(p, "arrow")) == 0


# ====================================================================== refusals
def test_device_and_sparse_inputs_are_refused() -> None:
    from hurray_bridge import sparse as hs

    s = hs.make_sparse("coo", (4,), np.zeros(1, ml_dtypes.int4), np.array([[1]]))
    with pytest.raises(hb.UnsupportedError, match="dense"):
        hb.pack_subbyte(s)
    fake = hb.Tensor(hb.Descriptor((4,), hb.int4, padded=True),
                     [hb.Buffer(hb.BufferRole.DATA, 0x1000, 4)], device=hb.Device(2, 0))
    with pytest.raises(hb.UnsupportedError, match="host memory"):
        hb.pack_subbyte(fake)


# ====================================================== trailing bits on every write path
def _dirty(d: hb.Descriptor, data: bytes, *more: bytes) -> hb.Tensor:
    """An hb.Tensor over ``data`` (and further buffers) exactly as given: dirty bits kept."""
    arrays = [np.frombuffer(bytearray(b), np.uint8) for b in (data, *more)]
    bufs = [hb.Buffer(spec.role, a.ctypes.data if a.size else 0, a.size)
            for spec, a in zip(d.buffer_layout(), arrays, strict=True)]
    assert all(b.nbytes == spec.nbytes for b, spec in zip(bufs, d.buffer_layout(), strict=True))
    return hb.Tensor(d, bufs, owner=tuple(arrays))


def _written(t: hb.Tensor, path: str, tmp: Any) -> list[bytes]:
    """Every buffer of ``t`` as it comes back from one write path."""
    import io
    import pickle

    from hurray_bridge import shm

    def bufs(x: hb.Tensor) -> list[bytes]:
        return [bytes(x.memoryview(b.role)) for b in x.buffers]

    if path == "dumps":
        return bufs(hb.loads(hb.dumps({"x": t}))["x"])
    if path == "save":
        p = tmp / "x.hurray"
        hb.save(p, {"x": t})
        with hb.load(p) as f:
            return bufs(f["x"])
    if path.startswith("pickle"):
        proto = int(path[-1])
        if proto == 5:  # out of band, as multiprocessing and Ray send it
            oob: list[Any] = []
            head = pickle.dumps(t, protocol=5, buffer_callback=oob.append)
            return bufs(pickle.loads(head, buffers=[b.raw() for b in oob]))
        return bufs(pickle.loads(pickle.dumps(t, protocol=proto)))
    if path == "stream":
        f = io.BytesIO()
        with hb.StreamWriter(f, t.descriptor) as w:
            w.write(t)
        f.seek(0)
        (back,) = list(hb.StreamReader(f))
        return bufs(back)
    if path == "shm":
        h = shm.share(t)
        try:
            return bufs(shm.attach(h))
        finally:
            h.unlink()
    raise AssertionError(path)


WRITE_PATHS = ["dumps", "save", "pickle4", "pickle5", "stream", "shm"]
# (descriptor, the source's buffers with set trailing bits, what must be written)
DIRTY = {
    "bool-3": (hb.Descriptor([3], hb.bool), [b"\xff"], [b"\x07"]),
    "int4-3": (hb.Descriptor([3], hb.int4), [b"\x21\xf3"], [b"\x21\x03"]),
    "uint2-2x3": (hb.Descriptor([2, 3], hb.uint2), [b"\xe4\xfd"], [b"\xe4\x0d"]),
    "float4-1": (hb.Descriptor([1], hb.float4_e2m1fn), [b"\x95"], [b"\x05"]),
    "int4-quantized": (
        hb.Descriptor([5], hb.int4, quantization=hb.Quantization(hb.QuantScheme.PER_TENSOR)),
        [b"\x10\x32\xa4", b"\x00\x00\x80\x3f"], [b"\x10\x32\x04", b"\x00\x00\x80\x3f"]),
    "int4-coo-values": (
        hb.Descriptor([8], hb.int4, hb.Layout.COO, sparse=hb.Sparse(1, hb.int8)),
        [b"\xf7", b"\x05"], [b"\x07", b"\x05"]),
    "bool-tiled": (hb.Descriptor([2, 3], hb.bool, hb.Layout.TILED, tile=[3]),
                   [b"\xff"], [b"\x3f"]),
}


@pytest.mark.parametrize("path", WRITE_PATHS)
@pytest.mark.parametrize("case", DIRTY)
def test_trailing_bits_are_written_as_zero(case: str, path: str, tmp_path: Any) -> None:
    d, source, expected = DIRTY[case]
    t = _dirty(d, *source)
    assert _written(t, path, tmp_path) == expected
    # The source itself is never touched: it may be read-only, or somebody else's.
    assert [bytes(t.memoryview(b.role)) for b in t.buffers] == source


# bool8 bytes other than 0 and 1 (element-types.md §2: a writer must not write them)
BAD_BOOL8 = {
    "row-major": (hb.Descriptor([4], hb.bool8), [b"\x00\x01\x02\xff"], 2),
    "coo-values": (hb.Descriptor([8], hb.bool8, hb.Layout.COO, sparse=hb.Sparse(2, hb.int8)),
                   [b"\x01\x80", b"\x01\x05"], 1),
    # elements at bytes 4, 2, 0 (a negative stride): byte 2 is element 1
    "strided": (hb.Descriptor([3], hb.bool8, hb.Layout.STRIDED, strides=[-2]),
                [b"\x01\x00\x02\x00\x01"], 1),
}


@pytest.mark.parametrize("path", WRITE_PATHS)
@pytest.mark.parametrize("case", BAD_BOOL8)
def test_no_write_path_writes_a_bool8_byte_that_is_no_bool8_value(
        case: str, path: str, tmp_path: Any) -> None:
    # np.frombuffer(bytes([2]), np.bool_) holds 0x02; it was written as it was.
    d, source, first_bad = BAD_BOOL8[case]
    t = _dirty(d, *source)
    with pytest.raises(hb.FormatError, match=rf"bool8 element {first_bad} holds the byte") as e:
        _written(t, path, tmp_path)
    assert e.value.field == "data"
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary
    # bytes 0 and 1 pass every path unchanged, and strided gaps are no elements
    good = [bytes(b & 1 for b in source[0]), *source[1:]]
    assert _written(_dirty(d, *good), path, tmp_path) == good
    gaps = hb.Descriptor([2], hb.bool8, hb.Layout.STRIDED, strides=[2])
    assert _written(_dirty(gaps, b"\x01\x07\x00"), path, tmp_path) == [b"\x01\x07\x00"]


@pytest.mark.parametrize("case", ["row-major", "strided"])
def test_the_safetensors_writer_refuses_a_bool8_byte_that_is_no_bool8_value(
        case: str, tmp_path: Any) -> None:
    from hurray_bridge import safetensors_io as sio

    d, source, first_bad = BAD_BOOL8[case]
    with pytest.raises(hb.FormatError, match=rf"entry 'x': bool8 element {first_bad} holds"):
        sio.save(tmp_path / "x.safetensors", {"x": _dirty(d, *source)})
    assert list(tmp_path.iterdir()) == []
    sio.save(tmp_path / "x.safetensors", {"x": _dirty(d, bytes(b & 1 for b in source[0]))})


def test_a_stream_goes_on_after_a_refused_bool8_message() -> None:
    # The refusal comes before the message's first byte: nothing to break.
    import io

    d, source, _ = BAD_BOOL8["row-major"]
    f = io.BytesIO()
    with hb.StreamWriter(f, d) as w:
        with pytest.raises(hb.FormatError, match="bool8 element 2"):
            w.write(_dirty(d, *source))
        w.write(_dirty(d, b"\x00\x01\x01\x01"))
    f.seek(0)
    assert [bytes(t.memoryview()) for t in hb.StreamReader(f)] == [b"\x00\x01\x01\x01"]


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_real_producers_with_set_trailing_bits(path: str, tmp_path: Any) -> None:
    pa = pytest.importorskip("pyarrow")
    t = hb.asarray(pa.array([True] * 8)[:3])  # zero-copy: the bitmap byte is 0xff
    assert t.dtype is hb.bool and bytes(t.memoryview()) == b"\xff"
    assert _written(t, path, tmp_path) == [b"\x07"]
    jnp = pytest.importorskip("jax.numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        j = hb.asarray(jnp.array([1, 2, 3], dtype=jnp.int4))
    if not j.descriptor.padded:  # JAX's CPU buffers are packed; the high nibble is unset
        (data,) = _written(j, path, tmp_path)
        assert data[0] == 0x21 and data[1] == 0x03


def test_clean_buffers_are_written_from_the_source_without_a_copy() -> None:
    """Only the last byte is ever rewritten; clean buffers go out as they are."""
    from hurray_bridge._trailing import written_pieces

    n = 1 << 20
    big = np.full(n, 0xFF, np.uint8)
    d = hb.Descriptor([8 * n - 3], hb.bool)
    t = hb.Tensor(d, [hb.Buffer(hb.BufferRole.DATA, big.ctypes.data, n)], owner=big)
    (pieces,) = written_pieces(d, [t.memoryview()])
    head, tail = pieces
    assert len(head) == n - 1 and bytes(tail) == b"\x1f"
    assert np.frombuffer(head, np.uint8).ctypes.data == big.ctypes.data  # a view, no copy
    clean = hb.Tensor(hb.Descriptor([8 * n], hb.bool),
                      [hb.Buffer(hb.BufferRole.DATA, big.ctypes.data, n)], owner=big)
    view = clean.memoryview()
    assert written_pieces(clean.descriptor, [view]) == [(view,)]
    # pickle protocol 5 keeps a clean buffer out of band, over the same memory
    import pickle

    oob: list[Any] = []
    pickle.dumps(clean, protocol=5, buffer_callback=oob.append)
    assert np.frombuffer(oob[0].raw(), np.uint8).ctypes.data == big.ctypes.data


def test_verify_reports_set_trailing_bits(tmp_path: Any) -> None:
    """A file that carries them (an older writer's, say) fails verify; a plain load reads it."""
    import subprocess
    import sys

    from hurray_bridge import container

    good = hb.dumps({"a": np.zeros(4, np.float32),
                     "flags": hb.pack_subbyte(np.array([True, False, True]))}, checksums=False)
    clean = tmp_path / "good.hurray"
    clean.write_bytes(good)
    fi = container.verify(clean)
    (flags,) = [e for e in fi.entries if e.name == "flags"]
    at = fi.data_offset + flags.buffers[0].offset
    assert good[at] == 0x05
    bad = good[:at] + b"\xf5" + good[at + 1:]
    p = tmp_path / "bad.hurray"
    p.write_bytes(bad)
    with pytest.raises(hb.FormatError, match="trailing bits") as e:
        container.verify(p)
    assert e.value.field == f"entries[{flags.position}].buffers[0].trailing_bits"
    assert "'flags'" in str(e.value) and "0xf5" in str(e.value)
    for load in (lambda: hb.loads(bad, verify=True), lambda: hb.load(p, verify=True)):
        with pytest.raises(hb.FormatError, match="trailing bits"):
            load()
    # Readers ignore them otherwise (element-types.md §4.1 rule 6).
    assert bytes(hb.unpack_subbyte(hb.loads(bad)["flags"]).memoryview()) == b"\x01\x00\x01"
    out = subprocess.run([sys.executable, "-m", "hurray_bridge", "verify", str(p)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "trailing bits" in out.stderr + out.stdout


def test_the_c_library_verifies_trailing_bits_too(tmp_path: Any, c_build: Any) -> None:
    """The C library's file check reports the same field (its writer is covered by
    tests/c/test_c_library.py::test_c_to_python, whose files Python verifies)."""
    from tests.c.test_c_library import _ok, _run

    build = c_build
    good = hb.dumps({"x": hb.pack_subbyte(np.array([True, False, True]))}, checksums=False)
    assert good[-1] == 0x05  # the one data byte is the file's last
    paths = []
    for k, data in enumerate([good, good[:-1] + b"\xfd"]):
        p = tmp_path / f"f{k}.hurray"
        p.write_bytes(data)
        paths.append(str(p))
    out = _ok(_run(build / "test_hurray", "check-files",
                   stdin="".join(p + "\n" for p in paths))).splitlines()
    assert out == ["ok", "err entries[0].buffers[0].trailing_bits"]


@pytest.mark.parametrize("dtype", [d.name for d in hb.dtypes.all_dtypes()])
@pytest.mark.parametrize("fill", [0x00, 0x01, 0xFF])
@pytest.mark.parametrize("count", [0, 1, 3, 8])
def test_placed_pieces_of_one_buffer_are_the_written_pieces(dtype: str, fill: int,
                                                            count: int) -> None:
    """The shortcut for one buffer of a type that is neither checked nor masked gives what
    written_pieces gives (or refuses what it refuses), for every element type."""
    from hurray_bridge._trailing import placed_pieces, written_pieces

    d = hb.Descriptor((count,), dtype)  # packed: 3 uint4 are 2 bytes, 4 trailing bits
    view = memoryview(bytes([fill]) * d.nbytes)

    def outcome(fn: Any) -> Any:
        try:
            pieces, at = fn()
        except hb.FormatError as exc:
            return type(exc), exc.field
        return [bytes(p) for p in pieces], list(at)

    def general() -> tuple[list[Any], list[int]]:
        pieces, at, off = [], [], 128
        for p in written_pieces(d, [view], "x")[0]:
            pieces.append(p)
            at.append(off)
            off += len(p)
        return pieces, at

    assert outcome(lambda: placed_pieces(d, [view], [128], "x")) == outcome(general)


# ================================= padded sub-byte elements: the high bits are written zero
# element-types.md §4.3: the bits above an element's `bits` in its byte MUST be written as
# zero and MUST be ignored on read. The value is the low bits', so zeroing them keeps it.
P = {"padded": True}
DIRTY_PADDED = {
    "int4": (hb.Descriptor([3], hb.int4, **P), [b"\xff\xf1\x80"], [b"\x0f\x01\x00"]),
    "uint4": (hb.Descriptor([3], hb.uint4, **P), [b"\xff\xf1\x80"], [b"\x0f\x01\x00"]),
    "int2": (hb.Descriptor([2], hb.int2, **P), [b"\xfe\x07"], [b"\x02\x03"]),
    "uint2": (hb.Descriptor([2], hb.uint2, **P), [b"\x04\x81"], [b"\x00\x01"]),
    "float4": (hb.Descriptor([3], hb.float4_e2m1fn, **P), [b"\xf1\x0f\x25"], [b"\x01\x0f\x05"]),
    # a strided span: the gap byte (1) is masked too, which changes no element
    "int4-strided": (hb.Descriptor([2], hb.int4, hb.Layout.STRIDED, strides=[-2], **P),
                     [b"\xf3\x90\x1c"], [b"\x03\x00\x0c"]),
    "int4-coo-values": (hb.Descriptor([8], hb.int4, hb.Layout.COO, sparse=hb.Sparse(2, hb.int8),
                                      **P), [b"\x17\xe9", b"\x01\x05"], [b"\x07\x09", b"\x01\x05"]),
    "clean": (hb.Descriptor([3], hb.int4, **P), [b"\x0f\x01\x08"], [b"\x0f\x01\x08"]),
}


@pytest.mark.parametrize("path", WRITE_PATHS)
@pytest.mark.parametrize("case", DIRTY_PADDED)
def test_padded_high_bits_are_written_as_zero(case: str, path: str, tmp_path: Any) -> None:
    d, source, expected = DIRTY_PADDED[case]
    t = _dirty(d, *source)
    assert _written(t, path, tmp_path) == expected
    assert [bytes(t.memoryview(b.role)) for b in t.buffers] == source  # the source untouched


def test_padded_high_bits_are_zeroed_in_a_large_buffer_piece_by_piece() -> None:
    # 3 MiB, dirty in its second MiB only: the clean pieces are written from the source.
    from hurray_bridge._trailing import written_pieces

    raw = bytearray(3 << 20)
    raw[(1 << 20) + 5] = 0xF7
    d = hb.Descriptor([len(raw)], hb.uint4, padded=True)
    view = memoryview(bytes(raw))
    (pieces,) = written_pieces(d, [view])
    assert b"".join(bytes(p) for p in pieces) == bytes(raw[:(1 << 20) + 5]) + b"\x07" + bytes(
        len(raw) - (1 << 20) - 6)
    assert sum(isinstance(p, memoryview) for p in pieces) >= 2  # not one copy of it all
    assert sum(len(p) for p in pieces if not isinstance(p, memoryview)) <= 1 << 20


def test_verify_reports_padded_high_bits(tmp_path: Any) -> None:
    """A file that carries them (written before this rule) fails verify, by entry and field,
    in Python and the CLI; a plain load reads it and the low bits are the values."""
    import subprocess
    import sys

    from hurray_bridge import container

    a = np.array([-1, 1, 0], ml_dtypes.int4)
    good = hb.dumps({"z": np.zeros(2, np.float32), "q": a}, checksums=False)
    fi = container.verify(_put(tmp_path / "good.hurray", good))
    (q,) = [e for e in fi.entries if e.name == "q"]
    at = fi.data_offset + q.buffers[0].offset
    assert good[at:at + 3] == b"\x0f\x01\x00"
    bad = good[:at] + b"\xff\xf1\x80" + good[at + 3:]
    p = _put(tmp_path / "bad.hurray", bad)
    with pytest.raises(hb.FormatError, match="high bits") as e:
        container.verify(p)
    assert e.value.field == f"entries[{q.position}].buffers[0].high_bits"
    assert "'q'" in str(e.value) and "0xff" in str(e.value) and "mask 0xf0" in str(e.value)
    for load in (lambda: hb.loads(bad, verify=True), lambda: hb.load(p, verify=True)):
        with pytest.raises(hb.FormatError, match="high bits"):
            load()
    back = hb.convert(hb.loads(bad)["q"], "numpy")
    assert back.tolist() == a.tolist()  # read: only the low bits count
    out = subprocess.run([sys.executable, "-m", "hurray_bridge", "verify", str(p)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "high bits" in out.stderr + out.stdout
    # a strided span's gap bytes are no elements: verify looks at the elements only
    d = hb.Descriptor([2], hb.int4, hb.Layout.STRIDED, strides=[2], padded=True)
    gaps = hb.dumps({"s": _dirty(d, b"\x03\x00\x0c")}, checksums=False)
    assert gaps[-3:] == b"\x03\x00\x0c"
    container.verify(_put(tmp_path / "gap.hurray", gaps[:-2] + b"\xf0" + gaps[-1:]))
    with pytest.raises(hb.FormatError, match=r"element 1 .*0xfc"):
        container.verify(_put(tmp_path / "el.hurray", gaps[:-1] + b"\xfc"))


def _put(path: Any, data: bytes) -> Any:
    path.write_bytes(data)
    return path


def test_the_c_library_verifies_and_writes_padded_high_bits_as_python(
        tmp_path: Any, c_build: Any) -> None:
    from tests.c.test_c_library import _ok, _run

    a = np.array([-1, 1, 0, 7], ml_dtypes.int4)
    good = hb.dumps({"q": a}, checksums=False)
    assert good[-4:] == b"\x0f\x01\x00\x07"
    d = hb.Descriptor([2], hb.int4, hb.Layout.STRIDED, strides=[2], padded=True)
    gaps = hb.dumps({"s": _dirty(d, b"\x03\x00\x0c")}, checksums=False)
    files = [good, good[:-4] + b"\xff\xf1\x80\x07", good[:-1] + b"\x17",
             gaps[:-2] + b"\xf0" + gaps[-1:], gaps[:-1] + b"\xfc"]
    paths = [str(_put(tmp_path / f"f{k}.hurray", data)) for k, data in enumerate(files)]
    out = _ok(_run(c_build / "test_hurray", "check-files",
                   stdin="".join(p + "\n" for p in paths))).splitlines()
    want = ["ok", "err entries[0].buffers[0].high_bits", "err entries[0].buffers[0].high_bits",
            "ok", "err entries[0].buffers[0].high_bits"]
    assert out == want
    for data, line in zip(files, out, strict=True):  # Python agrees
        try:
            hb.loads(data, verify=True)
            py = "ok"
        except hb.FormatError as exc:
            py = f"err {exc.field}"
        assert py == line
    # (the C writer's zeroing is checked by its unit test: test_hurray.c unit_padded)


def test_hurray_convert_of_a_file_with_padded_high_bits(tmp_path: Any) -> None:
    """Verified, it is refused as verify refuses it (not as damage: its checksum is right);
    unverified, it is written with the high bits zero."""
    import struct
    import zlib

    from hurray_bridge import container
    from tests.c.test_c_library import _reseal

    a = np.array([-1, 1, 0], ml_dtypes.int4)
    good = hb.dumps({"q": a})
    assert good[-3:] == b"\x0f\x01\x00"
    # the file an older writer wrote: the dirty bytes and their checksum
    raw = bytearray(good)
    raw[-3:] = b"\xff\xf1\x80"
    struct.pack_into("<I", raw, 128 + 8, zlib.crc32(b"\xff\xf1\x80"))  # entry 0's data_crc32
    src = _put(tmp_path / "old.hurray", _reseal(bytes(raw)))
    out = tmp_path / "out.hurray"
    for check in (lambda: container.verify(src),
                  lambda: container.rewrite(src, out, fsync=False)):
        with pytest.raises(hb.FormatError) as e:
            check()
        assert e.value.field == "entries[0].buffers[0].high_bits"
    assert not out.exists()
    container.rewrite(src, out, fsync=False, verify=False)
    assert out.read_bytes() == good
