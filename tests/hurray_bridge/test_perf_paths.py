"""The fast paths of issue 8 give exactly what the general paths give.

Every fast path here sits in front of a general one that stays in place: the
descriptor decoder's dense fast path (wire._decode_dense), the adapters' common
hand-offs (compact CPU memory of a whole-byte type), the JAX import through
jaxlib's own entry point, and Tensor's lazily built buffer table. Each test
compares the fast result with the general one (forced by an argument the fast
path does not take, or by switching the fast path off), including what a user
can observe: values, pointer, strides, read-only flags, lifetimes, errors.
"""

from __future__ import annotations

import gc
import importlib.util
import random
import warnings
import weakref
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hurray_bridge as hb
from hurray_bridge import wire
from hurray_bridge.layout import BufferRole, Layout
from tests.strategies import descriptors

np = pytest.importorskip("numpy", reason="numpy is not installed")

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None
HAS_ARROW = importlib.util.find_spec("pyarrow") is not None


# ------------------------------------------------------------------ descriptor decoding
def _general(data: Any, monkeypatch: pytest.MonkeyPatch, fn: Any) -> Any:
    """``fn(data)`` with the fast path switched off: the result, or the exception."""
    with monkeypatch.context() as m:
        m.setattr(wire, "_decode_dense", lambda data, n: None)  # compiled or not
        try:
            return fn(data)
        except Exception as exc:  # compared below, type and message
            return exc


def _same(a: Any, b: Any) -> None:
    if isinstance(b, Exception):
        assert type(a) is type(b) and str(a) == str(b)
        return
    assert a == b
    d_a = a if isinstance(a, hb.Descriptor) else a[0]
    d_b = b if isinstance(b, hb.Descriptor) else b[0]
    assert hash(d_a) == hash(d_b) and repr(d_a) == repr(d_b)
    for f in ("shape", "strides", "layout", "padded", "dtype"):
        assert type(getattr(d_a, f)) is type(getattr(d_b, f)), f
    if not d_a.is_dynamic:
        assert d_a.buffer_layout() == d_b.buffer_layout()
    if not isinstance(a, hb.Descriptor):
        assert [type(e.role) for e in a[1]] == [type(e.role) for e in b[1]]


def _compiled_equals_python(data: Any) -> None:
    """The compiled dense decoder (when built) answers as wire.py's Python one."""
    if wire._decode_dense is wire._decode_dense_python:
        return
    n = len(data) if not isinstance(data, memoryview) else data.nbytes
    for k in (n, n - 1, n + 1, 0):  # also the lengths a caller could get wrong
        py = wire._decode_dense_python(data, k) if 0 <= k <= n else None
        c = wire._decode_dense(data, k)
        if py is None or c is None:
            assert py is c, (bytes(data)[:48].hex(), k, py, c)
            continue
        assert c == py
        for f in ("shape", "strides", "layout", "padded", "dtype", "tile", "sparse",
                  "quantization", "shard"):
            assert type(getattr(c[0], f)) is type(getattr(py[0], f)), f
        assert all(type(v) is int for v in c[1:])


