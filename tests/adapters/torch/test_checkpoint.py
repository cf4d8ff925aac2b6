"""torch.distributed.checkpoint through HurrayStorageWriter / HurrayStorageReader.

Single process (no process group): every kind of state-dict value round-trips, the
files are ordinary Hurray files (``hurray verify``, ``hb.load``), a corrupt byte is
caught by the checksum on load, and the plan is JSON (the bridge unpickles nothing).
Several processes: two gloo ranks on loopback save DTensors (``Shard``, uneven and
empty boxes, ``Replicate``), plain tensors, bfloat16, empty and 0-d tensors and
non-tensor values; three ranks load them with other placements, and one process
loads them as plain tensors (DCP's planner reshards). Worker processes are bounded by
timeouts and killed in ``finally`` (tests/adapters/torch/dcp_worker.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("this torch was built without torch.distributed", allow_module_level=True)
dcp = pytest.importorskip("torch.distributed.checkpoint")

import hurray_bridge as hb  # noqa: E402
from hurray_bridge.adapters.torch.checkpoint import (  # noqa: E402
    METADATA_FILE,
    METADATA_KEY,
    HurrayStorageReader,
    HurrayStorageWriter,
    data_file,
)
from hurray_bridge.container import load_metadata, save  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
WORKER_TIMEOUT = 180  # seconds per group of ranks; a stuck rendezvous fails, never hangs


@contextlib.contextmanager
def _refused(kind: type[BaseException], match: str) -> Any:
    """DCP wraps what a rank raised in a CheckpointException (a BaseException), keyed by
    rank: the reader's own error is the one inside."""
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException) as info:
        yield
    exc = info.value.failures[0][0]
    assert isinstance(exc, kind), exc
    assert match in str(exc), exc


@pytest.fixture(autouse=True)
def _no_dcp_single_process_warning() -> Any:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _state() -> dict[str, Any]:
    return {
        "w": torch.randn(4, 3, generator=torch.Generator().manual_seed(1)),
        "b": torch.arange(5).to(torch.bfloat16),
        "e": torch.empty(0, 2),
        "s": torch.tensor(3.5),
        "i": torch.arange(6, dtype=torch.int64).reshape(3, 2).t(),  # not contiguous
        "n": 7,
        "cfg": {"lr": 0.1, "name": "x"},
    }


