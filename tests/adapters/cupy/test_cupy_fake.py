"""CuPy on a machine without CuPy or a GPU: what the CPU suite can check.

Three parts:

1. ``hb.get_adapter("cupy")`` without CuPy names the extra to install.
2. The core's handling of CUDA producers, with :class:`tests.producers.FakeCUDAProducer`
   (a producer at an address that is never dereferenced): device, pointer,
   the stream the bridge asks for on import (-1) and the consumer's stream it
   forwards on export, what it refuses to do with device memory.
3. ``adapters/cupy/__init__.py`` itself, imported over a small fake ``cupy`` module that
   records what the adapter asks of CuPy (streams, devices, copies). Real CuPy
   behaviour is covered by ``gpu_tests/``; these tests pin the adapter's logic.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import sys
import types
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule
from hurray_bridge.descriptor import compact_strides
from hurray_bridge.dtypes import dtype_from_dlpack
from hurray_bridge.layout import BufferRole
from hurray_bridge.tensor import Tensor
from tests.producers import FAKE_CUDA_ADDRESS, FakeCUDAProducer

np = pytest.importorskip("numpy", reason="numpy is not installed")

CUPY_INSTALLED = importlib.util.find_spec("cupy") is not None
CUDA = hb.Device(2, 0)


# --------------------------------------------------------------- 1. not installed
@pytest.mark.skipif(CUPY_INSTALLED, reason="CuPy is installed here (gpu_tests/ cover it)")
def test_get_adapter_without_cupy_names_the_extra() -> None:
    with pytest.raises(hb.BackendNotAvailableError) as info:
        hb.get_adapter("cupy")
    err = info.value
    assert err.framework == "cupy"
    assert err.extra == "cupy"
    assert "pip install 'hurray-bridge[cupy]'" in str(err)
    assert "hurray-bridge[cupy-cuda13]" in str(err)  # the other CUDA major's wheel
    assert isinstance(err, ImportError)
    assert "hurray_bridge.adapters.cupy" not in sys.modules


@pytest.mark.skipif(CUPY_INSTALLED, reason="CuPy is installed here (gpu_tests/ cover it)")
def test_convert_to_cupy_without_cupy_raises_before_touching_data() -> None:
    with pytest.raises(hb.BackendNotAvailableError, match=r"hurray-bridge\[cupy\]"):
        hb.convert(np.arange(3.0), "cupy")


# ------------------------------------------------------------ 2. fake CUDA producer
def test_import_reports_cuda_device_and_fake_pointer() -> None:
    p = FakeCUDAProducer((4, 3), hb.float32)
    t = hb.from_dlpack(p)
    assert t.device == CUDA
    assert str(t.device) == "cuda:0"
    assert t.__dlpack_device__() == (2, 0)
    assert t.data_ptr == FAKE_CUDA_ADDRESS
    assert t.buffers == (hb.Buffer(BufferRole.DATA, FAKE_CUDA_ADDRESS, 4 * 3 * 4),)
    assert (t.shape, t.dtype, t.strides) == ((4, 3), hb.float32, None)
    assert not t.device.is_host_accessible
    assert t.readonly is False and t.copied is False


def test_import_asks_for_no_synchronisation() -> None:
    # The bridge reads no device memory, so it asks the producer not to sync (-1) and
    # for the newest capsule it reads.
    p = FakeCUDAProducer()
    hb.from_dlpack(p)
    assert p.calls == [{"stream": -1, "max_version": (1, 3), "dl_device": None, "copy": None}]


def test_asarray_of_unknown_cuda_producer_goes_through_dlpack() -> None:
    p = FakeCUDAProducer((2, 5), hb.int16)
    t = hb.asarray(p)
    assert t.device == CUDA and t.data_ptr == FAKE_CUDA_ADDRESS
    assert p.calls[0]["stream"] == -1


@pytest.mark.parametrize("stream", [1, 2, 7, 0x7F00_1234_5600])
def test_export_forwards_consumer_stream_to_producer(stream: int) -> None:
    # The stream design: a consumer's stream reaches the producer, which makes that
    # stream wait for its own work. The bridge never syncs by itself.
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    capsule = t.__dlpack__(stream=stream, max_version=(1, 0))
    assert p.last_call == {"stream": stream, "max_version": (1, 0), "dl_device": None,
                           "copy": None}
    assert _capsule.capsule_name(capsule) == "dltensor_versioned"
    view = _capsule.consume_capsule(capsule)
    assert view.data == FAKE_CUDA_ADDRESS
    assert (view.device_type, view.device_id) == (2, 0)
    assert view.shape == (4, 3)


def test_export_legacy_request_forwards_stream_only() -> None:
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    capsule = t.__dlpack__(stream=5)
    assert p.last_call == {"stream": 5, "max_version": None, "dl_device": None, "copy": None}
    assert _capsule.capsule_name(capsule) == "dltensor"


def test_export_without_stream_forwards_none() -> None:
    # None means "the legacy default stream" to a CUDA producer; the bridge passes it on.
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    t.__dlpack__(max_version=(1, 3))
    assert p.last_call["stream"] is None


def test_each_export_is_a_fresh_request() -> None:
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    for s in (3, 4, 5):
        _capsule.consume_capsule(t.__dlpack__(stream=s, max_version=(1, 0)))
    assert [c["stream"] for c in p.calls] == [-1, 3, 4, 5]


def test_cuda_tensor_is_never_dereferenced_on_the_host() -> None:
    t = hb.from_dlpack(FakeCUDAProducer())
    with pytest.raises(hb.UnsupportedError, match="cuda:0"):
        t.copy()
    with pytest.raises(hb.UnsupportedError, match="cuda:0"):
        t.memoryview()
    with pytest.raises(hb.UnsupportedError):
        hb.from_dlpack(FakeCUDAProducer(), copy=True)  # a copy would read device memory


def test_export_to_cpu_with_copy_false_is_forwarded_and_refused() -> None:
    # tensor.py forwards every export of a device tensor that has a source, dl_device
    # included: the producer decides, and a CUDA producer refuses a host copy under
    # copy=False (BufferError; CopyRequiredError is a BufferError too).
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    with pytest.raises(BufferError, match="copy=False"):
        t.__dlpack__(stream=None, max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert p.last_call == {"stream": None, "max_version": (1, 0), "dl_device": (1, 0),
                           "copy": False}


def test_export_to_own_device_is_forwarded() -> None:
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    _capsule.consume_capsule(t.__dlpack__(stream=9, max_version=(1, 0), dl_device=(2, 0)))
    assert p.last_call["dl_device"] == (2, 0) and p.last_call["stream"] == 9


def _sourceless_cuda_tensor(shape: tuple[int, ...] = (4, 3)) -> Tensor:
    # A CUDA tensor the bridge did not import from a producer (no one to forward to).
    return Tensor._dense(FAKE_CUDA_ADDRESS, shape, hb.float32, strides=None, padded=False,
                         device=CUDA, owner=object(), readonly=False, copied=False)


def test_sourceless_cuda_tensor_refuses_host_export_with_copy_false() -> None:
    t = _sourceless_cuda_tensor()
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    with pytest.raises(hb.UnsupportedError, match="does not move data between devices"):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 0))


def test_sourceless_cuda_tensor_exports_its_own_capsule_without_touching_memory() -> None:
    t = _sourceless_cuda_tensor()
    view = _capsule.consume_capsule(t.__dlpack__(stream=7, max_version=(1, 0)))
    assert view.data == FAKE_CUDA_ADDRESS and (view.device_type, view.device_id) == (2, 0)


def test_numpy_refuses_cuda_memory_under_copy_false() -> None:
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    with pytest.raises(hb.CopyRequiredError, match="cuda:0"):
        hb.convert(t, "numpy", copy=False)
    n = len(p.calls)
    # copy=None: NumPy asks the producer for a host copy (the fake has none to give).
    with pytest.raises(BufferError):
        hb.convert(t, "numpy")
    assert p.calls[n]["dl_device"] == (1, 0) and p.calls[n]["copy"] is True


@pytest.mark.parametrize("shape", [(0,), (3, 0, 5), (0, 0)])
def test_empty_cuda_tensor_has_null_pointer_and_no_bytes(shape: tuple[int, ...]) -> None:
    # The producer hands a real-looking address; an empty tensor still has none in Hurray.
    t = hb.from_dlpack(FakeCUDAProducer(shape, hb.float64))
    assert t.shape == shape and t.device == CUDA
    assert t.data_ptr == 0 and t.nbytes == 0
    assert t.buffers == (hb.Buffer(BufferRole.DATA, 0, 0),)
    assert t.descriptor.is_empty


def test_rank0_cuda_tensor() -> None:
    t = hb.from_dlpack(FakeCUDAProducer((), hb.complex128))
    assert t.shape == () and t.nbytes == 16 and t.data_ptr == FAKE_CUDA_ADDRESS


def test_strided_cuda_tensor_spans_without_dereferencing() -> None:
    # A transposed 3x4 view of 4x3 float32 memory.
    t = hb.from_dlpack(FakeCUDAProducer((3, 4), hb.float32, strides=(1, 3)))
    assert t.strides == (1, 3)
    assert t.data_ptr == FAKE_CUDA_ADDRESS
    assert t.buffers[0].nbytes == 12 * 4


def test_negative_strides_cuda_tensor_starts_before_element_zero() -> None:
    t = hb.from_dlpack(FakeCUDAProducer((5,), hb.int32, strides=(-1,)))
    assert t.data_ptr == FAKE_CUDA_ADDRESS
    assert t.buffers[0].ptr == FAKE_CUDA_ADDRESS - 4 * 4


def test_readonly_flag_from_cuda_producer() -> None:
    t = hb.from_dlpack(FakeCUDAProducer(readonly=True))
    assert t.readonly


def test_producer_deleter_runs_once_after_last_consumer() -> None:
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    capsule = t.__dlpack__(stream=3, max_version=(1, 0))  # forwarded: the producer's own
    view = _capsule.consume_capsule(capsule)
    del capsule
    gc.collect()
    assert p.exported == 2 and p.released == 0
    del t
    gc.collect()
    assert p.released == 1  # the bridge's own import
    del view
    gc.collect()
    assert p.released == 2


# ------------------------------------------------------------------ 3. fake cupy
class _State:
    def __init__(self) -> None:
        self.device = 0
        self.stream_ptr = 0  # CuPy's "null" stream
        self.log: list[tuple[Any, ...]] = []
        self.bfloat16: Any = None
        self.next_address = 0x7E00_0000_0000


class _FakeEvent:
    def __init__(self, stream: _FakeStream) -> None:
        self.stream = stream


class _FakeStream:
    def __init__(self, state: _State, ptr: int) -> None:
        self._state = state
        self.ptr = ptr

    def record(self) -> _FakeEvent:
        self._state.log.append(("record", self.ptr))
        return _FakeEvent(self)

    def wait_event(self, event: _FakeEvent) -> None:
        self._state.log.append(("wait", self.ptr, event.stream.ptr))

    def __enter__(self) -> _FakeStream:
        self._saved = self._state.stream_ptr
        self._state.stream_ptr = self.ptr
        return self

    def __exit__(self, *exc: object) -> None:
        self._state.stream_ptr = self._saved


def _fake_cupy(state: _State) -> dict[str, types.ModuleType]:
    """A ``cupy`` with just the surface adapters/cupy/__init__.py uses, recording every request."""
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    runtime = types.ModuleType("cupy.cuda.runtime")
    core = types.ModuleType("cupy._core")
    core_dlpack = types.ModuleType("cupy._core.dlpack")
    core_dlpack.bfloat16 = state.bfloat16  # type: ignore[attr-defined]
    core.dlpack = core_dlpack  # type: ignore[attr-defined]

    class Device:
        def __init__(self, device: int | None = None) -> None:
            self.id = state.device if device is None else int(device)

        def __enter__(self) -> Device:
            self._saved = state.device
            state.device = self.id
            return self

        def __exit__(self, *exc: object) -> None:
            state.device = self._saved

    class _Data:
        def __init__(self, ptr: int) -> None:
            self.ptr = ptr

    class ndarray:
        def __init__(self, shape: tuple[int, ...], dtype: Any, ptr: int, device: int,
                     strides: tuple[int, ...] | None = None, owner: object = None,
                     host: np.ndarray | None = None) -> None:
            self.shape = tuple(shape)
            self.dtype = np.dtype(dtype)
            self.data = _Data(ptr)
            self._device = device
            self._strides = strides
            self._owner = owner
            self.host = host  # the values, for arrays made from host memory
            self.calls: list[dict[str, Any]] = []

        @property
        def device(self) -> Device:
            return Device(self._device)

        def copy(self) -> ndarray:
            state.log.append(("copy", self._device, state.device))
            addr = state.next_address
            state.next_address += 0x100_0000
            return ndarray(self.shape, self.dtype, addr, state.device, host=self.host)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, self._device)

        def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                       dl_device: Any = None, copy: Any = None) -> object:
            self.calls.append({"stream": stream, "max_version": max_version,
                               "dl_device": dl_device, "copy": copy})
            if self.dtype.kind not in "biufc" and self.dtype.name != "bfloat16":
                raise BufferError("dtype is not supported for dlpack export")
            code, bits = hb.get_adapter("numpy").dtype_of(self.dtype).dlpack
            strides = self._strides
            if strides is None:
                strides = compact_strides(self.shape)
            return _capsule.make_capsule(
                data=self.data.ptr, shape=self.shape, strides=strides, code=code, bits=bits,
                device_type=2, device_id=self._device, flags=0, owner=self,
                versioned=max_version is not None and max_version[0] >= 1)

    def from_dlpack(obj: Any) -> ndarray:
        if hasattr(obj, "__dlpack_device__"):
            dev_type, _dev_id = obj.__dlpack_device__()
            if dev_type not in (2, 13):
                raise TypeError("CPU arrays cannot be directly imported to CuPy.")
            stream = state.stream_ptr or 1  # CuPy: legacy default stream when none is set
            state.log.append(("from_dlpack", stream))
            capsule = obj.__dlpack__(stream=stream, max_version=(1, 0))
        else:
            state.log.append(("from_dlpack", "capsule"))
            capsule = obj
        view = _capsule.consume_capsule(capsule)
        dt = hb.get_adapter("numpy").native_dtype(dtype_from_dlpack(view.code, view.bits))
        return ndarray(view.shape, dt, view.data, view.device_id, strides=view.strides,
                       owner=view.owner)

    def array(obj: Any, copy: bool = True) -> ndarray:
        host = np.array(obj, copy=True)
        state.log.append(("h2d", state.device, host.shape, str(host.dtype)))
        addr = state.next_address if host.size else 0
        state.next_address += 0x100_0000
        return ndarray(host.shape, host.dtype, addr, state.device, host=host)

    cuda.Device = Device  # type: ignore[attr-defined]
    cuda.Stream = lambda non_blocking=False: _FakeStream(state, 0x5000)  # type: ignore[attr-defined]
    cuda.get_current_stream = lambda: _FakeStream(state, state.stream_ptr)  # type: ignore[attr-defined]
    cuda.runtime = runtime  # type: ignore[attr-defined]
    runtime.getDevice = lambda: state.device  # type: ignore[attr-defined]
    cupy.cuda = cuda  # type: ignore[attr-defined]
    cupy._core = core  # type: ignore[attr-defined]
    cupy.ndarray = ndarray  # type: ignore[attr-defined]
    cupy.from_dlpack = from_dlpack  # type: ignore[attr-defined]
    cupy.array = array  # type: ignore[attr-defined]
    ndarray.__module__ = "cupy"  # hb.asarray routes objects by their type's module
    return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy._core": core,
            "cupy._core.dlpack": core_dlpack}


_ADAPTER = "hurray_bridge.adapters.cupy"


@pytest.fixture
def fake() -> Iterator[tuple[Any, types.ModuleType, _State]]:
    """(adapter module, fake cupy, its state), with the fake installed only for one test."""
    if CUPY_INSTALLED:
        pytest.skip("real CuPy is installed: gpu_tests/ exercise the adapter on it")
    state = _State()
    mods = _fake_cupy(state)
    saved = {k: sys.modules.get(k) for k in (*mods, _ADAPTER)}
    sys.modules.update(mods)
    sys.modules.pop(_ADAPTER, None)
    try:
        adapter = importlib.import_module(_ADAPTER)
        yield adapter, mods["cupy"], state
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        pkg = sys.modules.get("hurray_bridge.adapters")
        if pkg is not None and hasattr(pkg, "cupy"):
            delattr(pkg, "cupy")


def _fake_array(cupy: Any, shape: tuple[int, ...] = (4, 3), dtype: Any = np.float32,
                device: int = 0) -> Any:
    return cupy.ndarray(shape, dtype, FAKE_CUDA_ADDRESS, device)


def test_fake_adapter_module_contract(fake: Any) -> None:
    adapter, _, _ = fake
    assert adapter.NAME == "cupy"
    assert {"to_hurray", "from_hurray"} <= set(adapter.__all__)
    assert hb.get_adapter("cupy") is adapter


def test_fake_dtype_table_derives_from_numpy_column(fake: Any) -> None:
    adapter, _, _ = fake
    table = adapter._tables()[0]
    # The table's Tier 1 types CuPy's DLPack reads; bfloat16 is off (fake CuPy says so).
    assert set(table) == {d for d in hb.dtypes.all_dtypes()
                          if d.tier == hb.dtypes.Tier.ONE and d.name != "bfloat16"}
    for d, npdt in table.items():
        assert npdt == hb.get_adapter("numpy").native_dtype(d)
        assert adapter.dtype_of(npdt) is d


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn", "int4",
                                  "uint2", "bool"])
def test_fake_unsupported_dtype_names_type_and_cupy(fake: Any, name: str) -> None:
    adapter, _, _ = fake
    with pytest.raises(hb.UnsupportedError, match=rf"CuPy has no dtype for {name}\b"):
        adapter.native_dtype(hb.dtypes.dtype_from_name(name))


def test_fake_bfloat16_needs_cupy_support(fake: Any) -> None:
    adapter, _, _ = fake
    with pytest.raises(hb.UnsupportedError, match="ml_dtypes"):
        adapter.native_dtype(hb.bfloat16)


def test_fake_bfloat16_when_cupy_enables_it(fake: Any) -> None:
    adapter, cupy, _ = fake
    ml_dtypes = pytest.importorskip("ml_dtypes")
    sys.modules["cupy._core.dlpack"].bfloat16 = ml_dtypes.bfloat16  # type: ignore[attr-defined]
    adapter._tables.cache_clear()
    try:
        assert adapter.native_dtype(hb.bfloat16) == np.dtype(ml_dtypes.bfloat16)
        t = adapter.to_hurray(_fake_array(cupy, (2, 2), ml_dtypes.bfloat16))
        assert t.dtype is hb.bfloat16
    finally:
        adapter._tables.cache_clear()


def test_fake_to_hurray_is_zero_copy_and_keeps_source(fake: Any) -> None:
    _adapter, cupy, _ = fake
    x = _fake_array(cupy, (4, 3), np.int64)
    t = hb.asarray(x)
    assert t.device == CUDA and t.data_ptr == FAKE_CUDA_ADDRESS
    assert (t.shape, t.dtype, t.copied) == ((4, 3), hb.int64, False)
    assert x.calls[0]["stream"] == -1  # no sync on import
    # A consumer's stream reaches the CuPy array.
    _capsule.consume_capsule(t.__dlpack__(stream=0x1234, max_version=(1, 0)))
    assert x.calls[-1]["stream"] == 0x1234


def test_fake_to_hurray_copy_true_copies_on_the_arrays_device(fake: Any) -> None:
    adapter, cupy, state = fake
    x = _fake_array(cupy, (4, 3), np.float32, device=1)
    t = adapter.to_hurray(x, copy=True)
    assert t.copied and t.data_ptr != FAKE_CUDA_ADDRESS
    assert t.device == hb.Device(2, 1)
    assert ("copy", 1, 1) in state.log  # made while device 1 was current
    assert state.device == 0


def test_fake_to_hurray_sends_sparse_matrices_to_the_sparse_route(fake: Any) -> None:
    adapter, _, _ = fake
    csr = type("csr_matrix", (), {"__module__": "cupyx.scipy.sparse._csr"})()
    with pytest.raises(hb.UnsupportedError, match=r"hurray_bridge\.sparse"):
        adapter.to_hurray(csr)


def test_fake_to_hurray_rejects_non_arrays_and_odd_dtypes(fake: Any) -> None:
    adapter, cupy, _ = fake
    with pytest.raises(hb.UnsupportedError, match=r"cupy\.ndarray"):
        adapter.to_hurray([1, 2, 3])
    with pytest.raises(hb.UnsupportedError, match="no Hurray element type"):
        adapter.to_hurray(_fake_array(cupy, (2,), np.dtype("V4")))


def test_fake_from_hurray_passes_cupys_stream_to_the_producer(fake: Any) -> None:
    adapter, _cupy, state = fake
    p = FakeCUDAProducer((4, 3), hb.float32)
    t = hb.from_dlpack(p)
    y = adapter.from_hurray(t)
    assert y.data.ptr == FAKE_CUDA_ADDRESS and y.shape == (4, 3)
    assert y.dtype == np.float32
    assert p.last_call == {"stream": 1, "max_version": (1, 0), "dl_device": None, "copy": None}
    with _FakeStream(state, 0xABC0):
        adapter.from_hurray(t)
    assert p.last_call["stream"] == 0xABC0


def test_fake_per_thread_default_stream_uses_a_relay_stream(fake: Any) -> None:
    # Under CuPy's per-thread default stream CuPy would pass stream=2, which torch
    # refuses. The adapter passes a real stream and orders the per-thread one after it.
    adapter, _cupy, state = fake
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    with _FakeStream(state, 2):
        y = adapter.from_hurray(t)
    assert y.data.ptr == FAKE_CUDA_ADDRESS
    relay = p.last_call["stream"]
    assert relay not in (None, -1, 0, 1, 2)
    # After the producer was asked (it enqueues its wait on the relay stream), an event
    # on the relay stream is recorded and the per-thread stream waits for it.
    assert state.log[-3:] == [("record", relay), ("wait", 2, relay), ("from_dlpack", "capsule")]


def test_fake_from_hurray_copy_true(fake: Any) -> None:
    adapter, _, state = fake
    t = hb.from_dlpack(FakeCUDAProducer())
    y = adapter.from_hurray(t, copy=True)
    assert y.data.ptr != FAKE_CUDA_ADDRESS
    assert state.log[-1] == ("copy", 0, 0)


@pytest.mark.parametrize("device", [0, "cuda", "cuda:0", (2, 0), hb.Device(2, 0)])
def test_fake_from_hurray_same_device_is_zero_copy(fake: Any, device: Any) -> None:
    adapter, _, _ = fake
    t = hb.from_dlpack(FakeCUDAProducer())
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        y = adapter.from_hurray(t, device=device, copy=False)
    assert y.data.ptr == FAKE_CUDA_ADDRESS


def test_fake_from_hurray_cupy_device_object(fake: Any) -> None:
    adapter, cupy, _ = fake
    t = hb.from_dlpack(FakeCUDAProducer())
    y = adapter.from_hurray(t, device=cupy.cuda.Device(0))
    assert y.data.ptr == FAKE_CUDA_ADDRESS


def test_fake_from_hurray_other_device_copies_and_says_so(fake: Any) -> None:
    adapter, cupy, state = fake
    p = FakeCUDAProducer()
    t = hb.from_dlpack(p)
    with pytest.raises(hb.CopyRequiredError, match=r"cuda:0 and device=cuda:1.*copy=False"):
        adapter.from_hurray(t, device=1, copy=False)
    with pytest.warns(hb.CopyWarning, match="cuda:0 to cuda:1"):
        y = adapter.from_hurray(t, device=cupy.cuda.Device(1))
    assert y.device.id == 1 and y.data.ptr != FAKE_CUDA_ADDRESS
    assert ("copy", 0, 1) in state.log  # imported on 0, copied while 1 was current
    assert state.device == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        adapter.from_hurray(t, device="cuda:1", copy=True)  # asked for: no warning


@pytest.mark.parametrize("device", ["cpu", (1, 0), hb.CPU, "cuda:x", 1.5, True])
def test_fake_from_hurray_rejects_non_cuda_devices(fake: Any, device: Any) -> None:
    adapter, _, _ = fake
    t = hb.from_dlpack(FakeCUDAProducer())
    with pytest.raises(hb.UnsupportedError, match="CUDA devices"):
        adapter.from_hurray(t, device=device)


def test_fake_host_tensor_is_copied_to_the_gpu_and_reported(fake: Any) -> None:
    adapter, _, state = fake
    a = np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2]  # a strided host view
    t = hb.asarray(a)
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        adapter.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="copied for cupy"):
        y = adapter.from_hurray(t)
    assert state.log[-1] == ("h2d", 0, (3, 2), "int32")
    np.testing.assert_array_equal(y.host, a)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        y2 = adapter.from_hurray(t, copy=True, device=1)
    assert y2.device.id == 1 and state.device == 0
    assert hb.convert(a, "cupy", copy=True).host.tolist() == a.tolist()


def test_fake_host_empty_tensor(fake: Any) -> None:
    adapter, _, _ = fake
    t = hb.asarray(np.empty((3, 0, 5), np.float32))
    y = adapter.from_hurray(t, copy=True)
    assert y.shape == (3, 0, 5) and y.data.ptr == 0


@pytest.mark.parametrize("shape", [(0,), (3, 0, 5)])
def test_fake_empty_cuda_tensor_reaches_cupy_with_null_pointer(fake: Any,
                                                               shape: tuple[int, ...]) -> None:
    adapter, _, _ = fake
    t = hb.from_dlpack(FakeCUDAProducer(shape))
    y = adapter.from_hurray(t)
    assert y.shape == shape and y.data.ptr == 0


def test_fake_from_hurray_unsupported_dtype_before_any_exchange(fake: Any) -> None:
    adapter, _, _ = fake
    p = FakeCUDAProducer((4,), hb.float8_e4m3fn)
    t = hb.from_dlpack(p)
    n = len(p.calls)
    with pytest.raises(hb.UnsupportedError, match="float8_e4m3fn"):
        adapter.from_hurray(t)
    assert len(p.calls) == n


def test_fake_from_hurray_refuses_sparse_tensor(fake: Any) -> None:
    adapter, _, _ = fake
    d = hb.Descriptor([3, 4], hb.float32, layout=hb.Layout.CSR, sparse=hb.Sparse(0))
    bufs = [(s.role, FAKE_CUDA_ADDRESS + 0x1000 * i if s.nbytes else 0, s.nbytes)
            for i, s in enumerate(d.buffer_layout())]
    t = Tensor(d, bufs, device=CUDA, owner=object())
    with pytest.raises(hb.UnsupportedError, match="CSR"):
        adapter.from_hurray(t)


def test_fake_cupy_to_cupy_roundtrip_shares_memory(fake: Any) -> None:
    _adapter, cupy, _ = fake
    x = _fake_array(cupy, (5,), np.complex64)
    y = hb.convert(x, "cupy")
    assert y.data.ptr == x.data.ptr and y.dtype == np.complex64
    assert x.calls[-1]["stream"] == 1  # the consumer's (legacy default) stream reached x


def test_fake_cupy_to_numpy_needs_a_copy(fake: Any) -> None:
    _, cupy, _ = fake
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(_fake_array(cupy), "numpy", copy=False)


def test_fake_adapter_satisfies_the_contract(fake: Any) -> None:
    from hurray_bridge._contract import NAMES, Adapter

    adapter, _, _ = fake
    assert isinstance(adapter, Adapter)
    assert sorted(adapter.__all__) == sorted(NAMES)
    assert adapter.NAME == "cupy" and adapter.HOLDS == {"dense", "sparse"}
    assert adapter.fast_import is None and adapter.fast_export is None  # no shortcuts
    table = adapter.native_dtypes()
    assert hb.float32 in table and hb.int4 not in table  # no sub-byte CuPy dtypes
    for dtype, native in table.items():
        assert adapter.native_dtype(dtype) == native and adapter.dtype_of(native) == dtype
    assert adapter.special_kind(object()) is None
