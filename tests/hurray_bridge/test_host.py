"""The core's host path (``hurray_bridge._host``) and the NumPy adapter over it."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge import _host, _subbyte  # noqa: E402
from hurray_bridge.adapters import numpy as hn  # noqa: E402


def test_the_numpy_adapter_is_the_core_host_path() -> None:
    # One implementation: the adapter re-exports the core's functions, it has no copy.
    for name in ("to_hurray", "from_hurray", "dtype_of", "native_dtype", "native_dtypes"):
        assert getattr(hn, name) is getattr(_host, name), name


def test_host_views_share_memory() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = _host.to_hurray(a)
    back = _host.from_hurray(t)
    assert np.shares_memory(a, back) and back.shape == (2, 3)
    assert _host.native_dtypes()[hb.float32] == np.float32


@pytest.mark.parametrize("name, call", [
    ("pack_subbyte", lambda f: f(np.array([1, 2, 3], np.uint8), 4)),
    ("unpack_subbyte", lambda f: f(np.array([0x21, 0x03], np.uint8), 3, 4)),
    ("check_sizes", lambda f: f((2, 3), 4)),
])
def test_moved_names_still_work_with_a_deprecation(name: str, call: object) -> None:
    with pytest.warns(DeprecationWarning, match=rf"adapters.numpy.{name} is deprecated"):
        fn = getattr(hn, name)
    assert name not in hn.__all__
    assert callable(call)
    got = call(fn)
    if name == "pack_subbyte":
        assert got.tolist() == _subbyte.pack(np.array([1, 2, 3], np.uint8), 4).tolist() == [
            0x21, 0x03]
    elif name == "unpack_subbyte":
        assert got.tolist() == [1, 2, 3]
    else:
        assert got is None
        with pytest.raises(hb.UnsupportedError, match="NumPy cannot hold shape"):
            fn((2**62, 2**62), 1)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        hn.nothing_here  # noqa: B018
