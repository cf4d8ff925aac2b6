"""Instruction counts of building and decoding descriptors, this tree against another.

``python -m benchmarks.descriptor_rules --base DIR [OP ...] [--n N]``: DIR is another
checkout of hurray_bridge (the commit before a change to descriptor.RULES or the wire
decoder, with its compiled module built or copied in). For each op and each tree a child
process imports that tree's package and runs the op N times under
``valgrind --tool=callgrind``, collecting only inside ``starmap_next`` (the loop of
``benchmarks/instructions.py``: imports, set-up and warm-up are not counted). It prints
instructions per call less those of an empty op, both trees, and the ratio this / base.

The ops are the hot paths the rules sit on: ``hb.asarray`` builds a dense descriptor per
tensor (the constructor's fast path, and its general path when the type is given by name),
the dense decoder is compiled where a C compiler was found and Python elsewhere,
other layouts and sections always take the rules, and ``hb.load`` decodes one descriptor
per entry of a file's index (``index`` reads the index of a file of 10,000 tensors).
Instruction counts are deterministic where wall time on a shared machine is not. Needs
valgrind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# op -> (expression of the loop's argument x, the op's body on x)
OPS = {
    "dense, DType": ("f32", "hb.Descriptor((1000,), x)"),
    "dense, by name": ('"float32"', "hb.Descriptor((1000,), x)"),
    "strided": ("(1, 4)", "hb.Descriptor((4, 1000), f32, hb.Layout.STRIDED, strides=x)"),
    "quantized": ("q", "hb.Descriptor((64, 64), hb.int8, quantization=x)"),
    "csr": ("sp", "hb.Descriptor((64, 64), f32, hb.Layout.CSR, sparse=x)"),
    "decode dense": ("hb.Descriptor((1000,), f32).to_bytes()", "wire.decode(x)"),
    "decode dense, Python": ("hb.Descriptor((1000,), f32).to_bytes()",
                             "wire._decode_dense_python(x, 72)"),
    "decode quantized": ("hb.Descriptor((64, 64), hb.int8, quantization=q).to_bytes()",
                         "wire.decode(x)"),
    "index": ("index_file", "read_index(x)"),
    "empty": ("None", "None"),
}

_CHILD = """
import collections, itertools, os, warnings
import numpy as np
import hurray_bridge as hb
from hurray_bridge import wire
from hurray_bridge._format import read_index
warnings.simplefilter("ignore")
f32 = hb.float32
q = hb.Quantization(hb.QuantScheme.PER_BLOCK, hb.float16, axis=1, block_size=32)
sp = hb.Sparse(100, hb.int32)
index_file = None
if {needs_file}:
    index_file = os.path.join({tmp!r}, "many.hurray")
    hb.save(index_file, {{f"t{{i}}": np.zeros(4 + i % 7, np.float32) for i in range(10000)}})
x = {arg}
def op(x):
    {body}
for _ in range({warm}):
    op(x)
collections.deque(itertools.starmap(op, itertools.repeat((x,), {n})), maxlen=0)
"""


def _count(tree: str, op: str, n: int) -> float:
    arg, body = OPS[op]
    warm = 2 if op == "index" else 2000
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=starmap_next", f"--callgrind-out-file={out}",
               sys.executable, "-c", _CHILD.format(arg=arg, body=body, n=n, warm=warm, tmp=tmp,
                                                   needs_file=op == "index")]
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONPATH=tree)
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=tree)
        with open(out) as f:
            total = next(int(ln.split()[1]) for ln in f if ln.startswith(("summary:", "totals:")))
    return total / n


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.descriptor_rules")
    p.add_argument("ops", nargs="*", help=f"any of {[k for k in OPS if k != 'empty']}")
    p.add_argument("--base", required=True, help="the other checkout to compare with")
    p.add_argument("--n", type=int, default=10000, help="calls per op (index: n / 1000)")
    args = p.parse_args()
    ops = args.ops or [k for k in OPS if k != "empty"]
    trees = {"this": ROOT, "base": os.path.abspath(args.base)}
    empty = {side: _count(tree, "empty", args.n) for side, tree in trees.items()}
    print(f"{'op':18} {'this':>12} {'base':>12}  this / base  (instructions per call)")
    for op in ops:
        n = max(args.n // 1000, 1) if op == "index" else args.n
        per = {side: _count(tree, op, n) - empty[side] for side, tree in trees.items()}
        print(f"{op:18} {per['this']:12.0f} {per['base']:12.0f}  {per['this'] / per['base']:.3f}")


if __name__ == "__main__":
    main()
