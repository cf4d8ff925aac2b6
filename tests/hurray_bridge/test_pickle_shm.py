"""hb.Tensor across processes: pickle (protocols 2-5, out-of-band buffers), multiprocessing,
concurrent.futures, and the shared-memory hand-off of ``hurray_bridge.shm``."""

from __future__ import annotations

import concurrent.futures
import gc
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import time
import weakref
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import Buffer, Descriptor, Layout, Quantization, QuantScheme, Sparse
from hurray_bridge._memory import buffer_address
from hurray_bridge.shm import SharedTensorHandle, attach, share

np = pytest.importorskip("numpy", reason="numpy is not installed")

SPAWN = mp.get_context("spawn")
TIMEOUT = 60


# ------------------------------------------------------------ sample tensors
def make(desc: Descriptor, *arrays: np.ndarray, readonly: bool = False) -> hb.Tensor:
    """An hb.Tensor over NumPy arrays, one per entry of ``desc.buffer_layout()``."""
    specs = desc.buffer_layout()
    assert len(specs) == len(arrays)
    bufs = []
    for spec, a in zip(specs, arrays):
        a = np.ascontiguousarray(a)
        assert a.nbytes == spec.nbytes, (spec, a.nbytes)
        bufs.append(Buffer(spec.role, a.ctypes.data if a.nbytes else 0, a.nbytes))
    return hb.Tensor(desc, bufs, owner=arrays, readonly=readonly)


def sample_tensors() -> dict[str, hb.Tensor]:
    """Dense, strided, empty, sub-byte, quantized and sparse tensors, built by hand."""
    rng = np.random.default_rng(7)
    base = rng.standard_normal((6, 8)).astype(np.float32)
    out: dict[str, hb.Tensor] = {
        "dense_f32": hb.asarray(base),
        "dense_c128": hb.asarray(rng.standard_normal(5) + 1j * rng.standard_normal(5)),
        "dense_u8_readonly": hb.asarray(np.frombuffer(bytes(range(40)), np.uint8).reshape(5, 8)),
        "strided_neg": hb.asarray(base[::-2, 1::3]),
        "transposed": hb.asarray(base.T),
        "scalar": hb.asarray(np.float64(-2.5)),
        "empty_1d": hb.asarray(np.zeros(0, np.float32)),
        "empty_3_0_5": hb.asarray(np.zeros((3, 0, 5), np.int16)),
        "nan_payloads": hb.asarray(np.array([0x7FC00001, 0xFFF00002, 0x7F800000], np.uint32)
                                   .view(np.float32)),
    }
    try:
        import ml_dtypes

        out["bf16"] = hb.asarray(base.astype(ml_dtypes.bfloat16))
        out["int4_padded"] = hb.asarray(np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4))
    except ImportError:  # pragma: no cover - ml_dtypes is in the test extra
        pass
    # Packed int4: 2 per byte, LSB first, 7 elements -> 4 bytes (last nibble zero).
    out["int4_packed"] = make(Descriptor([7], hb.int4), np.array([0x21, 0x43, 0x65, 0x07],
                                                                np.uint8))
    q = Quantization(QuantScheme.PER_AXIS, "float32", "int8", axis=0)
    out["quant_per_axis"] = make(
        Descriptor([4, 6], hb.int8, quantization=q),
        rng.integers(-128, 128, (4, 6), dtype=np.int8),
        np.array([0.5, 0.25, 2.0, 1.0], np.float32), np.array([0, -3, 5, 1], np.int8),
    )
    qb = Quantization(QuantScheme.PER_BLOCK, "float16", axis=1, block_size=4)
    out["quant_int4_block"] = make(
        Descriptor([2, 8], hb.int4, quantization=qb),
        rng.integers(0, 256, 8, dtype=np.uint8), np.array([1, 2, 3, 4], np.float16),
    )
    out["csr"] = make(
        Descriptor([3, 5], hb.float32, Layout.CSR, sparse=Sparse(4, "int32", canonical=True)),
        np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([0, 1, 1, 4], np.int32),
        np.array([2, 0, 3, 4], np.int32),
    )
    out["coo"] = make(
        Descriptor([3, 5], hb.float64, Layout.COO, sparse=Sparse(2, "int64")),
        np.array([7.0, -1.0]), np.array([[0, 2], [4, 1]], np.int64),
    )
    out["csr_nnz0_0x5"] = make(
        Descriptor([0, 5], hb.float32, Layout.CSR, sparse=Sparse(0, "int64")),
        np.zeros(0, np.float32), np.zeros(1, np.int64), np.zeros(0, np.int64),
    )
    return out


SAMPLES = sample_tensors()
NAMES = sorted(SAMPLES)


def snapshot(t: hb.Tensor) -> tuple[bytes, tuple[bytes, ...]]:
    """Everything that must survive a trip: the descriptor and every buffer's bytes."""
    return t.descriptor.to_bytes(), tuple(bytes(t.memoryview(b.role)) for b in t.buffers)


def assert_same(got: hb.Tensor, want: hb.Tensor) -> None:
    assert got.descriptor == want.descriptor
    assert snapshot(got) == snapshot(want)
    for b in got.buffers:
        assert (b.ptr == 0) == (b.nbytes == 0)  # empty buffers are NULL, others are not


