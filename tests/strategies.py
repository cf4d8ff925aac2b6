"""Hypothesis strategies for valid descriptors, shared by the property tests."""

from __future__ import annotations

from hypothesis import reject
from hypothesis import strategies as st

import hurray_bridge as hb

DTYPES = hb.dtypes.all_dtypes()
dims = st.one_of(st.integers(0, 6), st.just(hb.DYNAMIC), st.integers(0, 2**20))


@st.composite
def descriptors(draw: st.DrawFn) -> hb.Descriptor:
    rank = draw(st.one_of(st.integers(0, 4), st.integers(0, 64)))
    layout = draw(st.sampled_from(list(hb.Layout))) if rank else hb.Layout.ROW_MAJOR
    dtype = draw(st.sampled_from(DTYPES))
    padded = dtype.is_subbyte and draw(st.booleans())
    static = layout == hb.Layout.STRIDED or draw(st.booleans())
    shape_dims = st.integers(0, 5) if static else dims
    if layout in (hb.Layout.CSR, hb.Layout.CSC):
        rank = 2
    shape = draw(st.lists(shape_dims, min_size=rank, max_size=rank))
    kw: dict = {}
    if layout == hb.Layout.STRIDED:
        if dtype.is_subbyte:
            padded = True
        kw["strides"] = draw(st.lists(st.integers(-50, 50), min_size=rank, max_size=rank))
    elif layout == hb.Layout.TILED:
        k = draw(st.integers(1, rank))
        kw["tile"] = draw(st.lists(st.integers(1, 8), min_size=k, max_size=k))
    elif layout.is_sparse:
        # an empty shape has no index to store an entry at: nnz 0 (ADR-007 §6)
        nnz = 0 if 0 in shape else draw(st.integers(0, 100))
        cells = 1
        for d in shape:
            cells *= d
        # a canonical (duplicate-free) tensor cannot store more entries than it has cells
        canonical = draw(st.booleans()) and (hb.DYNAMIC in shape or nnz <= cells)
        # the index type must hold every index a dimension admits (memory-layout.md §5.1)
        biggest = max((d for d in shape if d != hb.DYNAMIC), default=0)
        index_types = [t for t in (hb.int8, hb.uint16, hb.int32, hb.int64)
                       if biggest <= 2 ** (t.bits - (t.kind == hb.dtypes.Kind.INT))]
        kw["sparse"] = hb.Sparse(nnz, draw(st.sampled_from(index_types)), canonical)
    quantizable = dtype.kind in (hb.dtypes.Kind.INT, hb.dtypes.Kind.UINT) or (
        dtype.kind == hb.dtypes.Kind.FLOAT and dtype.bits <= 8 and dtype is not hb.float8_e8m0fnu
    )
    if quantizable and draw(st.booleans()):
        scheme = draw(st.sampled_from(list(hb.QuantScheme)))
        static_axes = [i for i, d in enumerate(shape) if d != hb.DYNAMIC]
        if scheme != hb.QuantScheme.PER_TENSOR and static_axes:
            kw["quantization"] = hb.Quantization(
                scheme,
                draw(st.sampled_from([hb.float32, hb.float16, hb.float8_e8m0fnu])),
                draw(st.sampled_from([None, hb.int8, hb.uint8, hb.int32])),
                draw(st.sampled_from(static_axes)),
                draw(st.integers(1, 64)) if scheme == hb.QuantScheme.PER_BLOCK else None,
            )
        elif scheme == hb.QuantScheme.PER_TENSOR:
            kw["quantization"] = hb.Quantization(
                scheme, hb.float32, draw(st.sampled_from([None, hb.int32]))
            )
    if hb.DYNAMIC not in shape and draw(st.booleans()):
        offsets = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
        extra = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
        glob = [o + n + e for o, n, e in zip(offsets, shape, extra)]
        kw["shard"] = hb.Shard(glob, offsets, draw(st.integers(0, 7)), 2, draw(st.integers(0, 7)))
    try:
        return hb.Descriptor(shape, dtype, layout, padded=padded, **kw)
    except hb.FormatError as exc:
        # only a size overflow may refuse what the strategy built (huge dims, many of them)
        assert "overflows" in str(exc) or "more than 2**64" in str(exc), exc
        reject()
