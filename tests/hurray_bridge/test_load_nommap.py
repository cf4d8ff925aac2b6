"""``hb.load(path, mmap=False)``: large positional reads on a few threads into owned memory.

Both formats (.hurray and safetensors) go through ``hurray_bridge.files.pread.read_all``;
the thresholds are lowered here so that small files take the threaded path.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pathlib
import sys
import threading
import time
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _memory, container
from hurray_bridge import safetensors_io as sio
from hurray_bridge.files import pread as _pread
from hurray_bridge.files import reading

from .test_container_files import child

np = pytest.importorskip("numpy")


def _tensors() -> dict[str, Any]:
    rng = np.random.default_rng(3)
    out: dict[str, Any] = {f"w{i}": rng.standard_normal((37 + i, 129), dtype=np.float32)
                           for i in range(12)}
    out["h"] = rng.integers(0, 1 << 15, size=(1000,), dtype=np.int16)
    out["empty"] = np.zeros((0, 4), np.float32)
    out["scalar"] = np.float64(2.5)
    return out


@pytest.fixture
def threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small pieces and no threshold: a file of some 300 KiB is read by several threads."""
    monkeypatch.setattr(_pread, "CHUNK", 4096)
    monkeypatch.setattr(_pread, "THREADED_BYTES", 0)


def _write(tmp_path: pathlib.Path, fmt: str, tensors: dict[str, Any]) -> pathlib.Path:
    path = tmp_path / f"c.{fmt}"
    if fmt == "hurray":
        hb.save(path, tensors)
    else:
        sio.save(path, tensors)
    return path


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_values_equal_the_mapped_load_in_owned_aligned_writable_memory(
        tmp_path: pathlib.Path, fmt: str, threaded: None) -> None:
    tensors = _tensors()
    path = _write(tmp_path, fmt, tensors)
    mapped, read = hb.load(path), hb.load(path, mmap=False)
    assert read.keys() == mapped.keys() == tensors.keys()
    assert read.alignment == 64
    for name, t in read.items():
        assert isinstance(t, hb.Tensor)
        np.testing.assert_array_equal(np.asarray(t), np.asarray(mapped[name]))
        np.testing.assert_array_equal(np.asarray(t), tensors[name])
        assert not t.readonly
        if t.nbytes:
            assert t.buffers[0].ptr % 64 == 0, name
            assert not np.shares_memory(np.asarray(t), np.asarray(mapped[name]))
    # Our own memory: a write stays in this load.
    w = np.asarray(read["w3"])
    w[0, 0] = 1234.5
    assert np.asarray(hb.load(path, mmap=False)["w3"])[0, 0] == tensors["w3"][0, 0]


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_several_threads_read_and_the_pieces_cover_every_byte_once(
        tmp_path: pathlib.Path, fmt: str, threaded: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, fmt, _tensors())
    threads: set[int] = set()
    spans: list[tuple[int, int]] = []
    lock = threading.Lock()
    real = reading.pread_into

    def spy(fd: int, view: memoryview, offset: int) -> None:
        with lock:
            threads.add(threading.get_ident())
            spans.append((offset, offset + len(view)))
        time.sleep(0.001)  # a slow mount: the helpers get their turn however busy the machine
        real(fd, view, offset)

    monkeypatch.setattr(reading, "pread_into", spy)
    out = hb.load(path, mmap=False)
    assert len(threads) > 1
    assert all(b - a <= 4096 for a, b in spans)
    spans.sort()
    assert all(b <= c for (_, b), (c, _) in itertools.pairwise(spans))  # no byte read twice
    assert sum(b - a for a, b in spans) == sum(t.nbytes for t in out.values())


def test_a_small_file_is_read_by_the_calling_thread_alone(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "hurray", _tensors())
    threads: set[int] = set()
    real = reading.pread_into

    def spy(fd: int, view: memoryview, offset: int) -> None:
        threads.add(threading.get_ident())
        real(fd, view, offset)

    monkeypatch.setattr(reading, "pread_into", spy)
    hb.load(path, mmap=False)
    assert threads == {threading.get_ident()}  # under THREADED_BYTES: no pool started


@pytest.mark.parametrize("fmt", ["hurray", "safetensors"])
def test_a_file_cut_during_the_read_is_the_truncation_error_and_no_reader_is_left(
        tmp_path: pathlib.Path, fmt: str, threaded: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, fmt, _tensors())
    real = reading.pread_into
    calls = [0]
    lock = threading.Lock()

    def cutting(fd: int, view: memoryview, offset: int) -> None:
        with lock:
            calls[0] += 1
            if calls[0] == 5:  # another writer shrinks the file in the middle of the read
                os.truncate(path, 8192)
        real(fd, view, offset)

    monkeypatch.setattr(reading, "pread_into", cutting)
    with pytest.raises(hb.FormatError, match="truncated") as e:
        hb.load(path, mmap=False)
    assert e.value.field == "file_size"
    # Every helper has returned before the error is raised: none writes into freed memory.
    assert not [t for t in threading.enumerate() if t.name.startswith("hurray-pread")]


