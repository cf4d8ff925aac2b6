"""The copies of ``hurray convert``: one pass, memory that does not follow the file size,
and every check of ``verify`` made on the way (hurray -> safetensors), before the output
replaces anything.
"""

from __future__ import annotations

import errno
import os
import pathlib
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge import safetensors_io as sio
from hurray_bridge.files import checksums, engine, regions
from hurray_bridge.files import format as file_format

np = pytest.importorskip("numpy")

LINUX = sys.platform.startswith("linux")


@pytest.fixture(params=["whole", "one by one", "split", "pipelined", "crc thread", "chunked",
                        "zlib"])
def chunking(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """As shipped; each region read and written alone (as without os.writev), not with its
    neighbours; in 4 KiB chunks: in two halves at once (a helper thread writes the
    second), through the helper threads of one writer (every buffer hand-off), the checksums
    on the reading thread or on their own, or all on the caller's thread; or with zlib's
    CRC-32 (as where _speedups was not built) through the threads."""
    monkeypatch.setattr(engine, "_SPLIT_BYTES", 0 if request.param == "split" else None)
    if request.param == "one by one":
        monkeypatch.setattr(engine, "WRITES_VECTORS", False)
    if request.param not in ("whole", "one by one"):
        monkeypatch.setattr(engine, "CHUNK", 4096)
        monkeypatch.setattr(engine, "_THREADED_CRC_BYTES",
                            None if request.param == "chunked" else 0)
    if request.param in ("crc thread", "pipelined"):
        monkeypatch.setattr(engine, "_CRC_THREAD", request.param == "crc thread")
    if request.param == "zlib":
        monkeypatch.setattr(engine, "crc32", zlib.crc32)
        monkeypatch.setattr(engine, "_CRC_THREAD", True)
    return str(request.param)


def tensors() -> dict[str, Any]:
    rng = np.random.default_rng(9)
    return {"a": rng.integers(0, 255, 50_001, dtype=np.uint8),  # alignment padding follows
            "empty": np.zeros((3, 0), np.float32),
            "b": rng.standard_normal((33, 17)).astype(np.float32),
            "scalar": np.array(2.5),
            "c": rng.integers(-9, 9, 10_000, dtype=np.int16)}


def others(folder: pathlib.Path, *keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


@pytest.mark.parametrize("checked", [True, False], ids=["checksums", "none"])
def test_conversions_write_what_the_writers_from_memory_write(tmp_path: pathlib.Path,
                                                              chunking: str,
                                                              checked: bool) -> None:
    t = tensors()
    sio.save(tmp_path / "ref.safetensors", t, {"k": "v"})
    hb.save(tmp_path / "ref.hurray", t, {"k": "v"}, alignment=4096, checksums=checked)
    sio.safetensors_to_hurray(tmp_path / "ref.safetensors", tmp_path / "out.hurray",
                              alignment=4096, checksums=checked)
    assert (tmp_path / "out.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()
    sio.hurray_to_safetensors(tmp_path / "ref.hurray", tmp_path / "out.safetensors",
                              verify=checked)
    assert ((tmp_path / "out.safetensors").read_bytes()
            == (tmp_path / "ref.safetensors").read_bytes())


def test_the_checksums_written_and_checked_are_zlibs(tmp_path: pathlib.Path,
                                                     chunking: str) -> None:
    """Whichever CRC-32 computes them (the compiled one, where built, or zlib's) and however
    the copy is cut, the checksums are zlib.crc32 of each entry's bytes (a damaged entry
    refused on the way back: test_a_defect_found_on_the_way_leaves_the_output_as_it_was)."""
    t = tensors()
    sio.save(tmp_path / "in.safetensors", t)
    sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "out.hurray")
    idx = container.verify(tmp_path / "out.hurray")
    assert {e.name: e.checksum for e in idx.entries} == {
        k: zlib.crc32(np.ascontiguousarray(v).tobytes()) for k, v in t.items()}
    sio.hurray_to_safetensors(tmp_path / "out.hurray", tmp_path / "back.safetensors")
    assert ((tmp_path / "back.safetensors").read_bytes()
            == (tmp_path / "in.safetensors").read_bytes())


def test_without_positional_reads_the_bytes_are_the_same(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         chunking: str) -> None:
    """Where os.preadv is missing (Windows) a region is read after a seek."""
    t = tensors()
    sio.save(tmp_path / "ref.safetensors", t)
    hb.save(tmp_path / "ref.hurray", t)
    monkeypatch.delattr(os, "preadv", raising=False)
    sio.safetensors_to_hurray(tmp_path / "ref.safetensors", tmp_path / "out.hurray")
    sio.hurray_to_safetensors(tmp_path / "ref.hurray", tmp_path / "out.safetensors")
    monkeypatch.undo()
    assert (tmp_path / "out.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()
    assert ((tmp_path / "out.safetensors").read_bytes()
            == (tmp_path / "ref.safetensors").read_bytes())


def _damage(path: pathlib.Path, where: str) -> pathlib.Path:
    """A copy of ``path`` with one byte changed ``where``, which verify refuses."""
    raw = bytearray(path.read_bytes())
    h = file_format.parse_header(raw[:container.HEADER_SIZE], len(raw))
    idx = container.read_index(path)
    spans = {e.name: (idx.data_offset + e.buffers[0].offset, e.buffers[0].length)
             for e in idx.entries if e.buffers and e.buffers[0].length}
    if where == "head padding":
        assert h.data_offset > h.index_end
        at = h.index_end + 1
    elif where == "buffer padding":
        start, n = spans["a"]
        at = start + n + 3
    else:  # the bytes of an entry
        start, n = spans[where]
        at = start + n // 2
    raw[at] ^= 0x5A
    bad = path.with_name(f"bad-{where.replace(' ', '-')}.hurray")
    bad.write_bytes(raw)
    return bad


@pytest.mark.parametrize("where", ["b", "c", "buffer padding", "head padding", "strided"])
def test_a_defect_found_on_the_way_leaves_the_output_as_it_was(tmp_path: pathlib.Path,
                                                               chunking: str,
                                                               where: str) -> None:
    t = tensors()
    t["strided"] = np.arange(24, dtype=np.float32).reshape(4, 6).T  # gathered, its span checked
    hb.save(tmp_path / "in.hurray", t)
    bad = _damage(tmp_path / "in.hurray", where)
    with pytest.raises(hb.FormatError) as expected:
        container.verify(bad)
    out = tmp_path / "out.safetensors"
    sio.save(out, {"old": np.ones(2)})
    before = out.read_bytes()
    with pytest.raises(hb.FormatError) as e:
        sio.hurray_to_safetensors(bad, out)
    assert str(e.value) == str(expected.value) and e.value.field == expected.value.field
    assert out.read_bytes() == before
    assert others(tmp_path, "in.hurray", bad.name, "out.safetensors") == []  # no temporary
    assert sio.hurray_to_safetensors(bad, out, verify=False) == len(t)  # as it is, on purpose
    assert out.read_bytes() != before


def test_a_damaged_file_is_refused_as_damaged_before_an_entry_is_refused(
        tmp_path: pathlib.Path) -> None:
    coo = hb.Descriptor([4], hb.float32, hb.Layout.COO, sparse=hb.Sparse(0))
    from tests.vectors.generate_files import tensor

    hb.save(tmp_path / "in.hurray", {"sparse": tensor(coo, b"", b""), **tensors()})
    bad = _damage(tmp_path / "in.hurray", "b")
    with pytest.raises(hb.FormatError, match="checksum"):
        sio.hurray_to_safetensors(bad, tmp_path / "o.safetensors")
    with pytest.raises(hb.UnsupportedError, match="COO"):
        sio.hurray_to_safetensors(bad, tmp_path / "o.safetensors", verify=False)
    assert not (tmp_path / "o.safetensors").exists()


@pytest.mark.parametrize("direction", ["to hurray", "to safetensors"])
def test_a_source_cut_during_the_copy_is_a_format_error(tmp_path: pathlib.Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        direction: str) -> None:
    monkeypatch.setattr(engine, "CHUNK", 4096)
    t = {"w": np.arange(100_000, dtype=np.float32)}
    if direction == "to hurray":
        src, out, convert = tmp_path / "in.safetensors", tmp_path / "o.hurray", \
            sio.safetensors_to_hurray
        sio.save(src, t)
    else:
        src, out, convert = tmp_path / "in.hurray", tmp_path / "o.safetensors", \
            sio.hurray_to_safetensors
        hb.save(src, t)
    size = src.stat().st_size

    def cut(done: int, total: int) -> None:
        os.truncate(src, size // 2)  # another process shortens the file

    with pytest.raises(hb.FormatError, match="truncated: the file ended") as e:
        convert(src, out, progress=cut)
    assert e.value.field == "file_size"
    assert others(tmp_path, src.name) == []


def _halves(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Two tensors of 64 KiB written in two halves at once, in 4 KiB chunks."""
    monkeypatch.setattr(engine, "_SPLIT_BYTES", 0)
    monkeypatch.setattr(engine, "CHUNK", 4096)
    return {"first": np.arange(16384, dtype=np.float32),
            "second": np.arange(16384, dtype=np.float32)[::-1].copy()}


@pytest.mark.skipif(not (hasattr(os, "preadv") and hasattr(os, "pwrite")), reason="positional")
@pytest.mark.parametrize("direction", ["to hurray", "to safetensors"])
def test_a_split_write_reads_each_half_on_its_own_thread(tmp_path: pathlib.Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         direction: str) -> None:
    t = _halves(monkeypatch)
    sio.save(tmp_path / "ref.safetensors", t)
    hb.save(tmp_path / "ref.hurray", t)
    threads: dict[str, set[int]] = {}
    real = engine.pread_into

    def spy(fd: int, view: memoryview, offset: int) -> None:
        threads.setdefault(threading.current_thread().name, set()).add(offset)
        real(fd, view, offset)

    monkeypatch.setattr(engine, "pread_into", spy)
    calls: list[tuple[int, int]] = []
    if direction == "to hurray":
        ref, out = tmp_path / "ref.hurray", tmp_path / "out.hurray"
        sio.safetensors_to_hurray(tmp_path / "ref.safetensors", out,
                                  progress=lambda d, n: calls.append((d, n)))
    else:
        ref, out = tmp_path / "ref.safetensors", tmp_path / "out.safetensors"
        sio.hurray_to_safetensors(tmp_path / "ref.hurray", out,
                                  progress=lambda d, n: calls.append((d, n)))
    assert out.read_bytes() == ref.read_bytes()
    assert set(threads) == {"MainThread", "hurray-write"}
    assert max(threads["MainThread"]) < min(threads["hurray-write"])  # each its own half
    assert calls[-1][0] == calls[-1][1] == 2 * 65536
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


@pytest.mark.skipif(not (hasattr(os, "preadv") and hasattr(os, "pwrite")), reason="positional")
@pytest.mark.parametrize("half", ["MainThread", "hurray-write"])
def test_a_read_error_in_either_half_of_a_split_write_leaves_the_output_as_it_was(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, half: str) -> None:
    t = _halves(monkeypatch)
    sio.save(tmp_path / "in.safetensors", t)
    out = tmp_path / "out.hurray"
    hb.save(out, {"old": np.ones(2)})
    before = out.read_bytes()
    real = engine.pread_into
    chunks: list[str] = []

    def failing(fd: int, view: memoryview, offset: int) -> None:
        me = threading.current_thread().name
        chunks.append(me)
        if me == half and chunks.count(me) == 3:
            raise OSError(errno.EIO, "the disk said no")
        real(fd, view, offset)

    monkeypatch.setattr(engine, "pread_into", failing)
    with pytest.raises(OSError, match="the disk said no"):
        sio.safetensors_to_hurray(tmp_path / "in.safetensors", out)
    assert out.read_bytes() == before
    assert others(tmp_path, "in.safetensors", "out.hurray") == []
    assert {"MainThread", "hurray-write"} <= set(chunks)  # both halves ran


def test_a_read_that_reports_more_than_it_was_given_is_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "preadv"):
        pytest.skip("os.preadv")
    sio.save(tmp_path / "in.safetensors", tensors())
    real = os.preadv

    def boastful(fd: int, buffers: list[memoryview], offset: int) -> int:
        return real(fd, buffers, offset) + 1

    monkeypatch.setattr(os, "preadv", boastful)
    with pytest.raises(OSError, match=r"preadv\(\) returned") as e:
        sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray")
    assert e.value.errno == errno.EIO
    assert others(tmp_path, "in.safetensors") == []


def test_a_region_slices_and_indexes_like_the_view_it_stands_for(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "r.bin"
    path.write_bytes(bytes(range(200)))
    with open(path, "rb") as f:
        r = regions.Region(f.fileno(), 10, 100)
        part = r[5:20]
        assert (part.offset, len(part)) == (15, 15)
        assert (r[-1], r[0], len(r[:-1]), len(r[150:])) == (109, 10, 99, 0)
        with pytest.raises(IndexError):
            r[100]


def test_durable_writes_start_the_disk_early_and_fsync(tmp_path: pathlib.Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[int, int]] = []
    monkeypatch.setattr(engine, "_WRITEBACK_BYTES", 8192)
    monkeypatch.setattr(engine, "CHUNK", 4096)
    monkeypatch.setattr(engine, "_start_writeback",
                        lambda: lambda fd, off, n: started.append((off, n)))
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    t = tensors()
    sio.save(tmp_path / "in.safetensors", t, fsync=False)
    hb.save(tmp_path / "in.hurray", t, fsync=False)
    assert started == [] and synced == []
    calls: list[Callable[..., object]] = [
        lambda **kw: sio.safetensors_to_hurray(tmp_path / "in.safetensors",
                                               tmp_path / "o.hurray", **kw),
        lambda **kw: sio.hurray_to_safetensors(tmp_path / "in.hurray",
                                               tmp_path / "o.safetensors", **kw)]
    for call in calls:
        call(fsync=False)
        assert started == [] and synced == []
        call()
        assert len(synced) == (2 if os.name == "posix" else 1)  # the file and its folder
        assert len(started) > 3
        ends = [off + n for off, n in started]
        assert all(a == b for a, b in zip(ends, (off for off, _ in started[1:])))  # in order
        started.clear()
        synced.clear()


def test_peak_memory_does_not_follow_the_file_size(
        tmp_path: pathlib.Path, peak_growth: Callable[[Callable[[], object]], int]) -> None:
    n = 96 << 20
    src = tmp_path / "big.safetensors"
    with open(src, "wb") as f:  # written in pieces: the test holds no copy of the data
        header = b'{"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}}' % (n, n)
        header += b" " * (-len(header) % 8)
        f.write(len(header).to_bytes(8, "little") + header)
        piece = bytes(range(256)) * 4096
        for _ in range(n // len(piece)):
            f.write(piece)

    to = peak_growth(lambda: sio.safetensors_to_hurray(src, tmp_path / "big.hurray", fsync=False))
    back = peak_growth(lambda: sio.hurray_to_safetensors(
        tmp_path / "big.hurray", tmp_path / "back.safetensors", fsync=False))
    assert to < 32 << 20 and back < 32 << 20, (to >> 20, back >> 20)  # a few 4 MiB buffers


@pytest.mark.parametrize("checked", [True, False], ids=["checksums", "none"])
def test_save_from_memory_through_the_pipeline(tmp_path: pathlib.Path, chunking: str,
                                               checked: bool) -> None:
    t = tensors()
    hb.save(tmp_path / "m.hurray", t, checksums=checked, alignment=128)
    assert (tmp_path / "m.hurray").read_bytes() == hb.dumps(t, checksums=checked, alignment=128)
    sio.save(tmp_path / "m.safetensors", t)
    assert sio.hurray_to_safetensors(tmp_path / "m.hurray", tmp_path / "back.safetensors")
    assert ((tmp_path / "back.safetensors").read_bytes()
            == (tmp_path / "m.safetensors").read_bytes())


_CUT_AFTER_HEAD = """
import os, sys
from hurray_bridge import safetensors_io as sio
path, out = sys.argv[1], sys.argv[2]
from hurray_bridge.tensor import Tensor
real = Tensor.copy
def copy(self, *args, **kw):  # the file is cut as the strided entry is gathered
    os.truncate(path, 8192)
    return real(self, *args, **kw)
Tensor.copy = copy
from hurray_bridge.__main__ import main
sys.exit(main(["convert", "-q", path, out]))
"""


def test_a_strided_entry_cut_during_its_conversion_is_an_error_not_a_crash(
        tmp_path: pathlib.Path) -> None:
    """A strided entry is gathered to row-major from its span read into memory, not from a
    memory map of the file, which a cut file turns into SIGBUS (run in a subprocess)."""
    import subprocess

    src = tmp_path / "f.hurray"
    hb.save(src, {"w": np.asfortranarray(np.ones((512, 512), np.float32))})
    proc = subprocess.run([sys.executable, "-c", _CUT_AFTER_HEAD, str(src),
                           str(tmp_path / "o.safetensors")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.startswith(f"hurray: error: {src}: ") and "truncated" in proc.stderr, (
        proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.hurray"]


# ------------------------------------------------ small tensors read and written together
def many_small(seed: int, count: int = 120) -> dict[str, Any]:
    """Tensors of random small sizes (empty ones among them), types and shapes."""
    rng = np.random.default_rng(seed)
    kinds = [np.uint8, np.int16, np.float32, np.float64, np.bool_]
    out = {}
    for i in range(count):
        kind = kinds[int(rng.integers(len(kinds)))]
        n = int(rng.choice([0, 1, 3, 63, 64, 65, 1000, 4095, 4097, 20_000]))
        a = rng.integers(0, 2 if kind is np.bool_ else 100, n).astype(kind)
        out[f"t{i}"] = a.reshape(1, n) if i % 3 else a
    return out


@pytest.mark.parametrize("alignment", [64, 4096, 1 << 17])  # 1 << 17: gaps too wide to read
@pytest.mark.parametrize("seed", [1, 2])
def test_many_small_tensors_convert_as_the_writers_from_memory_write(
        tmp_path: pathlib.Path, chunking: str, alignment: int, seed: int) -> None:
    t = many_small(seed)
    sio.save(tmp_path / "ref.safetensors", t, {"k": "v"})
    hb.save(tmp_path / "ref.hurray", t, {"k": "v"}, alignment=alignment)
    sio.safetensors_to_hurray(tmp_path / "ref.safetensors", tmp_path / "out.hurray",
                              alignment=alignment)
    assert (tmp_path / "out.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()
    sio.hurray_to_safetensors(tmp_path / "ref.hurray", tmp_path / "out.safetensors")
    assert ((tmp_path / "out.safetensors").read_bytes()
            == (tmp_path / "ref.safetensors").read_bytes())
    container.rewrite(tmp_path / "ref.hurray", tmp_path / "re.hurray", alignment=64)
    hb.save(tmp_path / "ref64.hurray", t, {"k": "v"})
    assert (tmp_path / "re.hurray").read_bytes() == (tmp_path / "ref64.hurray").read_bytes()


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of each way to read or write, but reads of 64 bytes or less (the checks of
    the padding between two buffers read it on its own)."""
    calls: dict[str, int] = {}

    def counted(name: str, real: Any) -> Any:
        def call(*args: Any) -> Any:
            if name != "preadv" or sum(len(memoryview(v)) for v in args[1]) > 64:
                calls[name] = calls.get(name, 0) + 1
            return real(*args)
        return call

    for name in ("read", "preadv", "write", "pwrite", "writev", "pwritev"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, counted(name, getattr(os, name)))
    return calls


@pytest.mark.skipif(not engine.WRITES_VECTORS, reason="no os.writev on this system")
@pytest.mark.parametrize("direction", ["to hurray", "to safetensors"])
def test_small_tensors_are_read_and_written_a_buffer_at_a_time(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, direction: str) -> None:
    """200 tensors of 20 KB (4 MB, the size of one buffer) take a handful of system calls,
    not two per tensor."""
    t = {f"w{i}": np.full(5000, i, np.float32) for i in range(200)}
    sio.save(tmp_path / "in.safetensors", t)
    hb.save(tmp_path / "in.hurray", t)
    calls = _count_calls(monkeypatch)
    if direction == "to hurray":
        sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray",
                                  fsync=False)
    else:
        sio.hurray_to_safetensors(tmp_path / "in.hurray", tmp_path / "o.safetensors",
                                  fsync=False)
    monkeypatch.undo()
    data_calls = calls.get("preadv", 0) + calls.get("writev", 0) + calls.get("pwritev", 0)
    assert data_calls <= 6, calls
    if direction == "to hurray":
        assert hb.load(tmp_path / "o.hurray").keys() == t.keys()
        assert all(np.array_equal(np.asarray(v), t[k])
                   for k, v in hb.load(tmp_path / "o.hurray").items())
    else:
        assert ((tmp_path / "o.safetensors").read_bytes()
                == (tmp_path / "in.safetensors").read_bytes())


@pytest.mark.skipif(not engine.WRITES_VECTORS, reason="no os.writev on this system")
@pytest.mark.parametrize("short", [1, 7, 64, 1000])
def test_a_short_vector_write_is_continued_where_it_stopped(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, short: int) -> None:
    """A write that takes fewer bytes than its views hold (a signal, a nearly full disk)
    is continued from the byte it stopped at, inside a view or between two."""
    t = many_small(3, 40)
    sio.save(tmp_path / "in.safetensors", t)
    hb.save(tmp_path / "ref.hurray", t)
    real_writev, real_pwritev = os.writev, os.pwritev

    def cut(views: Any) -> list[memoryview]:
        out, left = [], short
        for v in views:
            v = memoryview(v).cast("B")
            if left <= 0:
                break
            out.append(v[:left])
            left -= len(v)
        return out

    monkeypatch.setattr(os, "writev", lambda fd, views: real_writev(fd, cut(views)))
    monkeypatch.setattr(os, "pwritev",
                        lambda fd, views, at: real_pwritev(fd, cut(views), at))
    sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray")
    monkeypatch.undo()
    assert (tmp_path / "o.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()


@pytest.mark.skipif(not engine.WRITES_VECTORS, reason="no os.writev on this system")
def test_a_vector_write_of_nothing_raises_instead_of_looping(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = many_small(4, 20)
    sio.save(tmp_path / "in.safetensors", t)
    monkeypatch.setattr(os, "writev", lambda fd, views: 0)
    monkeypatch.setattr(os, "pwritev", lambda fd, views, at: 0)
    with pytest.raises(OSError, match=r"writev\(\) returned 0") as e:
        sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray")
    monkeypatch.undo()
    assert e.value.errno == errno.EIO and e.value.filename == str(tmp_path / "o.hurray")
    assert others(tmp_path, "in.safetensors") == []


def test_padding_between_gathered_tensors_takes_no_memory_of_its_own(
        tmp_path: pathlib.Path) -> None:
    """Tiny tensors 2 MiB apart (the largest alignment): each run of padding is written
    as the old code wrote it, not held with the others until one write of them all."""
    import tracemalloc

    t = {f"t{i}": np.full(4, i, np.uint8) for i in range(40)}
    sio.save(tmp_path / "in.safetensors", t)
    tracemalloc.start()
    try:
        sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray",
                                  alignment=1 << 21, fsync=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (tmp_path / "o.hurray").stat().st_size > 40 << 21
    assert peak < 32 << 20, f"{peak >> 20} MiB allocated for {40 << 21 >> 20} MiB of padding"
    hb.save(tmp_path / "ref.hurray", t, alignment=1 << 21, fsync=False)
    assert (tmp_path / "o.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()


def test_the_offset_of_an_empty_buffer_is_never_read(tmp_path: pathlib.Path) -> None:
    """An empty buffer's offset is ignored on read (container.md), however far past the
    end of the file it points: verify accepts such a file, and so does the conversion."""
    import struct

    progress: list[tuple[int, int]] = []
    hb.save(tmp_path / "ok.hurray", {"a": np.arange(100, dtype=np.uint8),
                                     "e": np.zeros(0, np.float32)})
    raw = bytearray((tmp_path / "ok.hurray").read_bytes())
    table, meta = struct.unpack_from("<Q", raw, 24)[0], struct.unpack_from("<Q", raw, 40)[0]
    end = container.HEADER_SIZE + table  # "e" is the last entry: its buffer ends the table
    assert struct.unpack_from("<QQ", raw, end - 16) == (0, 0)  # offset 0, 0 bytes
    struct.pack_into("<Q", raw, end - 16, 1024)  # past the end of the file, near "a"
    assert container.read_index(tmp_path / "ok.hurray").data_offset + 1024 > len(raw)
    struct.pack_into("<I", raw, 76, zlib.crc32(raw[container.HEADER_SIZE:end + meta]))
    struct.pack_into("<I", raw, 124, zlib.crc32(raw[:124]))
    (tmp_path / "bad.hurray").write_bytes(raw)
    container.verify(tmp_path / "bad.hurray")
    sio.hurray_to_safetensors(tmp_path / "bad.hurray", tmp_path / "o.safetensors",
                              progress=lambda n, total: progress.append((n, total)))
    assert ((tmp_path / "o.safetensors").read_bytes() == sio_bytes(
        tmp_path, {"a": np.arange(100, dtype=np.uint8), "e": np.zeros(0, np.float32)}))
    assert progress and all(n > 0 for n, _ in progress), progress  # no call for no bytes


def sio_bytes(folder: pathlib.Path, t: dict[str, Any]) -> bytes:
    sio.save(folder / "ref.safetensors", t)
    return (folder / "ref.safetensors").read_bytes()


def test_a_file_of_empty_tensors_reports_no_progress(tmp_path: pathlib.Path) -> None:
    calls: list[tuple[int, int]] = []
    hb.save(tmp_path / "in.hurray", {"e": np.zeros(0, np.float32), "f": np.zeros((2, 0))})
    sio.hurray_to_safetensors(tmp_path / "in.hurray", tmp_path / "o.safetensors",
                              progress=lambda n, total: calls.append((n, total)))
    assert calls == []  # nothing written: a callback computing n / total is never called


# ------------------------------------------------- a split write that cuts through an entry
def cut_at(monkeypatch: pytest.MonkeyPatch, rel: int) -> None:
    """Every split write from now on cuts ``rel`` bytes into its data (none, for data of
    ``rel`` bytes or fewer), inside an entry or not."""
    def split(items: Any, base: int, total: int) -> Any:
        return engine._cut_at(items, base + rel) if rel < total else None

    monkeypatch.setattr(engine, "_split_point", split)


@pytest.mark.skipif(not (hasattr(os, "preadv") and hasattr(os, "pwrite")), reason="positional")
@pytest.mark.parametrize("one_by_one", [False, True], ids=["gathered", "one by one"])
def test_a_cut_anywhere_inside_an_entry_writes_the_same_file(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, one_by_one: bool) -> None:
    """Both halves are given the entry the cut goes through and write their own bytes of
    it; its CRC-32 is the two parts' combined. For cuts at every 97th byte of the data
    (padding, inside a gather, inside a chunk, between the pieces of one buffer), each
    output is byte for byte what the writers from memory write, and verifies."""
    t = {k: v for k, v in tensors().items()}
    t.update({"tail": np.arange(3000, dtype=np.int16), "flags": np.arange(999) % 3 == 0})
    sio.save(tmp_path / "ref.safetensors", t)
    hb.save(tmp_path / "ref.hurray", t)
    data = container.read_index(tmp_path / "ref.hurray")
    want_h = (tmp_path / "ref.hurray").read_bytes()
    want_s = (tmp_path / "ref.safetensors").read_bytes()
    st_data = len(want_s) - sum(np.asarray(v).nbytes for v in t.values())
    monkeypatch.setattr(engine, "CHUNK", 4096)
    if one_by_one:
        monkeypatch.setattr(engine, "WRITES_VECTORS", False)
    cuts = 0
    for rel in range(1, max(data.data_length, len(want_s) - st_data), 97):
        cut_at(monkeypatch, rel)
        sio.safetensors_to_hurray(tmp_path / "ref.safetensors", tmp_path / "o.hurray")
        sio.hurray_to_safetensors(tmp_path / "ref.hurray", tmp_path / "o.safetensors")
        assert (tmp_path / "o.hurray").read_bytes() == want_h, rel
        assert (tmp_path / "o.safetensors").read_bytes() == want_s, rel
        cuts += 1
    assert cuts > 100
    monkeypatch.undo()
    container.verify(tmp_path / "o.hurray")


@pytest.mark.skipif(not (hasattr(os, "preadv") and hasattr(os, "pwrite")), reason="positional")
def test_a_cut_through_a_strided_entry_checks_its_stored_span_once(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A strided entry's stored span is only checked (its gathered copy is written): for
    any cut, one half checks it, so the output is the same and a flipped bit in the span
    (or in a written entry beside it) is caught whichever half holds it."""
    rng = np.random.default_rng(3)
    t = {"a": rng.integers(0, 255, 5001, dtype=np.uint8),
         "strided": np.arange(24 * 50, dtype=np.float32).reshape(24, 50).T,
         "c": rng.integers(-9, 9, 3000, dtype=np.int16)}
    hb.save(tmp_path / "in.hurray", t)
    want = sio_bytes(tmp_path, {k: np.ascontiguousarray(v) for k, v in t.items()})
    index = container.read_index(tmp_path / "in.hurray")
    assert tuple(index.entries[1].descriptor.strides) == (1, 50)  # stored strided, not row-major
    raw = (tmp_path / "in.hurray").read_bytes()
    bad = {}
    for name, at in (("strided", 100), ("c", 3000)):
        flipped = bytearray(raw)
        entry = next(e for e in index.entries if e.name == name)
        flipped[index.data_offset + entry.buffers[0].offset + at] ^= 1
        bad[name] = tmp_path / f"bad_{name}.hurray"
        bad[name].write_bytes(flipped)
    monkeypatch.setattr(engine, "CHUNK", 4096)
    cuts = 0
    for rel in range(1, len(want), 61):
        cut_at(monkeypatch, rel)
        sio.hurray_to_safetensors(tmp_path / "in.hurray", tmp_path / "o.safetensors")
        assert (tmp_path / "o.safetensors").read_bytes() == want, rel
        for name, path in bad.items():
            with pytest.raises(hb.FormatError, match=f"'{name}': data checksum mismatch"):
                sio.hurray_to_safetensors(path, tmp_path / "o.safetensors")
        cuts += 1
    assert cuts > 100


def test_a_large_single_entry_is_written_in_two_halves_at_once(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry holding (nearly) all the bytes is cut at the page nearest the middle:
    the two halves read their own bytes of it on their own threads."""
    monkeypatch.setattr(engine, "_SPLIT_BYTES", 1 << 16)
    monkeypatch.setattr(engine, "CHUNK", 4096)
    t = {"w": np.arange(50_000, dtype=np.float32), "b": np.ones(3, np.float32)}
    sio.save(tmp_path / "in.safetensors", t)
    hb.save(tmp_path / "ref.hurray", t)
    threads: dict[str, list[int]] = {}
    real = engine.pread_into

    def spy(fd: int, view: memoryview, offset: int) -> None:
        threads.setdefault(threading.current_thread().name, []).append(offset)
        real(fd, view, offset)

    monkeypatch.setattr(engine, "pread_into", spy)
    sio.safetensors_to_hurray(tmp_path / "in.safetensors", tmp_path / "o.hurray")
    monkeypatch.undo()
    assert (tmp_path / "o.hurray").read_bytes() == (tmp_path / "ref.hurray").read_bytes()
    assert set(threads) == {"MainThread", "hurray-write"}
    assert max(threads["MainThread"]) < min(threads["hurray-write"])
    assert abs(len(threads["MainThread"]) - len(threads["hurray-write"])) <= 2  # chunks a half


def test_the_combined_crc_is_zlibs_for_any_cut() -> None:
    rng = np.random.default_rng(1)
    whole = rng.integers(0, 255, 5000, dtype=np.uint8).tobytes()
    for combine in {checksums.crc32_combine, checksums._py_crc32_combine}:
        for k in [0, 1, 7, 64, 4095, 4096, 4999, 5000]:
            assert combine(zlib.crc32(whole[:k]), zlib.crc32(whole[k:]),
                           len(whole) - k) == zlib.crc32(whole)
    assert checksums._py_crc32_combine(7, 9, (1 << 40) + 3) == checksums.crc32_combine(
        7, 9, (1 << 40) + 3)


@pytest.mark.parametrize("args, error", [
    ((1 << 32, 0, 1), OverflowError), ((0, 1 << 32, 1), OverflowError),
    ((-1, 0, 1), OverflowError), ((0, 0, 1 << 64), OverflowError),
    ((1.0, 0, 1), TypeError), ((0, 0, 3.0), TypeError), ((0, 0, -1), OverflowError),
], ids=["crc1 2**32", "crc2 2**32", "crc1 -1", "len2 2**64", "float crc", "float len2",
        "len2 -1"])
def test_both_crc_combines_refuse_what_is_not_a_crc_or_a_length(
        args: tuple[Any, ...], error: type[Exception]) -> None:
    """The Python combine takes what the compiled one takes: a CRC-32 below 2**32 and a
    length below 2**64. Each call runs in a child with a time limit: a negative length
    shifted right stays -1, and the Python one looped for ever on it."""
    for combine in sorted({"crc32_combine", "_py_crc32_combine"}):
        code = (f"from hurray_bridge.files import checksums\n"
                f"try:\n    checksums.{combine}(*{args!r})\n"
                f"except {error.__name__}:\n    print('refused')\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.stdout.strip() == "refused", (combine, done.stdout, done.stderr)
    assert checksums._py_crc32_combine(0xFFFFFFFF, 0xFFFFFFFF, (1 << 64) - 1) == (
        checksums.crc32_combine(0xFFFFFFFF, 0xFFFFFFFF, (1 << 64) - 1))
