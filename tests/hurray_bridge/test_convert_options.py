"""hb.convert's target keywords: passed to the target adapter's from_hurray for a dense
tensor (Arrow's kind=, Dask's chunks= in tests/adapters/dask), refused by name otherwise."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge import _shortcuts  # noqa: E402


def test_arrow_kind_reaches_the_adapter_without_a_copy() -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = hb.convert(a, "arrow", kind="tensor")
    assert isinstance(t, pa.Tensor) and t.shape == (4, 6)
    assert t.to_numpy().__array_interface__["data"][0] == a.__array_interface__["data"][0]
    fixed = hb.convert(a, "arrow", kind="fixed_shape_tensor")
    assert isinstance(fixed, pa.FixedShapeTensorArray) and len(fixed) == 4
    np.testing.assert_array_equal(fixed.to_numpy_ndarray(), a)


def test_a_keyword_the_target_does_not_take_is_refused_by_name() -> None:
    with pytest.raises(hb.UnsupportedError, match=r"hb.convert\(x, 'numpy'\) takes no "
                       r"chunks=: numpy's from_hurray takes only device= and copy="):
        hb.convert(np.arange(3), "numpy", chunks=2)
    with pytest.raises(hb.UnsupportedError, match=r"takes no knd=: arrow's from_hurray takes "
                       r"kind= besides device= and copy="):
        hb.convert(np.arange(3), "arrow", knd="tensor")


def test_keywords_are_refused_for_a_sparse_tensor() -> None:
    scipy_sparse = pytest.importorskip("scipy.sparse", reason="scipy is not installed")
    m = scipy_sparse.coo_array(np.eye(3))
    with pytest.raises(hb.UnsupportedError, match=r"kind='array' applies to a dense tensor, "
                       r"and this one is sparse"):
        hb.convert(m, "arrow", kind="array")
    # densify=True gives a dense result, but the keywords are not carried through it:
    # the refusal says how to get there in two steps.
    with pytest.raises(hb.UnsupportedError, match=r"densify it first \(hb.convert\(x, 'numpy', "
                       r"densify=True\)\), then pass it.*does not carry target keywords"):
        hb.convert(m, "arrow", densify=True, kind="array")
    # Without the keyword it converts as before.
    assert hb.convert(m, "numpy", densify=True).tolist() == np.eye(3).tolist()


def test_a_call_with_keywords_teaches_no_shortcut() -> None:
    a = np.arange(6.0)
    _shortcuts.clear()  # the others relearn theirs at their next call
    assert isinstance(hb.convert(a, "arrow", kind="array"), pa.Array)
    assert not _shortcuts.serves(a, "arrow")
    hb.convert(a, "arrow")  # the same call without the keyword learns one
    assert _shortcuts.serves(a, "arrow")
