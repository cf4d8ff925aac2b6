"""One test per normative rule of the seeds (data-model.md and ADR-007).

Each test is named after the rule it checks; the docstring quotes the rule's
gist. Wire-level variants build the offending bytes by hand, since a valid
Descriptor can never be made to encode them.
"""

from __future__ import annotations

import struct

import pytest

import hurray_bridge as hb
from hurray_bridge.wire import HEADER_SIZE, MAGIC, encode


def _header(
    rank: int, *, tag: int = 13, layout: int = 1, n_buf: int = 0, total: int | None = None
) -> bytes:
    body = 8 * min(rank, 100)
    total = HEADER_SIZE + body if total is None else total
    return struct.pack("<4sBBHIBBHQQ", MAGIC, 1, 0, 0, rank, tag, layout, n_buf, total, 0) + bytes(
        body
    )


# --- Rank -------------------------------------------------------------------


def test_rank_is_encoded_as_uint32() -> None:
    """Rank is a uint32 in the descriptor."""
    data = hb.Descriptor([2, 3, 4], hb.float32).to_bytes()
    assert struct.unpack_from("<I", data, 8)[0] == 3


def test_writer_must_not_emit_rank_above_64_when_built() -> None:
    with pytest.raises(hb.FormatError, match="rank 65 exceeds the maximum rank 64"):
        hb.Descriptor([1] * 65, hb.float32)


def test_writer_must_not_emit_rank_above_64_when_encoded() -> None:
    d = hb.Descriptor([1] * 64, hb.float32)
    object.__setattr__(d, "shape", (1,) * 65)  # smuggle past the constructor
    with pytest.raises(hb.FormatError, match="rank 65"):
        encode(d)


@pytest.mark.parametrize("rank", [65, 100, 0xFFFFFFFF])
def test_reader_must_reject_rank_above_64(rank: int) -> None:
    with pytest.raises(hb.FormatError, match=f"rank {rank} exceeds"):
        hb.Descriptor.from_bytes(_header(rank))


@pytest.mark.parametrize("rank", list(range(65)))
def test_implementation_supports_rank_0_through_64(rank: int) -> None:
    d = hb.Descriptor([2] * min(rank, 3) + [1] * max(0, rank - 3), hb.uint8)
    assert d.rank == rank
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d


# --- Shape ------------------------------------------------------------------


def test_dimension_size_must_be_non_negative() -> None:
    with pytest.raises(hb.FormatError, match=r"shape\[1\] = -1 is out of range"):
        hb.Descriptor([3, -1], hb.float32)


def test_dimension_size_is_uint64() -> None:
    with pytest.raises(hb.FormatError, match="out of range"):
        hb.Descriptor([2**64], hb.float32)
    d = hb.Descriptor([2**64 - 2], hb.bool)  # largest static size, 1-bit elements
    assert hb.Descriptor.from_bytes(d.to_bytes()).shape == (2**64 - 2,)


def test_zero_size_dimension_makes_element_count_zero() -> None:
    d = hb.Descriptor([7, 0, 9], hb.float32)
    assert d.element_count == 0 and d.is_empty


def test_dynamic_sentinel_is_uint64_max() -> None:
    assert hb.DYNAMIC == 0xFFFFFFFFFFFFFFFF
    d = hb.Descriptor([hb.DYNAMIC], hb.float32)
    assert d.is_dynamic and struct.unpack_from("<Q", d.to_bytes(), HEADER_SIZE)[0] == hb.DYNAMIC


def test_scalar_has_no_shape_bytes() -> None:
    d = hb.Descriptor([], hb.float32)
    # header + buffer table only: no shape array between them
    assert len(d.to_bytes()) == HEADER_SIZE + 24
    assert d.shape == () and d.rank == 0


# --- Element count ----------------------------------------------------------


def test_element_count_is_product_of_shape() -> None:
    assert hb.Descriptor([2, 3, 4], hb.float32).element_count == 24


def test_element_count_of_scalar_is_one() -> None:
    assert hb.Descriptor([], hb.float32).element_count == 1


def test_reader_must_not_compute_element_count_with_dynamic_dimension() -> None:
    with pytest.raises(hb.DynamicShapeError, match="element_count"):
        _ = hb.Descriptor([hb.DYNAMIC, 3], hb.float32).element_count


# --- Dynamic dimensions -----------------------------------------------------


def test_dynamic_rule_1_no_buffer_sizes_strides_or_counts_before_resolution() -> None:
    d = hb.Descriptor([4, hb.DYNAMIC], hb.float32)
    for compute in (
        lambda: d.nbytes,
        lambda: d.strides_or_compact,
        lambda: d.buffer_layout(),
        lambda: d.element_count,
    ):
        with pytest.raises(hb.DynamicShapeError, match="dynamic"):
            compute()
    r = d.resolve([5])
    assert r.element_count == 20 and r.nbytes == 80 and r.strides_or_compact == (5, 1)