def _both(data: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _compiled_equals_python(data)
    for fn in (wire.decode, wire.decode_prefix):
        try:
            fast: Any = fn(data)
        except Exception as exc:
            fast = exc
        _same(fast, _general(data, monkeypatch, fn))


@FUZZ
@given(descriptors())
def test_fast_decode_equals_general_decode(d: hb.Descriptor) -> None:
    raw = d.to_bytes()
    mp = pytest.MonkeyPatch()
    try:
        for data in (raw, bytearray(raw), memoryview(raw), raw + b"\0" * 8):
            _both(data, mp)
    finally:
        mp.undo()


@FUZZ
@given(descriptors(), st.data())
def test_fast_decode_accepts_only_what_the_general_decoder_accepts(
    d: hb.Descriptor, data: st.DataObject
) -> None:
    raw = bytearray(d.to_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    mp = pytest.MonkeyPatch()
    try:
        _both(bytes(raw), mp)
    finally:
        mp.undo()


_EDGE_FIELDS = (
    # (offset, struct format, value): the header and the one buffer entry of a rank-2
    # row-major float32 descriptor (32-byte header, 2 shape words, entry at 48).
    (0, "<4s", b"HRYX"), (4, "<B", 2), (6, "<H", 4), (6, "<H", 1), (8, "<I", 65),
    (12, "<B", 200), (13, "<B", 2), (13, "<B", 3), (14, "<H", 2), (16, "<Q", 48),
    (24, "<Q", 1), (32, "<Q", 2**64 - 1), (32, "<Q", 2**40), (48, "<B", 2), (49, "<B", 1),
    (56, "<Q", 32), (64, "<Q", 0), (64, "<Q", 4 * 3 * 5 + 4),
)


@pytest.mark.parametrize(("offset", "fmt", "value"), _EDGE_FIELDS)
def test_fast_decode_edge_fields(offset: int, fmt: str, value: Any,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import struct

    raw = bytearray(hb.Descriptor([3, 5], hb.float32).to_bytes())
    assert len(raw) == 72
    struct.pack_into(fmt, raw, offset, value)
    _both(bytes(raw), monkeypatch)


@pytest.mark.parametrize("strides", [(5, 1), (-5, 1), (1, 3), (0, 0), (-(2**63), 1),
                                     (2**62, 2**62), (1, -1)])
@pytest.mark.parametrize("dtype", ["float32", "int4", "uint2"])
@pytest.mark.parametrize("padded", [False, True])
def test_fast_decode_strided(strides: tuple[int, int], dtype: str, padded: bool,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    import struct

    base = hb.Descriptor([3, 5], "int8", Layout.STRIDED, (5, 1))
    raw = bytearray(base.to_bytes())
    struct.pack_into("<2q", raw, 48, *strides)
    raw[12] = hb.dtypes.dtype_from_name(dtype).tag
    if padded:
        raw[6] |= 4
    for nbytes in (15, 16, 8, 45, 2**63):
        struct.pack_into("<Q", raw, 80, nbytes)  # the entry's length (entry at 64)
        _both(bytes(raw), monkeypatch)


def test_fast_decode_random_dense_descriptors(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(8)
    names = [d.name for d in hb.dtypes.all_dtypes()]
    for _ in range(2000):
        rank = rng.choice([0, 1, 2, 4, 7, 64])
        shape = [rng.choice([0, 1, 2, 3, 7, 2**20, 2**40]) for _ in range(rank)]
        name = rng.choice(names)
        dt = hb.dtypes.dtype_from_name(name)
        padded = dt.is_subbyte and rng.random() < 0.5
        try:
            if rank and rng.random() < 0.5 and (padded or not dt.is_subbyte):
                strides = [rng.choice([-3, -1, 0, 1, 2, 1000]) for _ in range(rank)]
                d = hb.Descriptor(shape, name, Layout.STRIDED, strides, padded=padded)
            else:
                d = hb.Descriptor(shape, name, padded=padded)
            raw = bytearray(d.to_bytes())
        except hb.FormatError:
            continue
        _both(bytes(raw), monkeypatch)
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        _both(bytes(raw), monkeypatch)


def test_descriptor_from_bytes_binds_the_codec_once() -> None:
    d = hb.Descriptor([2, 3], hb.bfloat16)
    assert hb.Descriptor.from_bytes(d.to_bytes()) == d
    from hurray_bridge import descriptor

    assert descriptor._codec.decode is wire.decode and descriptor._codec.encode is wire.encode


# --------------------------------------------------------------------- Tensor internals
@pytest.mark.parametrize(("shape", "strides"), [
    ((4, 5), None), ((4, 5), (-5, 1)), ((4, 5), (1, -4)), ((3, 0, 5), None), ((), None),
    ((2, 3), (0, 1)), ((6,), (-2,)),
])
def test_lazy_buffer_table(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> None:
    base = np.zeros(64, np.float32)
    ptr = base.ctypes.data + 32 * 4
    t = hb.Tensor._dense(ptr, shape, hb.float32, strides=strides, padded=False, device=hb.CPU,
                         owner=base, readonly=False, copied=False)
    n = int(np.prod(shape))
    (b,) = t.buffers
    assert type(b) is hb.Buffer and b.role is BufferRole.DATA
    assert (b.ptr, b.nbytes) == (t.buffers[0].ptr, t.nbytes)
    if n == 0:
        assert (b.ptr, b.nbytes, t.data_ptr) == (0, 0, 0)
        return
    assert t.data_ptr == ptr
    desc = t.descriptor
    assert b.nbytes == desc.nbytes
    # The same tensor through the validating constructor: same table, same data pointer.
    u = hb.Tensor(desc, [b], owner=base)
    assert u.buffers == t.buffers and u.data_ptr == t.data_ptr and u.nbytes == t.nbytes
    assert bytes(t.memoryview()) == bytes(u.memoryview())


def test_export_compact_strides_cache() -> None:
    for shape in [(2, 3), (3, 2), (2, 3), (4,), (), (1, 1, 7)]:
        a = np.arange(int(np.prod(shape)), dtype=np.int16).reshape(shape)
        b = np.from_dlpack(hb.asarray(a))
        assert b.shape == a.shape and b.strides == a.strides and np.array_equal(a, b)


def test_host_view_format_and_lifetime() -> None:
    from hurray_bridge._memory import host_view

    a = np.arange(10, dtype=np.uint8)
    v = host_view(a.ctypes.data, 10, a, readonly=True)
    assert v.format == "B" and v.readonly and bytes(v) == bytes(a)


# ------------------------------------------------------------------------ NumPy adapter
NP_TYPES = ["bool8", "int8", "uint16", "int32", "int64", "float16", "float32", "float64",
            "complex64", "bfloat16", "float8_e4m3fn"]


def _np_array(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    from hurray_bridge.adapters.numpy import native_dtype

    dt = native_dtype(hb.dtypes.dtype_from_name(dtype))
    n = int(np.prod(shape))
    return (np.arange(n) % 7).astype(np.float32).astype(dt).reshape(shape)


@pytest.mark.parametrize("dtype", NP_TYPES)
@pytest.mark.parametrize("shape", [(6,), (2, 3), (), (4, 1, 3)])
@pytest.mark.parametrize("readonly", [False, True])
def test_numpy_fast_paths_match_general(dtype: str, shape: tuple[int, ...],
                                        readonly: bool) -> None:
    from hurray_bridge.adapters import numpy as hn

    a = _np_array(dtype, shape)
    a.flags.writeable = not readonly
    t = hn.to_hurray(a)
    assert t.data_ptr == a.__array_interface__["data"][0] and t.readonly is readonly
    fast = hn.from_hurray(t)
    general = hn.from_hurray(t, device="cpu")  # the fast path takes device=None only
    for out in (fast, general):
        assert out.dtype == a.dtype and out.shape == a.shape and out.strides == a.strides
        assert out.__array_interface__["data"][0] == t.data_ptr
        assert out.tobytes() == a.tobytes()
    assert fast.flags.writeable == general.flags.writeable == (not readonly)
    if readonly:
        with pytest.raises(ValueError):
            fast.flags.writeable = True


def test_numpy_to_hurray_leaves_no_buffer_export() -> None:
    from hurray_bridge.adapters import numpy as hn

    a = np.zeros(16, np.float32)
    hn.to_hurray(a)
    a.resize(32, refcheck=False)  # raises while any buffer export of a is alive


def test_numpy_fast_path_keeps_the_source_alive() -> None:
    from hurray_bridge.adapters import numpy as hn

    class Owner:
        pass

    a = np.arange(8, dtype=np.float32)
    owner = Owner()
    t = hb.Tensor._dense(a.ctypes.data, (8,), hb.float32, strides=None, padded=False,
                         device=hb.CPU, owner=(a, owner), readonly=False, copied=False)
    ref = weakref.ref(owner)
    out = hn.from_hurray(t)
    del t, owner, a
    gc.collect()
    assert ref() is not None and out[3] == 3
    del out
    gc.collect()
    assert ref() is None


# ------------------------------------------------------------------------ torch adapter
TORCH_TYPES = ["bool8", "int8", "uint8", "int16", "uint16", "int32", "int64", "float16",
               "bfloat16", "float32", "float64", "complex64", "float8_e4m3fn", "float8_e5m2"]


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize("dtype", TORCH_TYPES)
@pytest.mark.parametrize("shape", [(6,), (2, 3), (), (4, 1, 3)])
@pytest.mark.parametrize("readonly", [False, True])
def test_torch_fast_path_matches_general(dtype: str, shape: tuple[int, ...],
                                         readonly: bool) -> None:
    import torch

    from hurray_bridge.adapters import torch as ht

    src = torch.ones(shape, dtype=ht.native_dtype(hb.dtypes.dtype_from_name(dtype)))
    t = ht.to_hurray(src)
    if readonly:
        t = hb.Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=None, padded=False,
                             device=hb.CPU, owner=t, readonly=True, copied=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fast = ht.from_hurray(t)
        general = ht.from_hurray(t, device="cpu")  # the fast path takes device=None only
    for out in (fast, general):
        assert out.dtype == src.dtype and out.shape == src.shape
        assert out.stride() == src.stride() and out.data_ptr() == src.data_ptr()
        assert out.untyped_storage().nbytes() == src.untyped_storage().nbytes()
        assert torch.equal(out.reshape(-1).view(torch.uint8), src.reshape(-1).view(torch.uint8))
    fast.reshape(-1).view(torch.uint8)[0] = 0  # writable, as torch's own DLPack import
    assert src.reshape(-1).view(torch.uint8)[0] == 0


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_torch_fast_path_lifetime_and_no_capsule() -> None:
    import torch

    from hurray_bridge import _capsule
    from hurray_bridge.adapters import torch as ht

    class Owner:
        pass

    a = np.arange(8, dtype=np.float32)
    owner = Owner()
    t = hb.Tensor._dense(a.ctypes.data, (2, 4), hb.float32, strides=None, padded=False,
                         device=hb.CPU, owner=(a, owner), readonly=False, copied=False)
    exports = _capsule.live_exports()
    ref = weakref.ref(owner)
    out = ht.from_hurray(t)
    assert _capsule.live_exports() == exports  # no capsule, so no ctypes deleter to call
    del t, owner, a
    gc.collect()
    assert ref() is not None and out[1, 2].item() == 6.0
    del out
    gc.collect()
    assert ref() is None
    # An exception in flight while the tensor dies: nothing to report (no ctypes callback).
    y = ht.from_hurray(hb.asarray(np.ones(4, np.float32)))
    with pytest.raises(TypeError):
        y + "x"  # type: ignore[operator]
    del y
    gc.collect()
    assert torch.ones(1).item() == 1.0


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_torch_readonly_warning_is_ours() -> None:
    from hurray_bridge.adapters import torch as ht

    a = np.ones(4, np.float32)
    a.flags.writeable = False
    t = hb.asarray(a)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ht._readonly_warned = False
        ht.from_hurray(t)
    msgs = [str(w.message) for w in seen]
    assert msgs == [ht._READONLY_MESSAGE]


# ------------------------------------------------------------------------ Arrow adapter
@pytest.mark.skipif(not HAS_ARROW, reason="needs pyarrow")
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "float16", "float32",
                                   "float64"])
def test_arrow_fast_paths_match_general(dtype: str) -> None:
    import pyarrow as pa

    from hurray_bridge.adapters import arrow as ha

    arr = pa.array(np.arange(10).astype(np.dtype(dtype))).slice(2, 6)
    fast_t = ha.to_hurray(arr)
    general_t = ha.to_hurray(pa.chunked_array([arr]))  # goes through the general path
    for t in (fast_t, general_t):
        assert t.data_ptr == arr.buffers()[1].address + 2 * arr.type.bit_width // 8
        assert t.shape == (6,) and t.readonly and not t.copied
    fast = ha.from_hurray(fast_t)
    general = ha.from_hurray(fast_t, kind="array")  # the fast path takes kind=None only
    assert fast.equals(general) and fast.equals(arr) and fast.type == general.type
    assert fast.buffers()[1].address == general.buffers()[1].address == fast_t.data_ptr
    assert fast.null_count == 0 and fast.offset == 0
    empty = ha.from_hurray(ha.to_hurray(pa.array([], pa.float32())))
    assert len(empty) == 0 and empty.type == pa.float32()


@pytest.mark.skipif(not HAS_ARROW, reason="needs pyarrow")
def test_arrow_fast_path_still_refuses_nulls() -> None:
    import pyarrow as pa

    with pytest.raises(hb.UnsupportedError, match="null"):
        hb.asarray(pa.array([1.0, None], pa.float32()))


# -------------------------------------------------------------------------- JAX adapter
@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool8", "float16"])
def test_jax_raw_import_matches_public_api(dtype: str) -> None:
    import jax.numpy as jnp

    from hurray_bridge.adapters import jax as hj

    a = _np_array(dtype, (4, 8))
    raw = np.empty(a.nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    b = raw[off : off + a.nbytes].view(a.dtype).reshape(a.shape)
    b[...] = a
    t = hb.asarray(b)
    fast = hj.from_hurray(t)
    public = jnp.from_dlpack(t)
    for y in (fast, public):
        assert y.unsafe_buffer_pointer() == b.ctypes.data
        assert y.dtype == public.dtype and y.shape == public.shape
        assert y.sharding == public.sharding and y.committed == public.committed
        assert y.weak_type == public.weak_type
        assert np.asarray(y).tobytes() == b.tobytes()


@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_jax_raw_import_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from hurray_bridge.adapters import jax as hj

    calls = []

    def changed_signature(*args: Any) -> Any:
        calls.append(args)
        raise TypeError("a jaxlib with another signature")

    monkeypatch.setattr(hj, "_RAW_IMPORT", changed_signature)
    a = hb.asarray(_aligned_f32(16))
    y = hj.from_hurray(a)
    assert calls and hj._RAW_IMPORT is None  # switched off for good, public API used
    assert y.unsafe_buffer_pointer() == a.data_ptr


@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_jax_raw_import_releases_the_producer() -> None:
    from hurray_bridge.adapters import jax as hj

    class Owner:
        pass

    a = _aligned_f32(16)
    owner = Owner()
    t = hb.Tensor._dense(a.ctypes.data, (16,), hb.float32, strides=None, padded=False,
                         device=hb.CPU, owner=(a, owner), readonly=False, copied=False)
    ref = weakref.ref(owner)
    y = hj.from_hurray(t)
    del t, owner
    gc.collect()
    assert ref() is not None and float(y[5]) == 5.0
    del y
    gc.collect()
    assert ref() is None


def _aligned_f32(n: int) -> np.ndarray:
    raw = np.empty(n * 4 + 64, np.uint8)
    off = -raw.ctypes.data % 64
    a = raw[off : off + n * 4].view(np.float32)
    a[...] = np.arange(n)
    return a


# ------------------------------------------------------------------------------ benchmarks
def test_benchmark_timing_helpers() -> None:
    from benchmarks._timing import compare, ratio

    a, b, r = compare("a", lambda: sum(range(50)), "b", lambda: sum(range(5)), rounds=3,
                      min_time=0.001)
    assert a.median_us > 0 and b.median_us > 0 and r > 0
    assert ratio(0.5, "<= 1.0")["met"] is True and ratio(1.5, "< 1.0")["met"] is False
    assert ratio(None, "<= 1.3")["met"] is None and ratio(2.0, "info")["met"] is None


@FUZZ
@given(st.binary(min_size=0, max_size=700), st.sampled_from([1, 2]), st.integers(0, 64))
def test_compiled_dense_decoder_on_random_bytes(tail: bytes, layout: int, rank: int) -> None:
    # A plausible header (magic, version, one buffer, a rank and layout) over random
    # bytes, so the checks past the header are reached, not only the magic test.
    import struct

    head = struct.pack("<4sBBHIBBHQQ", b"HRYD", 1, 0, 0, rank, tail[0] if tail else 7,
                       layout, 1, 32 + len(tail), 0)
    _compiled_equals_python(head + tail)
    _compiled_equals_python(bytearray(head + tail))


def test_compiled_dense_decoder_is_in_use_when_built() -> None:
    try:
        from hurray_bridge import _speedups
    except ImportError:
        pytest.skip("hurray_bridge._speedups was not built (no C compiler at install time)")
    assert wire._decode_dense is _speedups.decode_dense
    raw = hb.Descriptor([8, 64, 56, 56], hb.bfloat16).to_bytes()
    assert hb.Descriptor.from_bytes(raw) == wire._decode_dense_python(raw, len(raw))[0]


class _FakeCudaProducer:
    """Claims CUDA memory (host memory nobody dereferences) and records the stream asked."""

    def __init__(self) -> None:
        self.host = np.arange(8, dtype=np.float32)
        self.streams: list[Any] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> object:
        from hurray_bridge import _capsule

        self.streams.append(stream)
        return _capsule.make_capsule(
            data=self.host.ctypes.data, shape=(8,), strides=(1,), code=2, bits=32,
            device_type=2, device_id=0, flags=0, owner=self.host,
            versioned=max_version is not None)


class _FakeGpu:
    """A fake JAX CUDA backend and device, installed in adapters/jax/__init__.py: what the raw
    import asks of them (backend name, hardware id) and what it hands jaxlib ends up
    in ``seen``. The device names ``stream`` for external ready events."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, stream: int) -> None:
        from hurray_bridge import _capsule
        from hurray_bridge.adapters import jax as hj

        self.seen: dict[str, Any] = {}
        seen = self.seen

        class Device:
            def get_stream_for_external_ready_events(self) -> int:
                return stream

        self.device = device = Device()

        class Backend:
            def device_from_local_hardware_id(self, i: int) -> Any:
                seen["hardware id"] = i
                return device

        backend = Backend()
        real_get_backend = hj._xla_bridge.get_backend

        def get_backend(name: str) -> Any:
            if name != "cuda":
                return real_get_backend(name)
            seen["backend"] = name
            return backend

        def raw(capsule: Any, dev: Any, stream: Any, copy: Any, kind: int) -> str:
            name = capsule if isinstance(capsule, str) else _capsule.capsule_name(capsule)
            seen["raw"] = (name, dev, stream, copy, kind)
            return "imported"

        monkeypatch.setattr(hj._xla_bridge, "get_backend", get_backend)
        monkeypatch.setattr(hj, "_RAW_IMPORT", raw)
        monkeypatch.setattr(hj, "_raw_devices", {})


@pytest.mark.skipif(not HAS_JAX, reason="needs jax")
def test_jax_raw_import_on_a_gpu_makes_jaxs_own_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: a fake backend and device record what the raw import asks. It must
    # make jnp.from_dlpack's calls with its arguments: the device's stream for external
    # ready events, that stream to the producer, then jaxlib with (capsule, device,
    # stream, copy=None, kDLCUDA).
    from hurray_bridge.adapters import jax as hj

    gpu = _FakeGpu(monkeypatch, stream=1234)
    producer = _FakeCudaProducer()
    t = hb.from_dlpack(producer)
    producer.streams.clear()
    assert hj._import(t) == "imported"
    assert gpu.seen == {"backend": "cuda", "hardware id": 0,
                        "raw": ("dltensor", gpu.device, 1234, None, 2)}
    assert producer.streams == [1234]  # the producer synchronised with JAX's stream

    # A device that cannot name its stream: the public API decides, as before.
    public: list[Any] = []

    def no_stream() -> int:
        raise RuntimeError("UNIMPLEMENTED")

    monkeypatch.setattr(gpu.device, "get_stream_for_external_ready_events", no_stream)
    monkeypatch.setattr(hj.jnp, "from_dlpack", lambda src: public.append(src) or "public")
    assert hj._import(t) == "public" and public == [t]


@pytest.mark.skipif(not (HAS_JAX and HAS_TORCH), reason="needs jax and torch")
def test_torch_to_jax_shortcut_on_a_gpu_makes_jaxs_own_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The shortcut's CUDA branch, with a stand-in for a CUDA torch tensor (torch here
    # has no CUDA) and the fake backend: JAX's stream for external ready events goes to
    # torch's __dlpack__, then jaxlib gets (capsule, the device of the tensor's index,
    # that stream, copy=None, kDLCUDA).
    import torch

    from hurray_bridge import _shortcuts
    from hurray_bridge.adapters import jax as hj

    gpu = _FakeGpu(monkeypatch, stream=77)

    class CudaTensor:  # what the shortcut asks of a torch.Tensor
        dtype = torch.float32
        requires_grad = False
        ndim = 2
        is_cpu = False
        is_cuda = True
        shape = (2, 3)

        def __init__(self, strides: tuple[int, ...]) -> None:
            self.strides = strides
            self.streams: list[Any] = []

        def is_neg(self) -> bool:
            return False

        def is_conj(self) -> bool:
            return False

        def is_contiguous(self) -> bool:
            return self.strides == (3, 1)

        def stride(self) -> tuple[int, ...]:
            return self.strides

        def get_device(self) -> int:
            return 1

        def __dlpack__(self, stream: Any = None) -> str:
            self.streams.append(stream)
            return "capsule"

    # torch's fast import of raw memory composed with JAX's fast export of it.
    fn = _shortcuts.maker(torch.Tensor, "torch", "jax")[0]  # type: ignore[index]
    for strides in ((3, 1), (1, 2)):  # row-major and transposed
        x = CudaTensor(strides)
        assert fn(x) == "imported"
        assert gpu.seen == {"backend": "cuda", "hardware id": 1,
                            "raw": ("capsule", gpu.device, 77, None, 2)}
        assert x.streams == [77]  # torch ordered its work before JAX's stream
        gpu.seen.clear()
        monkeypatch.setattr(hj, "_raw_devices", {})
    # Strides JAX refuses: declined, so the full path refuses in its own words.
    x = CudaTensor((6, 2))
    assert fn(x) is NotImplemented and x.streams == []
    # The raw import switched off (a jaxlib whose signature changed): declined.
    monkeypatch.setattr(hj, "_RAW_IMPORT", None)
    x = CudaTensor((3, 1))
    assert fn(x) is NotImplemented and x.streams == []


def test_dense_decoder_reads_a_buffer_that_changes_underneath_consistently() -> None:
    # Shared memory or a file map can change while it is decoded. Another process
    # flips a shape word between 4 and 2**40 as fast as it can; every descriptor the
    # fast path accepts must agree with its own buffer entry (the first compiled
    # version read the shape four times and returned 2**40 with a 16-byte buffer).
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import multiprocessing as mp, struct, sys, time
        from multiprocessing import shared_memory
        import hurray_bridge as hb
        from hurray_bridge import wire

        good = hb.Descriptor([4], hb.float32).to_bytes()
        a = good[32:40]
        b = struct.pack("<Q", 2**40)

        def writer(name, stop):
            shm = shared_memory.SharedMemory(name=name)
            buf = shm.buf
            while not stop.is_set():
                for _ in range(10000):
                    buf[32:40] = b
                    buf[32:40] = a
            del buf
            shm.close()

        if __name__ == "__main__":
            shm = shared_memory.SharedMemory(create=True, size=len(good))
            shm.buf[:len(good)] = good
            stop = mp.Event()
            p = mp.Process(target=writer, args=(shm.name, stop))
            p.start()
            view = shm.buf[:len(good)]
            n, bad, accepted, t0 = len(good), 0, 0, time.time()
            while time.time() - t0 < 2.0:
                r = wire._decode_dense(view, n)
                if r is not None:
                    accepted += 1
                    bad += r[0].nbytes != r[2]
            stop.set()
            p.join()
            del view
            shm.close()
            shm.unlink()
            print(accepted, bad)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    accepted, bad = map(int, out.stdout.split())
    assert accepted > 0 and bad == 0
