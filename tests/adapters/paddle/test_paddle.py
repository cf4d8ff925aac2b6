"""The Paddle adapter against PaddlePaddle's measured quirks (adapters/paddle/__init__.py).

Each quirk is first measured on the installed Paddle (so a release that changes it fails
here, and the handling can be revisited), then the adapter's handling is checked:
``(kDLCPU, None)`` as the device, READ_ONLY ignored on import, no uint16/32/64, negative
strides, bool8 bytes other than 0 and 1, rank above 9, tensors that record gradients.
Writes through Paddle into a loaded file run in a child process.
"""

from __future__ import annotations

import ctypes
import gc
import subprocess
import sys
import textwrap
import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _capsule
from hurray_bridge._registry import kept_apart
from hurray_bridge.safetensors_io import save as safetensors_save
from hurray_bridge.tensor import from_dlview

np = pytest.importorskip("numpy", reason="numpy is not installed")
_apart = kept_apart("paddle")
if _apart:
    pytest.skip(_apart, allow_module_level=True)
paddle = pytest.importorskip("paddle", reason="paddle is not installed")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")

from hurray_bridge.adapters import paddle as pd_adapter  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def _ptr(x: Any) -> int:
    return int(x.data_ptr())


def _copy_warnings(fn: Any) -> tuple[Any, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in caught if issubclass(w.category, hb.CopyWarning)]


def _readonly_array() -> Any:
    a = np.arange(8, dtype=np.float32)
    a.flags.writeable = False
    return a


# ------------------------------------------------------------------- device
def test_device_id_none_never_reaches_the_core() -> None:
    x = paddle.to_tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert x.__dlpack_device__()[1] is None, "Paddle now reports a device id: revisit"
    t = pd_adapter.to_hurray(x)
    assert t.device == hb.CPU and tuple(t.__dlpack_device__()) == (1, 0)
    assert t.data_ptr == _ptr(x) and not t.readonly and not t.copied


# ------------------------------------------------------------- read-only memory
def test_measured_paddle_writes_read_only_memory_it_imports() -> None:
    """The quirk: a versioned capsule flagged READ_ONLY becomes a writable Paddle tensor
    over the same memory."""
    a = _readonly_array()
    t = hb.asarray(a)
    y = paddle.from_dlpack(t.__dlpack__(max_version=(1, 0)))
    assert _ptr(y) == a.ctypes.data
    y[0] = 42.0
    assert a[0] == 42.0, "Paddle no longer writes read-only memory: the copy may go"


def test_read_only_tensor_reaches_paddle_as_a_reported_copy() -> None:
    a = _readonly_array()
    y, copies = _copy_warnings(lambda: hb.convert(a, "paddle"))
    assert _ptr(y) != a.ctypes.data
    assert copies and "READ_ONLY" in copies[0]
    y[0] = 42.0
    assert a[0] == 0.0 and float(y[0]) == 42.0
    with pytest.raises(hb.CopyRequiredError, match=r"READ_ONLY.*copy=False"):
        hb.convert(a, "paddle", copy=False)
    z, copies = _copy_warnings(lambda: hb.convert(a, "paddle", copy=True))
    assert _ptr(z) != a.ctypes.data and not copies


