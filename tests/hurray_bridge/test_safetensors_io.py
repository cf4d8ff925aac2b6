"""safetensors <-> Hurray, bit-exact, with the header parsed by the bridge (container.md §9).

The safetensors package writes and reads the files on the other side; the
conversion itself uses neither it nor a framework.
"""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge.safetensors_io import (
    hurray_to_safetensors,
    parse_header,
    read_header,
    safetensors_to_hurray,
)

np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors")

from tests.vectors.generate_files import tensor  # noqa: E402

ST_TYPES = {d.safetensors: d for d in hb.dtypes.all_dtypes() if d.safetensors}


def st_file(header: dict[str, Any] | bytes, data: bytes = b"", pad: int = 0) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * pad
    return struct.pack("<Q", len(raw)) + raw + data


def parse(blob: bytes) -> Any:
    return parse_header(blob, len(blob))


# ------------------------------------------------------------- with torch
@pytest.fixture(scope="module")
def torch_tensors() -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(6)
    t = {
        "bf16": torch.randn(4, 5, generator=g).to(torch.bfloat16),
        "f8_e4m3": torch.randn(7, generator=g).to(torch.float8_e4m3fn),
        "f8_e5m2": torch.randn(2, 3, generator=g).to(torch.float8_e5m2),
        "f8_e8m0": torch.tensor([1.0, 2.0, 0.5, 1024.0]).to(torch.float8_e8m0fnu),
        "f4": torch.randint(0, 256, (3, 2), dtype=torch.uint8, generator=g)
        .view(torch.float4_e2m1fn_x2),
        "f16": torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.float16),
        "f32": torch.randn(3, 4, generator=g),
        "f64": torch.randn(2, generator=g, dtype=torch.float64),
        "c64": torch.randn(3, generator=g, dtype=torch.complex64),
        "bool": torch.tensor([True, False, True]),
        "i8": torch.tensor([-128, 0, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "i16": torch.tensor([-1, 2], dtype=torch.int16),
        "u16": torch.tensor([1, 65535], dtype=torch.int32).to(torch.uint16),
        "i32": torch.tensor([-(2**31)], dtype=torch.int32),
        "u32": torch.tensor([2**32 - 1], dtype=torch.int64).to(torch.uint32),
        "i64": torch.tensor([2**63 - 1], dtype=torch.int64),
        "u64": torch.tensor([5], dtype=torch.int64).to(torch.uint64),
        "empty": torch.zeros(3, 0, 5),
        "scalar": torch.tensor(2.5),
        "path/like.name": torch.ones(1),
    }
    return t


def torch_bytes(x: Any) -> bytes:
    import torch

    return x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b""


def test_torch_checkpoint_round_trip_is_byte_identical(tmp_path: pathlib.Path,
                                                       torch_tensors: dict[str, Any]) -> None:
    from safetensors.torch import load_file, save_file

    src, mid, back = tmp_path / "a.safetensors", tmp_path / "a.hurray", tmp_path / "b.safetensors"
    meta = {"format": "pt", "note": "grüße ✓", "empty": ""}
    save_file(torch_tensors, src, metadata=meta)
    assert safetensors_to_hurray(src, mid) == len(torch_tensors)
    hb.load(mid, verify=True)
    assert hurray_to_safetensors(mid, back) == len(torch_tensors)
    assert back.read_bytes() == src.read_bytes()  # the very same file
    again = load_file(back)
    for k, x in torch_tensors.items():
        assert again[k].dtype == x.dtype and again[k].shape == x.shape, k
        assert torch_bytes(again[k]) == torch_bytes(x), k
    with safetensors.safe_open(back, "pt") as f:
        assert f.metadata() == meta


def test_hurray_side_of_a_torch_checkpoint(tmp_path: pathlib.Path,
                                           torch_tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    src, mid = tmp_path / "a.safetensors", tmp_path / "a.hurray"
    save_file(torch_tensors, src, metadata={"k": "v"})
    safetensors_to_hurray(src, mid)
    out = hb.load(mid)
    assert out.metadata == {"k": "v"}
    header = read_header(src)
    for e in header.entries:
        t = out[e.name]
        assert t.descriptor == hb.Descriptor(e.shape, e.dtype), e.name
        assert t.buffers[0].ptr % 64 == 0 or t.buffers[0].nbytes == 0
        assert bytes(t.memoryview()) == torch_bytes(torch_tensors[e.name]), e.name
    assert out["bf16"].dtype == hb.bfloat16
    assert out["f8_e4m3"].dtype == hb.float8_e4m3fn
    assert out["f8_e5m2"].dtype == hb.float8_e5m2
    assert out["f8_e8m0"].dtype == hb.float8_e8m0fnu
    assert out["f4"].dtype == hb.float4_e2m1fn and out["f4"].shape == (3, 4)  # logical shape
    assert out["bool"].dtype == hb.bool8


# ------------------------------------------------------------- with numpy only
def test_numpy_checkpoint_round_trip(tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import load_file, save_file

    arrays = {"a": np.arange(10, dtype=np.float32).reshape(2, 5), "b": np.array(7, np.int64),
              "c": np.zeros((0, 4), np.uint8), "d": np.array([True, False])}
    save_file(arrays, tmp_path / "n.safetensors")
    safetensors_to_hurray(tmp_path / "n.safetensors", tmp_path / "n.hurray")
    out = hb.load(tmp_path / "n.hurray")
    for k, a in arrays.items():
        np.testing.assert_array_equal(np.asarray(out[k]), a)
    hurray_to_safetensors(tmp_path / "n.hurray", tmp_path / "m.safetensors")
    back = load_file(tmp_path / "m.safetensors")
    for k, a in arrays.items():
        assert back[k].dtype == a.dtype and back[k].tobytes() == a.tobytes()


def test_hurray_to_safetensors_gathers_strided_tensors(tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import load_file

    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    hb.save(tmp_path / "s.hurray", {"t": base.T, "n": base[::-1, ::2]})
    hurray_to_safetensors(tmp_path / "s.hurray", tmp_path / "s.safetensors")
    back = load_file(tmp_path / "s.safetensors")
    np.testing.assert_array_equal(back["t"], base.T)
    np.testing.assert_array_equal(back["n"], base[::-1, ::2])


# ------------------------------------------------------------- what cannot go
def _cannot(tmp_path: pathlib.Path, value: Any, words: str) -> None:
    hb.save(tmp_path / "x.hurray", {"ok": np.ones(2), "bad": value})
    with pytest.raises(hb.UnsupportedError, match=words) as e:
        hurray_to_safetensors(tmp_path / "x.hurray", tmp_path / "x.safetensors")
    assert "'bad'" in str(e.value)
    assert not (tmp_path / "x.safetensors").exists()


def test_refusals_name_the_entry(tmp_path: pathlib.Path) -> None:
    coo = hb.Descriptor([4], hb.float32, hb.Layout.COO, sparse=hb.Sparse(0))
    _cannot(tmp_path, tensor(coo, b"", b""), "COO")
    q = hb.Descriptor([2], hb.int8, quantization=hb.Quantization(hb.QuantScheme.PER_TENSOR))
    _cannot(tmp_path, tensor(q, b"\x01\x02", bytes(4)), "quantized")
    _cannot(tmp_path, tensor(hb.Descriptor([4], hb.int4), b"\x00\x00"), "int4")
    _cannot(tmp_path, tensor(hb.Descriptor([8], hb.bool), b"\x00"), "bool")
    _cannot(tmp_path, np.ones(2, np.complex128), "complex128")
    _cannot(tmp_path, tensor(hb.Descriptor([3], hb.float4_e2m1fn), b"\x00\x00"), "whole bytes")
    _cannot(tmp_path, tensor(hb.Descriptor([2], hb.float4_e2m1fn, padded=True), b"\x00\x00"),
            "pack it")
    sh = hb.Descriptor([2], hb.float32, shard=hb.Shard([4], [2]))
    _cannot(tmp_path, tensor(sh, bytes(8)), "shard")


def test_a_name_utf8_cannot_encode_is_a_format_error_naming_it(tmp_path: pathlib.Path) -> None:
    # (a lone surrogate, as os.fsdecode makes of undecodable file names): it was a bare
    # UnicodeEncodeError from the JSON encoding of the header
    from hurray_bridge import safetensors_io

    target = tmp_path / "s.safetensors"
    with pytest.raises(hb.FormatError, match=r"'a\\udcff'.*UTF-8") as err:
        safetensors_io.save(target, {"ok": np.ones(2), "a\udcff": np.ones(2)}, fsync=False)
    assert err.value.field == "name"
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_a_type_outside_the_table_is_unsupported(tmp_path: pathlib.Path) -> None:
    names = [n for n in ("F6_E2M3", "F8_E4M3FNUZ") if n not in ST_TYPES]
    blob = st_file({"x": {"dtype": names[0], "shape": [4], "data_offsets": [0, 3]}}, bytes(3))
    with pytest.raises(hb.UnsupportedError, match=f"'x'.*{names[0]}"):
        parse(blob)
    (tmp_path / "f.safetensors").write_bytes(blob)
    with pytest.raises(hb.UnsupportedError):
        safetensors_to_hurray(tmp_path / "f.safetensors", tmp_path / "f.hurray")
    assert not (tmp_path / "f.hurray").exists()


# ------------------------------------------------------------- hostile headers
def entry(dtype: str = "F32", shape: Any = (2,), offsets: Any = (0, 8)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def test_valid_crafted_headers() -> None:
    idx = parse(st_file({"a": entry(), "__metadata__": {"k": "v"}}, bytes(8), pad=5))
    assert [e.name for e in idx.entries] == ["a"] and idx.metadata == {"k": "v"}
    assert idx.data_start == 8 + len(json.dumps({"a": entry(), "__metadata__": {"k": "v"}})) + 5
    assert parse(st_file({}, b"")).entries == ()
    idx = parse(st_file({"s": entry(shape=(), offsets=(0, 4)), "e": entry(shape=(0, 3),
                                                                          offsets=(4, 4))},
                        bytes(4)))
    assert [e.shape for e in idx.entries] == [(), (0, 3)]


@pytest.mark.parametrize("blob, field", [
    (b"", "header_length"),
    (b"\x01\x00\x00", "header_length"),
    (struct.pack("<Q", 100_000_001) + b"{}", "header_length"),
    (struct.pack("<Q", 2**64 - 1) + b"{}", "header_length"),
    (struct.pack("<Q", 50) + b"{}", "header_length"),
    (st_file(b"[1, 2]"), "header"),
    (st_file(b"{not json}"), "header"),
    (st_file(b'{"a": "\xff"}'), "header"),
    # the first defect in reading order: "a" is no entry before it is a duplicate
    (st_file(b'{"a": 1, "a": 2}'), "tensors['a']"),
    (st_file(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "a": 2}',
             bytes(8)), "header"),
    (st_file(b'{"__metadata__": {"k": "v", "k": "w"}}'), "header"),
    (st_file(b'{"a": {"dtype": "F32", "dtype": "F32"}}'), "header"),
    (st_file(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},}', bytes(8)),
     "header"),
    (st_file(b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}\0', bytes(8)),
     "header"),
    (st_file(b"{" + b'"a":' * 0 + b"[" * 100_000 + b"]" * 100_000 + b"}"), "header"),
    (st_file({"__metadata__": {"k": 1}}), "__metadata__"),
    (st_file({"__metadata__": ["k"]}), "__metadata__"),
    (st_file({"a": [1]}), "tensors['a']"),
    (st_file({"a": {**entry(), "extra": 1}}, bytes(8)), "tensors['a']"),
    (st_file({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "tensors['a']"),
    (st_file({"a": entry(dtype=3)}, bytes(8)), "tensors['a'].dtype"),
    (st_file({"a": entry(shape=[-2])}, bytes(8)), "tensors['a'].shape"),
    (st_file({"a": entry(shape=[True])}, bytes(8)), "tensors['a'].shape"),
    (st_file({"a": entry(shape=[2.0])}, bytes(8)), "tensors['a'].shape"),
    (st_file({"a": entry(shape="2")}, bytes(8)), "tensors['a'].shape"),
    (st_file({"a": entry(shape=[1] * 65, offsets=(0, 4))}, bytes(4)), "tensors['a'].shape"),
    (st_file({"a": entry(shape=[2**40] * 4, offsets=(0, 8))}, bytes(8)), "tensors['a'].shape"),
    # 2**64 - 1 is Hurray's dynamic-dimension marker, no size: a shape error, not a
    # DynamicShapeError asking to resolve() a file's tensor
    (st_file({"a": entry(shape=[2**64 - 1], offsets=(0, 8))}, bytes(8)), "tensors['a'].shape"),
    (st_file({"a": entry(shape=[0, 2**64 - 1], offsets=(0, 0))}, b""), "tensors['a'].shape"),
    (st_file({"a": entry(offsets=(8, 0))}, bytes(8)), "tensors['a'].data_offsets"),
    (st_file({"a": entry(offsets=(0, 16))}, bytes(8)), "tensors['a'].data_offsets"),
    (st_file({"a": entry(offsets=(0, 8, 9))}, bytes(8)), "tensors['a'].data_offsets"),
    (st_file({"a": entry(offsets=(0, -8))}, bytes(8)), "tensors['a'].data_offsets"),
    (st_file({"a": entry(offsets=(0, 4))}, bytes(8)), "tensors['a'].data_offsets"),
    (st_file({"a": entry(), "b": entry()}, bytes(8)), "tensors['b'].data_offsets"),
    (st_file({"a": entry(), "b": entry(offsets=(12, 20))}, bytes(20)),
     "tensors['b'].data_offsets"),
    (st_file({"a": entry()}, bytes(9)), "data"),
    (st_file({"a": entry(dtype="F4", shape=[3], offsets=(0, 2))}, bytes(2)),
     "tensors['a'].shape"),
])
def test_bad_headers_are_format_errors(blob: bytes, field: str) -> None:
    with pytest.raises(hb.FormatError) as e:
        parse(blob)
    assert e.value.field == field, str(e.value)


def test_truncated_and_flipped_safetensors_never_crash(tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    save_file({"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 2), np.int8)},
              tmp_path / "t.safetensors", metadata={"k": "v"})
    good = (tmp_path / "t.safetensors").read_bytes()
    for n in range(len(good)):
        with pytest.raises(hb.FormatError):
            parse(good[:n])
    for i in range(len(good)):
        bad = bytearray(good)
        bad[i] ^= 0x5A
        try:
            parse(bytes(bad))
        except (hb.FormatError, hb.UnsupportedError):
            pass


def test_conversion_of_a_bad_file_writes_nothing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "b.safetensors").write_bytes(st_file({"a": entry()}, bytes(4)))
    with pytest.raises(hb.FormatError):
        safetensors_to_hurray(tmp_path / "b.safetensors", tmp_path / "b.hurray")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.safetensors"]


def test_conversion_progress(tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    save_file({"a": np.ones(3 << 20, np.uint8), "b": np.ones(5, np.float32)},
              tmp_path / "p.safetensors")
    seen: list[tuple[int, int]] = []
    safetensors_to_hurray(tmp_path / "p.safetensors", tmp_path / "p.hurray",
                          progress=lambda d, t: seen.append((d, t)))
    total = seen[-1][1]
    assert seen[-1] == (total, total) and total >= (3 << 20) + 20
    seen.clear()
    hurray_to_safetensors(tmp_path / "p.hurray", tmp_path / "q.safetensors",
                          progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == ((3 << 20) + 20, (3 << 20) + 20)
    assert (tmp_path / "q.safetensors").read_bytes() == (tmp_path / "p.safetensors").read_bytes()


# ------------------------------------------- hostile headers: bounded work (memory, time)
_MEASURE_CHILD = r"""
import sys, time
from hurray_bridge.errors import FormatError
import hurray_bridge as hb

def hwm_kib():
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM"))

with open("/proc/self/clear_refs", "w") as f:  # VmHWM from here on
    f.write("5")
base = hwm_kib()
t = time.perf_counter()
try:
    hb.load(sys.argv[1])
    print("loaded")
except FormatError as exc:
    print(f"{exc.field}|{(hwm_kib() - base) * 1024}|{time.perf_counter() - t:.3f}|{exc}"[:2000])
"""


def _hostile_header(kind: str, size: int) -> bytes:
    """A header of about ``size`` bytes whose one defect comes last, of each attack's shape."""
    head = b'{"a":{"dtype":"F32","shape":['
    tail = b'],"data_offsets":[0,0]}}'
    n = (size - len(head) - len(tail)) // 3
    if kind == "nested empty lists":  # the issue's: [[],[],...]
        return head + b",".join([b"[]"] * n) + tail
    if kind == "objects in a shape":
        return head + b",".join([b"{}"] * n) + tail
    if kind == "long shape of big numbers":
        return head + b",".join([b"1000"] * (n * 3 // 5)) + tail
    if kind == "deep nesting":
        return head[:-1] + b"[" * (n * 3 // 2) + b"]" * (n * 3 // 2) + tail[1:]
    if kind == "one key repeated":
        return b'{"a":{' + b",".join([b'"shape":[]'] * (size // 11)) + b"}}"
    if kind == "many tensors":  # in the writer's own form (read in C), then one refused
        first = b'{"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},'
        one = b'"t%d":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},'
        body = b"".join(one % i for i in range(size // len(one % 100000)))
        return first + body + b'"bad":{"dtype":"U8","shape":[1],"data_offsets":[8,9]}}'
    if kind == "many metadata items":  # then an entry that is refused
        items = b",".join(b'"k%d":"v"' % i for i in range(size // 12))
        return b'{"__metadata__":{' + items + b'},"a":{"dtype":"F32","shape":[[]],' \
            b'"data_offsets":[0,0]}}'
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, field", [
    ("nested empty lists", "tensors['a'].shape"),
    ("objects in a shape", "tensors['a'].shape"),
    ("long shape of big numbers", "tensors['a'].shape"),
    ("deep nesting", "tensors['a'].shape"),
    ("one key repeated", "header"),
    ("many metadata items", "tensors['a'].shape"),
    ("many tensors", "tensors['bad'].data_offsets"),
])
def test_a_hostile_header_is_refused_in_bounded_memory(tmp_path: pathlib.Path, kind: str,
                                                       field: str) -> None:
    """Peak memory at most 4 x the header + 64 MiB before the FormatError (measured in a child
    process, whose peak resident set is its own): the header is checked as it is read, never
    built whole first."""
    import subprocess
    import sys

    if not pathlib.Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to measure a peak resident set")
    header = _hostile_header(kind, 14 << 20)
    path = tmp_path / "h.safetensors"
    path.write_bytes(st_file(header, bytes(8)))  # data to map: the compiled reader tries too
    res = subprocess.run([sys.executable, "-c", _MEASURE_CHILD, str(path)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got_field, peak, seconds, message = res.stdout.strip().split("|", 3)
    assert got_field == field, message
    assert int(peak) <= 4 * len(header) + (64 << 20), (
        f"{kind}: peak +{int(peak) >> 20} MiB for a {len(header) >> 20} MiB header "
        f"({seconds} s): {message[:200]}")


@pytest.mark.parametrize("header", [
    # what safetensors' own writer makes, and what its reader also takes
    b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    b'{ "a" : { "data_offsets" : [ 0 , 8 ] , "shape" : [ 2 ] , "dtype" : "F32" } }\n\t ',
    b'{"\\u00e9\\ud83d\\ude00\\"\\\\\\/\\b\\f\\n\\r\\t\\u0000":'
    b'{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    b'{"\\u005f_metadata__":{"k":"v\\u00e9","":""},'
    b'"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}',
    b'{"a":{"dtype":"F32","shape":[1,1,2],"data_offsets":[0,8]},'
    b'"b":{"dtype":"U8","shape":[0],"data_offsets":[8,8]},"__metadata__":{}}',
])
def test_unusual_but_valid_headers_read_as_safetensors_reads_them(tmp_path: pathlib.Path,
                                                                   header: bytes) -> None:
    from safetensors import safe_open

    path = tmp_path / "v.safetensors"
    path.write_bytes(st_file(header, bytes(8)))
    idx = read_header(path)
    with safe_open(str(path), "np") as f:
        assert [e.name for e in idx.entries] == sorted(f.keys(), key=[
            e.name for e in idx.entries].index)
        assert sorted(e.name for e in idx.entries) == sorted(f.keys())
        assert idx.metadata == (f.metadata() or {})
        for e in idx.entries:
            assert list(e.shape) == list(f.get_slice(e.name).get_shape())
    assert idx.entries[0].begin == 0


def test_a_header_of_many_tensors_and_metadata_reads_as_safetensors_reads_it(
        tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    tensors = {f"layers.{i}.w\u00e9": np.full((i % 7, 3), i, np.float32) for i in range(3000)}
    meta = {f"key {i}": "value \u2028\x1b" * (i % 5) for i in range(500)}
    save_file(tensors, tmp_path / "m.safetensors", metadata=meta)
    loaded = hb.load(tmp_path / "m.safetensors")
    assert list(loaded) == sorted(tensors, key=lambda k: (tensors[k].nbytes == 0, 0)) or \
        sorted(loaded) == sorted(tensors)
    assert loaded.metadata == meta
    for name, value in tensors.items():
        np.testing.assert_array_equal(np.asarray(hb.convert(loaded[name], "numpy")), value)


@pytest.mark.parametrize("where", ["name", "metadata key", "metadata value", "dtype"])
def test_a_lone_surrogate_is_refused_as_safetensors_refuses_it(where: str) -> None:
    """``\\ud800`` unpaired is no Unicode character: Python's JSON decoder makes a str of it
    that cannot be encoded (printed, written); the safetensors library refuses the file."""
    e = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
    header = {
        "name": '{"a\\ud800":' + e + '}',
        "metadata key": '{"__metadata__":{"\\udc00":"v"},"a":' + e + '}',
        "metadata value": '{"__metadata__":{"k":"x\\ud83d"},"a":' + e + '}',
        "dtype": '{"a":{"dtype":"F\\ud800","shape":[2],"data_offsets":[0,8]}}',
    }[where]
    with pytest.raises(hb.FormatError, match="lone surrogate") as info:
        parse(st_file(header.encode(), bytes(8)))
    assert "\\ud8" in str(info.value) or "\\udc00" in str(info.value)


def test_a_byte_order_mark_before_the_header_is_named(tmp_path: pathlib.Path) -> None:
    header = b'\xef\xbb\xbf{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    path = tmp_path / "bom.safetensors"
    path.write_bytes(st_file(header, bytes(8)))
    for call in (lambda: hb.load(path), lambda: read_header(path),
                 lambda: parse(path.read_bytes()),
                 lambda: safetensors_to_hurray(path, tmp_path / "o.hurray")):
        with pytest.raises(hb.FormatError, match="byte order mark") as info:
            call()
        assert info.value.field == "header" and "not a Hurray file" not in str(info.value)
