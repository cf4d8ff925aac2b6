"""Instruction counts of the peers suite's operations, under callgrind.

``python -m benchmarks.instructions [OP ...] [--n N] [--top K]`` with OP among
``import``, ``torch->numpy``, ``export``, ``round trip`` (default: all four): for each
op and each side (the bridge, apache-tvm-ffi) a child process runs the op N times
under ``valgrind --tool=callgrind``, collecting only inside ``starmap_next`` -- the loop is
``deque(starmap(op, repeat((x,), N)), maxlen=0)`` with ``op`` a Python function that makes
the result and drops it, so each call's construction and destruction are counted and
the imports and warm-up are not. It prints instructions per call less those of an
empty ``op`` (the loop and the Python frame, the same on both sides), and the
functions with the most own instructions per call (``callgrind_annotate``).

Instruction counts are deterministic where wall time on a shared machine is not:
this is how small differences between the two sides are read. Not a suite: it
prints, it measures no goal (the ratios of goals are wall time, ``peers``). Needs
valgrind and apache-tvm-ffi.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

# op -> (the bridge's expression, tvm-ffi's expression), as in benchmarks/peers.py
OPS = {
    "import": ("hb.asarray(x)", "tvm_ffi.from_dlpack(x)"),
    "torch->numpy": ('hb.convert(x, "numpy")', "np.from_dlpack(tvm_ffi.from_dlpack(x))"),
    "export": ("torch.from_dlpack(t_hb)", "torch.from_dlpack(t_tvm)"),
    "round trip": ("torch.from_dlpack(hb.asarray(x))",
                   "torch.from_dlpack(tvm_ffi.from_dlpack(x))"),
    "empty": ("None", "None"),
}

_CHILD = """
import collections, itertools, warnings
import numpy as np, torch, tvm_ffi
import hurray_bridge as hb
warnings.simplefilter("ignore")
x = torch.ones(1000, dtype=torch.float32)
# The bridges' tensors of x only for the export: alive, they change what torch does for
# every import of x (benchmarks/peers.py times the fresh hand-offs without them).
t_hb, t_tvm = (hb.asarray(x), tvm_ffi.from_dlpack(x)) if {held} else (None, None)
def op(x):
    {expr}
for _ in range(2000):
    op(x)
collections.deque(itertools.starmap(op, itertools.repeat((x,), {n})), maxlen=0)
"""


def _run(expr: str, n: int, top: int, keep: str | None = None
         ) -> tuple[float, list[tuple[float, str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or os.path.join(tmp, "cg.out")
        held = re.search(r"\bt_(?:hb|tvm)\b", expr) is not None  # the export's tensors
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=starmap_next", f"--callgrind-out-file={out}",
               sys.executable, "-c", _CHILD.format(expr=expr, n=n, held=held)]
        env = dict(os.environ, PYTHONHASHSEED="0")
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        with open(out) as f:
            total = next(int(ln.split()[1]) for ln in f if ln.startswith(("summary:", "totals:")))
        ann = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=99",
                              out], check=True, capture_output=True, text=True).stdout
    rows: list[tuple[float, str]] = []
    for ln in ann.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.+?)\s*$", ln)
        if m is None or ":" not in m.group(2) or len(rows) >= top:
            continue
        name = m.group(2).split(" [")[0]
        rows.append((int(m.group(1).replace(",", "")) / n, name))
    return total / n, rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions")
    p.add_argument("ops", nargs="*", help=f"any of {[k for k in OPS if k != 'empty']}")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--keep", metavar="DIR", help="keep the callgrind files in DIR")
    args = p.parse_args()
    ops = args.ops or [k for k in OPS if k != "empty"]
    base, _ = _run(OPS["empty"][0], args.n, 0)
    print(f"loop and frame: {base:.0f} instructions per call (subtracted below)")
    for op in ops:
        counts = []
        for side, expr in zip(("hurray", "tvm-ffi"), OPS[op]):
            keep = None
            if args.keep:
                os.makedirs(args.keep, exist_ok=True)
                keep = os.path.join(args.keep, f"{op.replace(' ', '_').replace('>', '')}.{side}.cg")
            per, rows = _run(expr, args.n, args.top, keep)
            counts.append(per - base)
            print(f"\n{op} [{side}] {expr}: {per - base:.0f} instructions per call")
            for own, name in rows:
                print(f"    {own:8.1f}  {name}")
        print(f"\n{op}: ratio hurray / tvm-ffi {counts[0] / counts[1]:.3f}")


if __name__ == "__main__":
    main()
