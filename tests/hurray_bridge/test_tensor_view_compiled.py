"""The compiled NumPy view of an hb.Tensor (``_host.tensor_view`` where ``_speedups`` was
built) gives the arrays the Python view gives: over the same memory (zero-copy), of the
same type, shape, strides and flags, read-only where the tensor is, and declines the
same tensors; the read-only ones it makes itself (one array whose base is the tensor)
cannot be made writable and keep the memory alive."""

from __future__ import annotations

import gc
import pathlib
import sys
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _memory

np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")

from hurray_bridge import _host  # noqa: E402  (imports NumPy)
from tests.vectors.generate_files import tensor  # noqa: E402

compiled = pytest.mark.skipif(_host.tensor_view is _host.tensor_view_python,
                              reason="hurray_bridge._speedups not built: no compiled view")


def _arrays() -> dict[str, Any]:
    out = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "scalar": np.array(7, np.int64),
        "bool": np.array([True, False, True]),
        "u8": np.arange(5, dtype=np.uint8),
        "c64": np.ones((2, 2), np.complex64),
        "empty": np.zeros((3, 0), np.float64),
        "rank5": np.ones((1, 2, 1, 2, 1), np.int16),
    }
    try:  # NumPy's extended types, where ml_dtypes is installed
        import ml_dtypes
    except ImportError:
        return out
    out["bf16"] = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)
    out["f8"] = np.arange(4, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)
    return out


def _tensors(tmp_path: pathlib.Path) -> dict[str, hb.Tensor]:
    """Mapped read-only tensors of both formats (back to back, so some unaligned), and
    others: writable, strided, sub-byte, sparse, read-only over a NumPy array."""
    from safetensors.numpy import save_file

    arrays = _arrays()
    out: dict[str, hb.Tensor] = {}
    st = tmp_path / "a.safetensors"
    # (float8_e4m3fn is an ml_dtypes type safetensors.numpy does not know)
    save_file({k: v for k, v in arrays.items() if k != "f8"}, st)
    hr = tmp_path / "a.hurray"
    hb.save(hr, arrays, fsync=False)
    for prefix, path in (("st", st), ("hurray", hr)):
        for k, t in hb.load(path).items():
            assert isinstance(t, hb.Tensor)
            out[f"{prefix}:{k}"] = t
    writable = hb.loads(bytearray(hb.dumps(arrays)))
    out.update({f"writable:{k}": t for k, t in writable.items()
                if isinstance(t, hb.Tensor)})
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    out["readonly numpy"] = hb.asarray(ro)
    out["strided"] = hb.asarray(np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2])
    out["int4"] = tensor(hb.Descriptor([5], hb.int4), b"\x21\x43\x05")
    return out


def _facts(a: Any) -> Any:
    if a is NotImplemented:
        return a
    return (type(a), a.dtype, a.shape, a.strides, a.__array_interface__["data"],
            a.flags.c_contiguous, a.flags.aligned, a.flags.writeable, a.tobytes(),
            _memory.write_protected(a))


def test_the_compiled_view_answers_as_the_python_one(tmp_path: pathlib.Path) -> None:
    for name, t in _tensors(tmp_path).items():
        got, want = _host.tensor_view(t), _host.tensor_view_python(t)
        assert _facts(got) == _facts(want), name
        if got is not NotImplemented:
            assert got.__array_interface__["data"][0] == t.data_ptr, name  # zero-copy


@compiled
def test_read_only_views_are_made_in_c_and_stay_read_only(tmp_path: pathlib.Path) -> None:
    made = 0
    for name, t in _tensors(tmp_path).items():
        a = _host.tensor_view(t)
        if a is NotImplemented or not t.readonly:
            continue
        assert a.base is t, name  # the compiled view: one array, the tensor its base
        made += 1
        with pytest.raises(ValueError, match="WRITEABLE"):
            a.flags.writeable = True
        assert np.shares_memory(a, _host.tensor_view_python(t))
    assert made >= 10


@compiled
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_compiled_view_keeps_the_map_alive(tmp_path: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    path = tmp_path / "k.safetensors"
    save_file({"w": np.arange(1000, dtype=np.float64)}, path)
    f = hb.load(path)
    a = hb.convert(f["w"], "numpy")
    assert a.base is f["w"]
    f.close()
    del f
    gc.collect()
    assert str(path) in pathlib.Path("/proc/self/maps").read_text()  # held by the array
    np.testing.assert_array_equal(a, np.arange(1000, dtype=np.float64))
    del a
    gc.collect()
    assert str(path) not in pathlib.Path("/proc/self/maps").read_text()
