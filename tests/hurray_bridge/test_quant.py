"""Quantized tensors: torch quantized <-> Hurray, per-block descriptors, hb.dequantize.

torch per-tensor and per-channel affine tensors (qint8, quint8, qint32) go to
Hurray and back with the storage shared and scales/zero points exact;
hb.dequantize equals torch's dequantize bit for bit. Per-block schemes (int4
with float8_e8m0fnu scales, MX float4, uint4 with zero points, float8 storage)
travel through every adapter as QuantizedArray. Bad parameters are refused.
"""

from __future__ import annotations

import gc
import pickle
import warnings
import weakref
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import quant as hq

np = pytest.importorskip("numpy", reason="numpy is not installed")

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

PER_TENSOR, PER_AXIS, PER_BLOCK = (hb.QuantScheme.PER_TENSOR, hb.QuantScheme.PER_AXIS,
                                   hb.QuantScheme.PER_BLOCK)
QDTYPES = {"qint8": (torch.qint8, hb.int8, (-128, 127)),
           "quint8": (torch.quint8, hb.uint8, (0, 255)),
           "qint32": (torch.qint32, hb.int32, (-(2**31), 2**31 - 1))}
INT_OF = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        # torch 2.13 deprecates its quantized dtypes (pytorch/pytorch#184982): still supported.
        warnings.filterwarnings("ignore", message=".*quantiz.*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*are deprecated", category=UserWarning)
        yield


def tbytes(x: Any) -> bytes:
    return x.contiguous().numpy().tobytes()


def np_of(t: hb.Tensor) -> np.ndarray:
    return np.asarray(hb.convert(t, "numpy"))


def _q_storage(rng: np.random.Generator, qd: Any, shape: tuple[int, ...]) -> Any:
    lo, hi = QDTYPES[{torch.qint8: "qint8", torch.quint8: "quint8",
                      torch.qint32: "qint32"}[qd]][2]
    return torch.from_numpy(rng.integers(lo, hi, size=shape, endpoint=True)).to(INT_OF[qd])


def per_tensor(qd: Any, shape: tuple[int, ...] = (4, 6), scale: float = 0.0371,
               zp: int = 3, seed: int = 0) -> Any:
    ir = _q_storage(np.random.default_rng(seed), qd, shape)
    return torch._make_per_tensor_quantized_tensor(ir, scale, zp)