@pytest.mark.parametrize("kind", ["hurray", "safetensors"])
def test_loaded_tensors_reach_paddle_copied(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"w.{kind}"
    save = hb.save if kind == "hurray" else safetensors_save
    save(path, {"w": np.arange(64, dtype=np.float32)})
    before = path.read_bytes()
    t = hb.load(path)["w"]
    assert t.readonly
    y, copies = _copy_warnings(lambda: hb.convert(t, "paddle"))
    assert copies and _ptr(y) != t.data_ptr
    y[3] = -1.0
    assert np.asarray(t)[3] == 3.0, "a write through Paddle reached the loaded tensor"
    assert path.read_bytes() == before


def test_loads_of_bytes_is_a_private_copy_paddle_may_share() -> None:
    """hb.loads copies an immutable bytes object (container.loads): its tensors are
    writable, so Paddle shares them, and a write reaches neither the bytes nor a new load."""
    blob = hb.dumps({"w": np.arange(64, dtype=np.float32)})
    t = hb.loads(blob)["w"]
    assert not t.readonly
    y, copies = _copy_warnings(lambda: hb.convert(t, "paddle"))
    assert not copies and _ptr(y) == t.data_ptr
    y[3] = -1.0
    assert np.asarray(t)[3] == -1.0
    assert np.asarray(hb.loads(blob)["w"])[3] == 3.0


@pytest.mark.parametrize("suffix", ["hurray", "safetensors"])
def test_write_through_paddle_after_load_changes_nothing_in_a_child(suffix: str,
                                                                    tmp_path: Path) -> None:
    path = tmp_path / f"w.{suffix}"
    w = np.arange(1024, dtype=np.float32)
    (hb.save if suffix == "hurray" else safetensors_save)(path, {"w": w})
    before = path.read_bytes()
    code = f"""
        import warnings
        warnings.simplefilter("ignore")
        import numpy as np, hurray_bridge as hb
        f = hb.load({str(path)!r})
        y = hb.convert(f["w"], "paddle")
        y[:] = -7.0
        again = hb.load({str(path)!r})
        assert float(np.asarray(f["w"])[5]) == 5.0, "the loaded view changed"
        assert float(np.asarray(again["w"])[5]) == 5.0, "a new load sees the write"
        print("ok", float(y[5]))
    """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok -7.0" in r.stdout
    assert path.read_bytes() == before


# ------------------------------------------------------------------ element types
@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_unsigned_wider_than_a_byte_is_refused_naming_the_fix(name: str) -> None:
    d = getattr(hb, name)
    assert d not in pd_adapter.native_dtypes()
    with pytest.raises(hb.UnsupportedError, match=f"cannot hold {name}.*Cast the values"):
        hb.convert(np.arange(3, dtype=name), "paddle")
    # Paddle itself imports the type, but has no kernels for it (the measured quirk):
    x = paddle.from_dlpack(np.arange(3, dtype=name))
    with pytest.raises(RuntimeError, match="kernel"):
        x + x
    with pytest.raises(hb.UnsupportedError, match=f"cannot hold {name}"):
        hb.asarray(x)


def test_paddle_uint16_is_spelt_bfloat16_and_to_tensor_misreads_it() -> None:
    assert str(paddle.uint16) == "paddle.bfloat16", "Paddle fixed its uint16 name: revisit"
    assert pd_adapter.dtype_of(paddle.bfloat16) is hb.bfloat16
    with pytest.raises(hb.UnsupportedError, match="uint16"):
        pd_adapter.dtype_of(paddle.uint16)


@pytest.mark.parametrize("name", ["bool8", "int8", "uint8", "int16", "int32", "int64",
                                  "float16", "bfloat16", "float32", "float64", "complex64",
                                  "complex128", "float8_e4m3fn", "float8_e5m2"])
def test_each_held_type_crosses_both_ways_without_a_copy(name: str) -> None:
    d = getattr(hb, name)
    assert d in pd_adapter.native_dtypes()
    nd = hb.adapters.numpy.native_dtype(d)
    a = (np.arange(6) % 2 == 0).astype(nd) if name == "bool8" else np.arange(6).astype(nd)
    y, copies = _copy_warnings(lambda: hb.convert(a, "paddle"))
    assert not copies and _ptr(y) == a.ctypes.data
    assert y.dtype == pd_adapter.native_dtype(d)
    back = hb.convert(y, "numpy")
    assert back.dtype == a.dtype and back.tobytes() == a.tobytes()
    assert back.ctypes.data == a.ctypes.data


@pytest.mark.parametrize("name", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                                  "int4", "float4_e2m1fn"])
def test_types_paddle_lacks_are_refused(name: str) -> None:
    d = getattr(hb, name)
    assert d not in pd_adapter.native_dtypes()
    with pytest.raises(hb.UnsupportedError, match=f"no dtype for {name}"):
        pd_adapter.native_dtype(d)


