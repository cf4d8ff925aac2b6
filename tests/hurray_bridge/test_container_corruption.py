"""Bad files never hurt the process (docs/spec/container.md §1, §6).

Every single-byte change and every truncation of a small file is either a
FormatError or a successful load, never another exception; ``verify`` reports
every one of them. With the checksums recomputed after each change (what a
hostile writer would do) the structural checks alone must hold. Then one test
per defect of the issue, each naming its entry and field.
"""

from __future__ import annotations

import gc
import pathlib
import random
import struct
import sys
import zlib
from collections.abc import Callable, Sequence

import pytest

import hurray_bridge as hb
from hurray_bridge import container, wire
from hurray_bridge.container import HEADER_SIZE
from hurray_bridge.files import format as file_format
from hurray_bridge.files.format import ENTRY as _ENTRY
from hurray_bridge.files.format import HEADER as _HEADER
from hurray_bridge.files.format import META as _META

np = pytest.importorskip("numpy")

from tests.vectors.generate_files import tensor  # noqa: E402

Q = hb.QuantScheme


def small_file() -> bytes:
    """A few kilobytes holding one of each kind of entry, plus metadata."""
    coo = hb.Descriptor([4, 5], hb.float32, hb.Layout.COO, sparse=hb.Sparse(2, hb.int32))
    quant = hb.Descriptor([2, 3], hb.int8, quantization=hb.Quantization(
        Q.PER_AXIS, hb.float16, hb.int8, axis=1))
    return hb.dumps({
        "dense": np.arange(12, dtype=np.float32).reshape(3, 4),
        "strided": np.arange(6, dtype=np.int16)[::-2],
        "empty": np.zeros((3, 0, 5), np.float64),
        "coo": tensor(coo, bytes(range(8)), bytes(range(16))),
        "quant": tensor(quant, bytes(range(6)), bytes(range(6)), bytes(range(3))),
        "int4": tensor(hb.Descriptor([5], hb.int4), b"\x21\x43\x05"),
    }, {"format": "test", "ü": "v"})


DATA = small_file()
H = file_format.parse_header(DATA[:HEADER_SIZE], len(DATA))


def reseal(data: bytes | bytearray) -> bytes:
    """Recompute both index checksums over whatever the header now declares."""
    buf = bytearray(data)
    if len(buf) < HEADER_SIZE:
        return bytes(buf)
    t_len, m_len = struct.unpack_from("<Q", buf, 24)[0], struct.unpack_from("<Q", buf, 40)[0]
    end = min(len(buf), HEADER_SIZE + min(t_len, len(buf)) + min(m_len, len(buf)))
    struct.pack_into("<I", buf, 76, zlib.crc32(buf[HEADER_SIZE:end]))
    struct.pack_into("<I", buf, 124, zlib.crc32(buf[:124]))
    return bytes(buf)


def load_all(data: bytes, **kw: bool) -> None:
    """Load, then read every byte of every buffer (a success must be usable)."""
    out = hb.loads(data, **kw)
    for t in out.values():
        for b in t.buffers:
            if b.nbytes:
                bytes(t.memoryview(b.role))


def outcome(fn: Callable[[], object]) -> str:
    try:
        fn()
    except hb.FormatError:
        return "format"
    return "ok"


# ------------------------------------------------------------- whole-file sweeps
def test_small_file_is_valid_and_small() -> None:
    load_all(DATA, verify=True)
    assert 4096 < len(DATA) < 8192


def test_truncation_at_every_offset() -> None:
    for n in range(len(DATA)):
        with pytest.raises(hb.FormatError):
            hb.loads(DATA[:n])


