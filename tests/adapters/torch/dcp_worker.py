"""One rank of the multi-process DCP tests (test_checkpoint.py): ``python -m
tests.adapters.torch.dcp_worker MODE DIR`` (MODE: save, load, save-local, load-local),
with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment. It exits 0 when
its checks passed; an assertion ends it with a traceback on stderr, which the test
shows."""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

from hurray_bridge.adapters.torch.checkpoint import HurrayStorageReader, HurrayStorageWriter


def expected() -> dict[str, object]:
    """The global values every rank saves, and every load must give back."""
    return {
        "model.shard": torch.arange(21, dtype=torch.float32).reshape(7, 3),
        "model.rep": torch.linspace(0, 1, 5),
        "model.bf16": (torch.arange(24, dtype=torch.float32) / 8).reshape(6, 4)
        .to(torch.bfloat16),
        "model.tiny": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
        "model.one": torch.tensor([[7.0, 8.0, 9.0]]),  # one row: the other ranks' boxes are empty
        "plain": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5),
        "step": 11,
        "cfg": {"lr": 0.125, "name": "run-7"},
    }


def zeros_like(value: object) -> object:
    if isinstance(value, DTensor):
        return distribute_tensor(torch.zeros(value.shape, dtype=value.dtype), value.device_mesh,
                                 value.placements)
    if isinstance(value, torch.Tensor):
        return torch.zeros_like(value)
    if isinstance(value, dict):
        return {k: type(v)() for k, v in value.items()}
    return type(value)()


def save_state(mesh: object) -> dict[str, object]:
    g = expected()
    return {
        "model.shard": distribute_tensor(g["model.shard"], mesh, [Shard(0)]),
        "model.rep": distribute_tensor(g["model.rep"], mesh, [Replicate()]),
        "model.bf16": distribute_tensor(g["model.bf16"], mesh, [Shard(1)]),
        "model.tiny": distribute_tensor(g["model.tiny"], mesh, [Shard(0)]),
        "model.one": distribute_tensor(g["model.one"], mesh, [Shard(0)]),
        **{k: g[k] for k in ("plain", "empty", "scalar", "step", "cfg")},
    }


def load_state(mesh: object) -> dict[str, object]:
    """Destinations with other placements than the save's: DCP's planner reshards."""
    g = expected()
    return zeros_like_all({
        "model.shard": distribute_tensor(g["model.shard"], mesh, [Shard(1)]),
        "model.rep": distribute_tensor(g["model.rep"], mesh, [Shard(0)]),
        "model.bf16": distribute_tensor(g["model.bf16"], mesh, [Shard(0)]),
        "model.tiny": distribute_tensor(g["model.tiny"], mesh, [Replicate()]),
        "model.one": distribute_tensor(g["model.one"], mesh, [Shard(0)]),
        **{k: g[k] for k in ("plain", "empty", "scalar", "step", "cfg")},
    })


def zeros_like_all(sd: dict[str, object]) -> dict[str, object]:
    return {k: zeros_like(v) for k, v in sd.items()}


def check(sd: dict[str, object]) -> None:
    for k, want in expected().items():
        got = sd[k]
        if isinstance(got, DTensor):
            got = got.full_tensor()
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor) and got.dtype == want.dtype, (k, got)
            assert torch.equal(got, want), (k, got, want)
        else:
            assert got == want, (k, got, want)


def main(mode: str, path: str) -> None:
    world = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (world,))
        if mode == "save":
            dcp.save(save_state(mesh), storage_writer=HurrayStorageWriter(path))
        elif mode == "save-local":  # no collectives: every rank plans and keeps its own plan
            dcp.save(save_state(mesh), storage_writer=HurrayStorageWriter(path),
                     use_collectives=False)
        elif mode == "load-local":  # a rank's own plan has its own chunks: same placements
            sd = zeros_like_all(save_state(mesh))
            dcp.load(sd, storage_reader=HurrayStorageReader(path))
            check(sd)
        else:
            sd = load_state(mesh)
            dcp.load(sd, storage_reader=HurrayStorageReader(path))
            check(sd)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    # The checks passed and the group is destroyed. Gloo's worker threads may still drop a
    # tensor whose storage holds a Python object (torch's own pickled-object tensors); if one
    # does while the interpreter finalizes, the thread is ended inside C++ and the process
    # aborts ("terminate called without an active exception", about 1 run in 20 of these
    # tests; pytorch/pytorch#179291 describes it). Leave without finalizing.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
