"""The PyTorch adapter: dtype x shape sweeps, views, copies, refusals and lifetimes."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import warnings
import weakref
from typing import Any

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge import _subbyte  # noqa: E402
from hurray_bridge.adapters import numpy as hnp  # noqa: E402
from hurray_bridge.adapters import torch as ht  # noqa: E402
from hurray_bridge.tensor import CPU, Device, Tensor  # noqa: E402

# Every table type torch holds in one element per byte or more (float4 x2 is separate).
DTYPES = [d for d in ht._TO_TORCH if d is not hb.float4_e2m1fn]
SHAPES = [(), (0,), (3, 0, 5), (2, 3), (1,) * 64]
CUDA = torch.cuda.is_available()


def _ids(v: object) -> str:
    if isinstance(v, tuple):
        return "rank64" if len(v) == 64 else "x".join(map(str, v)) or "scalar"
    return str(v)


def _random_torch(dtype: hb.DType, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """Random bit patterns (NaNs and all) of a torch dtype; bools are 0/1."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for d in shape:
        n *= d
    tdt = ht.native_dtype(dtype)
    isz = torch.empty((), dtype=tdt).element_size()
    high = 2 if dtype is hb.bool8 else 256
    raw = torch.randint(0, high, (n * isz,), dtype=torch.uint8, generator=g)
    return raw.view(tdt).reshape(shape)