def test_truncated_files_on_disk(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.hurray"
    for n in sorted({0, 1, 4, 127, 128, 129, H.index_end - 1, H.data_offset, len(DATA) - 1,
                     *range(0, len(DATA), 211)}):
        path.write_bytes(DATA[:n])
        for call in (lambda: hb.load(path), lambda: hb.load(path, mmap=False),
                     lambda: container.read_index(path), lambda: container.verify(path)):
            with pytest.raises(hb.FormatError):
                call()


def test_every_single_byte_change_is_caught_or_harmless() -> None:
    """Flip one bit (varying which) and all bits of every byte of the file."""
    for i in range(len(DATA)):
        for mask in (1 << (i % 8), 0xFF):
            bad = bytearray(DATA)
            bad[i] ^= mask
            bad = bytes(bad)
            result = outcome(lambda: load_all(bad))  # noqa: B023
            if result == "ok":
                # Only bytes the index does not cover: padding and tensor data.
                assert i >= H.index_end, i
            with pytest.raises(hb.FormatError):
                hb.loads(bad, verify=True)  # ... and verify sees every one


def test_every_index_byte_change_resealed_only_format_errors() -> None:
    """A writer that recomputes the checksums: the structural checks must hold alone."""
    seen = {"ok": 0, "format": 0}
    for i in range(H.index_end):
        for mask in (1 << (i % 8), 0xFF, 0x80):
            bad = bytearray(DATA)
            bad[i] ^= mask
            bad = reseal(bad)
            seen[outcome(lambda: load_all(bad))] += 1  # noqa: B023
    assert seen["format"] > seen["ok"]


def test_random_multi_byte_mutations_resealed() -> None:
    rng = random.Random(6)
    for _ in range(3000):
        bad = bytearray(DATA)
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(H.index_end)
            bad[i] = rng.randrange(256)
        if rng.random() < 0.3:  # large values in count and length fields
            off = rng.choice([8, 12, 24, 40, 48, 56, 64, 72, HEADER_SIZE, HEADER_SIZE + 4])
            struct.pack_into("<I", bad, off, rng.choice([0, 1, 2**31, 2**32 - 1, 80, 4095]))
        outcome(lambda: load_all(reseal(bad)))  # noqa: B023


def test_garbage_inputs() -> None:
    rng = random.Random(7)
    for n in (0, 1, 127, 128, 129, 4096, 5000):
        for _ in range(30):
            junk = bytes(rng.randrange(256) for _ in range(n))
            with pytest.raises(hb.FormatError):
                hb.loads(junk)
            with pytest.raises(hb.FormatError):
                hb.loads(b"HRYF\x01\x00" + junk)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_bad_file_leaves_no_map(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.hurray"
    bad = bytearray(DATA)
    bad[-1] ^= 1  # the last data byte: found only by verify, after mapping
    path.write_bytes(bad)
    with pytest.raises(hb.FormatError):
        hb.load(path, verify=True)
    gc.collect()
    with open("/proc/self/maps") as f:
        assert str(path) not in f.read()


# -------------------------------------------------------------- crafted defects
def build(entries: Sequence[tuple[bytes, bytes, int]], meta: Sequence[tuple[bytes, bytes]] = (),
          data: bytes = b"", *, alignment: int = 64, flags: int = 1, **over: int) -> bytes:
    """A file from raw parts, checksums correct; ``over`` replaces header fields."""
    table = b"".join(_ENTRY.pack(len(n), len(d), crc, 0) + n + bytes(-len(n) % 8) + d
                     for n, d, crc in entries)
    md = b"".join(_META.pack(len(k), len(v)) + k + v + bytes(-(len(k) + len(v)) % 8)
                  for k, v in meta)
    index_end = HEADER_SIZE + len(table) + len(md)
    d_off = -(-index_end // max(4096, alignment)) * max(4096, alignment) if data else index_end
    f = {"flags": flags, "n_entries": len(entries), "n_metadata": len(meta),
         "table_offset": HEADER_SIZE, "table_length": len(table),
         "metadata_offset": HEADER_SIZE + len(table), "metadata_length": len(md),
         "data_offset": d_off, "data_length": len(data), "file_size": d_off + len(data),
         "alignment": alignment, "major": 1}
    f.update(over)
    head = bytearray(_HEADER.pack(
        b"HRYF", f["major"], 0, f["flags"], f["n_entries"], f["n_metadata"], f["table_offset"],
        f["table_length"], f["metadata_offset"], f["metadata_length"], f["data_offset"],
        f["data_length"], f["file_size"], f["alignment"], zlib.crc32(table + md), bytes(44), 0))
    struct.pack_into("<I", head, 124, zlib.crc32(head[:124]))
    return bytes(head) + table + md + bytes(d_off - index_end) + data


def desc(d: hb.Descriptor, offsets: Sequence[int] | None = None,
         lengths: Sequence[int] | None = None) -> bytes:
    """Encode ``d``, then overwrite buffer offsets/lengths with anything at all."""
    raw = bytearray(wire.encode(d))
    n = len(d.buffer_layout())
    for j in range(n):
        at = len(raw) - 24 * (n - j)
        if offsets is not None:
            struct.pack_into("<Q", raw, at + 8, offsets[j])
        if lengths is not None:
            struct.pack_into("<Q", raw, at + 16, lengths[j])
    return bytes(raw)


F12 = hb.Descriptor([3], hb.float32)  # 12 bytes
DATA12 = bytes(range(12))
CRC12 = zlib.crc32(DATA12)


def check(data: bytes, field: str, *words: str) -> hb.FormatError:
    with pytest.raises(hb.FormatError) as e:
        hb.loads(data)
    assert e.value.field == field, str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)
    return e.value


def test_crafted_valid_file_loads() -> None:
    """The builder makes valid files: each defect below changes one thing."""
    good = build([(b"a", desc(F12), CRC12)], [(b"k", b"v")], DATA12)
    out = hb.loads(good, verify=True)
    assert bytes(out["a"].memoryview()) == DATA12 and out.metadata == {"k": "v"}
    two = build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [64]), CRC12)],
                data=DATA12 + bytes(52) + DATA12)
    assert len(hb.loads(two, verify=True)) == 2


