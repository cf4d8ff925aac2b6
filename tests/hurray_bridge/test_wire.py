"""The binary descriptor codec: round trips, and hostile bytes that only ever raise FormatError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import hurray_bridge as hb
from hurray_bridge.dtypes import all_dtypes
from hurray_bridge.wire import ALIGNMENT, decode_prefix, encode, encoded_size
from tests.strategies import descriptors

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(descriptors())
def test_every_valid_descriptor_round_trips(d: hb.Descriptor) -> None:
    data = d.to_bytes()
    assert len(data) == encoded_size(d) and len(data) % 8 == 0
    back = hb.Descriptor.from_bytes(data)
    assert back == d and hash(back) == hash(d)
    assert back.to_bytes() == data


@FUZZ
@given(descriptors(), st.data())
def test_truncated_bytes_raise_format_error(d: hb.Descriptor, data: st.DataObject) -> None:
    raw = d.to_bytes()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(hb.FormatError):
        hb.Descriptor.from_bytes(raw[:cut])


@FUZZ
@given(descriptors(), st.data())
def test_mutated_bytes_raise_only_format_error(d: hb.Descriptor, data: st.DataObject) -> None:
    raw = bytearray(d.to_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    try:
        back = hb.Descriptor.from_bytes(bytes(raw))
    except hb.FormatError:
        return
    # A mutation that still decodes must give a valid descriptor that re-encodes to itself.
    assert hb.Descriptor.from_bytes(back.to_bytes()) == back


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_raise_only_format_error(raw: bytes) -> None:
    try:
        hb.Descriptor.from_bytes(raw)
    except hb.FormatError:
        pass


@FUZZ
@given(st.binary(min_size=0, max_size=600))
def test_random_bytes_after_a_valid_header_raise_only_format_error(tail: bytes) -> None:
    head = struct.pack(
        "<4sBBHIBBHQQ",
        b"HRYD",
        1,
        0,
        0,
        len(tail) // 8 % 70,
        13,
        1 + len(tail) % 6,
        len(tail) % 9,
        32 + len(tail),
        0,
    )
    try:
        hb.Descriptor.from_bytes(head + tail)
    except hb.FormatError:
        pass


def test_header_layout_is_as_documented() -> None:
    d = hb.Descriptor([2, 3], hb.float32)
    raw = d.to_bytes()
    magic, major, minor, flags, rank, tag, layout, n_buf, total, res = struct.unpack_from(
        "<4sBBHIBBHQQ", raw
    )
    assert (magic, major, minor, flags, rank, tag, layout, n_buf, total, res) == (
        b"HRYD",
        1,
        0,
        0,
        2,
        hb.float32.tag,
        1,
        1,
        len(raw),
        0,
    )
    assert struct.unpack_from("<2Q", raw, 32) == (2, 3)
    assert struct.unpack_from("<B7sQQ", raw, 48) == (1, bytes(7), 0, 24)


@pytest.mark.parametrize(
    "field,offset,value,match",
    [
        ("magic", 0, b"XXXX", "bad magic"),
        ("version", 4, b"\x02", "unsupported major version"),
        ("flags", 6, b"\x00\x80", "unknown flag bits"),
        ("layout", 13, b"\x09", "unknown layout tag"),
        ("type_tag", 12, b"\xee", "unknown element type tag"),
        ("reserved", 24, b"\x01", "reserved header bytes"),
        ("n_buffers", 14, b"\x09\x00", "at most 8"),
        ("total_size", 16, b"\xff\xff", "truncated"),
        ("buffer role", 48, b"\x07", "unknown buffer role"),
        ("buffer reserved", 49, b"\x01", "reserved buffer-entry"),
        ("buffer length", 64, b"\x19", "disagrees"),
        ("buffer offset", 56, b"\x08", "not a multiple of 64"),
    ],
)
def test_each_header_defect_names_its_field(
    field: str, offset: int, value: bytes, match: str
) -> None:
    raw = bytearray(hb.Descriptor([2, 3], hb.float32).to_bytes())
    raw[offset : offset + len(value)] = value
    with pytest.raises(hb.FormatError, match=match):
        hb.Descriptor.from_bytes(bytes(raw))


def test_trailing_bytes_rejected_by_strict_decoder_but_not_by_prefix_decoder() -> None:
    raw = hb.Descriptor([2], hb.int8).to_bytes()
    with pytest.raises(hb.FormatError, match="trailing"):
        hb.Descriptor.from_bytes(raw + b"\0" * 8)
    d, _table, size = decode_prefix(raw + b"\0" * 8)
    assert size == len(raw) and d.shape == (2,)


def test_overlapping_buffers_rejected() -> None:
    d = hb.Descriptor([4, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(3, hb.int32))
    # The encoder refuses overlapping offsets: write [128, 0, 64], then move VALUES to 0.
    raw = bytearray(encode(d, offsets=[128, 0, 64]))
    table = len(raw) - 3 * 24
    struct.pack_into("<Q", raw, table + 8, 0)
    with pytest.raises(hb.FormatError, match="overlaps") as e:
        hb.Descriptor.from_bytes(bytes(raw))
    assert e.value.field == "buffers[1].offset"  # the later of the two, sorted by offset
    assert hb.Descriptor.from_bytes(encode(d, offsets=[128, 0, 64])) == d


def test_encoder_refuses_misaligned_offsets() -> None:
    with pytest.raises(hb.FormatError, match="64-byte aligned"):
        encode(hb.Descriptor([4], hb.float32), offsets=[ALIGNMENT + 4])


_SIZES = st.one_of(st.integers(0, 4), st.integers(0, 2**64 - 1),
                   st.sampled_from([2**32, 2**40, 2**62, 2**63, 2**64 - 2]))


@FUZZ
@given(st.lists(_SIZES, max_size=6), st.sampled_from(all_dtypes()))
def test_a_dense_descriptor_is_built_as_the_general_path_builds_it(
        shape: list[int], dtype: hb.DType) -> None:
    """Descriptor's shortcut (a tuple shape, row-major, nothing else) and its general path
    (the same shape as a list) agree: the same value and buffer table, or the same error."""

    def outcome(s: object) -> object:
        try:
            d = hb.Descriptor(s, dtype)  # type: ignore[arg-type]
        except hb.FormatError as exc:
            return ("error", str(exc), exc.field)
        return d, d.buffer_layout() if not d.is_dynamic else None, d.shape

    fast, general = outcome(tuple(shape)), outcome(shape)
    assert fast == general


def test_the_buffer_table_cache_is_no_field_and_old_pickles_still_work() -> None:
    """The caches are slots of a base class: not compared, listed, copied or pickled, so a
    descriptor restored from a pickle of the nine fields (an older release's) works."""
    import copy
    import dataclasses

    made = hb.Descriptor((3, 4), hb.float32)
    made.buffer_layout()
    decoded = hb.Descriptor.from_bytes(made.to_bytes())
    assert [f.name for f in dataclasses.fields(made)][-1] == "padded"
    assert len(dataclasses.astuple(made)) == 9
    assert dataclasses.asdict(made) == dataclasses.asdict(decoded)
    old = hb.Descriptor.__new__(hb.Descriptor)
    old.__setstate__([(3, 4), hb.float32, hb.Layout.ROW_MAJOR, None, None, None, None, None,
                      False])
    assert old == made and old.buffer_layout() == made.buffer_layout()
    assert old.to_bytes() == made.to_bytes() and copy.copy(old).nbytes == 48
    # The hash, kept once asked for, is no field either: equal descriptors, however
    # made, hash alike, and a pickle holds the nine fields alone.
    h = hash(made)
    assert hash(made) == h == hash(decoded) == hash(old) == hash(copy.deepcopy(made))
    assert len(made.__getstate__()) == 9


class _Offset(int):
    """An int the encoder's dense shortcut does not take: the general path answers."""


@FUZZ
@given(descriptors(), st.sampled_from([0, 64, 128, 4096, 1 << 40, 2**64 - 64, 2**64, -64,
                                       63, 65, 2**64 - 1]))
def test_a_placed_dense_descriptor_encodes_as_the_general_path_does(d: hb.Descriptor,
                                                                    off: int) -> None:
    """One offset given: what encode answers (bytes or the FormatError and its field) is the
    general path's, shortcut or not, for every descriptor and offset, good or bad."""
    # One offset places only a one-buffer descriptor; hypothesis draws again for the rest
    # (about two in three), so every example counted compares the two paths.
    assume(not d.is_dynamic and len(d.buffer_layout()) == 1)

    def outcome(o: int) -> object:
        try:
            return encode(d, [o])
        except hb.FormatError as exc:
            return ("error", str(exc), exc.field)

    assert outcome(off) == outcome(_Offset(off))


def test_the_dense_shortcut_and_the_general_path_give_the_same_bytes() -> None:
    for d in (hb.Descriptor([3, 5], hb.float32), hb.Descriptor([], hb.bool8),
              hb.Descriptor([0, 7], hb.int64), hb.Descriptor([9], hb.int4),
              hb.Descriptor([9], hb.int4, padded=True), hb.Descriptor([1] * 64, hb.uint8)):
        for off in (0, 64, 2**64 - 128):
            fast = encode(d, [off])
            assert fast == encode(d, [_Offset(off)])
            back, entries, total = decode_prefix(fast)
            assert back == d and total == len(fast)
            assert [(e.offset, e.length) for e in entries] == [(off if d.nbytes else 0,
                                                                d.nbytes)]


def test_huge_rank_claim_with_short_input_does_not_allocate() -> None:
    # rank 64 claims 512 shape bytes; 40 are given: refused before anything is built
    raw = struct.pack("<4sBBHIBBHQQ", b"HRYD", 1, 0, 0, 64, 13, 1, 0, 32 + 512, 0) + bytes(8)
    with pytest.raises(hb.FormatError, match="truncated"):
        hb.Descriptor.from_bytes(raw)


def test_non_bytes_input_is_a_format_error() -> None:
    with pytest.raises(hb.FormatError, match="expected bytes"):
        hb.Descriptor.from_bytes("HRYD")  # type: ignore[arg-type]


# --------------------------------------------------------------- issue 9: fuzzing
# The coverage-guided target is fuzz/fuzz_descriptor.py (1,067,344 runs, nothing but
# FormatError); its canonical re-encoding check runs here on mutated descriptors too.


@FUZZ
@given(descriptors(), st.data())
def test_accepted_bytes_are_the_canonical_encoding(d: hb.Descriptor, data: st.DataObject) -> None:
    """Whatever decodes re-encodes to the same bytes, given the offsets it was read with.

    Two fields are exempt, both by the spec: the minor version (a 1.x reader reads
    any 1.x and writes its own) and the offset of a zero-length buffer (ignored on
    read, written as 0, metadata.md §8 rule 3).
    """
    raw = bytearray(d.to_bytes())
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        back, table, _ = decode_prefix(bytes(raw))
        hb.Descriptor.from_bytes(bytes(raw))
    except hb.FormatError:
        return
    expected = bytearray(raw)
    expected[5] = 0
    at = len(raw) - 24 * len(table)
    for j, e in enumerate(table):
        if not e.length:
            struct.pack_into("<Q", expected, at + 24 * j + 8, 0)
    assert encode(back, [e.offset if e.length else 0 for e in table]) == bytes(expected)


def test_fuzz_finding_any_minor_version_is_read_and_rewritten_as_1_0() -> None:
    # First fuzzer finding (a test-harness expectation, not a codec bug): minor
    # version 8 decodes, and the descriptor re-encodes as 1.0.
    raw = bytearray(hb.Descriptor([0], hb.float32).to_bytes())
    raw[5] = 8
    d = hb.Descriptor.from_bytes(bytes(raw))
    assert d == hb.Descriptor([0], hb.float32) and d.to_bytes()[5] == 0


def test_encoder_refuses_what_its_decoder_refuses() -> None:
    """metadata.md §8 rules 4-5 hold on write too: no overlap, offset + length <= 2**64 - 1."""
    csr = hb.Descriptor([4, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(3, hb.int32))
    # VALUES (12 bytes) and INDPTR (20 bytes) both at 0; then INDICES inside INDPTR's span.
    for offsets in ([0, 0, 64], [0, 64, 64], [128, 64, 64]):
        with pytest.raises(hb.FormatError, match="overlaps") as e:
            encode(csr, offsets=offsets)
        assert e.value.field == "buffers.offset"
    # Adjacent, out of table order, with gaps: all fine, and decoded back as written.
    for offsets in ([128, 0, 64], [0, 64, 128], [4096, 64, 0]):
        raw = encode(csr, offsets=offsets)
        d, table, _ = decode_prefix(raw)
        assert d == csr and [b.offset for b in table] == offsets
    # The last aligned offset at which 128 bytes still end by 2**64 - 1, and the next one.
    dense = hb.Descriptor([32], hb.float32)
    last = (2**64 - 1 - 128) // ALIGNMENT * ALIGNMENT
    assert decode_prefix(encode(dense, offsets=[last]))[1][0].offset == last
    with pytest.raises(hb.FormatError, match=r"2\*\*64 - 1") as e:
        encode(dense, offsets=[last + ALIGNMENT])
    assert e.value.field == "buffers.offset"
    for bad in (-64, 2**64, 2**65):
        with pytest.raises(hb.FormatError) as e:
            encode(dense, offsets=[bad])
        assert e.value.field == "buffers.offset"
    for bad in (64.0, "64", None, True):
        with pytest.raises(hb.FormatError, match="integer") as e:
            encode(dense, offsets=[bad])  # type: ignore[list-item]
        assert e.value.field == "buffers.offset"
    # Canonical placement too: 2**64 - 10 data bytes fit, but padded to 64 they push the
    # scales past 2**64 - 1 (the old encoder called that offset "not 64-byte aligned").
    huge = hb.Descriptor([2**64 - 10], hb.uint8,
                         quantization=hb.Quantization(hb.QuantScheme.PER_TENSOR, hb.float32))
    with pytest.raises(hb.FormatError, match=r"2\*\*64 - 1") as e:
        encode(huge)
    assert e.value.field == "buffers.offset"
    # An empty buffer's offset is written as 0 whatever it was (rule 3), and overlaps nothing.
    empty = hb.Descriptor([0, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(0, hb.int32))
    raw = encode(empty, offsets=[2**64 - 1, 0, 12345])
    assert [b.offset for b in decode_prefix(raw)[1]] == [0, 0, 0]


def test_the_worked_example_of_the_spec_is_the_encoders_output() -> None:
    """metadata.md §11: the hex dump, its stated length and the golden vector agree."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    text = (root / "docs" / "spec" / "metadata.md").read_text(encoding="utf-8")
    section = text[text.index("## 11. Worked example"):]
    stated = int(re.search(r"is\s+(\d+) bytes", section).group(1))  # type: ignore[union-attr]
    dump = re.search(r"```\n([0-9a-f]+)\n```", section).group(1)  # type: ignore[union-attr]
    raw = hb.Descriptor([3, 0, 5], hb.float32).to_bytes()
    assert bytes.fromhex(dump) == raw
    assert stated == len(raw) == 80
    assert (root / "tests" / "vectors" / "shape_3_0_5.bin").read_bytes() == raw


def _patched(raw: bytes, *edits: tuple[int, bytes], cut: int = 0) -> bytes:
    """``raw`` with bytes replaced at offsets, the last ``cut`` bytes dropped and
    ``total_size`` made to agree with the shorter length."""
    out = bytearray(raw)
    for at, value in edits:
        out[at:at + len(value)] = value
    if cut:
        del out[-cut:]
        struct.pack_into("<Q", out, 16, len(out))
    return bytes(out)


def test_checks_run_section_by_section_as_the_spec_says() -> None:
    """metadata.md §9: a section's own checks come before anything of a later section,
    and the rules that span sections (step 16) after every section was read."""
    csr = hb.Descriptor([4, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(3, hb.int32))
    raw = csr.to_bytes()
    sparse_at = 32 + 8 * 2
    table_at = len(raw) - 3 * 24

    def field(data: bytes) -> str | None:
        with pytest.raises(hb.FormatError) as e:
            decode_prefix(data)
        return e.value.field

    # step 14 of the sparse section before step 13 of the buffer table
    assert field(_patched(raw, (sparse_at + 10, b"\x01"), cut=24)) == "sparse.reserved"
    # a section-local rule of step 16 (the nnz range) before step 14 of a later section
    assert field(_patched(raw, (sparse_at, struct.pack("<Q", 2**64 - 1)),
                          (table_at + 1, b"\x01"))) == "sparse.nnz"
    # a rule that spans sections (nnz against the shape: an empty shape) after all of them
    assert field(_patched(raw, (32, struct.pack("<Q", 0)),
                          (table_at + 1, b"\x01"))) == "buffers[0].reserved"
    assert field(_patched(raw, (32, struct.pack("<Q", 0)))) == "sparse.nnz"
    # the shard section: the fixed part, then offsets, then global_shape, each truncated
    sharded = hb.Descriptor([2], hb.int8, shard=hb.Shard([4], [2])).to_bytes()
    assert len(sharded) == 32 + 8 + 16 + 16 + 24
    assert field(_patched(sharded, cut=24 + 16 + 8)) == "shard"
    assert field(_patched(sharded, cut=24 + 16)) == "shard.offsets"
    assert field(_patched(sharded, cut=24 + 8)) == "shard.global_shape"
    assert field(_patched(sharded, cut=24)) == "buffers[0]"
    # DYNAMIC in the offsets is named as the spec's step 16 says
    assert field(_patched(sharded, (32 + 8 + 16, struct.pack("<Q", hb.DYNAMIC)))) == (
        "shard.global_shape")
    assert field(_patched(sharded, (32 + 8 + 12, struct.pack("<i", -1)))) == "shard.device_id"


def with_index_type(d: hb.Descriptor, itype: hb.DType) -> bytes:
    """``d``'s encoding with its sparse index type replaced by ``itype`` (and the index
    buffers' lengths with it), whether or not ``itype`` may describe it."""
    assert d.sparse is not None
    raw = bytearray(d.to_bytes())
    raw[32 + 8 * d.rank + 8] = itype.tag
    n = 0 if d.is_dynamic else len(d.buffer_layout())
    for j in range(n):
        at = len(raw) - 24 * (n - j)
        if raw[at] in (hb.BufferRole.INDICES, hb.BufferRole.INDPTR):
            length = struct.unpack_from("<Q", raw, at + 16)[0]
            struct.pack_into("<Q", raw, at + 16, length // d.sparse.index_dtype.itemsize
                             * itype.itemsize)
    return bytes(raw)


# memory-layout.md §5.1: the index type holds nnz (CSR/CSC) and every index a dimension admits
@pytest.mark.parametrize("layout,shape,nnz,itype,limit", [
    (hb.Layout.CSR, [2, 2], 200, hb.int8, "nnz = 200"),      # INDPTR ends at nnz
    (hb.Layout.CSC, [2, 2], 256, hb.uint8, "nnz = 256"),
    (hb.Layout.CSR, [2, 129], 1, hb.int8, "dimension 1 has size 129"),  # column indices
    (hb.Layout.CSC, [300, 2], 1, hb.uint8, "dimension 0 has size 300"),  # row indices
    (hb.Layout.COO, [4, 2**15 + 1], 1, hb.int16, "dimension 1 has size 32769"),
    (hb.Layout.COO, [2**31 + 1], 1, hb.int32, "dimension 0 has size 2147483649"),
])
def test_an_index_type_too_narrow_is_refused_built_and_decoded(
        layout: hb.Layout, shape: list[int], nnz: int, itype: hb.DType, limit: str) -> None:
    def build(t: hb.DType) -> hb.Descriptor:
        return hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(nnz, t))

    with pytest.raises(hb.FormatError, match=f"{limit}.*wider index type") as e:
        build(itype)
    assert e.value.field == "sparse.index_dtype" and itype.name in str(e.value)
    # The bytes a writer that does not check would emit: the decoder refuses them.
    with pytest.raises(hb.FormatError) as e:
        decode_prefix(with_index_type(build(hb.uint64), itype))
    assert e.value.field == "sparse.index_dtype"


@pytest.mark.parametrize("layout,shape,nnz,itype", [
    (hb.Layout.CSR, [2, 2], 127, hb.int8),     # the largest nnz int8 holds
    (hb.Layout.CSR, [3, 128], 4, hb.int8),      # column indices 0 ... 127
    (hb.Layout.CSC, [256, 3], 255, hb.uint8),
    (hb.Layout.COO, [128, 128], 5, hb.int8),    # COO stores no nnz: any count
    (hb.Layout.COO, [300], 0, hb.int8),          # nnz = 0 stores no index at all
    (hb.Layout.CSR, [3, hb.DYNAMIC], 2, hb.int8),  # unknown until resolved
])
def test_an_index_type_that_just_fits_is_accepted(
        layout: hb.Layout, shape: list[int], nnz: int, itype: hb.DType) -> None:
    d = hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(nnz, itype))
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d
    if hb.DYNAMIC not in shape:  # the helper above makes what the encoder makes
        wide = hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(nnz, hb.uint64))
        assert with_index_type(wide, itype) == d.to_bytes()


def test_resolving_a_dimension_too_large_for_the_index_type_is_refused() -> None:
    d = hb.Descriptor([3, hb.DYNAMIC], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(2, hb.int8))
    assert d.resolve([128]).shape == (3, 128)
    with pytest.raises(hb.FormatError, match="dimension 1 has size 129"):
        d.resolve([129])
