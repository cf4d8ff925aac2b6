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

``python -m benchmarks.instructions --against TREE [PAIR ...]`` measures the hand-off
table's ``hb.convert`` pairs (``HANDOFFS``: the torch -> JAX shortcut among them) in this
checkout and in another one (``TREE``, a git worktree of an earlier commit with its
compiled module built), the same way, and prints the ratio this / that: how a change
moved the hand-offs, read where wall time is noise.

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

# pair -> (the source, the bridge's hand-off), as in benchmarks/handoff.py
HANDOFFS = {
    "numpy->torch": ("np.ones(1000, np.float32)", 'hb.convert(x, "torch")'),
    "torch->numpy": ("torch.ones(1000)", 'hb.convert(x, "numpy")'),
    "torch->jax": ("torch.ones(1000)", 'hb.convert(x, "jax")'),
    "jax->torch": ("jax.numpy.ones(1000, np.float32)", 'hb.convert(x, "torch")'),
    "arrow->torch": ("pa.array(np.ones(1000, np.float32))", 'hb.convert(x, "torch")'),
    "numpy->jax": ("np.ones(1000, np.float32)", 'hb.convert(x, "jax")'),
    "asarray torch": ("torch.ones(1000)", "hb.asarray(x)"),
}

_CHILD = """
import collections, itertools, warnings
import numpy as np, torch, tvm_ffi
{more_imports}
import hurray_bridge as hb
warnings.simplefilter("ignore")
x = {source}
# The bridges' tensors of x only for the export: alive, they change what torch does for
# every import of x (benchmarks/peers.py times the fresh hand-offs without them).
t_hb, t_tvm = (hb.asarray(x), tvm_ffi.from_dlpack(x)) if {held} else (None, None)
def op(x):
    {expr}
for _ in range(2000):
    op(x)
collections.deque(itertools.starmap(op, itertools.repeat((x,), {n})), maxlen=0)
"""


def _run(expr: str, n: int, top: int, keep: str | None = None, *,
         source: str = "torch.ones(1000, dtype=torch.float32)", tree: str | None = None
         ) -> tuple[float, list[tuple[float, str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = keep or os.path.join(tmp, "cg.out")
        held = re.search(r"\bt_(?:hb|tvm)\b", expr) is not None  # the export's tensors
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=starmap_next", f"--callgrind-out-file={out}",
               sys.executable, "-c", _CHILD.format(
                   expr=expr, n=n, held=held, source=source,
                   more_imports="import jax, jax.numpy, pyarrow as pa" if tree else "")]
        env = dict(os.environ, PYTHONHASHSEED="0")
        if tree:  # the other checkout first on the path: its package is the one imported
            env["PYTHONPATH"] = os.pathsep.join([tree, env.get("PYTHONPATH", "")])
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
    p.add_argument("--against", metavar="TREE",
                   help="measure the hand-off pairs here and in TREE (another checkout)")
    args = p.parse_args()
    if args.against:
        _against(args.against, args.ops or list(HANDOFFS), args.n)
        return
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


def _against(tree: str, pairs: list[str], n: int) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this": here, "that": os.path.abspath(tree)}
    empty = {k: _run("None", n, 0, tree=v)[0] for k, v in sides.items()}
    print(f"| pair | this | that ({tree}) | this / that |\n|---|---:|---:|---:|")
    for pair in pairs:
        source, expr = HANDOFFS[pair]
        per = {k: _run(expr, n, 0, source=source, tree=v)[0] - empty[k]
               for k, v in sides.items()}
        print(f"| {pair} | {per['this']:.0f} | {per['that']:.0f} | "
              f"{per['this'] / per['that']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