def test_offset_past_the_end() -> None:
    check(build([(b"w", desc(F12, [64]), CRC12)], data=DATA12), "entries[0].buffers[0].offset",
          "entry 'w'", "past")
    check(build([(b"w", desc(F12, [2**64 - 64]), CRC12)], data=DATA12),
          "entries[0].buffers[0].offset")


def test_overlapping_buffers_across_entries() -> None:
    e = check(build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [0]), CRC12)],
                    data=DATA12), "entries[1].buffers[0].offset", "entry 'b'", "overlaps",
              "entries[0]")
    assert e.entry == "b"  # type: ignore[attr-defined]


def test_overlapping_buffers_within_an_entry() -> None:
    csr = hb.Descriptor([2, 2], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(1, hb.int64))
    check(build([(b"s", desc(csr, [0, 0, 64]), 0)], data=bytes(128), flags=0),
          "entries[0].buffers[1].offset", "entry 's'", "overlaps")


def test_gap_between_buffers() -> None:
    check(build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [128]), CRC12)],
                data=DATA12 + bytes(116) + DATA12), "entries[1].buffers[0].offset", "gap")
    check(build([(b"a", desc(F12, [64]), CRC12)], data=bytes(64) + DATA12),
          "entries[0].buffers[0].offset", "gap")


def test_bytes_after_the_last_buffer() -> None:
    check(build([(b"a", desc(F12), CRC12)], data=DATA12 + b"\x00"), "data_length")


def test_misaligned_offsets() -> None:
    check(build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [16]), CRC12)],
                data=DATA12 * 3), "entries[1].buffers[0].offset", "not a multiple", "64")
    check(build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [64]), CRC12)],
                data=DATA12 + bytes(52) + DATA12, alignment=128),
          "entries[1].buffers[0].offset", "alignment 128")


def test_length_disagrees_with_the_descriptor() -> None:
    check(build([(b"a", desc(F12, lengths=[16]), CRC12)], data=bytes(16)),
          "entries[0].buffers[0].length", "entry 'a'", "12 bytes")


def test_absurd_counts() -> None:
    good = [(b"a", desc(F12), CRC12)]
    check(build(good, data=DATA12, n_entries=2**32 - 1), "n_entries")
    check(build(good, data=DATA12, n_entries=2), "n_entries")
    check(build(good, data=DATA12, n_entries=0), "table_length")
    check(build(good, [(b"k", b"v")], DATA12, n_metadata=2**32 - 1), "n_metadata")
    check(build(good, data=DATA12, table_length=2**63), "table_length")
    check(build(good, data=DATA12, metadata_length=(16 << 20) + 8), "metadata_length",
          "exceeds")


def test_absurd_rank() -> None:
    raw = bytearray(desc(F12))
    struct.pack_into("<I", raw, 8, 0xFFFFFFFF)
    check(build([(b"r", bytes(raw), CRC12)], data=DATA12), "entries[0].rank", "entry 'r'")
    struct.pack_into("<I", raw, 8, 65)
    check(build([(b"r", bytes(raw), CRC12)], data=DATA12), "entries[0].rank")


