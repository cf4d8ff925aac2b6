"""The compiled peer: apache-tvm-ffi against the bridge, torch tensor of 1000 float32.

- ``tvm_ffi.from_dlpack(x)`` against ``hb.asarray(x)``: each bridge's own tensor
  over torch's memory;
- torch -> tvm_ffi -> NumPy, ``np.from_dlpack(tvm_ffi.from_dlpack(x))``, against
  ``hb.convert(x, "numpy")``;
- for reference, NumPy importing the torch tensor directly, ``np.from_dlpack(x)``.

tvm-ffi is a compiled FFI layer (C++), the bridge is pure Python: the ratios are
for information, there is no goal. Importing tvm_ffi patches torch (its DLPack C
exchange API addon), so the measurements run in a child process and the other
suites never see it. Needs ``pip install apache-tvm-ffi``; without it the suite
says so and measures nothing.

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
    x = torch.ones(N, dtype=torch.float32)
    ptr = x.data_ptr()
    # Zero-copy on every side before anything is timed.
    assert np.from_dlpack(tvm_ffi.from_dlpack(x)).ctypes.data == ptr
    assert hb.convert(x, "numpy").ctypes.data == ptr
    assert hb.asarray(x).data_ptr == ptr

    cases = (
        ("import", "hb.asarray(torch)", lambda: hb.asarray(x),
         "tvm_ffi.from_dlpack(torch)", lambda: tvm_ffi.from_dlpack(x)),
        ("torch->numpy", "hb.convert(torch, 'numpy')", lambda: hb.convert(x, "numpy"),
         "np.from_dlpack(tvm_ffi.from_dlpack(torch))",
         lambda: np.from_dlpack(tvm_ffi.from_dlpack(x))),
        ("torch->numpy vs direct", "hb.convert(torch, 'numpy')", lambda: hb.convert(x, "numpy"),
         "np.from_dlpack(torch)", lambda: np.from_dlpack(x)),
    )
    for key, an, af, bn, bf in cases:
        a, b, r = compare(an, af, bn, bf, rounds=rounds)
        results["timings"] += [a.as_dict(), b.as_dict()]
        results["ratios"][f"{key}: hb / {bn}"] = ratio(r, "info")
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
