"""torch.distributed.checkpoint: the Hurray storage backend against DCP's own.

One state dict (default ~128 MiB: 32 float32 and bfloat16 matrices and 32 small
vectors, random values), saved and loaded through
``HurrayStorageWriter``/``HurrayStorageReader`` and through DCP's
``FileSystemWriter``/``FileSystemReader``, in the same run:

- save, one process: both durable (Hurray: fsync of each file and its folder, CRC-32
  checksums; DCP: ``sync_files=True``, no checksums), interleaved rounds, each after
  ``os.sync()`` so that neither writer pays for the other's dirty pages;
- load, one process, into preallocated tensors: interleaved rounds (Hurray checks
  the checksum of every entry it reads; DCP has none to check);
- save on two gloo ranks (``Shard(0)`` DTensors), both writers interleaved in the
  same two processes, each save timed from a barrier to a barrier;
- bytes read and peak memory per rank, each load in a fresh child process (its
  ``/proc/self/io`` ``rchar`` and ``VmHWM`` growth over the destination tensors):
  one rank loading everything, and two gloo ranks each loading one half of every
  tensor (``Shard(0)`` DTensors) from the one-process checkpoint; for Hurray with
  checksums and with ``verify=False`` (only the rows a rank needs).

Files are read right after they are written (warm page cache; nothing here can drop
caches), so the load times compare the readers' own work, not the disk.

``python -m benchmarks dcp [--small]``; ``python -m benchmarks.dcp --size 512MiB``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

from ._timing import Timing, compare, parse_size, ratio, time_saves

DEFAULT_SIZE = 128 << 20
SMALL_SIZE = 16 << 20
N_BIG = 32
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state_dict(size: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(7)
    out: dict[str, Any] = {}
    per = size // N_BIG
    for i in range(N_BIG):
        dt = torch.float32 if i % 2 == 0 else torch.bfloat16
        cols = 1024
        rows = max(2, per // (cols * (4 if dt == torch.float32 else 2)))
        out[f"layers.{i}.weight"] = torch.randn(rows, cols, generator=g).to(dt)
        out[f"layers.{i}.norm"] = torch.randn(cols, generator=g)
    return out


def _zeros(sd: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in sd.items()}


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    return 0




# ---------------------------------------------------------------- child ranks
def _child_saves(path: str, size: int, repeat: int) -> None:
    """One of two ranks saving the same DTensors (``Shard(0)``) through both writers,
    interleaved: prints this rank's median times (from a barrier to a barrier)."""
    import datetime

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from hurray_bridge.adapters.torch.checkpoint import HurrayStorageWriter

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))
    sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in _state_dict(size).items()}
    writers = {"hurray": lambda: HurrayStorageWriter(os.path.join(path, "hurray")),
               "dcp": lambda: FileSystemWriter(os.path.join(path, "dcp"), overwrite=True)}
    times: dict[str, list[float]] = {k: [] for k in writers}
    for r in range(repeat + 1):  # the first round warms up and is dropped
        for kind in (("hurray", "dcp") if r % 2 else ("dcp", "hurray")):
            if dist.get_rank() == 0:
                os.sync()
            dist.barrier()
            t0 = time.perf_counter()
            dcp.save(sd, storage_writer=writers[kind]())
            dist.barrier()
            if r:
                times[kind].append(time.perf_counter() - t0)
    print(json.dumps({k: statistics.median(v) for k, v in times.items()}), flush=True)
    dist.destroy_process_group()


