"""The compiled peer: apache-tvm-ffi against the bridge, torch tensor of 1000 float32.

- ``tvm_ffi.from_dlpack(x)`` against ``hb.asarray(x)``: each bridge's own tensor
  over torch's memory;
- torch -> tvm_ffi -> NumPy, ``np.from_dlpack(tvm_ffi.from_dlpack(x))``, against
  ``hb.convert(x, "numpy")``;
- the export to torch, ``torch.from_dlpack(t)`` of each bridge's tensor (made once),
  and the round trip ``torch.from_dlpack(hb.asarray(x))`` against
  ``torch.from_dlpack(tvm_ffi.from_dlpack(x))``;
- for reference, NumPy importing the torch tensor directly, ``np.from_dlpack(x)``;
- the import again while each bridge's tensor of ``x`` is alive (information: torch's
  exchange API does less per import then, see docs/benchmarks.md).

The hand-offs of a tensor that nothing else holds are timed first, before the tensors
that the export case needs exist.

Both sides are compiled: tvm-ffi is C++/Cython, and with ``hurray_bridge._speedups``
built the bridge reads torch tensors through torch's DLPack C exchange API and exports
through a compiled ``__dlpack__`` (docs/impl/c-ffi.md §8). The goal is at most 1.0x
(the bridge no slower); without the compiled module the ratios are information only.
The bridge reads every torch tensor's requires_grad and neg bit (and conj bit for
complex types) before it shares the memory; tvm-ffi does not (it hands a conj or neg
view over raw). Importing tvm_ffi may patch torch (its DLPack C exchange API addon, on
torch builds without one), so the measurements run in a child process and the other
suites never see it. Needs ``pip install apache-tvm-ffi``; without it the suite says so
and measures nothing.

``python -m benchmarks peers``
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from ._timing import compare, ratio

N = 1000


def _child(rounds: int) -> dict[str, Any]:
    import warnings

    import numpy as np
    import torch
    import tvm_ffi

    import hurray_bridge as hb

    warnings.simplefilter("ignore", UserWarning)
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    version = getattr(tvm_ffi, "__version__", "?")
    results["notes"].append(f"apache-tvm-ffi {version}")
    from hurray_bridge import _exchange

    compiled = _exchange.installed
    results["notes"].append("bridge: compiled DLPack path (hurray_bridge._speedups)" if compiled
                            else "bridge: Python path (hurray_bridge._speedups not built)")
    x = torch.ones(N, dtype=torch.float32)
    ptr = x.data_ptr()
    # Zero-copy on every side before anything is timed (the results die at once).
    assert np.from_dlpack(tvm_ffi.from_dlpack(x)).ctypes.data == ptr
    assert hb.convert(x, "numpy").ctypes.data == ptr
    assert hb.asarray(x).data_ptr == ptr
    assert torch.from_dlpack(hb.asarray(x)).data_ptr() == ptr
    assert torch.from_dlpack(tvm_ffi.from_dlpack(x)).data_ptr() == ptr

    goal = "<= 1.0" if compiled else "info"
    # The hand-offs of a tensor that nothing else holds (a model's weight, a fresh result)
    # first. While a DLPack export of x is alive (the bridges' tensors that the export case
    # needs), torch's exchange API does less work for every import of x: its C++ reference
    # count then never drops back to one, which in torch 2.13 releases and retakes the
    # Python object (~300 instructions on both sides; tvm_ffi's owning import gains twice).
    # The import is timed again in that state, for information.
    fresh = (
        ("import", "hb.asarray(torch)", lambda: hb.asarray(x),
         "tvm_ffi.from_dlpack(torch)", lambda: tvm_ffi.from_dlpack(x), goal),
        ("torch->numpy", "hb.convert(torch, 'numpy')", lambda: hb.convert(x, "numpy"),
         "np.from_dlpack(tvm_ffi.from_dlpack(torch))",
         lambda: np.from_dlpack(tvm_ffi.from_dlpack(x)), goal),
        ("round trip", "torch.from_dlpack(hb.asarray(torch))",
         lambda: torch.from_dlpack(hb.asarray(x)),
         "torch.from_dlpack(tvm_ffi.from_dlpack(torch))",
         lambda: torch.from_dlpack(tvm_ffi.from_dlpack(x)), goal),
        ("torch->numpy vs direct", "hb.convert(torch, 'numpy')", lambda: hb.convert(x, "numpy"),
         "np.from_dlpack(torch)", lambda: np.from_dlpack(x), "info"),
    )

    def measure(cases: tuple[tuple[Any, ...], ...]) -> None:
        for key, an, af, bn, bf, want in cases:
            a, b, r = compare(an, af, bn, bf, rounds=rounds)
            results["timings"] += [a.as_dict(), b.as_dict()]
            results["ratios"][f"{key}: hb / {bn}"] = ratio(r, want)

    measure(fresh)
    # Only now: made before the loop above, these would be alive while it runs.
    t_hb, t_tvm = hb.asarray(x), tvm_ffi.from_dlpack(x)
    measure((
        ("export to torch", "torch.from_dlpack(hb_tensor)", lambda: torch.from_dlpack(t_hb),
         "torch.from_dlpack(tvm_tensor)", lambda: torch.from_dlpack(t_tvm), goal),
        ("import while an export of x is alive", "hb.asarray(torch)", lambda: hb.asarray(x),
         "tvm_ffi.from_dlpack(torch)", lambda: tvm_ffi.from_dlpack(x), "info"),
    ))
    return results


def run(small: bool = False) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.peers", "--child", "11" if small else "21"],
            capture_output=True, text=True, timeout=600, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"timings": [], "ratios": {}, "notes": [f"peers child failed: {exc}"]}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["?"]
        if "No module named 'tvm_ffi'" in proc.stderr:
            why = "apache-tvm-ffi is not installed (pip install apache-tvm-ffi): nothing measured"
        else:
            why = f"peers child failed: {tail[0]}"
        return {"timings": [], "ratios": {}, "notes": [why]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]) if len(sys.argv) > 2 else 21)))
    else:
        print(json.dumps(run(), indent=1))