def test_measured_paddle_misreads_bool_bytes_other_than_0_and_1() -> None:
    raw = np.array([0, 1, 2, 255], np.uint8)
    y = paddle.from_dlpack(raw.view(np.bool_))
    assert int(y.astype("int32").sum()) == 258, "Paddle now normalises bool: revisit"


def test_bool8_bytes_other_than_0_and_1_reach_paddle_normalised() -> None:
    raw = np.array([0, 1, 2, 255], np.uint8)
    b = raw.view(np.bool_)
    y, copies = _copy_warnings(lambda: hb.convert(b, "paddle"))
    assert copies and "0x01" in copies[0] and _ptr(y) != raw.ctypes.data
    assert y.astype("int32").numpy().tolist() == [0, 1, 1, 1]
    assert paddle.logical_not(y).astype("int32").numpy().tolist() == [1, 0, 0, 0]
    assert raw.tolist() == [0, 1, 2, 255], "the source must not be normalised in place"
    with pytest.raises(hb.CopyRequiredError, match="0x01"):
        hb.convert(b, "paddle", copy=False)
    ok = np.array([True, False, True])
    z = hb.convert(ok, "paddle", copy=False)
    assert _ptr(z) == ok.ctypes.data


def test_one_bit_bool_is_unpacked_with_a_report() -> None:
    bits = hb.quant.pack_subbyte(hb.asarray(np.array([1, 0, 1, 1, 0], np.bool_)))
    assert bits.dtype is hb.bool
    y, copies = _copy_warnings(lambda: hb.convert(bits, "paddle"))
    assert copies and y.dtype == paddle.bool
    assert y.numpy().tolist() == [True, False, True, True, False]
    with pytest.raises(hb.CopyRequiredError, match="unpacked"):
        hb.convert(bits, "paddle", copy=False)


# -------------------------------------------------------------------- layouts
def test_measured_paddle_cannot_import_negative_strides() -> None:
    a = np.arange(6, dtype=np.float32)[::-1]
    with pytest.raises(MemoryError):  # the import succeeds; the first read fails
        paddle.from_dlpack(a.copy()[::-1].__dlpack__(max_version=(1, 0))).numpy()
    y, copies = _copy_warnings(lambda: hb.convert(a, "paddle"))
    assert copies and "negative strides" in copies[0]
    assert y.numpy().tolist() == a.tolist()
    with pytest.raises(hb.CopyRequiredError, match="negative strides"):
        hb.convert(a, "paddle", copy=False)


def test_strided_views_cross_both_ways_without_a_copy() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    for view in (a.T, a[:, ::2], a[1:, 1:3]):
        y, copies = _copy_warnings(lambda v=view: hb.convert(v, "paddle", copy=False))
        assert not copies and _ptr(y) == view.ctypes.data
        assert y.numpy().tolist() == view.tolist()
    x = paddle.to_tensor(a)
    for view in (x.T, x[:, ::2], x[:, 1:3]):
        t = hb.asarray(view)
        assert t.data_ptr == _ptr(view) and not t.copied
        assert np.asarray(t).tolist() == view.numpy().tolist()


@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (3, 0, 2)])
def test_empty_and_rank_0_both_ways(shape: tuple[int, ...]) -> None:
    a = np.zeros(shape, np.float32) if 0 in shape else np.full(shape, 2.5, np.float32)
    y = hb.convert(a, "paddle", copy=False)
    assert tuple(y.shape) == shape
    t = hb.asarray(y)
    assert t.shape == shape and t.dtype is hb.float32
    if 0 in shape:
        assert t.data_ptr == 0 and _ptr(y) == 0
    else:
        assert _ptr(y) == a.ctypes.data == t.data_ptr and float(y) == 2.5


def test_rank_above_9_is_refused_before_paddle_sees_it() -> None:
    nine = np.zeros((1,) * 9, np.float32)
    assert tuple(hb.convert(nine, "paddle").shape) == (1,) * 9
    with pytest.raises(hb.UnsupportedError, match=r"at most 9 dimensions.*has 10"):
        hb.convert(np.zeros((1,) * 10, np.float32), "paddle")