def _child(kind: str, path: str, size: int) -> None:
    """One rank's load in a fresh interpreter: prints its bytes read and peak growth."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    from hurray_bridge.adapters.torch.checkpoint import HurrayStorageReader

    world = int(os.environ.get("WORLD_SIZE", "1"))
    sd = _state_dict(size)
    if world > 1:
        import datetime

        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        mesh = init_device_mesh("cpu", (world,))
        dest: dict[str, Any] = {k: distribute_tensor(torch.zeros(v.shape, dtype=v.dtype), mesh,
                                                     [Shard(0)]) for k, v in sd.items()}
    else:
        dest = _zeros(sd)
    want = {k: v for k, v in sd.items()}
    del sd
    reader = (FileSystemReader(path) if kind == "dcp" else
              HurrayStorageReader(path, verify=(kind == "hurray")))
    base_rss, rchar0 = _proc_status("VmRSS"), _rchar()
    # VmHWM is the peak since start; reset it where the kernel allows (Linux >= 4.0).
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(dest, storage_reader=reader)
    read = _rchar() - rchar0
    peak = _proc_status("VmHWM") - base_rss
    ok = True
    for k, v in dest.items():
        local = v.to_local() if hasattr(v, "to_local") else v
        if world > 1:
            from hurray_bridge.adapters.torch.shards import local_box

            box, _ = local_box(tuple(v.shape), v.device_mesh, v.placements)
            ok &= bool(torch.equal(local, want[k][box.slices()]))
        else:
            ok &= bool(torch.equal(local, want[k]))
    needed = sum(v.to_local().numel() * v.element_size() if hasattr(v, "to_local")
                 else v.numel() * v.element_size() for v in dest.values())
    print(json.dumps({"read": read, "peak": peak, "needed": needed, "ok": ok}), flush=True)
    if world > 1:
        import torch.distributed as dist

        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ranks(kind: str, path: str, size: int, world: int, repeat: int = 0,
           ) -> list[dict[str, Any]]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
            [sys.executable, "-W", "ignore", "-m", "benchmarks.dcp", "--child", kind, path,
             "--size", str(size), "--repeat", str(repeat)], cwd=ROOT, env=dict(env, RANK=str(r)),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)) for r in range(world)]
        outs = []
        try:
            for p in procs:
                outs.append(p.communicate(timeout=600))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    rows = []
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"{kind} rank failed (exit {p.returncode}):\n{err[-3000:]}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def run(size: int | None = None, small: bool = False, directory: str | None = None,
        ) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    try:
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    except ImportError:
        results["notes"].append("needs torch with torch.distributed; skipped")
        return results
    from hurray_bridge.adapters.torch.checkpoint import HurrayStorageReader, HurrayStorageWriter

    size = size or (SMALL_SIZE if small else DEFAULT_SIZE)
    repeat = 5  # rounds per pair: the saves spread widely on a shared disk
    sd = _state_dict(size)
    total = sum(v.numel() * v.element_size() for v in sd.values())
    results["notes"].append(f"{len(sd)} tensors, {total / (1 << 20):.1f} MiB "
                            "(float32 and bfloat16); warm page cache")
    tmp = tempfile.mkdtemp(prefix="hurray-bench-dcp-", dir=directory)
    hdir, ddir = os.path.join(tmp, "hurray"), os.path.join(tmp, "dcp")
    t = results["timings"]
    r = results["ratios"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP's single-process notice, overwrite notice
            saves = time_saves({
                f"dcp.save, HurrayStorageWriter ({total >> 20} MiB; fsync, checksums)":
                    lambda: dcp.save(sd, storage_writer=HurrayStorageWriter(hdir)),
                "dcp.save, FileSystemWriter (sync_files, no checksums)":
                    lambda: dcp.save(sd, storage_writer=FileSystemWriter(ddir, overwrite=True)),
            }, repeat)
            t.extend(m.as_dict() for m in saves)
            r["save_vs_filesystemwriter"] = ratio(saves[0].median_us / saves[1].median_us,
                                                  "<= 1.0")
            dest_h, dest_d = _zeros(sd), _zeros(sd)
            th, td, lr = compare(
                "dcp.load, HurrayStorageReader (checksums verified)",
                lambda: dcp.load(dest_h, storage_reader=HurrayStorageReader(hdir)),
                "dcp.load, FileSystemReader",
                lambda: dcp.load(dest_d, storage_reader=FileSystemReader(ddir)),
                rounds=2 * repeat + 1, min_time=0.0)
            assert all(torch.equal(dest_h[k], sd[k]) and torch.equal(dest_d[k], sd[k])
                       for k in sd)
            t += [th.as_dict(), td.as_dict()]
            r["load_vs_filesystemreader"] = ratio(lr, "<= 1.0")
        if not sys.platform.startswith("linux"):
            results["notes"].append("bytes read and peak memory need /proc; not measured")
            return results
        for m in (sd, dest_h, dest_d):  # the children's memory is what is measured next
            m.clear()
        per_rank: dict[str, Any] = {}
        for world in (1, 2):
            if world > 1:
                import torch.distributed as dist

                if not dist.is_gloo_available():
                    results["notes"].append("no gloo backend: the two-rank load not measured")
                    break
            for kind, path in (("hurray", hdir), ("hurray-noverify", hdir), ("dcp", ddir)):
                rows = _ranks(kind, path, size, world)
                if not all(row["ok"] for row in rows):
                    raise RuntimeError(f"{kind} on {world} rank(s) loaded wrong values")
                per_rank[f"{world}:{kind}"] = rows
        if "2:dcp" in per_rank:
            saves2 = _ranks("saves", tmp, size, 2, repeat)
            h2, d2 = (max(x[k] for x in saves2) for k in ("hurray", "dcp"))
            t += [Timing("dcp.save on 2 gloo ranks, HurrayStorageWriter (slowest rank)",
                         h2 * 1e6, 0.0, 1).as_dict(),
                  Timing("dcp.save on 2 gloo ranks, FileSystemWriter (slowest rank)",
                         d2 * 1e6, 0.0, 1).as_dict()]
            r["save_2_ranks_vs_filesystemwriter"] = ratio(h2 / d2, "<= 1.0")
        for world in (1, 2):
            d = per_rank.get(f"{world}:dcp")
            if d is None:
                continue
            for kind in ("hurray", "hurray-noverify"):
                h = per_rank[f"{world}:{kind}"]
                label = f"{world}_rank{'s' * (world > 1)}_{kind.replace('-', '_')}"
                r[f"bytes_read_{label}_vs_filesystemreader"] = ratio(
                    max(x["read"] for x in h) / max(x["read"] for x in d), "<= 1.0",
                    per_rank_mib=[round(x["read"] / (1 << 20), 1) for x in h],
                    peer_per_rank_mib=[round(x["read"] / (1 << 20), 1) for x in d],
                    needed_per_rank_mib=[round(x["needed"] / (1 << 20), 1) for x in h])
                results["notes"].append(
                    f"{world} rank(s), {kind}: read per rank "
                    f"{[round(x['read'] / (1 << 20), 1) for x in h]} MiB (FileSystemReader "
                    f"{[round(x['read'] / (1 << 20), 1) for x in d]}, needed "
                    f"{[round(x['needed'] / (1 << 20), 1) for x in h]}); peak growth "
                    f"{[round(x['peak'] / (1 << 20), 1) for x in h]} MiB (FileSystemReader "
                    f"{[round(x['peak'] / (1 << 20), 1) for x in d]})")
                r[f"peak_memory_{label}_vs_filesystemreader"] = ratio(
                    max(x["peak"] for x in h) / max(1, max(x["peak"] for x in d)),
                    "informational: VmHWM growth over the destination tensors",
                    per_rank_mib=[round(x["peak"] / (1 << 20), 1) for x in h],
                    peer_per_rank_mib=[round(x["peak"] / (1 << 20), 1) for x in d])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return results




def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.dcp")
    p.add_argument("--size", type=parse_size, default=None, help="checkpoint size, e.g. 512MiB")
    p.add_argument("--small", action="store_true")
    p.add_argument("--child", nargs=2, metavar=("KIND", "DIR"), help=argparse.SUPPRESS)
    p.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child and args.child[0] == "saves":
        _child_saves(args.child[1], args.size, args.repeat)
        return
    if args.child:
        _child(args.child[0], args.child[1], args.size)
        return
    print(json.dumps(run(size=args.size, small=args.small), indent=1))


if __name__ == "__main__":
    main()
