"""torch DTensor <-> hb.ShardedTensor, for real: two processes on the gloo backend.

The one test starts two worker processes (this file run as a script) that form a
process group on loopback (free ports found by binding port 0), run every case in
the same order, and write what passed to a JSON file; the test then reads both.
The cases: ``hb.asarray(dtensor)`` gives each rank its shard as a partial
ShardedTensor over the same memory, with the box torch's own checkpoint helper
computes; ``Partial`` is refused naming the fix; ``hb.shards.to_dtensor`` builds a
working DTensor (``full_tensor()`` gathers it over gloo) without a copy, or with one
when resharding; per-rank files merge into the whole tensor; and a DTensor's shards
become one global ``jax.Array`` across the two processes (``jax.distributed`` on CPU,
one device per process) with each process's JAX buffer being the torch memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RANK = os.environ.get("HB_DTENSOR_RANK")
ROOT = Path(__file__).resolve().parents[3]
CASES = ["rows_uneven", "columns", "replicate", "placements_match_torch", "empty_shard",
         "partial_refused", "to_dtensor_zero_copy", "to_dtensor_needs_the_box",
         "per_rank_files", "jax_global_array"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(RANK is not None, reason="the worker runs no pytest")
def test_dtensor_on_two_gloo_ranks(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               HB_JAX_PORT=str(_free_port()), HB_DTENSOR_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               JAX_PLATFORMS="cpu", OMP_NUM_THREADS="1")
    outputs = []
    # Each Popen as a context, so no rank's pipe is left open when the other one fails.
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
                     [sys.executable, __file__], env=dict(env, HB_DTENSOR_RANK=str(r)),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for r in (0, 1)]
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=240)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
    report = "\n".join(f"--- rank {r} (exit {p.returncode})\n{out[-6000:]}"
                       for r, (p, out) in enumerate(zip(procs, outputs)))
    for r in (0, 1):
        path = tmp_path / f"result{r}.json"
        assert path.exists(), report
        result = json.loads(path.read_text())
        assert not result["failed"], report
        assert sorted(result["passed"] + result["skipped"]) == sorted(CASES), report
    assert all(p.returncode == 0 for p in procs), report


# ------------------------------------------------------------------ the worker
def _worker() -> int:
    import datetime

    t0 = time.perf_counter()
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    import hurray_bridge as hb
    from hurray_bridge.adapters.torch.shards import local_box
    from hurray_bridge.shards import to_dtensor

    rank = int(os.environ["HB_DTENSOR_RANK"])
    out_dir = Path(os.environ["HB_DTENSOR_DIR"])
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2,))
    print(f"rank {rank}: imports and process group: {time.perf_counter() - t0:.2f} s", flush=True)
    # The same global tensors on both ranks: 5 rows split 3 + 2 (torch.chunk), 4 x 6 evenly.
    g = torch.arange(20, dtype=torch.float32).reshape(5, 4)
    e = torch.arange(24, dtype=torch.float32).reshape(4, 6)

    def check_shard(d: Any, st: Any) -> None:
        """st is this rank's part of DTensor d: one shard, the local memory, torch's box."""
        local = d.to_local()
        shape, offsets = compute_local_shape_and_global_offset(d.shape, d.device_mesh,
                                                               d.placements)
        assert isinstance(st, hb.ShardedTensor) and len(st) == 1, st
        assert st.shape == tuple(d.shape) and st.dtype == hb.float32
        assert st.boxes[0] == hb.Box(tuple(offsets), tuple(shape)), (st.boxes, offsets, shape)
        t = st.shards[0]
        if local.numel():
            assert t.data_ptr == local.data_ptr()  # zero-copy: the local tensor's memory
        assert t.device == hb.CPU and not t.copied
        # The box is right: the local values are the global tensor's there.
        assert np.array_equal(local.numpy(), d.full_tensor().numpy()[st.boxes[0].slices()])

    def rows_uneven() -> None:
        d = distribute_tensor(g, mesh, [Shard(0)])
        st = hb.asarray(d)
        check_shard(d, st)
        assert not st.is_complete and "partial" in repr(st)
        assert st.boxes[0] == (hb.Box((0, 0), (3, 4)) if rank == 0 else hb.Box((3, 0), (2, 4)))
        assert st.shards[0].descriptor.shard.replica_id == 0
        with _raises(hb.FormatError, "box \\[3:5, 0:4\\]" if rank == 0 else "box \\[0:3, 0:4\\]"):
            hb.assemble(st)  # one rank's part alone is not the tensor

    def columns() -> None:
        d = distribute_tensor(e, mesh, [Shard(-1)])
        st = hb.asarray(d)
        check_shard(d, st)
        assert st.boxes[0] == hb.Box((0, 3 * rank), (4, 3))

    def replicate() -> None:
        d = distribute_tensor(g, mesh, [Replicate()])
        st = hb.asarray(d)
        check_shard(d, st)
        assert st.is_complete and st.shards[0].descriptor.shard.replica_id == rank
        assert np.array_equal(hb.assemble(st), g.numpy())

    def placements_match_torch() -> None:
        # Several mesh dimensions, nested and uneven splits: the boxes are torch's.
        for shape, placements in [((1, 2), [Replicate(), Shard(0)]),
                                  ((2, 1), [Shard(1), Shard(1)]),
                                  ((2, 1), [Shard(0), Replicate()]),
                                  ((1, 2), [Shard(1), Shard(0)])]:
            m2 = init_device_mesh("cpu", shape)
            for gshape in [(5, 4), (1, 7), (0, 3), (3, 5)]:
                box, _ = local_box(gshape, m2, placements)
                lshape, offs = compute_local_shape_and_global_offset(gshape, m2, placements)
                assert box.sizes == tuple(lshape), (shape, placements, gshape, box, lshape)
                if box.volume:  # torch's offset of an empty piece is its own convention
                    assert box.offsets == tuple(offs), (shape, placements, gshape, box, offs)
            d = distribute_tensor(g, m2, placements)
            check_shard(d, hb.asarray(d))

    def empty_shard() -> None:
        d = distribute_tensor(torch.ones(1, 3), mesh, [Shard(0)])  # rank 1 gets no rows
        st = hb.asarray(d)
        assert st.boxes[0].sizes == ((1, 3) if rank == 0 else (0, 3))
        back = to_dtensor(st, mesh, [Shard(0)])
        assert torch.equal(back.full_tensor(), torch.ones(1, 3))

    def partial_refused() -> None:
        p = DTensor.from_local(torch.ones(2, 2), mesh, [Partial()], run_check=False)
        with _raises(hb.UnsupportedError, "redistribute.*Replicate\\(\\).*full_tensor"):
            hb.asarray(p)
        with _raises(hb.UnsupportedError, "Partial"):
            to_dtensor(hb.split(np.ones((2, 2), np.float32), [((0, 0), (2, 2))]), mesh,
                       [Partial()])
        with _raises(hb.UnsupportedError, "hb.asarray"):
            hb.get_adapter("torch").to_hurray(p)  # the dense adapter points the way
        assert torch.equal(hb.convert(hb.asarray(p.full_tensor()), "torch"),
                           torch.full((2, 2), 2.0))

    def to_dtensor_zero_copy() -> None:
        d = distribute_tensor(g, mesh, [Shard(0)])
        st = hb.asarray(d)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no copy, no warning
            y = to_dtensor(st, mesh, [Shard(0)], copy=False)
        assert isinstance(y, DTensor) and y.placements == (Shard(0),) and y.shape == g.shape
        assert y.to_local().data_ptr() == d.to_local().data_ptr()
        assert torch.equal(y.full_tensor(), g)
        z = to_dtensor(st, mesh, [Shard(0)], copy=True)
        assert z.to_local().data_ptr() != d.to_local().data_ptr()
        assert torch.equal(z.full_tensor(), g)

    def to_dtensor_needs_the_box() -> None:
        st = hb.asarray(distribute_tensor(g, mesh, [Shard(0)]))
        with _raises(hb.FormatError, "is not covered by these shards"):
            to_dtensor(st, mesh, [Shard(1)])  # other ranks' rows are not here
        whole = hb.split(g.numpy(), hb.grid_boxes((5, 4), (2, 1)))  # every box, this process
        with _raises(hb.CopyRequiredError, "resharding"):
            to_dtensor(whole, mesh, [Shard(1)], copy=False)
        with pytest.warns(hb.CopyWarning, match="resharding"):
            y = to_dtensor(whole, mesh, [Shard(1)])
        assert torch.equal(y.full_tensor(), g)

    def per_rank_files() -> None:
        d, de = distribute_tensor(g, mesh, [Shard(0)]), distribute_tensor(e, mesh, [Shard(0)])
        files = [str(out_dir / f"rank{r}.hurray") for r in (0, 1)]
        extra = {"step": np.array([7])} if rank == 0 else {}
        hb.save(files[rank], {"w": d, "e": de, **extra}, {"run": "a", "rank": str(rank)})
        dist.barrier()
        names = [en.name for en in hb.container.read_index(files[rank]).entries]
        assert names[:2] == ["w[0]", "e[0]"], names  # ordinary entries with shard sections
        own = hb.load(files[rank])
        mine = hb.asarray(d)
        assert not own["w"].is_complete and own["w"].boxes == mine.boxes
        assert own["w"].shards[0].readonly  # a view into the file's map
        both = hb.load(files)
        assert list(both) == ["w", "e", "step"] and both.metadata == {"run": "a"}
        w = both["w"]
        assert w.is_complete and len(w) == 2
        assert np.array_equal(hb.assemble(w), g.numpy())
        # This rank's box straight from its file's map, then resharded from both files.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch gets read-only memory
            y = to_dtensor(own["w"], mesh, [Shard(0)], copy=False)
        assert y.to_local().data_ptr() == own["w"].shards[0].data_ptr
        assert torch.equal(y.full_tensor(), g)
        with pytest.warns(hb.CopyWarning, match="resharding"):
            z = to_dtensor(w, mesh, [Shard(1)])
        assert torch.equal(z.full_tensor(), g)
        with _raises(hb.FormatError, "box \\[3:5, 0:4\\] of global shape \\[5, 4\\] is in no file"):
            hb.load(files[:1])

    def jax_global_array() -> None:
        try:
            import jax
        except ImportError:
            raise _Skip("jax is not installed") from None
        from jax.experimental import multihost_utils
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        from hurray_bridge.shards import to_jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{os.environ['HB_JAX_PORT']}", num_processes=2,
                                   process_id=rank)
        try:
            assert len(jax.devices()) == 2 and len(jax.local_devices()) == 1
            sharding = NamedSharding(Mesh(np.array(jax.devices()), ("x",)), P("x"))
            d = distribute_tensor(e, mesh, [Shard(0)])  # the same boxes as the JAX sharding
            local = d.to_local()
            with warnings.catch_warnings():
                warnings.simplefilter("error" if local.data_ptr() % 64 == 0 else "ignore")
                y = to_jax(hb.asarray(d), sharding)
            assert y.shape == (4, 6) and not y.is_fully_addressable
            (mine,) = y.addressable_shards
            if local.data_ptr() % 64 == 0:  # JAX takes 64-byte aligned host memory as it is
                assert mine.data.unsafe_buffer_pointer() == local.data_ptr()
            assert np.array_equal(np.asarray(multihost_utils.process_allgather(y, tiled=True)),
                                  e.numpy())
            # Both ranks' files, mapped: each process's JAX shard is its box in the map.
            both = hb.load([str(out_dir / f"rank{r}.hurray") for r in (0, 1)])
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                z = to_jax(both["e"], sharding)
            (zs,) = z.addressable_shards
            ptrs = {t.data_ptr for t in both["e"].shards}
            assert zs.data.unsafe_buffer_pointer() in ptrs
            assert np.array_equal(np.asarray(multihost_utils.process_allgather(z, tiled=True)),
                                  e.numpy())
        finally:
            jax.distributed.shutdown()

    scope = locals()
    cases: dict[str, Callable[[], None]] = {name: scope[name] for name in CASES}
    passed, failed, skipped = [], {}, []
    for name, case in cases.items():
        start = time.perf_counter()
        try:
            case()
        except _Skip as exc:
            skipped.append(name)
            print(f"rank {rank}: {name}: skipped ({exc})", flush=True)
        except BaseException:
            failed[name] = traceback.format_exc()
            print(f"rank {rank}: {name}: FAILED\n{failed[name]}", flush=True)
        else:
            passed.append(name)
        dist.barrier()  # keep the ranks in step even after a failure
        print(f"rank {rank}: {name}: {time.perf_counter() - start:.2f} s", flush=True)
    (out_dir / f"result{rank}.json").write_text(
        json.dumps({"passed": passed, "failed": failed, "skipped": skipped}))
    dist.destroy_process_group()
    return 1 if failed else 0


class _Skip(Exception):
    pass


class _raises:
    """``pytest.raises`` without pytest's machinery: the exception type and a regex."""

    def __init__(self, kind: type[BaseException], pattern: str) -> None:
        self.kind, self.pattern = kind, pattern

    def __enter__(self) -> None:
        return None

    def __exit__(self, tp: Any, exc: Any, tb: Any) -> bool:
        import re

        if tp is None:
            raise AssertionError(f"did not raise {self.kind.__name__}")
        if not issubclass(tp, self.kind) or not re.search(self.pattern, str(exc)):
            return False
        return True


if __name__ == "__main__" and RANK is not None:
    sys.exit(_worker())