# ----------------------------------------------------------- exports, autograd
def test_measured_legacy_exports_are_mutable() -> None:
    x = paddle.to_tensor(np.arange(4, dtype=np.float32))
    view = _capsule.consume_capsule(x.__dlpack__())  # legacy: no READ_ONLY flag to read
    assert not view.versioned and view.data == _ptr(x)
    ctypes.c_float.from_address(view.data).value = 9.0
    assert float(x[0]) == 9.0
    versioned = _capsule.consume_capsule(x.__dlpack__(max_version=(1, 0)))
    assert versioned.versioned and not versioned.flags & 1  # DLPACK_FLAG_BITMASK_READ_ONLY
    from_dlview(view)  # released through the tensor it becomes
    from_dlview(versioned)
    assert pd_adapter.LEGACY_EXPORTS_MUTABLE is True
    assert not hb.from_dlpack(x).readonly


def test_tensor_recording_gradients_is_shared_read_only() -> None:
    x = paddle.to_tensor(np.arange(4, dtype=np.float32), stop_gradient=False)
    with pytest.raises(Exception, match="requires gradients"):
        x.__dlpack__()
    t = hb.asarray(x)
    assert t.readonly and t.data_ptr == _ptr(x)
    n = hb.convert(x, "numpy")
    assert not n.flags.writeable and n.ctypes.data == _ptr(x)
    assert not hb.asarray(x, copy=True).readonly


def test_copy_true_both_ways_gives_fresh_memory() -> None:
    a = np.arange(5, dtype=np.float32)
    y = hb.convert(a, "paddle", copy=True)
    assert _ptr(y) != a.ctypes.data
    t = pd_adapter.to_hurray(y, copy=True)
    assert t.copied and t.data_ptr != _ptr(y)


def test_not_a_paddle_tensor_is_refused() -> None:
    with pytest.raises(hb.UnsupportedError, match=r"paddle\.Tensor"):
        pd_adapter.to_hurray(np.zeros(3))
    with pytest.raises(hb.UnsupportedError, match=r"hb\.Tensor"):
        pd_adapter.from_hurray(np.zeros(3))
    with pytest.raises(hb.UnsupportedError, match="device"):
        pd_adapter.from_hurray(hb.asarray(np.zeros(3)), device="tpu")


# ------------------------------------------------------------------ lifetimes
@pytest.mark.parametrize("path", ["pointer", "capsule"])
def test_export_survives_paddle_replacing_the_tensors_memory(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``paddle.assign(bigger, output=x)`` gives ``x`` a new allocation and frees the old
    one unless someone holds it: the export does (a DenseTensor sharing it, or the
    capsule where this Paddle lacks the calls the pointer path needs)."""
    if path == "capsule":
        monkeypatch.setattr(pd_adapter, "_DenseTensor", None)
    x = paddle.to_tensor(np.arange(100_000, dtype=np.float32))
    ptr = _ptr(x)
    t = hb.asarray(x)
    assert t.data_ptr == ptr
    paddle.assign(paddle.zeros([300_000]), output=x)
    assert _ptr(x) != ptr, "Paddle kept the allocation: the case tests nothing"
    gc.collect()
    junk = [paddle.to_tensor(np.full(100_000, 7, np.float32)) for _ in range(20)]
    assert np.asarray(t)[99_999] == 99_999.0 and len(junk) == 20


def test_export_outlives_the_paddle_tensor(frozen_heap: None) -> None:
    x = paddle.to_tensor(np.arange(1000, dtype=np.float32))
    gone = weakref.ref(x)
    t = hb.asarray(x)
    del x
    gc.collect()
    assert gone() is None
    assert np.asarray(t)[999] == 999.0


def test_import_keeps_the_tensor_alive_until_paddle_drops_it(frozen_heap: None) -> None:
    t = hb.asarray(np.arange(1000, dtype=np.float32))
    alive = weakref.ref(t)
    y = hb.convert(t, "paddle")
    del t
    gc.collect()
    assert alive() is not None and float(y[999]) == 999.0
    del y
    gc.collect()
    assert alive() is None