def per_channel(qd: Any, shape: tuple[int, ...] = (3, 5, 4), axis: int = 1,
                seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    n = shape[axis]
    scales = torch.from_numpy(rng.uniform(1e-3, 2, n) * 10.0 ** rng.integers(-4, 3, n))
    zps = torch.from_numpy(rng.integers(0, 9, n))
    return torch._make_per_channel_quantized_tensor(_q_storage(rng, qd, shape), scales, zps,
                                                    axis)


# ============================================================= torch -> Hurray
@pytest.mark.parametrize("name", QDTYPES)
def test_torch_per_tensor_to_hurray_shares_storage(name: str) -> None:
    qd, storage, _ = QDTYPES[name]
    q = per_tensor(qd, zp=-5 if name != "quint8" else 7)
    t = hb.asarray(q, copy=False)
    d = t.descriptor
    assert d.dtype is storage and d.shape == (4, 6)
    assert d.quantization == hb.Quantization(PER_TENSOR, hb.float64, hb.int64)
    assert [b.role for b in t.buffers] == [hb.BufferRole.DATA, hb.BufferRole.SCALES,
                                           hb.BufferRole.ZERO_POINTS]
    assert t.buffer(hb.BufferRole.DATA).ptr == q.data_ptr()  # int_repr() would have copied
    assert not t.copied
    c = hq.components(t)
    assert np_of(c.scales).tolist() == [q.q_scale()]
    assert np_of(c.zero_points).tolist() == [q.q_zero_point()]
    assert np_of(c.data).tobytes() == tbytes(q.int_repr())


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("name", QDTYPES)
def test_torch_per_channel_to_hurray(name: str, axis: int) -> None:
    qd = QDTYPES[name][0]
    q = per_channel(qd, axis=axis)
    t = hb.asarray(q)
    d = t.descriptor
    assert d.quantization == hb.Quantization(PER_AXIS, hb.float64, hb.int64, axis=axis)
    assert t.buffer(hb.BufferRole.DATA).ptr == q.data_ptr()
    assert t.buffer(hb.BufferRole.SCALES).nbytes == 8 * q.shape[axis]
    c = hq.components(t)
    assert np_of(c.scales).tobytes() == tbytes(q.q_per_channel_scales())
    assert np_of(c.zero_points).tobytes() == tbytes(q.q_per_channel_zero_points())


def test_copy_true_copies_the_storage() -> None:
    q = per_tensor(torch.qint8)
    t = hb.asarray(q, copy=True)
    assert t.copied and t.buffer(hb.BufferRole.DATA).ptr != q.data_ptr()
    assert np_of(hq.components(t).data).tobytes() == tbytes(q.int_repr())


def test_strided_torch_storage_is_shared_as_strided() -> None:
    q = per_tensor(torch.quint8, (5, 7)).t()
    t = hb.asarray(q, copy=False)
    assert t.descriptor.layout == hb.Layout.STRIDED
    assert t.descriptor.strides == (1, 7)
    assert np.asarray(hb.dequantize(t)).tobytes() == tbytes(q.dequantize())
    back = hb.convert(t, "torch")
    assert back.stride() == (1, 7) and back.data_ptr() == q.data_ptr()
    assert torch.equal(back.int_repr(), q.int_repr())


# ============================================================= Hurray -> torch
@pytest.mark.parametrize("name", QDTYPES)
def test_round_trip_to_torch_is_bit_exact_and_zero_copy(name: str) -> None:
    qd = QDTYPES[name][0]
    for q in (per_tensor(qd, zp=0 if name == "quint8" else -3), per_channel(qd, axis=2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            back = hb.convert(q, "torch", copy=False)
        assert back.dtype == qd and back.qscheme() == q.qscheme()
        assert back.data_ptr() == q.data_ptr()
        assert torch.equal(back.int_repr(), q.int_repr())
        if q.qscheme() == torch.per_tensor_affine:
            assert (back.q_scale(), back.q_zero_point()) == (q.q_scale(), q.q_zero_point())
        else:
            assert tbytes(back.q_per_channel_scales()) == tbytes(q.q_per_channel_scales())
            assert torch.equal(back.q_per_channel_zero_points(), q.q_per_channel_zero_points())
            assert back.q_per_channel_axis() == q.q_per_channel_axis()
        assert tbytes(back.dequantize()) == tbytes(q.dequantize())


def test_hurray_quantized_from_other_sources_becomes_torch_quantized() -> None:
    # Built from NumPy arrays: float32 scales and int8 zero points are widened for torch.
    data = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    q = hb.Quantization(PER_AXIS, hb.float32, hb.int8, axis=0)
    t = hq.quantized(data, np.array([0.5, 0.25, 2.0], np.float32), np.array([1, -2, 0], np.int8),
                     quantization=q)
    y = hb.convert(t, "torch")
    assert y.qscheme() == torch.per_channel_affine and y.dtype == torch.qint8
    assert y.data_ptr() == data.ctypes.data
    assert np.asarray(hb.dequantize(t)).tobytes() == tbytes(y.dequantize())
    # Symmetric (no zero points): zero points 0 in torch.
    s = hq.quantized(data, np.array(0.125, np.float16), quantization=hb.Quantization(
        PER_TENSOR, hb.float16))
    y = hb.convert(s, "torch")
    assert y.q_zero_point() == 0 and y.q_scale() == 0.125
    assert np.asarray(hb.dequantize(s)).tobytes() == tbytes(y.dequantize())


def test_torch_copy_true_and_lifetime() -> None:
    q = per_tensor(torch.qint8)
    y = hb.convert(q, "torch", copy=True)
    assert y.data_ptr() != q.data_ptr() and torch.equal(y.int_repr(), q.int_repr())
    data = np.arange(12, dtype=np.uint8)
    ref = weakref.ref(data)
    t = hq.quantized(data, np.array([0.5]), np.array([3]), quantization=hb.Quantization(
        PER_TENSOR, hb.float64, hb.int64))
    z = hb.convert(t, "torch")
    del data, t
    gc.collect()
    assert ref() is not None
    assert z.int_repr().tolist() == list(range(12))
    del z
    gc.collect()
    assert ref() is None


def test_zero_point_outside_the_torch_range_is_refused() -> None:
    t = hq.quantized(np.zeros(3, np.uint8), np.array([1.0]), np.array([300]),
                     quantization=hb.Quantization(PER_TENSOR, hb.float64, hb.int64))
    with pytest.raises(hb.FormatError) as e:
        hb.convert(t, "torch")
    assert e.value.field == "quantization.zero_points"


# ================================================================ dequantize
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("name", QDTYPES)
def test_dequantize_matches_torch_bit_for_bit(name: str, seed: int) -> None:
    qd, _, (lo, hi) = QDTYPES[name]
    rng = np.random.default_rng(seed)
    scale = float(rng.uniform(1e-3, 3) * 10.0 ** rng.integers(-8, 6))
    zp = int(rng.integers(lo, hi)) if name != "qint32" else int(rng.integers(-10**6, 10**6))
    q = per_tensor(qd, (int(rng.integers(1, 9)), int(rng.integers(1, 70))), scale, zp, seed)
    assert np.asarray(hb.dequantize(q)).tobytes() == tbytes(q.dequantize())
    c = per_channel(qd, (2, int(rng.integers(1, 6)), int(rng.integers(1, 40))),
                    axis=int(rng.integers(0, 3)), seed=seed)
    assert np.asarray(hb.dequantize(c)).tobytes() == tbytes(c.dequantize())


def test_dequantize_returns_float32_like_torch_and_float64_on_request() -> None:
    q = per_tensor(torch.qint32, scale=1e-7, zp=12345)
    out = hb.dequantize(q)
    assert out.dtype is hb.float32 and q.dequantize().dtype == torch.float32
    out64 = np.asarray(hb.dequantize(q, dtype="float64"))
    ir = q.int_repr().numpy().astype(np.int64)
    assert out64.tobytes() == ((ir - 12345).astype(np.float64) * q.q_scale()).tobytes()
    with pytest.raises(hb.UnsupportedError, match="float32 or float64"):
        hb.dequantize(q, dtype="float16")


def test_dequantize_refuses_what_is_not_quantized() -> None:
    with pytest.raises(hb.UnsupportedError, match="not quantized"):
        hb.dequantize(np.zeros(3, np.int8))


# ============================================================== empty axes
def test_empty_per_channel_axis_has_empty_scales() -> None:
    e = torch._make_per_channel_quantized_tensor(
        torch.empty(3, 0, dtype=torch.int8), torch.empty(0, dtype=torch.float64),
        torch.empty(0, dtype=torch.long), 1)
    t = hb.asarray(e)
    assert t.buffer(hb.BufferRole.SCALES) == hb.Buffer(hb.BufferRole.SCALES, 0, 0)
    assert t.buffer(hb.BufferRole.ZERO_POINTS).nbytes == 0
    assert t.buffer(hb.BufferRole.DATA) == hb.Buffer(hb.BufferRole.DATA, 0, 0)
    assert np.asarray(hb.dequantize(t)).shape == (3, 0)
    back = hb.convert(t, "torch")
    assert back.shape == (3, 0) and back.q_per_channel_scales().numel() == 0
    # Along the other axis: 3 scales, although the tensor is empty.
    t2 = hq.quantized(np.zeros((3, 0), np.int8), np.ones(3, np.float32), quantization=
                      hb.Quantization(PER_AXIS, hb.float32, axis=0))
    assert t2.buffer(hb.BufferRole.SCALES).nbytes == 12
    assert np.asarray(hb.dequantize(t2)).shape == (3, 0)
    # Per-block with an empty axis: ceil(0 / 32) = 0 blocks.
    t3 = hq.quantized(np.zeros((4, 0), ml_dtypes.int4), np.zeros((4, 0), ml_dtypes.float8_e8m0fnu),
                      quantization=hb.Quantization(PER_BLOCK, hb.float8_e8m0fnu, axis=1,
                                                   block_size=32))
    assert t3.buffer(hb.BufferRole.SCALES) == hb.Buffer(hb.BufferRole.SCALES, 0, 0)
    # Per-tensor: always one scale.
    t4 = hb.asarray(per_tensor(torch.qint8, (0, 5)))
    assert t4.buffer(hb.BufferRole.SCALES).nbytes == 8 and t4.buffer(hb.BufferRole.DATA).ptr == 0


def test_dynamic_axis_is_refused() -> None:
    with pytest.raises(hb.FormatError) as e:
        hb.Descriptor([hb.DYNAMIC, 4], hb.int8,
                      quantization=hb.Quantization(PER_AXIS, hb.float32, axis=0))
    assert e.value.field == "quantization.axis"
    with pytest.raises(hb.FormatError):
        hb.Descriptor([4, hb.DYNAMIC], hb.int4, quantization=hb.Quantization(
            PER_BLOCK, hb.float8_e8m0fnu, axis=1, block_size=32))


# ================================================================ per-block
def _block_reference(codes: np.ndarray, scales: np.ndarray, zps: np.ndarray | None,
                     axis: int, block: int) -> np.ndarray:
    """Per-block dequantization, one block at a time (float64)."""
    out = np.empty(codes.shape, np.float64)
    moved = np.moveaxis(codes.astype(np.float64), axis, 0)
    res = np.moveaxis(out, axis, 0)
    s = np.moveaxis(scales.astype(np.float64), axis, 0)
    z = None if zps is None else np.moveaxis(zps.astype(np.float64), axis, 0)
    for b in range(s.shape[0]):
        sl = slice(b * block, (b + 1) * block)
        res[sl] = (moved[sl] - (0 if z is None else z[b])) * s[b]
    return out


def _int4_weights(seed: int = 3) -> hb.Tensor:
    """int4 weights (8 x 96), one float8_e8m0fnu scale per 32 along axis 1 (MX-style)."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-8, 8, size=(8, 96)).astype(ml_dtypes.int4)
    e = (2.0 ** rng.integers(-10, 4, size=(8, 3))).astype(ml_dtypes.float8_e8m0fnu)
    q = hb.Quantization(PER_BLOCK, hb.float8_e8m0fnu, None, axis=1, block_size=32)
    return hb.pack_subbyte(hq.quantized(w, e, quantization=q))


def test_per_block_int4_with_e8m0_scales() -> None:
    t = _int4_weights()
    d = t.descriptor
    assert d.dtype is hb.int4 and not d.padded
    assert [(b.role, b.nbytes) for b in t.buffers] == [(hb.BufferRole.DATA, 8 * 96 // 2),
                                                       (hb.BufferRole.SCALES, 8 * 3)]
    c = hq.components(t)
    codes = np.asarray(hb.unpack_subbyte(c.data)).astype(np.int64)
    scales = np.asarray(c.scales).astype(np.float64)
    expected = _block_reference(codes, scales, None, 1, 32)
    assert np.asarray(hb.dequantize(t, dtype="float64")).tobytes() == expected.tobytes()
    assert np.asarray(hb.dequantize(t)).tobytes() == expected.astype(np.float32).tobytes()


def test_per_block_uint4_with_zero_points_and_a_short_last_block() -> None:
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 16, size=(300, 5)).astype(ml_dtypes.uint4)
    q = hb.Quantization(PER_BLOCK, hb.float16, hb.uint8, axis=0, block_size=128)
    scales = rng.uniform(0.01, 1, size=(3, 5)).astype(np.float16)  # ceil(300 / 128) = 3
    zps = rng.integers(0, 16, size=(3, 5)).astype(np.uint8)
    t = hq.quantized(codes, scales, zps, quantization=q)
    assert t.descriptor.padded  # ml_dtypes holds one element per byte
    expected = _block_reference(codes.astype(np.int64), scales, zps, 0, 128)
    assert np.asarray(hb.dequantize(t, dtype="float64")).tobytes() == expected.tobytes()
    packed = hb.pack_subbyte(t)
    assert not packed.descriptor.padded and packed.buffer(hb.BufferRole.DATA).nbytes == 750
    assert packed.buffer(hb.BufferRole.SCALES).ptr == t.buffer(hb.BufferRole.SCALES).ptr
    assert np.asarray(hb.dequantize(packed)).tobytes() == np.asarray(hb.dequantize(t)).tobytes()


@pytest.mark.parametrize("storage", ["float8_e4m3fn", "float8_e5m2", "int8"])
def test_per_block_float8_storage(storage: str) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    q = hb.Quantization(PER_BLOCK, hb.float8_e8m0fnu, axis=1, block_size=32)
    scales = np.full((4, 2), 2.0**-4)
    t = hb.quantize(x, storage, q, scales)
    assert t.dtype.name == storage
    dq = np.asarray(hb.dequantize(t))
    stored = np.asarray(hb.convert(hq.components(t).data, "numpy")).astype(np.float64)
    assert dq.tobytes() == (stored * 2.0**-4).astype(np.float32).tobytes()


def test_mx_float4_travels_through_torch_as_float4_x2() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    q = hb.Quantization(PER_BLOCK, hb.float8_e8m0fnu, axis=1, block_size=32)
    t = hb.quantize(x, hb.float4_e2m1fn, q, np.full((2, 2), 0.5))
    y = hb.convert(t, "torch")
    assert isinstance(y, hq.QuantizedArray)
    assert y.data.dtype == torch.float4_e2m1fn_x2 and tuple(y.data.shape) == (2, 32)
    assert y.data.data_ptr() == t.buffer(hb.BufferRole.DATA).ptr  # packed: shared
    assert y.scales.dtype == torch.float8_e8m0fnu
    back = hb.asarray(y)
    assert back.descriptor == t.descriptor
    assert np.asarray(hb.dequantize(back)).tobytes() == np.asarray(hb.dequantize(t)).tobytes()


@pytest.mark.parametrize("to", ["numpy", "jax", "arrow", "torch"])
def test_per_block_descriptor_travels_through_every_adapter(to: str) -> None:
    if to == "jax":
        pytest.importorskip("jax")
    if to == "arrow":
        pytest.importorskip("pyarrow")
    # uint8 storage, float32 scales, uint8 zero points: every adapter holds these types.
    rng = np.random.default_rng(4)
    data = rng.integers(0, 256, size=(6, 40)).astype(np.uint8)
    q = hb.Quantization(PER_BLOCK, hb.float32, hb.uint8, axis=1, block_size=16)
    t = hq.quantized(data, rng.uniform(0.01, 1, (6, 3)).astype(np.float32),
                     rng.integers(0, 255, (6, 3)).astype(np.uint8), quantization=q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)
        y = hb.convert(t, to) if to != "arrow" else None
        if to == "arrow":
            # Arrow arrays are rank 1: the storage goes as a pa.Tensor, scales as Tensors.
            y = hb.convert(t, "arrow")
    assert isinstance(y, hq.QuantizedArray) and y.quantization == q
    back = hb.asarray(y)
    assert back.descriptor == t.descriptor
    assert np.asarray(hb.dequantize(back)).tobytes() == np.asarray(hb.dequantize(t)).tobytes()


def test_int4_to_jax_and_back() -> None:
    pytest.importorskip("jax")
    t = _int4_weights()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)  # JAX cannot import int4 zero-copy
        y = hb.convert(t, "jax")
    assert str(y.data.dtype) == "int4" and str(y.scales.dtype) == "float8_e8m0fnu"
    back = hb.asarray(y)
    assert np.asarray(hb.dequantize(back)).tobytes() == np.asarray(hb.dequantize(t)).tobytes()


def test_torch_cannot_hold_int4_storage() -> None:
    with pytest.raises(hb.UnsupportedError, match="int4"):
        hb.convert(_int4_weights(), "torch")


# ============================================================== quantize
def test_quantize_rounds_half_to_even_and_saturates() -> None:
    q = hb.Quantization(PER_TENSOR, hb.float32, hb.int8)
    x = np.array([2.5, 3.5, -2.5, 1000.0, -1000.0, 0.49], np.float32)
    t = hb.quantize(x, hb.int8, q, np.array(1.0), np.array(1))
    assert np_of(hq.components(t).data).tolist() == [3, 5, -1, 127, -128, 1]
    t4 = hb.quantize(np.array([9.0, -9.0, 0.5, 1.5]), hb.int4, hb.Quantization(
        PER_TENSOR, hb.float32), np.array(1.0))
    assert np.asarray(hb.unpack_subbyte(hq.components(t4).data)).astype(int).tolist() == \
        [7, -8, 0, 2]
    u2 = hb.quantize(np.array([-1.0, 2.0, 7.0]), hb.uint2, hb.Quantization(
        PER_TENSOR, hb.float32), np.array(1.0))
    assert np.asarray(hb.unpack_subbyte(hq.components(u2).data)).astype(int).tolist() == [0, 2, 3]


def test_quantize_float_storage_saturates() -> None:
    q = hb.Quantization(PER_TENSOR, hb.float32)
    t = hb.quantize(np.array([1e9, -1e9, np.nan]), hb.float8_e4m3fn, q, np.array(1.0))
    vals = np.asarray(hb.convert(hq.components(t).data, "numpy")).astype(np.float64)
    assert vals[0] == 448.0 and vals[1] == -448.0 and np.isnan(vals[2])
    with pytest.raises(ValueError, match="no NaN"):
        hb.quantize(np.array([np.nan]), hb.float4_e2m1fn, q, np.array(1.0))
    with pytest.raises(ValueError, match="NaN"):
        hb.quantize(np.array([np.nan]), hb.int8, q, np.array(1.0))


def test_quantize_then_dequantize_matches_torch() -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((5, 8)).astype(np.float32)
    scales = rng.uniform(0.01, 0.1, 8)
    zps = rng.integers(-5, 5, 8)
    t = hb.quantize(x, hb.int8, hb.Quantization(PER_AXIS, hb.float64, hb.int64, axis=1),
                    scales, zps)
    y = hb.convert(t, "torch")
    assert np.asarray(hb.dequantize(t)).tobytes() == tbytes(y.dequantize())


# ================================================================ bad input
def test_scales_of_the_wrong_length_are_refused() -> None:
    q = hb.Quantization(PER_AXIS, hb.float32, hb.int8, axis=1)
    data = np.zeros((2, 5), np.int8)
    with pytest.raises(hb.FormatError, match="4 scales given") as e:
        hq.quantized(data, np.ones(4, np.float32), np.zeros(5, np.int8), quantization=q)
    assert e.value.field == "quantization.scales"
    with pytest.raises(hb.FormatError) as e:
        hq.quantized(data, np.ones(5, np.float32), np.zeros(6, np.int8), quantization=q)
    assert e.value.field == "quantization.zero_points"
    with pytest.raises(hb.FormatError) as e:
        hb.quantize(np.zeros((2, 5)), hb.int8, q, np.ones(3), np.zeros(5))
    assert e.value.field == "quantization.scales"
    qb = hb.Quantization(PER_BLOCK, hb.float32, axis=1, block_size=2)
    with pytest.raises(hb.FormatError, match="6"):  # ceil(5 / 2) = 3 blocks x 2 rows
        hq.quantized(data, np.ones(5, np.float32), quantization=qb)


def test_mismatched_parameters_are_refused() -> None:
    data = np.zeros(4, np.int8)
    q = hb.Quantization(PER_TENSOR, hb.float32, hb.int8)
    with pytest.raises(hb.FormatError, match="float64") as e:
        hq.quantized(data, np.ones(1), np.zeros(1, np.int8), quantization=q)
    assert e.value.field == "quantization.scales"
    with pytest.raises(hb.FormatError, match="none given"):
        hq.quantized(data, np.ones(1, np.float32), quantization=q)
    with pytest.raises(hb.FormatError, match="symmetric"):
        hq.quantized(data, np.ones(1, np.float32), np.zeros(1, np.int8),
                     quantization=hb.Quantization(PER_TENSOR, hb.float32))
    with pytest.raises(hb.FormatError) as e:  # axis out of range
        hq.quantized(data, np.ones(4, np.float32), quantization=hb.Quantization(
            PER_AXIS, hb.float32, axis=1))
    assert e.value.field == "quantization.axis"
    with pytest.raises(hb.FormatError):  # float32 is no storage type
        hq.quantized(np.zeros(4, np.float32), np.ones(1, np.float32),
                     quantization=hb.Quantization(PER_TENSOR, hb.float32))


def test_unsupported_torch_schemes_are_refused() -> None:
    q4 = torch.quantize_per_channel(torch.randn(4, 4), torch.rand(4) + 0.1, torch.rand(4), 0,
                                    torch.quint4x2)
    with pytest.raises(hb.UnsupportedError, match="quint4x2"):
        hb.asarray(q4)
    qf = torch.quantize_per_channel(torch.randn(4, 4), torch.rand(4) + 0.1, torch.rand(4), 0,
                                    torch.quint8)  # float zero points: float_qparams
    with pytest.raises(hb.UnsupportedError, match="float"):
        hb.asarray(qf)


# =========================================================== other targets
def test_torch_quantized_to_numpy_is_a_quantized_array() -> None:
    q = per_channel(torch.quint8, axis=0)
    y = hb.convert(q, "numpy")
    assert isinstance(y, hq.QuantizedArray)
    assert y.data.dtype == np.uint8 and y.data.ctypes.data == q.data_ptr()
    assert y.scales.dtype == np.float64 and y.zero_points.dtype == np.int64
    assert y.quantization.axis == 0
    t = hb.asarray(y)
    assert np.asarray(hb.dequantize(t)).tobytes() == tbytes(q.dequantize())
    back = hb.convert(y, "torch")
    assert back.data_ptr() == q.data_ptr() and torch.equal(back.dequantize(), q.dequantize())


def test_densify_dequantizes_only_on_request() -> None:
    q = per_tensor(torch.qint8)
    a = hb.convert(q, "numpy", densify=True)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32
    assert a.tobytes() == tbytes(q.dequantize())
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(q, "numpy", densify=True, copy=False)


def test_quantized_tensors_pickle() -> None:
    t = _int4_weights()
    u = pickle.loads(pickle.dumps(t, protocol=5))
    assert u.descriptor == t.descriptor
    assert np.asarray(hb.dequantize(u)).tobytes() == np.asarray(hb.dequantize(t)).tobytes()
    q = per_channel(torch.qint8)
    v = pickle.loads(pickle.dumps(hb.asarray(q)))
    assert tbytes(hb.convert(v, "torch").dequantize()) == tbytes(q.dequantize())


def test_quantized_tensor_has_no_dlpack_form() -> None:
    t = hb.asarray(per_tensor(torch.qint8))
    with pytest.raises(hb.UnsupportedError, match="quantized"):
        t.__dlpack__()