def _zeros(sd: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[k] = torch.zeros(v.shape, dtype=v.dtype)
        elif isinstance(v, dict):
            out[k] = {kk: type(vv)() for kk, vv in v.items()}
        else:
            out[k] = type(v)()
    return out


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        if isinstance(w, torch.Tensor):
            assert got[k].dtype == w.dtype and torch.equal(got[k], w), k
        else:
            assert got[k] == w, k


def test_single_process_round_trip(tmp_path: Path) -> None:
    sd = _state()
    dcp.save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [METADATA_FILE, data_file(0)]
    out = _zeros(sd)
    dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    _assert_same(out, sd)


def test_checkpoint_id_instead_of_a_path(tmp_path: Path) -> None:
    sd = {"x": torch.arange(3.0)}
    dcp.save(sd, checkpoint_id=tmp_path / "a", storage_writer=HurrayStorageWriter(tmp_path))
    assert (tmp_path / "a" / METADATA_FILE).exists()
    out = {"x": torch.zeros(3)}
    dcp.load(out, checkpoint_id=tmp_path / "a", storage_reader=HurrayStorageReader(tmp_path))
    assert torch.equal(out["x"], sd["x"])
    assert HurrayStorageWriter.validate_checkpoint_id(tmp_path)
    assert not HurrayStorageReader.validate_checkpoint_id("s3://bucket/ckpt")


def test_files_are_ordinary_hurray_files(tmp_path: Path) -> None:
    sd = _state()
    dcp.save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    rank_file = tmp_path / data_file(0)
    for f in (rank_file, tmp_path / METADATA_FILE):
        proc = subprocess.run([sys.executable, "-m", "hurray_bridge", "verify", str(f)],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    with hb.load(rank_file, verify=True) as f:
        for k in ("w", "b", "e", "s", "i"):
            assert torch.equal(hb.convert(f[k], "torch", copy=True), sd[k]), k
        # DCP's byte items are opaque uint8 entries: the bridge hands them over unread.
        assert f["n"].dtype == hb.uint8 and f["n"].shape[0] > 0
    assert hb.load(tmp_path / METADATA_FILE) == {}


def test_the_plan_is_json_not_pickle(tmp_path: Path) -> None:
    dcp.save(_state(), storage_writer=HurrayStorageWriter(tmp_path))
    doc = json.loads(load_metadata(tmp_path / METADATA_FILE)[METADATA_KEY])
    assert doc["items"]["b"] == {"dtype": "bfloat16", "size": [5], "chunks": [[[0], [5]]]}
    assert doc["items"]["s"]["size"] == [] and doc["items"]["n"] == {"bytes": True}
    assert doc["planner_data"]["cfg.lr"] == ["cfg", "lr"]
    assert ["w", [0, 0], data_file(0), "w"] in doc["storage"]
    # No unpickling on the way: the tensors load with pickle's functions and class broken,
    # which DCP's own reader needs (its .metadata is a pickle): the control below.
    import pickle

    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    dcp.save({"w": torch.zeros(4, 3)}, storage_writer=FileSystemWriter(tmp_path / "peer"))

    class Refuse(pickle.Unpickler):
        def __init__(self, *a: Any, **k: Any) -> None:
            raise AssertionError("unpickled")

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("unpickled")

    out = _zeros({"w": torch.zeros(4, 3), "b": torch.zeros(5, dtype=torch.bfloat16)})
    real = pickle.load, pickle.loads, pickle.Unpickler
    pickle.load, pickle.loads, pickle.Unpickler = refuse, refuse, Refuse  # type: ignore[misc]
    try:
        dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
        from torch.distributed.checkpoint.api import CheckpointException

        with pytest.raises(CheckpointException, match="read failed: unpickled"):
            dcp.load({"w": torch.zeros(4, 3)},
                     storage_reader=FileSystemReader(tmp_path / "peer"))
    finally:
        pickle.load, pickle.loads, pickle.Unpickler = real  # type: ignore[misc]
    assert out["b"].dtype == torch.bfloat16 and out["b"].tolist() == [0, 1, 2, 3, 4]


def _flip_a_byte_of(path: Path, entry: str) -> None:
    idx = hb.container.read_index(path)
    e = next(e for e in idx.entries if e.name == entry)
    at = idx.data_offset + e.buffers[0].offset
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x40]))


def test_checksums_are_verified_on_load(tmp_path: Path) -> None:
    sd = {"w": torch.arange(12.0).reshape(4, 3), "v": torch.arange(4.0)}
    dcp.save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    _flip_a_byte_of(tmp_path / data_file(0), "w")
    out = {"w": torch.zeros(4, 3)}
    with _refused(hb.FormatError, "checksum mismatch"):
        dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    # Only the entries read are checked: v is intact and loads.
    out = {"v": torch.zeros(4)}
    dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    assert torch.equal(out["v"], sd["v"])
    # verify=False skips the check (and loads the corrupt value, as the file holds it).
    out = {"w": torch.zeros(4, 3)}
    dcp.load(out, storage_reader=HurrayStorageReader(tmp_path, verify=False))
    assert not torch.equal(out["w"], sd["w"])


def test_whole_chunks_are_read_into_the_destination(tmp_path: Path) -> None:
    """No buffer in between: the destination's memory is where the bytes land, and the
    path that reads a box into fresh memory is never taken."""
    sd = {"w": torch.arange(64.0).reshape(8, 8)}
    dcp.save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    dest = torch.zeros(8, 8)
    ptr = dest.data_ptr()
    from hurray_bridge.adapters.torch import checkpoint as ck

    made = []
    real_box = ck._RankFile.box

    def spy(self: Any, *a: Any) -> Any:
        made.append(a)
        return real_box(self, *a)

    ck._RankFile.box = spy  # type: ignore[method-assign]
    try:
        out = {"w": dest}
        dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    finally:
        ck._RankFile.box = real_box  # type: ignore[method-assign]
    assert out["w"].data_ptr() == ptr and torch.equal(dest, sd["w"])
    assert made == []


