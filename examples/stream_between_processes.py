"""Stream variable-size batches from one process to another through a pipe.

The producer (a child process started by this script) declares a schema whose
batch dimension is dynamic, ``float32 [DYNAMIC, 16]``, then writes batches of
different sizes, one of them empty, to its standard output. The consumer (this
process) reads them with ``hb.StreamReader``: every message is checked against
the schema before its buffers are read, and each arrives as an ``hb.Tensor`` in
fresh 64-byte aligned memory, which NumPy (or any framework) views without a
copy. The framing is specified in docs/spec/interchange.md §6.

Run: python examples/stream_between_processes.py
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import hurray_bridge as hb

WIDTH = 16
BATCH_SIZES = (32, 7, 0, 128, 1, 64)  # uneven, and an empty batch: 0 is a size


def produce() -> None:
    """Child: write one batch per size to stdout, then end the stream."""
    schema = hb.Descriptor([hb.DYNAMIC, WIDTH], hb.float32)
    rng = np.random.default_rng(0)
    with hb.StreamWriter(sys.stdout.buffer, schema) as w:
        for i, n in enumerate(BATCH_SIZES):
            batch = rng.standard_normal((n, WIDTH)).astype(np.float32)
            batch[:, 0] = i  # tag each row with its batch number
            w.write(batch)  # any native array, or an hb.Tensor


def consume() -> None:
    """Parent: start the producer and read its stream."""
    with subprocess.Popen([sys.executable, __file__, "--produce"], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        reader = hb.StreamReader(p.stdout)
        print(f"schema: {reader.schema}")
        count = 0
        for t in reader:
            a = np.asarray(t)  # a view of the message's memory
            assert a.shape == (BATCH_SIZES[count], WIDTH)
            assert (a[:, 0] == count).all()
            # the mean of no values is undefined, not 0: say so for the empty batch
            mean = f"{a[:, 1:].mean():+.3f}" if a.size else "n/a (empty batch)"
            print(f"batch {count}: shape {a.shape}, mean {mean}")
            count += 1
    if p.returncode:
        raise SystemExit(f"producer failed with exit code {p.returncode}")
    print(f"received {count} batches")


if __name__ == "__main__":
    produce() if "--produce" in sys.argv else consume()