def test_a_failing_helper_stops_the_others_before_the_error_is_raised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pread, "CHUNK", 1)
    done: list[int] = []
    lock = threading.Lock()

    def read_into(fd: int, view: memoryview, offset: int) -> None:
        if offset == 3:
            raise OSError(5, "EIO")
        with lock:
            done.append(offset)
        view[0] = offset & 0xFF

    dest = memoryview(bytearray(10_000))
    with pytest.raises(OSError, match="EIO"):
        _pread.read_all(-1, [(0, dest)], read_into, threads=3)
    assert len(done) < 100  # the others stopped at their next piece
    assert not [t for t in threading.enumerate() if t.name.startswith("hurray-pread")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_the_resident_set_grows_by_the_tensors_bytes_only(tmp_path: pathlib.Path) -> None:
    # 128 MiB in 64 tensors, read in a fresh interpreter: its resident set is this read's.
    path = tmp_path / "big.hurray"
    block = np.random.default_rng(0).integers(0, 255, size=(2 << 20,), dtype=np.uint8)
    hb.save(path, {f"t{i}": block for i in range(64)}, fsync=False)
    hb.save(tmp_path / "small.hurray", {"t": block[:1 << 16]}, fsync=False)
    del block
    r = child(f"""
        import os, resource
        import hurray_bridge as hb
        import numpy as np

        def rss():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

        hb.load({str(tmp_path / "small.hurray")!r}, mmap=False)  # imports, first-use setup
        before = rss()
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        out = hb.load({str(path)!r}, mmap=False)
        after = rss()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        total = sum(t.nbytes for t in out.values())
        print(total, before, after, peak_before, peak)
        """, timeout=120)
    assert r.returncode == 0, r.stderr
    total, before, after, peak_before, peak = map(int, r.stdout.split())
    assert total == 128 << 20
    slack = 8 << 20
    assert after - before >= total * 0.99  # the tensors are in memory of their own
    assert after - before <= total + slack, (after - before) / total
    # No moment held more than the tensors: no staging buffer, no second copy.
    assert peak <= max(peak_before, before + total + slack), (peak - before) / total


def test_verify_reads_the_data_once_and_checks_the_memory_it_read(
        tmp_path: pathlib.Path, threaded: None, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = _tensors()
    path = _write(tmp_path, "hurray", tensors)
    idx = container.read_index(path)
    data = sum(b.length for e in idx.entries for b in e.buffers)
    read = [0]
    real = reading.pread_into

    def counting(fd: int, view: memoryview, offset: int) -> None:
        read[0] += len(view)
        real(fd, view, offset)

    monkeypatch.setattr(reading, "pread_into", counting)
    out = hb.load(path, mmap=False, verify=True)
    np.testing.assert_array_equal(np.asarray(out["w5"]), tensors["w5"])
    # The data once, plus the padding between buffers and the header's: never twice.
    assert data <= read[0] <= data + idx.data_offset + 64 * len(idx.entries), (read[0], data)

    # A flipped byte in the middle of a tensor is still found, and named.
    (b,) = next(e for e in idx.entries if e.name == "w7").buffers
    with open(path, "r+b") as f:
        f.seek(idx.data_offset + b.offset + b.length // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(hb.FormatError, match="checksum mismatch") as e:
        hb.load(path, mmap=False, verify=True)
    assert "w7" in str(e.value) and e.value.field == "entries[7].checksum"
    hb.load(path, mmap=False)  # unverified, the same bytes load


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_memory_to_be_filled_comes_untouched_from_the_os(monkeypatch: pytest.MonkeyPatch) -> None:
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    before = rss()
    alloc = _memory.alloc_aligned(64 << 20, filled=True)
    assert alloc is not None and alloc.ptr % mmap.PAGESIZE == 0
    assert rss() - before < 4 << 20  # no page zeroed in advance: each is written once
    view = _memory.host_view(alloc.ptr, alloc.nbytes, alloc)
    assert not any(view[:: 1 << 16])  # zero, as every allocation
    del view, alloc

    # Out of maps (vm.max_map_count): the allocator's memory, still aligned.
    def refuse(*args: object) -> None:
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(_memory._mmap, "mmap", refuse)
    alloc = _memory.alloc_aligned(2 << 20, filled=True)
    assert alloc is not None and alloc.ptr % 64 == 0 and alloc.nbytes == 2 << 20