def _random_numpy(dtype: hb.DType, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = hnp.native_dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64))
    high = 2 if dtype is hb.bool8 else 256
    raw = rng.integers(0, high, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def tbytes(x: torch.Tensor) -> bytes:
    """Logical row-major bytes of a torch tensor (bit-exact, NaN-safe)."""
    return bytes(x.contiguous().reshape(-1).view(torch.uint8).numpy())


def nbytes_of(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def nptr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# ------------------------------------------------------------------ dtype table
def test_dtype_map_comes_from_the_table() -> None:
    for d in hb.dtypes.all_dtypes():
        if d.torch is None:
            with pytest.raises(hb.UnsupportedError, match=d.name):
                ht.native_dtype(d)
        else:
            assert ht.native_dtype(d) is getattr(torch, d.torch)
            assert ht.dtype_of(getattr(torch, d.torch)) is d
    assert ht.native_dtype(hb.float4_e2m1fn) is torch.float4_e2m1fn_x2
    assert ht.dtype_of(torch.bool) is hb.bool8


@pytest.mark.parametrize(
    "tdt",
    [torch.complex32, torch.int4, torch.uint3, torch.int1, torch.uint7, torch.bits8,
     torch.bits16],
    ids=str,
)
def test_unmapped_dtypes_are_refused_by_name(tdt: torch.dtype) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ComplexHalf is "experimental"
        x = torch.zeros(4, dtype=torch.uint8).view(tdt)
    with pytest.raises(hb.UnsupportedError, match=str(tdt).removeprefix("torch.")):
        ht.to_hurray(x)


# ----------------------------------------------------------- dtype x shape sweep
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_hb_torch(dtype: hb.DType, shape: tuple[int, ...]) -> None:
    x = _random_torch(dtype, shape)
    t = ht.to_hurray(x)
    assert (t.dtype, t.shape, t.device, t.copied, t.readonly) == (dtype, shape, CPU, False, False)
    assert t.strides is None
    if x.numel():
        assert t.data_ptr == x.data_ptr()
        assert t.nbytes == x.numel() * x.element_size()
    else:
        assert t.data_ptr == 0 and t.nbytes == 0 and t.buffers[0].ptr == 0
    y = ht.from_hurray(t)
    assert y.dtype is x.dtype and tuple(y.shape) == shape
    if x.numel():
        assert y.data_ptr() == x.data_ptr()
    else:
        assert y.data_ptr() == 0
    assert tbytes(y) == tbytes(x)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_torch_hb_numpy(dtype: hb.DType, shape: tuple[int, ...]) -> None:
    x = _random_torch(dtype, shape, seed=1)
    a = hnp.from_hurray(ht.to_hurray(x))
    assert a.dtype == hnp.native_dtype(dtype) and a.shape == shape
    if x.numel():
        assert nptr(a) == x.data_ptr()
    assert nbytes_of(a) == tbytes(x)


@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_numpy_hb_torch(dtype: hb.DType, shape: tuple[int, ...]) -> None:
    a = _random_numpy(dtype, shape, seed=2)
    y = ht.from_hurray(hnp.to_hurray(a))
    assert y.dtype is ht.native_dtype(dtype) and tuple(y.shape) == shape
    if a.size:
        assert y.data_ptr() == nptr(a)
    else:
        assert y.data_ptr() == 0  # no allocation for an empty result
    assert tbytes(y) == nbytes_of(a)


def test_registry_finds_the_adapter() -> None:
    x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    t = hb.asarray(x)
    assert t.data_ptr == x.data_ptr() and t.dtype is hb.int32
    y = hb.convert(np.arange(4.0), "torch")
    assert y.dtype is torch.float64 and y.tolist() == [0.0, 1.0, 2.0, 3.0]
    a = hb.convert(x, "numpy")
    assert nptr(a) == x.data_ptr()


# ------------------------------------------------------------------------ views
def _views(x: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "transposed": x.t(),
        "sliced_gaps": x[::2, 1::3],
        "expand": x[:1].expand(5, x.shape[1]),
        "offset": x[1:, 2:],
        "column": x[:, 1:2],
    }


@pytest.mark.parametrize("view", ["transposed", "sliced_gaps", "expand", "offset", "column"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views_zero_copy(dtype: hb.DType, view: str) -> None:
    base = _random_torch(dtype, (4, 6), seed=3)
    x = _views(base)[view]
    t = ht.to_hurray(x)
    assert t.data_ptr == x.data_ptr() and not t.copied
    if not x.is_contiguous():
        assert t.strides == x.stride()
    y = ht.from_hurray(t)
    assert y.data_ptr() == x.data_ptr()
    assert tuple(y.shape) == tuple(x.shape)
    assert y.stride() == x.stride() or (y.is_contiguous() and x.is_contiguous())
    assert tbytes(y) == tbytes(x)
    a = hnp.from_hurray(t)
    assert nptr(a) == x.data_ptr()
    assert nbytes_of(a) == tbytes(x)


def test_zero_strides_from_numpy_broadcast() -> None:
    a = np.broadcast_to(np.arange(4, dtype=np.float32), (3, 4))
    t = hb.asarray(a)
    assert t.strides == (0, 1) and t.readonly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only (tested below)
        y = ht.from_hurray(t)
    assert y.stride() == (0, 1) and y.data_ptr() == nptr(a)
    assert y.tolist() == a.tolist()


# -------------------------------------------------------------- negative strides
def test_negative_strides_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1]
    t = hb.asarray(a)
    assert t.strides == (4, -1)
    with pytest.raises(hb.CopyRequiredError, match="negative strides"):
        ht.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="negative strides"):
        y = ht.from_hurray(t)
    assert y.tolist() == a.tolist() and y.is_contiguous()
    assert y.data_ptr() != t.data_ptr
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = ht.from_hurray(t, copy=True)  # asked for: no warning
    assert z.tolist() == a.tolist()


def test_negative_stride_on_size_1_dim_is_dropped() -> None:
    a = np.arange(12, dtype=np.float32)
    t = Tensor._dense(nptr(a), (1, 3), hb.float32, strides=(-5, 2), padded=False, device=CPU,
                      owner=a, readonly=False, copied=False)
    y = ht.from_hurray(t, copy=False)
    assert y.data_ptr() == nptr(a) and y.tolist() == [[0.0, 2.0, 4.0]]


def test_negative_strides_never_abort_the_process() -> None:
    # torch 2.12/2.13 abort (SIGABRT) when DLPack hands them negative strides
    # (pytorch/pytorch#188023): the adapter must never get that far.
    code = textwrap.dedent("""
        import warnings
        import numpy as np
        import hurray_bridge as hb
        warnings.simplefilter("ignore")
        a = np.arange(24, dtype=np.int16).reshape(2, 3, 4)[::-1, :, ::-2]
        y = hb.convert(a, "torch")
        assert y.tolist() == a.tolist()
        try:
            hb.convert(a, "torch", copy=False)
        except hb.CopyRequiredError:
            print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"


# ---------------------------------------------------------------- autograd bits
def test_requires_grad_is_detached_and_read_only() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    t = ht.to_hurray(x)
    assert t.data_ptr == x.data_ptr() and not t.copied
    assert t.readonly  # a write would change what autograd computes with
    assert not t.owner.tensor.requires_grad  # held through detach(): no autograd graph
    # torch has no read-only tensors: back to torch is a copy (tests/cross/test_readonly_edges.py)
    with pytest.warns(hb.CopyWarning, match=r"requires grad.*x\.detach\(\)"):
        y = ht.from_hurray(t)
    assert not y.requires_grad and y.data_ptr() != x.data_ptr() and torch.equal(y, x.detach())
    p = torch.nn.Parameter(torch.ones(2))
    assert ht.to_hurray(p).data_ptr == p.data_ptr() and ht.to_hurray(p).readonly
    assert not ht.to_hurray(x, copy=True).readonly  # a copy is the caller's own
    assert not ht.to_hurray(x.detach()).readonly


def test_conj_bit_is_resolved_by_a_copy() -> None:
    base = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    x = base.conj()
    assert x.is_conj()
    with pytest.raises(hb.CopyRequiredError, match="conj"):
        ht.to_hurray(x, copy=False)
    t = ht.to_hurray(x)
    assert t.copied and t.data_ptr != base.data_ptr()
    assert hnp.from_hurray(t).tolist() == [1 - 2j, 3 + 4j]


def test_neg_bit_is_resolved_by_a_copy() -> None:
    x = torch.tensor([1 + 2j, 3 - 4j]).conj().imag
    assert x.is_neg()
    with pytest.raises(hb.CopyRequiredError, match="neg"):
        ht.to_hurray(x, copy=False)
    t = ht.to_hurray(x)
    assert t.copied and hnp.from_hurray(t).tolist() == [-2.0, 4.0]


# --------------------------------------------------------------- float4 (x2)
# Known values: ml_dtypes codes 0.5 -> 0x1, 1.0 -> 0x2, -1.0 -> 0xA, 6.0 -> 0x7.
FP4_VALUES = [0.5, 1.0, -1.0, 6.0]
FP4_BYTES = [0x21, 0x7A]  # element 0 in the low nibble


def test_fp4_nibble_order_matches_ml_dtypes() -> None:
    codes = np.array(FP4_VALUES, ml_dtypes.float4_e2m1fn).view(np.uint8)
    assert codes.tolist() == [0x1, 0x2, 0xA, 0x7]
    assert _subbyte.pack(codes, 4).tolist() == FP4_BYTES
    try:  # torch's own unpacker (used by its ONNX exporter), where present
        from torch.onnx._internal.exporter._type_casting import unpack_float4x2_as_uint8
    except ImportError:
        return
    x = torch.tensor([FP4_BYTES], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert unpack_float4x2_as_uint8(x).tolist() == [codes.tolist()]


def test_fp4_x2_to_hurray_doubles_last_dim() -> None:
    x = torch.tensor([FP4_BYTES, [0x00, 0xF8]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    t = ht.to_hurray(x)
    assert t.dtype is hb.float4_e2m1fn and t.shape == (2, 4)
    assert not t.descriptor.padded and t.nbytes == 4
    assert t.data_ptr == x.data_ptr() and not t.copied
    with pytest.warns(hb.CopyWarning):  # NumPy stores one fp4 per byte: unpacked
        a = hnp.from_hurray(t)
    assert a.dtype == ml_dtypes.float4_e2m1fn
    assert a.astype(np.float32).tolist() == [FP4_VALUES, [0.0, 0.0, -0.0, -6.0]]
    y = ht.from_hurray(t)
    assert y.dtype is torch.float4_e2m1fn_x2 and tuple(y.shape) == (2, 2)
    assert y.data_ptr() == x.data_ptr()
    assert tbytes(y) == tbytes(x)


def test_fp4_packed_from_numpy_values_to_torch() -> None:
    vals = np.array([FP4_VALUES * 2, FP4_VALUES[::-1] * 2], ml_dtypes.float4_e2m1fn)
    packed = _subbyte.pack(vals.view(np.uint8), 4)
    t = Tensor._dense(nptr(packed), (2, 8), hb.float4_e2m1fn, strides=None, padded=False,
                      device=CPU, owner=packed, readonly=False, copied=False)
    y = ht.from_hurray(t, copy=False)
    assert y.dtype is torch.float4_e2m1fn_x2 and tuple(y.shape) == (2, 4)
    assert y.data_ptr() == nptr(packed)
    assert tbytes(y) == packed.tobytes()
    back = ht.to_hurray(y)
    assert back.shape == (2, 8) and back.data_ptr == nptr(packed)
    with pytest.warns(hb.CopyWarning):
        assert hnp.from_hurray(back).astype(np.float32).tolist() == vals.astype(
            np.float32).tolist()


def test_fp4_odd_last_dim_and_rank0_refused() -> None:
    packed = np.zeros(2, np.uint8)
    odd = Tensor._dense(nptr(packed), (3,), hb.float4_e2m1fn, strides=None, padded=False,
                        device=CPU, owner=packed, readonly=False, copied=False)
    with pytest.raises(hb.UnsupportedError, match="odd"):
        ht.from_hurray(odd)
    scalar = Tensor._dense(nptr(packed), (), hb.float4_e2m1fn, strides=None, padded=False,
                           device=CPU, owner=packed, readonly=False, copied=False)
    with pytest.raises(hb.UnsupportedError, match="rank 0"):
        ht.from_hurray(scalar)
    x0 = torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    with pytest.raises(hb.UnsupportedError, match="rank-0"):
        ht.to_hurray(x0)


def test_fp4_x2_non_contiguous_needs_a_copy() -> None:
    base = torch.arange(12, dtype=torch.uint8).reshape(3, 4).view(torch.float4_e2m1fn_x2)
    x = base.t()
    with pytest.raises(hb.CopyRequiredError, match="contiguous"):
        ht.to_hurray(x, copy=False)
    t = ht.to_hurray(x)
    assert t.copied and t.shape == (4, 6) and t.strides is None
    assert bytes(t.memoryview()) == tbytes(x)


def test_fp4_empty() -> None:
    x = torch.empty((3, 0), dtype=torch.float4_e2m1fn_x2)
    t = ht.to_hurray(x)
    assert t.shape == (3, 0) and t.data_ptr == 0 and t.nbytes == 0
    y = ht.from_hurray(t)
    assert y.dtype is torch.float4_e2m1fn_x2 and tuple(y.shape) == (3, 0) and y.data_ptr() == 0


def test_fp4_padded_refused() -> None:
    a = np.array(FP4_VALUES, ml_dtypes.float4_e2m1fn)
    with pytest.raises(hb.UnsupportedError, match=r"padded.*float4_e2m1fn"):
        ht.from_hurray(hb.asarray(a))


# ----------------------------------------------------------- other sub-byte types
@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2"])
def test_subbyte_refused(name: str) -> None:
    a = np.zeros((2, 4), getattr(ml_dtypes, name))
    with pytest.raises(hb.UnsupportedError, match=rf"torch.*{name}"):
        ht.from_hurray(hb.asarray(a))  # padded
    packed = np.zeros(4, np.uint8)
    t = Tensor._dense(nptr(packed), (2, 4), getattr(hb, name), strides=None, padded=False,
                      device=CPU, owner=packed, readonly=False, copied=False)
    with pytest.raises(hb.UnsupportedError, match=f"packed {name}"):
        ht.from_hurray(t)


def _packed_bool(values: np.ndarray) -> tuple[Tensor, np.ndarray]:
    packed = _subbyte.pack(values.astype(np.uint8), 1)
    t = Tensor._dense(nptr(packed) if packed.size else 0, values.shape, hb.bool, strides=None,
                      padded=False, device=CPU, owner=packed, readonly=True, copied=False)
    return t, packed


@pytest.mark.parametrize("shape", [(), (13,), (3, 5), (0,), (2, 0, 3)], ids=_ids)
def test_one_bit_bool_unpacked_with_report(shape: tuple[int, ...]) -> None:
    vals = np.random.default_rng(5).integers(0, 2, shape).astype(bool)
    t, _packed = _packed_bool(vals)
    with pytest.raises(hb.CopyRequiredError, match="1-bit"):
        ht.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="1-bit"):
        y = ht.from_hurray(t)
    assert y.dtype is torch.bool and tuple(y.shape) == shape
    assert y.numpy().tolist() == vals.tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = ht.from_hurray(t, copy=True)
    assert z.numpy().tolist() == vals.tolist()


def test_one_bit_bool_ignores_trailing_bits() -> None:
    packed = np.array([0b1111_0101], np.uint8)  # 3 elements: 1, 0, 1; the rest is padding
    t = Tensor._dense(nptr(packed), (3,), hb.bool, strides=None, padded=False, device=CPU,
                      owner=packed, readonly=False, copied=False)
    with pytest.warns(hb.CopyWarning):
        assert ht.from_hurray(t).tolist() == [True, False, True]


# -------------------------------------------------------------------- read-only
def test_read_only_warns_once_and_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ht, "_readonly_warned", False)
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    t = hb.asarray(a)
    assert t.readonly
    with pytest.warns(UserWarning, match="read-only memory"):
        y = ht.from_hurray(t)
    assert y.data_ptr() == nptr(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y2 = ht.from_hurray(t)  # once per process, as torch.from_numpy
        z = ht.from_hurray(t, copy=True)
    assert y2.data_ptr() == nptr(a) and z.data_ptr() != nptr(a)


def test_read_only_copy_does_not_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ht, "_readonly_warned", False)
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z = ht.from_hurray(hb.asarray(a), copy=True)
    assert z.tolist() == a.tolist() and not ht._readonly_warned


# ------------------------------------------------------------------------ empty
@pytest.mark.parametrize("shape", [(0,), (3, 0, 5), (0, 4), (2, 0, 1)], ids=_ids)
def test_empty_no_allocation(shape: tuple[int, ...]) -> None:
    x = torch.empty(shape)
    t = ht.to_hurray(x)
    assert t.data_ptr == 0 and t.nbytes == 0 and t.descriptor.shape == shape
    y = ht.from_hurray(t)
    assert y.data_ptr() == 0 and tuple(y.shape) == shape and y.dtype is torch.float32
    # An empty slice of a non-empty storage becomes NULL inside Hurray (torch 2.13 also
    # answers data_ptr() == 0 for any tensor without elements).
    z = torch.ones(4, 5)[:, 2:2]
    assert z.untyped_storage().data_ptr() != 0
    tz = ht.to_hurray(z)
    assert tz.data_ptr == 0 and tz.nbytes == 0
    assert ht.from_hurray(tz).data_ptr() == 0


def test_torch_from_dlpack_of_null_capsule_is_unallocated() -> None:
    # What the adapter relies on (and hb.Tensor exports): NULL data -> data_ptr() == 0.
    t = hb.asarray(np.zeros((3, 0, 5), np.float32))
    assert torch.from_dlpack(t).data_ptr() == 0


# ------------------------------------------------------------------------ copies
def test_copy_true_both_directions() -> None:
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    t = ht.to_hurray(x, copy=True)
    assert t.copied and t.data_ptr != x.data_ptr() and t.strides is None
    assert t.data_ptr % 64 == 0
    assert hnp.from_hurray(t).tolist() == x.tolist()
    t0 = ht.to_hurray(x)
    y = ht.from_hurray(t0, copy=True)
    assert y.data_ptr() != x.data_ptr() and y.tolist() == x.tolist()
    y[0, 0] = 99
    assert x[0, 0] == 0


def test_copy_false_zero_copy_paths_do_not_raise() -> None:
    x = torch.arange(6.0).reshape(2, 3)[:, ::2]
    t = ht.to_hurray(x, copy=False)
    assert ht.from_hurray(t, copy=False).data_ptr() == x.data_ptr()


def test_device_move_is_a_copy() -> None:
    t = ht.to_hurray(torch.arange(4.0))
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        ht.from_hurray(t, device="meta", copy=False)
    m = ht.from_hurray(t, device="meta")
    assert m.device.type == "meta" and tuple(m.shape) == (4,)
    same = ht.from_hurray(t, device="cpu", copy=False)
    assert same.data_ptr() == t.data_ptr
    assert ht.from_hurray(t, device=torch.device("cpu")).data_ptr() == t.data_ptr
    assert ht.from_hurray(t, device=CPU).data_ptr() == t.data_ptr
    with pytest.raises(hb.UnsupportedError):
        ht.from_hurray(t, device=object())


def test_pinned_host_device_imports_as_cpu() -> None:
    # torch imports kDLCUDAHost as "Unsupported device_type: 3"; the adapter hands such
    # host memory over as CPU memory (a fake pinned tensor: memory from NumPy).
    a = np.arange(5, dtype=np.int32)
    t = Tensor._dense(nptr(a), (5,), hb.int32, strides=None, padded=False, device=Device(3, 0),
                      owner=a, readonly=False, copied=False)
    y = ht.from_hurray(t, copy=False)
    assert y.device.type == "cpu" and y.data_ptr() == nptr(a) and y.tolist() == a.tolist()


def test_float8_byte_view_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    # Older torch refuses float8 DLPack imports: the adapter then imports bytes and views.
    monkeypatch.setattr(ht, "_BYTE_VIEW", set())
    real = ht._import

    def refusing(t: Tensor, host: bool) -> torch.Tensor:
        if t.dtype.name.startswith("float8"):
            raise BufferError("float8 types are not supported by dlpack")
        return real(t, host)

    monkeypatch.setattr(ht, "_import", refusing)
    a = _random_numpy(hb.float8_e4m3fn, (4, 6), seed=9)[:, ::2]
    y = ht.from_hurray(hb.asarray(a), copy=False)
    assert y.dtype is torch.float8_e4m3fn and y.data_ptr() == nptr(a)
    assert y.stride() == (6, 2)
    assert tbytes(y) == nbytes_of(a)
    assert hb.float8_e4m3fn in ht._BYTE_VIEW


# ------------------------------------------------------------------ refusals
def test_sparse_and_quantized_refused() -> None:
    with pytest.raises(hb.UnsupportedError, match=r"sparse_coo.*hurray_bridge.quant"):
        ht.to_hurray(torch.eye(3).to_sparse())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        csr = torch.eye(3).to_sparse_csr()
        q = torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.quint8)
    with pytest.raises(hb.UnsupportedError, match="sparse_csr"):
        ht.to_hurray(csr)
    with pytest.raises(hb.UnsupportedError, match=r"per_tensor_affine.*hurray_bridge.quant"):
        ht.to_hurray(q)


def test_other_refusals() -> None:
    with pytest.raises(hb.UnsupportedError, match="meta"):
        ht.to_hurray(torch.empty(3, device="meta"))
    with pytest.raises(hb.FormatError, match="rank 65"):
        ht.to_hurray(torch.zeros([1] * 65))
    with pytest.raises(hb.UnsupportedError, match=r"torch.Tensor"):
        ht.to_hurray(np.zeros(3))


# --------------------------------------------------------------------- lifetime
def test_lifetime_torch_source() -> None:
    x = torch.arange(1000, dtype=torch.float32)
    ptr = x.data_ptr()
    r = weakref.ref(x.untyped_storage())
    t = ht.to_hurray(x)
    del x
    gc.collect()
    assert r() is not None  # the hb.Tensor keeps the storage alive
    y = ht.from_hurray(t)
    a = hnp.from_hurray(t)
    del t
    gc.collect()
    assert r() is not None and y.data_ptr() == ptr and nptr(a) == ptr
    del y
    gc.collect()
    assert r() is not None  # the NumPy view still needs it
    assert a[999] == 999.0
    del a
    gc.collect()
    assert r() is None


def test_lifetime_numpy_source() -> None:
    a = np.arange(1000, dtype=np.int64)
    r = weakref.ref(a)
    y = ht.from_hurray(hb.asarray(a))
    del a
    gc.collect()
    assert r() is not None
    assert int(y[999]) == 999
    del y
    gc.collect()
    assert r() is None


def test_lifetime_copy_releases_source() -> None:
    x = torch.arange(10.0)
    r = weakref.ref(x)
    t = ht.to_hurray(x, copy=True)
    del x
    gc.collect()
    assert r() is None and hnp.from_hurray(t).tolist() == list(map(float, range(10)))


# ------------------------------------------------------------------------- CUDA
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@cuda_only
@pytest.mark.parametrize("dtype", [*DTYPES, hb.float4_e2m1fn], ids=str)
def test_cuda_round_trip(dtype: hb.DType) -> None:
    if dtype is hb.float4_e2m1fn:
        x = torch.randint(0, 256, (4, 6), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    else:
        x = _random_torch(dtype, (4, 6), seed=11)
    x = x.cuda()
    t = ht.to_hurray(x)
    assert t.device == Device(2, x.device.index) and t.data_ptr == x.data_ptr()
    y = ht.from_hurray(t)
    assert y.device == x.device and y.data_ptr() == x.data_ptr() and y.dtype is x.dtype
    assert tbytes(y.cpu()) == tbytes(x.cpu())
    z = ht.from_hurray(t, device="cpu")
    assert z.device.type == "cpu" and tbytes(z) == tbytes(x.cpu())
    with pytest.raises(hb.CopyRequiredError):
        ht.from_hurray(t, device="cpu", copy=False)
    c = ht.to_hurray(x, copy=True)
    assert c.copied and c.data_ptr != x.data_ptr() and c.device == t.device


@cuda_only
def test_cuda_views_empty_and_numpy_to_cuda() -> None:
    x = torch.arange(24.0, device="cuda").reshape(4, 6)[::2, 1::2]
    y = ht.from_hurray(ht.to_hurray(x))
    assert y.data_ptr() == x.data_ptr() and y.stride() == x.stride()
    e = torch.empty((3, 0), device="cuda")
    te = ht.to_hurray(e)
    assert te.data_ptr == 0
    ye = ht.from_hurray(te)
    assert ye.device.type == "cuda" and ye.data_ptr() == 0
    g = ht.from_hurray(hb.asarray(np.arange(4.0)), device="cuda:0")
    assert g.device.type == "cuda" and g.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]


@cuda_only
def test_pinned_tensor_is_host_accessible() -> None:
    x = torch.arange(8.0).pin_memory()
    t = ht.to_hurray(x)
    assert t.device.type in (3, 11) and t.device.is_host_accessible
    assert t.data_ptr == x.data_ptr()
    assert nptr(hnp.from_hurray(t)) == x.data_ptr()
    y = ht.from_hurray(t, copy=False)
    assert y.device.type == "cpu" and y.data_ptr() == x.data_ptr()


@cuda_only
def test_cuda_stream_sync_forwarded() -> None:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.full((1 << 20,), 3.0, device="cuda")
        x.mul_(2)
        t = ht.to_hurray(x)
    y = ht.from_hurray(t)  # torch's current (default) stream waits for s via __dlpack__
    assert float(y.sum()) == 6.0 * (1 << 20)


# ------------------------------------------------ the storage under a zero-copy export
# resize_ reallocates a tensor's storage and frees the old memory; every zero-copy export
# of a CPU tensor makes the storage non-resizable first, as Tensor.numpy() does, so that
# resize_ raises instead of leaving the export over freed memory.
def _import_paths() -> dict[str, object]:
    from hurray_bridge import _shortcuts

    general = hb.convert.general  # type: ignore[attr-defined]  # the front's full path
    python = getattr(ht.to_hurray, "__wrapped__", ht.to_hurray)  # behind the compiled front
    paths: dict[str, object] = {
        "asarray": hb.asarray,
        "from_dlpack": hb.from_dlpack,  # torch's own capsule: the adapter's hold still runs
        "to_hurray (Python)": python,
        "torch round trip (Python)": lambda x: ht.from_hurray(python(x)),
    }
    fronts = {"python": _shortcuts.front(general, use_compiled=False)}
    if _shortcuts.compiled:
        fronts["compiled"] = hb.convert
    for kind, f in fronts.items():
        for to in ("numpy", "jax", "arrow"):
            paths[f"convert {to} ({kind} front)"] = (lambda x, f=f, to=to: f(x, to))
    return paths


@pytest.mark.parametrize("path", list(_import_paths()))
@pytest.mark.parametrize("view", ["whole", "slice"])
def test_a_zero_copy_export_makes_the_storage_non_resizable(path: str, view: str) -> None:
    if "jax" in path:
        pytest.importorskip("jax")
    if "arrow" in path:
        pytest.importorskip("pyarrow")
    to = _import_paths()[path]
    for _ in range(2):  # the second convert may take a learned shortcut
        base = torch.arange(1024, dtype=torch.float32)
        x = base if view == "whole" else base[16:]
        want = x.clone().numpy().tobytes()  # (x.numpy() would make x's storage non-resizable)
        out = to(x)  # type: ignore[operator]
        # (torch leaves the tensor with the new shape when its storage refuses.)
        for owner in (x, base) if x is not base else (x,):
            with pytest.raises(RuntimeError, match="resiz"):
                owner.resize_(10_000_000)
        got = hb.convert(out, "numpy") if not isinstance(out, np.ndarray) else out
        assert np.asarray(got).tobytes() == want


def test_a_copy_leaves_the_storage_resizable() -> None:
    x = torch.arange(8.0)
    t = hb.asarray(x, copy=True)
    x.resize_(10_000)  # nothing of x's memory was handed out
    assert hb.convert(t, "numpy").tolist() == list(range(8))


# x.set_(...) and x.data = ... swap the storage under a tensor object and drop the old
# one: an export must keep the storage alive, not only the tensor object, or it reads
# freed memory (a crash, or another allocation's values). Run in a child: a failure
# segfaults.
@pytest.mark.parametrize("swap", ["x.set_(torch.zeros(3))", "x.data = torch.zeros(3)"])
def test_an_export_survives_a_storage_swap_under_its_tensor(swap: str) -> None:
    code = textwrap.dedent("""
        import gc, sys, warnings
        import numpy as np
        import torch
        import hurray_bridge as hb
        from hurray_bridge import _shortcuts
        from hurray_bridge.adapters import torch as ht
        warnings.simplefilter("ignore")
        python = getattr(ht.to_hurray, "__wrapped__", ht.to_hurray)
        paths = {"asarray": hb.asarray, "to_hurray": ht.to_hurray,
                 "to_hurray (Python)": python}
        fronts = {"python": _shortcuts.front(hb.convert.general, use_compiled=False)}
        if _shortcuts.compiled:
            fronts["compiled"] = hb.convert
        for kind, f in fronts.items():
            for to in ("numpy", "jax", "arrow"):
                paths[f"convert {to} ({kind} front)"] = (lambda x, f=f, to=to: f(x, to))
        n = 1 << 20
        want = np.arange(n, dtype=np.float32)
        for name, to in paths.items():
            for attempt in range(2):  # the second convert may take a learned shortcut
                x = torch.arange(n, dtype=torch.float32)
                out = to(x)
                SWAP
                del x
                gc.collect()
                junk = [torch.full((n,), -1.0) for _ in range(8)]
                got = hb.convert(out, "numpy") if isinstance(out, hb.Tensor) else out
                assert np.array_equal(np.asarray(got), want), (name, attempt)
                del junk, out, got
            print("ok", name, flush=True)
    """).replace("SWAP", swap)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout[-1000:], r.stderr[-2000:])
    assert r.stdout.count("ok ") >= 6


# The compiled paths remember (weakly) the last tensors they found on a non-resizable
# storage and skip the storage read for them; these tests pin what that memory must never
# do: skip the mark for a storage that lacks it, or keep a tensor or its memory alive.
def _marking_paths() -> dict[str, Any]:
    python = getattr(ht.to_hurray, "__wrapped__", ht.to_hurray)
    return {"asarray": hb.asarray, "convert numpy": lambda x: hb.convert(x, "numpy"),
            "to_hurray (Python)": python}


def _assert_marked(x: Any) -> None:
    assert not x.untyped_storage().resizable()
    alias = x.detach()  # (a refused resize_ still leaves its tensor with the new shape)
    with pytest.raises(RuntimeError, match="resiz"):
        alias.resize_(10_000_000)


@pytest.mark.parametrize("path", list(_marking_paths()))
def test_repeated_hand_offs_of_one_tensor_stay_marked(path: str) -> None:
    to = _marking_paths()[path]
    x = torch.arange(1024, dtype=torch.float32)
    kept = [to(x) for _ in range(5)]
    _assert_marked(x)
    for view in (x[8:], x.view(32, 32).t()):  # other tensors over the same storage
        kept.append(to(view))
        _assert_marked(view)
    assert all(np.asarray(hb.convert(k, "numpy") if isinstance(k, Tensor) else k).size
               for k in kept)


@pytest.mark.parametrize("path", list(_marking_paths()))
def test_new_tensors_at_reused_addresses_are_marked(path: str) -> None:
    # Freed tensor objects and storages come back at the same addresses: each new storage
    # is resizable again and must be marked, whatever the last hand-off left behind.
    to = _marking_paths()[path]
    seen, reused = set(), 0
    for i in range(200):
        x = torch.full((1000,), float(i))
        assert x.untyped_storage().resizable()
        key = (id(x), x.data_ptr())
        reused += key in seen
        seen.add(key)
        out = to(x)
        _assert_marked(x)
        del x, out
    assert reused > 0, "no address came back: this allocator does not exercise the case"


@pytest.mark.parametrize("path", list(_marking_paths()))
@pytest.mark.parametrize("swap", ["set_", "data", "data twice"])
def test_a_storage_swapped_under_a_handed_off_tensor_is_marked(path: str, swap: str) -> None:
    to = _marking_paths()[path]
    x = torch.ones(1000)
    for i in range(20):
        to(x)
        to(x)
        _assert_marked(x)
        if swap == "set_":
            x.set_(torch.full((1000,), float(i)))
        elif swap == "data":
            x.data = torch.full((1000,), float(i))
        else:
            # The old storage is freed first, so the new one may take its address: the
            # same tensor object at the same data address, over a resizable storage.
            x.data = torch.empty(0)
            x.data = torch.full((1000,), float(i))
        assert x.untyped_storage().resizable()
        out = to(x)
        _assert_marked(x)
        assert np.asarray(hb.convert(out, "numpy") if isinstance(out, Tensor) else out)[0] == i


@pytest.mark.parametrize("path", list(_marking_paths()))
def test_the_hand_off_memory_keeps_no_tensor_alive(path: str) -> None:
    to = _marking_paths()[path]
    x = torch.ones(1000)
    to(x)
    to(x)  # the second finds it remembered
    tensor, storage = weakref.ref(x), weakref.ref(x.untyped_storage())
    del x
    gc.collect()
    assert tensor() is None and storage() is None


@pytest.mark.skipif(not ht.COMPILED_IMPORT, reason="the compiled import is not built here")
@pytest.mark.parametrize("path", ["asarray", "convert numpy"])
def test_a_remembered_tensor_skips_the_storage_read(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    to = _marking_paths()[path]
    reads = []
    read = torch.Tensor.untyped_storage

    def counted(self: Any) -> Any:
        reads.append(1)
        return read(self)

    monkeypatch.setattr(torch.Tensor, "untyped_storage", counted)
    x = torch.ones(1000)
    for _ in range(2):  # (the first convert may take the full path)
        to(x)
    n = len(reads)
    assert n >= 1
    for _ in range(3):
        to(x)
    assert len(reads) == n  # remembered: no storage read
    x.data = torch.ones(1000)  # another storage: read again, then remembered
    to(x)
    assert len(reads) == n + 1
    to(x)
    to(x)
    assert len(reads) == n + 1
    _assert_marked(x)