def test_refusals_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(hb.FormatError, match="holds no complete checkpoint"):
        HurrayStorageReader(tmp_path).read_metadata()
    save(tmp_path / METADATA_FILE, {}, {"other": "x"})
    with pytest.raises(hb.FormatError, match=METADATA_KEY):
        HurrayStorageReader(tmp_path).read_metadata()
    bad = {"format": 1, "items": {}, "storage": [["w", [0], "../escape.hurray", "w"]]}
    save(tmp_path / METADATA_FILE, {}, {METADATA_KEY: json.dumps(bad)})
    with pytest.raises(hb.FormatError, match="not a file name in the checkpoint's folder"):
        HurrayStorageReader(tmp_path).read_metadata()
    bad = {"format": 1, "items": {"w": {"dtype": "no_such_type", "size": [1], "chunks": []}},
           "storage": []}
    save(tmp_path / METADATA_FILE, {}, {METADATA_KEY: json.dumps(bad)})
    with pytest.raises(hb.FormatError, match="no_such_type"):
        HurrayStorageReader(tmp_path).read_metadata()
    save(tmp_path / METADATA_FILE, {}, {METADATA_KEY: json.dumps({"format": 99})})
    with pytest.raises(hb.FormatError, match="plan format 99"):
        HurrayStorageReader(tmp_path).read_metadata()
    for modules in (5, "abc", [1], {"m": 1}):  # a TypeError, or a string split into letters
        bad = {"format": 1, "items": {}, "storage": [], "modules": modules}
        save(tmp_path / METADATA_FILE, {}, {METADATA_KEY: json.dumps(bad)})
        with pytest.raises(hb.FormatError, match="'modules' is"):
            HurrayStorageReader(tmp_path).read_metadata()


def test_a_missing_entry_is_named(tmp_path: Path) -> None:
    dcp.save({"w": torch.arange(3.0)}, storage_writer=HurrayStorageWriter(tmp_path))
    save(tmp_path / data_file(0), {"other": torch.arange(3.0)})  # another save's file
    with _refused(hb.FormatError, "does not have"):
        dcp.load({"w": torch.zeros(3)}, storage_reader=HurrayStorageReader(tmp_path))


