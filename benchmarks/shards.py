"""A sharded ``jax.Array`` through ``hb.asarray`` / ``hb.convert``, against JAX's own ways.

One float32 array of 1 GiB (``--small``: 64 MiB) on four CPU devices (a 2x2 mesh,
``P("x", "y")``; and ``P("x", None)``, each box on two devices), in a child process
started with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (the flag must
be set before JAX is imported). Interleaved in the same run:

- ``hb.asarray(x)`` (an hb.ShardedTensor of zero-copy views) against the per-shard
  loop ``[np.from_dlpack(s.data) for s in x.addressable_shards]``, and against
  ``jax.device_get(x)``, the gather it saves;
- ``hb.convert(x, "numpy", copy=True)`` (assembly, each box read once) against
  ``jax.device_get(x)``, for both shardings. A jax.Array keeps the NumPy value
  ``device_get`` made (later calls return it), so each call gathers a fresh
  array over the same buffers (``make_array_from_single_device_arrays``, ~20 us);
- ``hb.convert(st, "jax")`` of a shard set of 64-byte aligned NumPy rows that name
  the four devices (the sharding is rebuilt, every shard aliased) against the
  per-shard loop ``jnp.from_dlpack(row, device=d)`` +
  ``jax.make_array_from_single_device_arrays``, which copies the rows bound for
  devices other than cpu:0 (JAX places foreign CPU memory on cpu:0 only);
- ``hb.convert(x, "jax")`` (x itself) against rebuilding x from its shards.

Before timing, zero-copy claims are checked by data pointer and results by value.
Goals: assembly within 1.3x of ``jax.device_get``; ``hb.asarray`` under 1 % of it
(views, no gather); a host shard set to JAX within 1.3x of the per-shard loop.
The zero-copy calls against their loops are for information: an hb.ShardedTensor
describes every shard (box, replica, device) where the loops only view buffers.

``python -m benchmarks shards [--small]``
"""

from __future__ import annotations

import json
import sys
import warnings
from typing import Any

from ._timing import compare, ratio, run_on_host_devices

DEFAULT_BYTES = 1 << 30
SMALL_BYTES = 64 << 20
DEVICES = 4


def _child(nbytes: int, rounds: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import hurray_bridge as hb

    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    side = int((nbytes // 4) ** 0.5)
    side -= side % 32  # rows of 64-byte multiples, split evenly in two and four
    shape = (side, side)
    size_mib = side * side * 4 / (1 << 20)
    results["notes"].append(f"float32 {list(shape)} ({size_mib:.0f} MiB) on {DEVICES} CPU "
                            f"devices; jax {jax.__version__}")
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:DEVICES])
    host = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)

    def record(key: str, an: str, af: Any, bn: str, bf: Any, goal: str, **extra: Any) -> None:
        a, b, r = compare(an, af, bn, bf, rounds=rounds, min_time=0.004)
        results["timings"] += [a.as_dict(), b.as_dict()]
        results["ratios"][key] = ratio(r, goal, **extra)

    def device_get(x: Any) -> Any:
        fresh = jax.make_array_from_single_device_arrays(
            x.shape, x.sharding, [s.data for s in x.addressable_shards])
        return jax.device_get(fresh)

    for label, spec in (("2x2", P("x", "y")), ("rows x2 replicas", P("x", None))):
        x = jax.device_put(host, NamedSharding(mesh, spec))
        x.block_until_ready()
        st = hb.asarray(x)
        ptrs = [s.data.unsafe_buffer_pointer() for s in x.addressable_shards]
        assert [t.data_ptr for t in st.shards] == ptrs  # zero-copy views
        assert np.array_equal(hb.convert(x, "numpy", copy=True), host)
        assert np.array_equal(device_get(x), host)
        if label == "2x2":
            record("asarray(sharded) / np.from_dlpack per shard",
                   "hb.asarray(x)", lambda x=x: hb.asarray(x),
                   "[np.from_dlpack(s.data) for s in shards]",
                   lambda x=x: [np.from_dlpack(s.data) for s in x.addressable_shards],
                   "info", zero_copy=True)
            record("asarray(sharded) / jax.device_get",
                   "hb.asarray(x)", lambda x=x: hb.asarray(x),
                   "jax.device_get(x)", lambda x=x: device_get(x), "< 0.01", zero_copy=True)
            rebuilt = jax.make_array_from_single_device_arrays(
                x.shape, x.sharding, [s.data for s in x.addressable_shards])
            assert rebuilt.addressable_shards[0].data.unsafe_buffer_pointer() == ptrs[0]
            assert hb.convert(x, "jax") is x
            record("convert(sharded, 'jax') / rebuild from shards",
                   "hb.convert(x, 'jax')", lambda x=x: hb.convert(x, "jax"),
                   "make_array_from_single_device_arrays(s.data ...)",
                   lambda x=x: jax.make_array_from_single_device_arrays(
                       x.shape, x.sharding, [s.data for s in x.addressable_shards]),
                   "info", zero_copy=True)
        record(f"convert(sharded {label}, 'numpy') / jax.device_get",
               "hb.convert(x, 'numpy', copy=True)",
               lambda x=x: hb.convert(x, "numpy", copy=True),
               "jax.device_get(x)", lambda x=x: device_get(x), "<= 1.3",
               boxes_read=len(st.primary_shards()), shards=len(st))
        del x, st

    # Host rows that name the devices: hb rebuilds the sharding and aliases every row.
    buf = np.empty(host.nbytes + 64, np.uint8)
    off = -buf.ctypes.data % 64
    rows_host = buf[off:off + host.nbytes].view(np.float32).reshape(shape)
    rows_host[...] = host
    boxes = hb.shards.grid_boxes(shape, (DEVICES, 1))
    devices = jax.devices()[:DEVICES]
    st = hb.shards.split(rows_host, boxes, devices=[(1, d.id) for d in devices])
    sharding = NamedSharding(jax.make_mesh((DEVICES,), ("x",), devices=devices), P("x", None))
    views = [rows_host[b.slices()] for b in boxes]

    def loop() -> Any:
        # Waited for: the rows bound for other devices are copied asynchronously.
        return jax.make_array_from_single_device_arrays(
            shape, sharding, [jnp.from_dlpack(v, device=d) for v, d in zip(views, devices)]
        ).block_until_ready()

    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        y = hb.convert(st, "jax", copy=False)
    assert {s.data.unsafe_buffer_pointer() for s in y.addressable_shards} == {
        v.ctypes.data for v in views}
    theirs = loop()
    aliased = sum(s.data.unsafe_buffer_pointer() in {v.ctypes.data for v in views}
                  for s in theirs.addressable_shards)
    assert np.array_equal(np.asarray(theirs), host) and np.array_equal(np.asarray(y), host)
    record("convert(host shard set, 'jax') / jnp.from_dlpack per shard",
           "hb.convert(st, 'jax')", lambda: hb.convert(st, "jax").block_until_ready(),
           "make_array(jnp.from_dlpack(row, device=d) ...)", loop, "<= 1.3",
           zero_copy=True, direct_loop_aliases=f"{aliased} of {DEVICES} rows")
    return results


def run(small: bool = False) -> dict[str, Any]:
    nbytes = SMALL_BYTES if small else DEFAULT_BYTES
    return run_on_host_devices("shards", [str(nbytes), "7" if small else "9"], DEVICES,
                               ("jax",), timeout=1200)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--child":
        print(json.dumps(_child(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        print(json.dumps(run(small="--small" in sys.argv), indent=1))