def test_duplicate_names() -> None:
    check(build([(b"a", desc(F12, [0]), CRC12), (b"a", desc(F12, [64]), CRC12)],
                data=DATA12 + bytes(52) + DATA12), "entries[1].name", "duplicate", "entries[0]")


@pytest.mark.parametrize("name, words", [
    (b"\xff\xfe", "UTF-8"), (b"a\xc3", "UTF-8"), (b"\xed\xa0\x80", "UTF-8"),
    (b"a\x00b", "NUL"),
])
def test_bad_names(name: bytes, words: str) -> None:
    check(build([(name, desc(F12), CRC12)], data=DATA12), "entries[0].name", words)


def test_name_lengths() -> None:
    check(build([(b"", desc(F12), CRC12)], data=DATA12), "entries[0].name_length")
    check(build([(b"x" * 4097, desc(F12), CRC12)], data=DATA12), "entries[0].name_length")
    raw = bytearray(build([(b"a", desc(F12), CRC12)], data=DATA12))
    struct.pack_into("<I", raw, HEADER_SIZE, 2**32 - 1)
    check(reseal(raw), "entries[0].name_length")
    struct.pack_into("<I", raw, HEADER_SIZE, 1)
    struct.pack_into("<I", raw, HEADER_SIZE + 4, 2**32 - 8)
    check(reseal(raw), "entries[0].descriptor_length")


def test_name_padding_must_be_zero() -> None:
    raw = bytearray(build([(b"a", desc(F12), CRC12)], data=DATA12))
    raw[HEADER_SIZE + 16 + 3] = 1
    check(reseal(raw), "entries[0].name", "padding")


def test_descriptor_length_disagrees() -> None:
    d = desc(F12) + bytes(8)
    check(build([(b"a", d, CRC12)], data=DATA12), "entries[0].descriptor_length")


def test_dynamic_descriptor_in_a_file() -> None:
    d = hb.Descriptor([hb.DYNAMIC, 4], hb.float32).to_bytes() + bytes(24)
    # 56 bytes so the length check passes; the descriptor's own total_size is 40
    check(build([(b"dyn", d, 0)], flags=0), "entries[0].descriptor_length")
    d = hb.Descriptor([hb.DYNAMIC] * 3, hb.float32).to_bytes()
    check(build([(b"dyn", d, 0)], flags=0), "entries[0].shape", "dynamic")


def test_bad_descriptor_fields_are_named() -> None:
    raw = bytearray(desc(F12))
    raw[12] = 200  # unknown type tag
    check(build([(b"t", bytes(raw), CRC12)], data=DATA12), "entries[0].type_tag", "entry 't'")
    raw = bytearray(desc(F12))
    raw[0] = ord("X")
    check(build([(b"t", bytes(raw), CRC12)], data=DATA12), "entries[0].magic")


def test_metadata_defects() -> None:
    good = [(b"a", desc(F12), CRC12)]
    check(build(good, [(b"k", b"\xff")], DATA12), "metadata[0].value", "UTF-8")
    check(build(good, [(b"\xc0", b"v")], DATA12), "metadata[0].key", "UTF-8")
    check(build(good, [(b"k\x00", b"v")], DATA12), "metadata[0].key", "NUL")
    check(build(good, [(b"", b"v")], DATA12), "metadata[0].key")
    check(build(good, [(b"k", b"v"), (b"k", b"w")], DATA12), "metadata[1].key", "duplicate")
    raw = bytearray(build(good, [(b"k", b"v")], DATA12))
    at = HEADER_SIZE + 16 + 8 + len(desc(F12))
    struct.pack_into("<I", raw, at + 4, 2**32 - 1)
    check(reseal(raw), "metadata[0].value", "truncated")