# ------------------------------------------------------------- several processes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run_ranks(mode: str, path: Path, world: int) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    outputs: list[str] = []
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(subprocess.Popen(
                     [sys.executable, "-X", "faulthandler", "-W", "ignore", "-m",
                      "tests.adapters.torch.dcp_worker",
                      mode, str(path)], cwd=ROOT, env=dict(env, RANK=str(r)),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
                 for r in range(world)]
        try:
            for p in procs:
                outputs.append(p.communicate(timeout=WORKER_TIMEOUT)[0])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
    report = "\n".join(f"--- {mode} rank {r} (exit {p.returncode})\n{out[-4000:]}"
                       for r, (p, out) in enumerate(zip(procs, outputs)))
    assert all(p.returncode == 0 for p in procs), report


@pytest.fixture(scope="module")
def two_rank_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    path = tmp_path_factory.mktemp("dcp2")
    _run_ranks("save", path, 2)
    return path


def test_two_ranks_save_one_file_each(two_rank_checkpoint: Path) -> None:
    names = sorted(os.listdir(two_rank_checkpoint))
    assert names == [METADATA_FILE, data_file(0), data_file(1)]
    for r in (0, 1):
        hb.container.verify(two_rank_checkpoint / data_file(r))


def test_hb_load_of_every_rank_file_gives_global_tensors(two_rank_checkpoint: Path) -> None:
    from tests.adapters.torch.dcp_worker import expected

    g = expected()
    files = [two_rank_checkpoint / data_file(r) for r in (0, 1)]
    with hb.load(files, verify=True) as f:
        # Every DTensor is a set of shard entries (a replicated one: one whole box, written
        # once, DCP deduplicating replicas); "model.one" has an empty box on rank 1.
        for k in ("model.shard", "model.bf16", "model.tiny", "model.one", "model.rep"):
            st = f[k]
            assert isinstance(st, hb.ShardedTensor) and st.is_complete, k
            assert st.shape == tuple(g[k].shape)
            assert torch.equal(hb.shards.assemble(st, to="torch"), g[k]), k
        assert [b.is_empty for b in f["model.one"].boxes] == [False, True]
        # Plain tensors, the same on every rank, were written once, as entries of their own.
        for k in ("plain", "empty", "scalar"):
            assert torch.equal(hb.convert(f[k], "torch", copy=True), g[k]), k


def test_the_c_library_verifies_and_reads_the_rank_files(two_rank_checkpoint: Path,
                                                         c_build: Path) -> None:
    """``hurray-c verify`` checks every byte (checksums included); ``hurray-c inspect``
    sees the entries Python wrote, shapes and checksums alike."""
    tool = c_build / "hurray-c"
    for name in (data_file(0), data_file(1), METADATA_FILE):
        proc = subprocess.run([str(tool), "verify", str(two_rank_checkpoint / name)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout + proc.stderr
    path = two_rank_checkpoint / data_file(1)
    proc = subprocess.run([str(tool), "inspect", "--json", str(path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    idx = hb.container.read_index(path)
    assert [(r["name"], r["shape"], r["checksum"]) for r in rows] == [
        (e.name, list(e.descriptor.shape), e.checksum) for e in idx.entries]
    assert "model.shard[0]" in [r["name"] for r in rows]


def test_two_ranks_load_on_three_with_other_placements(two_rank_checkpoint: Path) -> None:
    _run_ranks("load", two_rank_checkpoint, 3)


def test_two_ranks_without_collectives_keep_a_plan_each(tmp_path: Path) -> None:
    """``use_collectives=False``: each rank writes its own plan, and DCP's load, finding
    no global plan, reads each rank's own."""
    if not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    _run_ranks("save-local", tmp_path, 2)
    assert sorted(os.listdir(tmp_path)) == [f"__0{METADATA_FILE}", data_file(0),
                                            f"__1{METADATA_FILE}", data_file(1)]
    _run_ranks("load-local", tmp_path, 2)


def test_two_ranks_load_in_one_process_as_plain_tensors(two_rank_checkpoint: Path) -> None:
    from tests.adapters.torch.dcp_worker import expected

    g = expected()
    out = _zeros(g)
    dcp.load(out, storage_reader=HurrayStorageReader(two_rank_checkpoint))
    _assert_same(out, g)


def test_byte_items_reach_dcp_as_bytes(two_rank_checkpoint: Path) -> None:
    """What DCP made of ``step`` comes back byte for byte; the planner decodes it."""
    seen: list[bytes] = []
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class Spy(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            seen.append(value.getvalue())
            super().load_bytes(read_item, value)

    out: dict[str, Any] = {"step": 0}
    dcp.load(out, storage_reader=HurrayStorageReader(two_rank_checkpoint), planner=Spy())
    assert out["step"] == 11
    doc = json.loads(load_metadata(two_rank_checkpoint / METADATA_FILE)[METADATA_KEY])
    [(file, entry)] = [(f, e) for fqn, _, f, e in doc["storage"] if fqn == "step"]
    with hb.load(two_rank_checkpoint / file) as f:
        raw = f[entry].memoryview().tobytes()
    assert seen == [raw]


def test_a_rank_reads_only_the_bytes_of_its_boxes(tmp_path: Path) -> None:
    """Rows 2..5 of an 8 x 1024 float32 entry: the checksummed read takes the whole entry
    (the CRC covers it), verify=False only the rows asked for."""
    w = torch.arange(8 * 1024, dtype=torch.float32).reshape(8, 1024)
    dcp.save({"w": w, "v": torch.ones(1 << 16)}, storage_writer=HurrayStorageWriter(tmp_path))
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    req = ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex("w", [0, 0]),
                   dest_offsets=torch.Size([0, 0]), storage_index=MetadataIndex("w", [0, 0]),
                   storage_offsets=torch.Size([2, 0]), lengths=torch.Size([4, 1024]))
    for verify, expect in ((True, w.numel() * 4), (False, 4 * 1024 * 4)):
        dest = torch.zeros(4, 1024)
        reader = HurrayStorageReader(tmp_path, verify=verify)
        md = reader.read_metadata()
        reader.set_up_storage_reader(md, True)
        planner = DefaultLoadPlanner()
        planner.resolve_tensor = lambda r, d=dest: d  # type: ignore[method-assign,misc]
        planner.commit_tensor = lambda r, t: None  # type: ignore[method-assign]
        reader.read_data(LoadPlan([req]), planner).wait()
        assert torch.equal(dest, w[2:6]) and reader.bytes_read == expect, verify
    # A column box is read from its first to its last element (rows 1..6, columns 3..4).
    req = ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex("w", [0, 0]),
                   dest_offsets=torch.Size([0, 0]), storage_index=MetadataIndex("w", [0, 0]),
                   storage_offsets=torch.Size([1, 3]), lengths=torch.Size([6, 2]))
    dest = torch.zeros(6, 2)
    reader = HurrayStorageReader(tmp_path, verify=False)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    planner.resolve_tensor = lambda r: dest  # type: ignore[method-assign]
    reader.read_data(LoadPlan([req]), planner).wait()
    assert torch.equal(dest, w[1:7, 3:5])
    assert reader.bytes_read == ((6 * 1024 + 4) - (1 * 1024 + 3) + 1) * 4


def test_a_box_read_checks_the_whole_entry_and_keeps_only_the_box(tmp_path: Path) -> None:
    """A corrupt byte outside the rows a rank asks for is still caught (verify=True),
    read through the small buffer; verify=False, which never reads it, loads the rows."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

    w = torch.arange(8 * 1024, dtype=torch.float32).reshape(8, 1024)
    dcp.save({"w": w}, storage_writer=HurrayStorageWriter(tmp_path))
    path = tmp_path / data_file(0)
    idx = hb.container.read_index(path)
    at = idx.data_offset + idx.entries[0].buffers[0].offset + 7 * 1024 * 4  # row 7
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xff")
    req = ReadItem(type=LoadItemType.TENSOR, dest_index=MetadataIndex("w", [0, 0]),
                   dest_offsets=torch.Size([0, 0]), storage_index=MetadataIndex("w", [0, 0]),
                   storage_offsets=torch.Size([2, 0]), lengths=torch.Size([4, 1024]))
    dest = torch.zeros(4, 1024)
    planner = DefaultLoadPlanner()
    planner.resolve_tensor = lambda r: dest  # type: ignore[method-assign]
    planner.commit_tensor = lambda r, t: None  # type: ignore[method-assign]
    for verify in (True, False):
        reader = HurrayStorageReader(tmp_path, verify=verify)
        reader.set_up_storage_reader(reader.read_metadata(), True)
        if verify:
            with pytest.raises(hb.FormatError, match="checksum mismatch"):
                reader.read_data(LoadPlan([req]), planner)
        else:
            reader.read_data(LoadPlan([req]), planner).wait()
            assert torch.equal(dest, w[2:6])


def test_every_common_dtype_round_trips_bit_for_bit(tmp_path: Path) -> None:
    names = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "float16",
             "bfloat16", "float32", "float64", "complex64", "complex128", "float8_e4m3fn",
             "float8_e5m2"]
    dts = [getattr(torch, n) for n in names if hasattr(torch, n)]
    sd = {str(dt): (torch.arange(12) % 5).to(dt).reshape(3, 4) for dt in dts}
    dcp.save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    out = {k: torch.ones(v.shape, dtype=v.dtype) for k, v in sd.items()}
    dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    for k, v in sd.items():
        assert out[k].dtype == v.dtype
        assert torch.equal(out[k].view(torch.uint8), v.view(torch.uint8)), k


def test_async_save(tmp_path: Path) -> None:
    """dcp.async_save stages the state dict (DCP's own stager) and writes it in the
    background through the same writer."""
    sd = {"x": torch.arange(6.0), "n": 3}
    fut = dcp.async_save(sd, storage_writer=HurrayStorageWriter(tmp_path))
    fut.result(timeout=120)
    out = {"x": torch.zeros(6), "n": 0}
    dcp.load(out, storage_reader=HurrayStorageReader(tmp_path))
    assert torch.equal(out["x"], sd["x"]) and out["n"] == 3
