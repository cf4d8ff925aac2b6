"""The Arrow PyCapsule interface against each engine's own NumPy path, in the same run.

Both sides of every ratio share memory (nothing is copied on either side), so what is
timed is the per-call cost of building and reading the C structs:

- export: ``pa.array(t)`` of an hb.Tensor (rank 1: a primitive array; rank 2: an
  ``arrow.fixed_shape_tensor``) against pyarrow's own import of the NumPy array behind
  it (``pa.array(a)``, ``pa.FixedShapeTensorArray.from_numpy_ndarray(a)``);
- ``pl.Series(t)`` against ``pl.Series(a)`` (polars' NumPy constructor);
- import: ``hb.asarray`` of a polars Series (through ``__arrow_c_stream__``) against
  ``Series.to_numpy()`` (zero-copy for a numeric Series without nulls), and of a pyarrow
  array seen only through ``__arrow_c_array__`` against ``hb.asarray`` of the same array
  through the Arrow adapter.

- size: ``pa.array(t)`` of a 64 MiB tensor against the same call on a 1 MiB one: a copy
  would make it about 64 times slower, sharing keeps it level (goal <= 1.5).

The bridge builds and releases the structs in Python (ctypes) where pyarrow and polars do
it in C++: the ratios against their NumPy paths are that per-call overhead (tens of
microseconds at most on a loaded machine, whatever the size), with the loose goal <= 20.

``python -m benchmarks arrow_capsule [--small]``.
"""

from __future__ import annotations

from typing import Any

import hurray_bridge as hb

from ._timing import compare, ratio


class _OnlyArrowArray:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.inner.__arrow_c_array__(requested_schema)


def run(small: bool = False) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa

    rounds = 9 if small else 21
    n = 1 << 18  # 1 MiB of float32
    flat = np.arange(n, dtype=np.float32)
    rows = flat.reshape(-1, 64)
    t_flat, t_rows = hb.asarray(flat), hb.asarray(rows)
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": [
        "ratios are medians of per-round ratios, each side timed back to back in every "
        "round; shared machine, figures are noisy"]}

    def pair(key: str, a_name: str, a: Any, b_name: str, b: Any, goal: str = "<= 20") -> None:
        ta, tb, r = compare(a_name, a, b_name, b, rounds=rounds)
        results["timings"] += [ta.as_dict(), tb.as_dict()]
        results["ratios"][key] = ratio(r, goal, peer=b_name)

    pair("pa_array_rank1", "pa.array(hb.Tensor) rank 1, 1 MiB", lambda: pa.array(t_flat),
         "pa.array(np.ndarray) rank 1", lambda: pa.array(flat))
    pair("pa_array_rank2", "pa.array(hb.Tensor) rank 2 -> fixed_shape_tensor",
         lambda: pa.array(t_rows),
         "FixedShapeTensorArray.from_numpy_ndarray", lambda: (
             pa.FixedShapeTensorArray.from_numpy_ndarray(rows)))
    big = hb.asarray(np.zeros(64 * n, dtype=np.float32))
    pair("size_64MiB_vs_1MiB", "pa.array(hb.Tensor) rank 1, 64 MiB", lambda: pa.array(big),
         "pa.array(hb.Tensor) rank 1, 1 MiB", lambda: pa.array(t_flat), goal="<= 1.5")
    arr = pa.array(flat)
    only = _OnlyArrowArray(arr)
    pair("asarray_capsule", "hb.asarray(object with only __arrow_c_array__)",
         lambda: hb.asarray(only), "hb.asarray(pa.Array) (Arrow adapter)",
         lambda: hb.asarray(arr))
    try:
        import polars as pl
    except ImportError:
        results["notes"].append("polars is not installed: its pairs are left out")
        return results
    series = pl.Series(flat)
    pair("pl_series", "pl.Series(hb.Tensor)", lambda: pl.Series(t_flat),
         "pl.Series(np.ndarray)", lambda: pl.Series(flat))
    pair("asarray_polars", "hb.asarray(pl.Series) (stream)", lambda: hb.asarray(series),
         "pl.Series.to_numpy() (zero-copy)", series.to_numpy)
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(small=True), indent=2))