# ------------------------------------------------------- workers (spawned)
def _echo(t: hb.Tensor) -> tuple[hb.Tensor, tuple[bytes, tuple[bytes, ...]], bool]:
    """Runs in a child: send the tensor back, with what the child saw."""
    return t, snapshot(t), t.readonly


def _queue_echo(q_in: Any, q_out: Any) -> None:
    while True:
        t = q_in.get()
        if t is None:
            return
        q_out.put(_echo(t))


def _attach_and_report(handle: SharedTensorHandle, write: bool) -> tuple[Any, ...]:
    t = attach(handle)
    before = snapshot(t)
    if write:
        a = np.asarray(t)
        a.reshape(-1)[0] = 42  # seen by every other mapping
    return before, t.readonly, os.getpid()


def _attach_wait_write(handle: SharedTensorHandle, ready: Any, go: Any, done: Any) -> None:
    t = attach(handle)
    a = np.asarray(t)
    ready.set()
    go.wait(TIMEOUT)
    done.put(a.tolist())  # the parent wrote after we attached


# ------------------------------------------------------------------- pickle
@pytest.mark.parametrize("protocol", [2, 4, 5])
@pytest.mark.parametrize("name", NAMES)
def test_pickle_in_band_bit_exact(name: str, protocol: int) -> None:
    t = SAMPLES[name]
    u = pickle.loads(pickle.dumps(t, protocol=protocol))
    assert_same(u, t)
    assert u.readonly == t.readonly  # every protocol keeps the flag (bytes vs bytearray)
    for b in u.buffers:
        if b.nbytes:
            assert b.ptr not in {x.ptr for x in t.buffers}  # a real copy in-band


@pytest.mark.parametrize("name", NAMES)
def test_pickle_out_of_band_shares_memory(name: str) -> None:
    t = SAMPLES[name]
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=oob.append)
    assert len(oob) == len(t.buffers)
    # The stream itself holds the descriptor only: no element bytes in band.
    assert len(data) < 200 + len(t.descriptor.to_bytes())
    u = pickle.loads(data, buffers=oob)
    assert_same(u, t)
    # Handed back the same buffers, the receiver points into the sender's memory.
    assert [b.ptr for b in u.buffers] == [b.ptr for b in t.buffers]


def test_pickle_out_of_band_keeps_source_alive() -> None:
    a = np.arange(64, dtype=np.int64)
    ref = weakref.ref(a)
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(hb.asarray(a), protocol=5, buffer_callback=oob.append)
    u = pickle.loads(data, buffers=oob)
    del a, oob
    gc.collect()
    assert ref() is not None  # u still uses that memory
    assert np.asarray(u).tolist() == list(range(64))
    del u
    gc.collect()
    assert ref() is None


def test_pickle_out_of_band_read_only_buffers_give_read_only_tensor() -> None:
    t = SAMPLES["dense_f32"]
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=oob.append)
    # What a receiver in another process gets from an object store: read-only views.
    frozen = [memoryview(bytearray(b.raw())).toreadonly() for b in oob]
    u = pickle.loads(data, buffers=frozen)
    assert u.readonly and not t.readonly
    assert u.data_ptr == buffer_address(frozen[0])[0]  # shared, as handed over
    assert_same(u, t)
    # A bytes object is immutable: it is copied, and the copy's flag is the sender's.
    v = pickle.loads(data, buffers=[bytes(b.raw()) for b in oob])
    assert not v.readonly
    assert not any(isinstance(getattr(k, "obj", None), bytes) for k in v.owner), v.owner
    assert_same(v, t)


def test_pickle_refuses_device_memory() -> None:
    t = SAMPLES["dense_f32"]
    dev = hb.Tensor(t.descriptor, t.buffers, device=(2, 0), owner=t)
    with pytest.raises(hb.UnsupportedError, match="not on the host"):
        pickle.dumps(dev, protocol=5)


def test_unpickle_rejects_wrong_buffer_length() -> None:
    t = SAMPLES["dense_f32"]
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=oob.append)
    with pytest.raises(hb.FormatError, match="calls for"):
        pickle.loads(data, buffers=[b"\0" * 8])


# ------------------------------------------------ multiprocessing (spawn)
def test_multiprocessing_spawn_queue_round_trip() -> None:
    q_in, q_out = SPAWN.Queue(), SPAWN.Queue()
    p = SPAWN.Process(target=_queue_echo, args=(q_in, q_out))
    p.start()
    try:
        for name in NAMES:
            t = SAMPLES[name]
            q_in.put(t)
            back, seen, seen_ro = q_out.get(timeout=TIMEOUT)
            assert seen == snapshot(t), name  # the child saw exactly our bytes
            assert seen_ro == t.readonly, name
            assert_same(back, t)
    finally:
        q_in.put(None)
        p.join(TIMEOUT)
    assert p.exitcode == 0