def test_header_defects() -> None:
    good = [(b"a", desc(F12), CRC12)]
    check(build(good, data=DATA12, major=2), "version")
    check(build(good, data=DATA12, flags=0x10), "flags")
    check(build(good, data=DATA12, alignment=96), "alignment")
    check(build(good, data=DATA12, alignment=32), "alignment")
    check(build(good, data=DATA12, table_offset=136), "table_offset")
    check(build(good, data=DATA12, metadata_offset=0), "metadata_offset")
    check(build(good, data=DATA12, data_offset=4096 * 2), "data_offset")
    check(build(good, data=DATA12, file_size=10**6), "file_size", "truncated")
    check(build(good, data=DATA12, data_length=11), "data_length")
    check(build(good, data=DATA12) + b"\x00", "file_size", "follow")
    check(build(good, data=DATA12)[:-1], "file_size", "truncated")
    raw = bytearray(build(good, data=DATA12))
    raw[100] = 1  # reserved
    check(reseal(raw), "header.reserved")
    raw = bytearray(build(good, data=DATA12))
    raw[100] = 1  # ... and without resealing, the header checksum fires first
    check(bytes(raw), "header.checksum")
    raw = bytearray(build(good, data=DATA12))
    raw[HEADER_SIZE + 20] ^= 1
    check(bytes(raw), "index.checksum")


def test_reserved_entry_bytes_and_stray_checksums() -> None:
    raw = bytearray(build([(b"a", desc(F12), CRC12)], data=DATA12))
    struct.pack_into("<I", raw, HEADER_SIZE + 12, 1)
    check(reseal(raw), "entries[0].reserved")
    check(build([(b"a", desc(F12), CRC12)], data=DATA12, flags=0), "entries[0].checksum")


@pytest.mark.parametrize("head, words", [
    (b"HRYD\x01\x00", "bare Hurray descriptor"),
    (struct.pack("<Q", 40) + b'{"a":{"dtype":"F32"', "safetensors"),
    (b"\x93NUMPY\x01\x00", "NumPy"),
    (b"PK\x03\x04", "not a Hurray file"),
])
def test_wrong_magic_says_what_the_file_is(head: bytes, words: str) -> None:
    check(head + bytes(200), "magic", words)


def test_verify_catches_padding() -> None:
    good = build([(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [64]), CRC12)],
                 data=DATA12 + bytes(52) + DATA12)
    raw = bytearray(good)
    raw[4096 + 30] = 1  # between the buffers
    hb.loads(bytes(raw))
    with pytest.raises(hb.FormatError) as e:
        hb.loads(bytes(raw), verify=True)
    assert e.value.field == "entries[1].buffers[0].offset"
    raw = bytearray(good)
    raw[4000] = 1  # before the data region
    with pytest.raises(hb.FormatError) as e:
        hb.loads(bytes(raw), verify=True)
    assert e.value.field == "data_offset"


def test_repeated_descriptors_are_checked_entry_by_entry() -> None:
    """Entries with identical descriptors share one decode; their offsets are still checked."""
    same = [(b"a", desc(F12, [0]), CRC12), (b"b", desc(F12, [64]), CRC12)]
    data = DATA12 + bytes(52) + DATA12
    assert len(hb.loads(build(same, data=data))) == 2
    check(build([*same, (b"c", desc(F12, [136]), CRC12)], data=data + bytes(60) + DATA12),
          "entries[2].buffers[0].offset", "entry 'c'", "not a multiple")
    check(build([*same, (b"c", desc(F12, [64]), CRC12)], data=data),
          "entries[2].buffers[0].offset", "entry 'c'", "overlaps")
    check(build([*same, (b"c", desc(F12, [2**64 - 64]), CRC12)], data=data),
          "entries[2].buffers[0].offset", "past")
    csr = hb.Descriptor([2, 2], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(1, hb.int64))
    ok = [(b"s", desc(csr, [0, 64, 128]), 0), (b"t", desc(csr, [192, 256, 320]), 0)]
    body = bytes(328)
    assert len(hb.loads(build(ok, data=body, flags=0))) == 2
    bad = [ok[0], (b"t", desc(csr, [192, 192, 320]), 0)]  # inside the second entry
    check(build(bad, data=body, flags=0), "entries[1].buffers[1].offset", "entry 't'",
          "overlaps")
    # Offsets of empty buffers are ignored, so they do not split the cache either.
    empty = hb.Descriptor([0], hb.float32)
    two = build([(b"x", desc(empty, [0]), 0), (b"y", desc(empty, [12345]), 0)], flags=0)
    assert [t.buffers[0].ptr for t in hb.loads(two).values()] == [0, 0]
