"""Restoring a sharded ``jax.Array`` from a file: hb against orbax-checkpoint, same devices.

One float32 array (default 1 GiB; ``--small``: 64 MiB) sharded over eight CPU devices in
rows (``P("x", None)``), in a child process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must be set before JAX
is imported). It is saved once each way: ``hb.save(path, {"w": hb.asarray(x)})`` (the
eight boxes as entries) and orbax's ``StandardCheckpointer().save`` (its default OCDBT
layout). Restored onto a target sharding, interleaved in the same run (``compare``):

- ``hb.shards.to_jax(hb.load(path)["w"], sharding)``: the file mapped, every box handed to
  JAX without a copy where the target's box is a stored one; and with
  ``hb.load(path, mmap=False)`` (every box read into memory first);
- ``StandardCheckpointer().restore(dir, {"w": ShapeDtypeStruct(..., sharding=sharding)})``.

Each restore is followed by one jitted sum of the whole array, waited for: a mapped
restore reads the file only when JAX touches it, so a restore alone would compare reading
with not reading (reported for information). Targets: the stored sharding, and a 4x2 grid
(``P("x", "y")``, each target box cut from a stored one: hb copies, and says so). Also with
the page cache emptied before each call (``posix_fadvise(DONTNEED)`` of every file of both
checkpoints, Linux on a block device): the disk's speed, not the page cache's. Goal: no
slower than orbax (ratio <= 1.0). Results are checked by value before timing.

``python -m benchmarks jax_restore [--small]``
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import warnings
from typing import Any

from ._timing import compare, ratio, run_on_host_devices

DEFAULT_BYTES = 1 << 30
SMALL_BYTES = 64 << 20
DEVICES = 8


def _drop_cache(*paths: str) -> bool:
    """Empty the page cache of ``paths`` (files, and every file under folders); False
    where this system cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    files = [p for p in paths if os.path.isfile(p)]
    files += [os.path.join(root, n) for p in paths if os.path.isdir(p)
              for root, _, names in os.walk(p) for n in names]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _child(nbytes: int, rounds: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import hurray_bridge as hb

    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    side = int((nbytes // 4) ** 0.5)
    side -= side % 128  # rows of 64-byte multiples, split evenly in eight and in two
    shape = (side, side)
    from importlib.metadata import version

    results["notes"].append(
        f"float32 {list(shape)} ({side * side * 4 / (1 << 20):.0f} MiB) on {DEVICES} CPU "
        f"devices; jax {jax.__version__}, orbax-checkpoint {version('orbax-checkpoint')}")
    rows = NamedSharding(jax.make_mesh((DEVICES,), ("x",)), P("x", None))
    grid = NamedSharding(jax.make_mesh((4, 2), ("x", "y")), P("x", "y"))
    host = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    x = jax.device_put(host, rows)
    x.block_until_ready()
    tmp = tempfile.mkdtemp(prefix="hurray-jax-restore-")
    hpath, odir = os.path.join(tmp, "w.hurray"), os.path.join(tmp, "orbax")
    ck = ocp.StandardCheckpointer()
    try:
        hb.save(hpath, {"w": hb.asarray(x)}, fsync=False)
        ck.save(odir, {"w": x})
        ck.wait_until_finished()
        del x
        os.sync()  # written back: the pages the cold runs drop are clean
        total = jax.jit(jnp.sum)

        def record(key: str, an: str, af: Any, bn: str, bf: Any, goal: str, **extra: Any) -> None:
            a, b, r = compare(an, af, bn, bf, rounds=rounds, min_time=0.0)
            results["timings"] += [a.as_dict(), b.as_dict()]
            results["ratios"][key] = ratio(r, goal, **extra)

        for label, target in (("rows", rows), ("4x2 grid", grid)):
            abstract = {"w": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=target)}

            def hb_restore(target: Any = target, mmap: bool = True) -> Any:
                return hb.shards.to_jax(hb.load(hpath, mmap=mmap)["w"], target)

            def orbax_restore(abstract: Any = abstract) -> Any:
                return ck.restore(odir, abstract)["w"]

            def summed(fn: Any, cold: bool = False) -> Any:
                def run() -> float:
                    if cold:
                        _drop_cache(hpath, odir)
                    return float(total(fn()))
                return run

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", hb.CopyWarning)  # the grid is a reshard
                for fn in (hb_restore, lambda: hb_restore(mmap=False), orbax_restore):
                    y = fn()
                    assert y.sharding.is_equivalent_to(target, 2)
                    assert np.array_equal(np.asarray(y), host)
                    del y
                record(f"restore + sum ({label}): hb.load (mapped) / orbax restore",
                       "to_jax(hb.load(path)) + sum", summed(hb_restore),
                       "orbax StandardCheckpointer.restore + sum", summed(orbax_restore),
                       "<= 1.0")
                record(f"restore + sum ({label}): hb.load(mmap=False) / orbax restore",
                       "to_jax(hb.load(path, mmap=False)) + sum",
                       summed(lambda: hb_restore(mmap=False)),
                       "orbax StandardCheckpointer.restore + sum", summed(orbax_restore),
                       "<= 1.0")
                if label == "rows":
                    record("restore only (rows): hb.load (mapped, nothing read) / orbax",
                           "to_jax(hb.load(path))", hb_restore,
                           "orbax StandardCheckpointer.restore", lambda: orbax_restore()
                           .block_until_ready(), "info")
                    if _drop_cache(hpath, odir):
                        for mmap in (True, False):
                            record(f"cold restore + sum (rows): hb.load(mmap={mmap}) / orbax",
                                   f"to_jax(hb.load(path, mmap={mmap})) + sum, cache emptied",
                                   summed(lambda mmap=mmap: hb_restore(mmap=mmap), cold=True),
                                   "orbax restore + sum, cache emptied",
                                   summed(orbax_restore, cold=True), "<= 1.0")
    finally:
        ck.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return results


def run(small: bool = False, nbytes: int | None = None) -> dict[str, Any]:
    nbytes = nbytes or (SMALL_BYTES if small else DEFAULT_BYTES)
    return run_on_host_devices("jax_restore", [str(nbytes), "7" if small else "9"], DEVICES,
                               ("jax", "orbax"), timeout=1800)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        size = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--bytes=")),
                    None)
        print(json.dumps(run(small="--small" in sys.argv, nbytes=size), indent=1))