def test_process_pool_executor_round_trip() -> None:
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=SPAWN) as pool:
        futures = {name: pool.submit(_echo, SAMPLES[name]) for name in NAMES}
        for name, fut in futures.items():
            back, seen, _ = fut.result(timeout=TIMEOUT)
            assert seen == snapshot(SAMPLES[name]), name
            assert_same(back, SAMPLES[name])


# ------------------------------------------------------------ shared memory
def _segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


posix_only = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX /dev/shm")


@pytest.mark.parametrize("name", NAMES)
def test_share_attach_same_process(name: str) -> None:
    t = SAMPLES[name]
    with share(t) as h:
        u = attach(h)
        assert_same(u, t)
        assert not u.readonly
        for b in u.buffers:
            assert b.ptr % 64 == 0 or b.nbytes == 0
            assert b.ptr not in {x.ptr for x in t.buffers if x.nbytes}  # copied once, into shm


def test_handle_is_small_and_picklable() -> None:
    a = np.zeros((512, 512), np.float32)  # 1 MiB
    with share(a) as h:
        blob = pickle.dumps(h)
        assert len(blob) < 400
        h2 = pickle.loads(blob)
        assert h2 == h
        assert h2.tensor_descriptor == hb.asarray(a).descriptor
        assert "psm" in repr(h2) or h2.name in repr(h2)


def test_empty_tensor_needs_no_segment() -> None:
    h = share(np.zeros((3, 0, 5), np.float32))
    assert h.name is None and h.nbytes == 0
    u = attach(h)
    assert u.shape == (3, 0, 5) and u.buffers[0].ptr == 0
    h.unlink()  # a no-op, allowed


@posix_only
def test_spawned_process_maps_zero_copy_and_sees_writes() -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    h = share(a)
    try:
        mine = attach(h)
        ctx_ready, ctx_go = SPAWN.Event(), SPAWN.Event()
        done = SPAWN.Queue()
        p = SPAWN.Process(target=_attach_wait_write, args=(h, ctx_ready, ctx_go, done))
        p.start()
        assert ctx_ready.wait(TIMEOUT)
        np.asarray(mine)[2, 3] = -1.0  # written after the child mapped the segment
        ctx_go.set()
        seen = done.get(timeout=TIMEOUT)
        p.join(TIMEOUT)
        assert seen[2][3] == -1.0 and seen[0] == [0.0, 1.0, 2.0, 3.0]
        # ... and the other way round: the child's write is visible here.
        expected_before = snapshot(mine)
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
            before, ro, pid = pool.submit(_attach_and_report, h, True).result(TIMEOUT)
        assert pid != os.getpid() and not ro
        assert before == expected_before
        assert np.asarray(mine)[0, 0] == 42
        # The child exited: the segment is still there (consumers never unlink).
        assert _segment_exists(h.name)
    finally:
        h.unlink()
    assert not _segment_exists(h.name)
    # Unlinking removed the name; our mapping is still valid.
    assert np.asarray(mine)[2, 3] == -1.0
    with pytest.raises(FileNotFoundError, match="no longer exists"):
        attach(h)


@posix_only
def test_readonly_handle_maps_read_only() -> None:
    with share(np.arange(10, dtype=np.int32), readonly=True) as h:
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
            before, ro, _ = pool.submit(_attach_and_report, h, False).result(TIMEOUT)
        assert ro
        u = attach(h)
        assert u.readonly
        arr = np.asarray(u)
        assert not arr.flags.writeable
        assert before == snapshot(u)


@posix_only
def test_unlink_is_idempotent_and_mapping_outlives_it() -> None:
    h = share(np.ones(100, np.uint8))
    u = attach(h)
    name = h.name
    assert _segment_exists(name)
    h.unlink()
    h.unlink()
    assert not _segment_exists(name)
    assert bytes(u.memoryview()) == b"\x01" * 100
    ref = weakref.ref(u.owner)
    del u
    gc.collect()
    assert ref() is None  # the mapping is closed with its last tensor


@posix_only
def test_owner_exit_without_unlink_is_cleaned_by_resource_tracker() -> None:
    code = (
        "import numpy as np, hurray_bridge.shm as s\n"
        "h = s.share(np.arange(8))\n"
        "print(h.name, flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT, check=True)
    name = out.stdout.split()[0]
    deadline = time.monotonic() + 10
    while _segment_exists(name) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _segment_exists(name)
    assert "leaked shared_memory" in out.stderr  # Python says so: the owner should unlink


def test_attach_rejects_a_handle_pointing_outside_the_segment() -> None:
    from hurray_bridge.wire import encode

    with share(np.zeros(16, np.uint8)) as h:
        big = Descriptor([100000], hb.uint8)
        bad = SharedTensorHandle(h.name, encode(big, [0]), h.nbytes, False, h.owner_pid)
        with pytest.raises(hb.FormatError, match="segment"):
            attach(bad)
        with pytest.raises(TypeError):
            attach("not a handle")  # type: ignore[arg-type]


def test_share_refuses_device_memory() -> None:
    t = SAMPLES["dense_f32"]
    dev = hb.Tensor(t.descriptor, t.buffers, device=(2, 0), owner=t)
    with pytest.raises(hb.UnsupportedError, match="host"):
        share(dev)