def test_dynamic_rule_2_unresolved_descriptor_carries_no_buffer_table() -> None:
    """The buffers come with the resolved sizes (interchange.md), never with the schema."""
    data = hb.Descriptor([hb.DYNAMIC, 3], hb.float32).to_bytes()
    assert struct.unpack_from("<H", data, 14)[0] == 0
    forged = bytearray(data)
    struct.pack_into("<H", forged, 14, 1)
    with pytest.raises(hb.FormatError):
        hb.Descriptor.from_bytes(bytes(forged))


def test_dynamic_rule_3_quantization_axis_must_not_be_dynamic() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_AXIS, hb.float32, axis=0)
    with pytest.raises(hb.FormatError, match="quantization axis 0 is dynamic"):
        hb.Descriptor([hb.DYNAMIC, 4], hb.int8, quantization=q)
    # a dynamic dimension elsewhere is fine
    d = hb.Descriptor([8, hb.DYNAMIC], hb.int8, quantization=q)
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d


def test_dynamic_rule_4_shard_descriptors_must_not_use_dynamic_dimensions() -> None:
    with pytest.raises(hb.FormatError, match="dynamic"):
        hb.Descriptor([hb.DYNAMIC, 3], hb.float32, shard=hb.Shard([8, 3], [0, 0]))
    with pytest.raises(hb.FormatError, match="dynamic"):
        hb.Shard([hb.DYNAMIC, 3], [0, 0])


# --- Element type -----------------------------------------------------------


def test_element_type_is_a_uint8_tag() -> None:
    data = hb.Descriptor([1], hb.bfloat16).to_bytes()
    assert data[12] == hb.bfloat16.tag
    assert all(0 < t.tag < 256 for t in hb.dtypes.all_dtypes())
    assert len({t.tag for t in hb.dtypes.all_dtypes()}) == len(hb.dtypes.all_dtypes())


def test_storage_type_is_orthogonal_to_quantization() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_TENSOR, hb.float32, hb.int8)
    d = hb.Descriptor([4], hb.int8, quantization=q)
    assert d.dtype is hb.int8 and d.to_bytes()[12] == hb.int8.tag


def test_quantized_storage_must_be_integer_or_low_precision_float() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_TENSOR)
    with pytest.raises(hb.FormatError, match="integer, float8 or float4"):
        hb.Descriptor([4], hb.float32, quantization=q)
    hb.Descriptor([4], hb.float8_e4m3fn, quantization=q)
    hb.Descriptor([4], hb.float4_e2m1fn, quantization=q)


# --- Scalars ----------------------------------------------------------------


@pytest.mark.parametrize(
    "layout,kw",
    [
        (hb.Layout.STRIDED, {"strides": ()}),
        (hb.Layout.TILED, {"tile": (1,)}),
        (hb.Layout.COO, {"sparse": hb.Sparse(1)}),
    ],
)
def test_scalar_must_not_carry_strided_tiled_or_sparse_layout(layout: hb.Layout, kw: dict) -> None:
    with pytest.raises(hb.FormatError, match="scalar"):
        hb.Descriptor([], hb.float32, layout, **kw)


def test_scalar_data_buffer_is_one_element() -> None:
    assert hb.Descriptor([], hb.float64).nbytes == 8
    assert hb.Descriptor([], hb.int4).nbytes == 1  # a partial byte rounds up to one


# --- Empty tensors (data-model.md and ADR-007) ------------------------------


@pytest.mark.parametrize("shape", [[0], [3, 0, 5], [0, 0], [1] * 63 + [0]])
def test_adr007_1_any_dimension_may_be_zero(shape: list[int]) -> None:
    d = hb.Descriptor(shape, hb.float32)
    assert d.is_empty and d.element_count == 0


def test_adr007_2_reader_must_accept_empty_tensor() -> None:
    d = hb.Descriptor([3, 0, 5], hb.float32)
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d


def test_adr007_3_empty_tensor_carries_complete_descriptor() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_AXIS, hb.float32, hb.int8, axis=1)
    d = hb.Descriptor([4, 0], hb.int8, quantization=q)
    back = hb.Descriptor.from_bytes(d.to_bytes())
    assert back.quantization == q and back.layout == hb.Layout.ROW_MAJOR and back.dtype is hb.int8
    assert [s.role for s in back.buffer_layout()] == [
        hb.BufferRole.DATA,
        hb.BufferRole.SCALES,
        hb.BufferRole.ZERO_POINTS,
    ]


def test_adr007_4_empty_data_buffer_has_zero_bytes() -> None:
    d = hb.Descriptor([3, 0, 5], hb.complex128)
    assert d.nbytes == 0 and d.buffer_layout() == (hb.BufferSpec(hb.BufferRole.DATA, 0),)


def test_adr007_4_zero_length_buffer_offset_is_not_checked_for_alignment() -> None:
    data = bytearray(hb.Descriptor([0], hb.float32).to_bytes())
    struct.pack_into("<Q", data, len(data) - 16, 3)  # misaligned offset of a 0-byte buffer
    assert hb.Descriptor.from_bytes(bytes(data)).is_empty


def test_adr007_5_zero_and_dynamic_are_distinct() -> None:
    zero, dyn = hb.Descriptor([0], hb.float32), hb.Descriptor([hb.DYNAMIC], hb.float32)
    assert zero != dyn and zero.to_bytes() != dyn.to_bytes()
    assert zero.is_empty and not zero.is_dynamic and dyn.is_dynamic and not dyn.is_empty


def test_adr007_5_resolve_never_substitutes_zero_for_dynamic() -> None:
    d = hb.Descriptor([hb.DYNAMIC, 0], hb.float32)
    r = d.resolve({0: 0})
    assert r.shape == (0, 0) and not r.is_dynamic
    with pytest.raises(hb.DynamicShapeError, match="axis 1 is static"):
        d.resolve({1: 0})
    with pytest.raises(hb.DynamicShapeError, match="out of range"):
        d.resolve({0: hb.DYNAMIC})


@pytest.mark.parametrize(
    "layout,shape",
    [
        (hb.Layout.COO, [5, 7]),
        (hb.Layout.CSR, [5, 7]),
        (hb.Layout.CSC, [5, 7]),
        (hb.Layout.CSR, [0, 7]),
        (hb.Layout.COO, [0]),
    ],
)
def test_adr007_6_sparse_nnz_zero_is_valid_independent_of_shape(
    layout: hb.Layout, shape: list[int]
) -> None:
    d = hb.Descriptor(shape, hb.float32, layout, sparse=hb.Sparse(0, hb.int32))
    back = hb.Descriptor.from_bytes(d.to_bytes())
    assert back == d and back.sparse is not None and back.sparse.nnz == 0
    assert back.nbytes == 0


@pytest.mark.parametrize("dtype", [hb.bool, hb.int4, hb.uint4, hb.int2, hb.uint2, hb.float4_e2m1fn])
def test_adr007_7_empty_subbyte_tensor_occupies_zero_bytes(dtype: hb.DType) -> None:
    assert hb.Descriptor([0], dtype).nbytes == 0
    assert hb.Descriptor([5, 0], dtype).nbytes == 0
    assert hb.Descriptor([3], dtype).nbytes == -(-3 * dtype.bits // 8)  # a partial byte rounds up


@pytest.mark.parametrize(
    "scheme,kw",
    [
        (hb.QuantScheme.PER_AXIS, {}),
        (hb.QuantScheme.PER_BLOCK, {"block_size": 32}),
    ],
)
def test_adr007_8_quantization_axis_of_size_zero_has_empty_scales(
    scheme: hb.QuantScheme, kw: dict
) -> None:
    q = hb.Quantization(scheme, hb.float16, hb.uint8, axis=1, **kw)
    d = hb.Descriptor([4, 0], hb.uint8, quantization=q)
    scales = [s for s in d.buffer_layout() if s.role != hb.BufferRole.DATA]
    assert [s.nbytes for s in scales] == [0, 0]
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d


# --- Consequences the implementation adds (found in review) ---------------------


def test_empty_shape_never_overflows_whatever_its_other_sizes() -> None:
    for shape in ([2**40, 2**40, 0], [0, 2**40, 2**40]):
        d = hb.Descriptor(shape, hb.float32)
        assert d.element_count == 0 and d.nbytes == 0


def test_canonical_sparse_cannot_store_more_entries_than_cells() -> None:
    with pytest.raises(hb.FormatError, match="nnz 100"):
        hb.Descriptor([5, 7], hb.float32, hb.Layout.COO, sparse=hb.Sparse(100, canonical=True))
    # duplicates are allowed when not canonical (torch's uncoalesced COO)
    hb.Descriptor([5, 7], hb.float32, hb.Layout.COO, sparse=hb.Sparse(100))


def test_e8m0_is_a_scale_type_not_a_storage_type() -> None:
    q = hb.Quantization(hb.QuantScheme.PER_TENSOR)
    with pytest.raises(hb.FormatError, match="float8"):
        hb.Descriptor([4], hb.float8_e8m0fnu, quantization=q)
