"""Files as a careless user and a hostile neighbour meet them (container.md §7, §8, §8.1).

Special files (FIFOs, device nodes) are made by each test in its own temporary
folder, never the system's; anything that could hang or kill the interpreter
runs in a subprocess with a timeout.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import container
from hurray_bridge import safetensors_io as sio
from hurray_bridge.files import data_checks, reading
from hurray_bridge.files import disk as _disk

np = pytest.importorskip("numpy")

POSIX = os.name == "posix"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def child(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; a hang is a failed test, not a stuck suite."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {timeout} s:\n{code}")


def others(folder: pathlib.Path, *keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


# --------------------------------------------------------- suffix and content agree
@pytest.mark.parametrize("name", ["m.safetensors", "M.SafeTensors", "a.npy", "b.npz"])
def test_save_refuses_a_name_of_another_format(tmp_path: pathlib.Path, name: str) -> None:
    with pytest.raises(hb.FormatError) as e:
        hb.save(tmp_path / name, {"w": np.ones(3, np.float32)})
    msg = str(e.value)
    assert e.value.field == "path" and name in msg and ".hurray" in msg
    if name.lower().endswith(".safetensors"):
        assert "safetensors_io.save" in msg
    assert list(tmp_path.iterdir()) == []


def test_bytes_paths_get_the_same_rules(tmp_path: pathlib.Path) -> None:
    with pytest.raises(hb.FormatError, match="names a safetensors file"):
        hb.save(os.fsencode(tmp_path / "m.safetensors"), {"w": np.ones(3)})  # type: ignore[arg-type]
    hb.save(os.fsencode(tmp_path / "m.hurray"), {"w": np.ones(3)})  # type: ignore[arg-type]
    assert others(tmp_path) == ["m.hurray"]  # a proper temporary name, renamed away


def test_safetensors_io_save_writes_safetensors(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "m.safetensors"
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert sio.save(path, {"w": w, "b": np.ones(2, np.int8)}, {"k": "v"}) == 2
    idx = sio.read_header(path)
    assert [(e.name, e.dtype.name, e.shape) for e in idx.entries] == [
        ("w", "float32", (2, 3)), ("b", "int8", (2,))]
    assert idx.metadata == {"k": "v"}
    data = path.read_bytes()
    assert data[idx.data_start:idx.data_start + 24] == w.tobytes()
    # and it converts like any safetensors file
    sio.safetensors_to_hurray(path, tmp_path / "m.hurray")
    assert np.asarray(hb.load(tmp_path / "m.hurray")["w"]).tolist() == w.tolist()


def test_safetensors_io_save_refusals(tmp_path: pathlib.Path) -> None:
    with pytest.raises(hb.FormatError, match="__metadata__"):
        sio.save(tmp_path / "x.safetensors", {"__metadata__": np.ones(1)})
    with pytest.raises(hb.FormatError, match=r"x\.hurray.*Hurray"):
        sio.save(tmp_path / "x.hurray", {"a": np.ones(1)})
    with pytest.raises(hb.UnsupportedError, match="metadata value for 'k'"):
        sio.save(tmp_path / "x.safetensors", {"a": np.ones(1)}, {"k": 1})  # type: ignore[dict-item]
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------ what save replaces
@pytest.mark.skipif(not POSIX, reason="FIFOs are POSIX")
def test_save_refuses_a_fifo(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "pipe.hurray"
    os.mkfifo(fifo)
    r = child(f"""
        import numpy as np, hurray_bridge as hb
        try:
            hb.save({str(fifo)!r}, {{"w": np.ones(3)}})
        except hb.UnsupportedError as exc:
            print("refused:", exc)
        """)
    assert r.returncode == 0, r.stderr
    assert "refused:" in r.stdout and "FIFO" in r.stdout and str(fifo) in r.stdout
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still the FIFO
    assert others(tmp_path, "pipe.hurray") == []  # no temporary left


@pytest.mark.skipif(not POSIX or os.geteuid() != 0,
                    reason="making a device node (os.mknod) needs root")
def test_save_refuses_a_device_node(tmp_path: pathlib.Path) -> None:
    node = tmp_path / "null"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a null device of our own
    with pytest.raises(hb.UnsupportedError, match="character device"):
        hb.save(node, {"w": np.ones(3)})
    assert stat.S_ISCHR(os.lstat(node).st_mode)
    assert others(tmp_path, "null") == []


def test_save_refuses_a_directory_before_writing(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "d.hurray"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as e:
        hb.save(target, {"w": np.ones(3)})
    assert e.value.filename == str(target)
    assert others(tmp_path, "d.hurray") == []


@pytest.mark.skipif(not POSIX, reason="POSIX permissions")
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444])
def test_save_keeps_the_mode_of_the_file_it_replaces(tmp_path: pathlib.Path, mode: int) -> None:
    path = tmp_path / "p.hurray"
    hb.save(path, {"w": np.ones(3)})
    os.chmod(path, mode)
    hb.save(path, {"w": np.zeros(3)})
    assert stat.S_IMODE(os.stat(path).st_mode) == mode
    assert np.asarray(hb.load(path)["w"]).tolist() == [0, 0, 0]


@pytest.mark.skipif(not POSIX, reason="symbolic links")
def test_save_over_a_symlink_replaces_the_link_not_its_target(tmp_path: pathlib.Path) -> None:
    real = tmp_path / "real.hurray"
    hb.save(real, {"w": np.ones(3)})
    before = real.read_bytes()
    link = tmp_path / "link.hurray"
    link.symlink_to(real)
    hb.save(link, {"w": np.zeros(3)})
    assert not link.is_symlink() and real.read_bytes() == before


# --------------------------------------------- errors name the output, not the input
def _enospc_after(monkeypatch: pytest.MonkeyPatch, calls: int) -> None:
    """Every way of writing a file fails with ENOSPC after ``calls`` writes in all."""
    n = [0]

    def failing(real: Any) -> Any:
        def write(fd: int, *args: Any) -> int:
            n[0] += 1
            if n[0] > calls:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return int(real(fd, *args))
        return write

    for name in ("write", "pwrite", "writev", "pwritev"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, failing(getattr(os, name)))


@pytest.mark.parametrize("size, calls", [(1000, 0), (600_000, 1)])
def test_a_full_disk_is_reported_against_the_output(tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    size: int, calls: int) -> None:
    out = tmp_path / "o.hurray"  # (a small file is written in one call, a larger in several)
    _enospc_after(monkeypatch, calls)
    with pytest.raises(OSError) as e:
        hb.save(out, {"w": np.ones(size)})
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(out)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def st_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "in.safetensors"
    hb.save(tmp_path / "in.hurray", {"a": np.arange(3 << 20, dtype=np.uint8),
                                     "b": np.ones(1000)})
    sio.hurray_to_safetensors(tmp_path / "in.hurray", path)
    (tmp_path / "in.hurray").unlink()
    return path


def test_safetensors_to_hurray_on_a_full_disk(tmp_path: pathlib.Path, st_file: pathlib.Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "o.hurray"
    hb.save(out, {"old": np.ones(2)})
    before = out.read_bytes()
    _enospc_after(monkeypatch, 1)
    with pytest.raises(OSError) as e:  # once a BufferError: "cannot close exported pointers"
        sio.safetensors_to_hurray(st_file, out)
    assert type(e.value) is OSError and e.value.errno == errno.ENOSPC
    assert e.value.filename == str(out)
    assert out.read_bytes() == before and others(tmp_path, "o.hurray", "in.safetensors") == []


@pytest.mark.parametrize("exc", [ValueError("stop"), KeyboardInterrupt()])
def test_a_failing_progress_callback_surfaces_as_itself(tmp_path: pathlib.Path,
                                                        st_file: pathlib.Path,
                                                        exc: BaseException) -> None:
    out = tmp_path / "o.hurray"
    hb.save(out, {"old": np.ones(2)})
    before = out.read_bytes()

    def progress(done: int, total: int) -> None:
        raise exc

    with pytest.raises(type(exc)):
        sio.safetensors_to_hurray(st_file, out, progress=progress)
    assert out.read_bytes() == before and others(tmp_path, "o.hurray", "in.safetensors") == []
    # the source is not held open: converting again works
    assert sio.safetensors_to_hurray(st_file, out) == 2


# ----------------------------------------------------- counts a file cannot have moved
@pytest.mark.parametrize("size, call", [(1000, "writev"), (600_000, "write")])
def test_a_write_of_nothing_raises_instead_of_looping(tmp_path: pathlib.Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      size: int, call: str) -> None:
    out = tmp_path / "z.hurray"
    hb.save(out, {"old": np.ones(2)})
    before = out.read_bytes()
    monkeypatch.setattr(os, "write", lambda fd, data: 0)
    monkeypatch.setattr(os, "writev", lambda fd, views: 0)
    with pytest.raises(OSError, match=rf"{call}\(\) returned 0") as e:  # (a small file: one writev)
        hb.save(out, {"w": np.ones(size)})
    monkeypatch.undo()
    assert e.value.errno == errno.EIO and e.value.filename == str(out)
    assert out.read_bytes() == before and others(tmp_path, "z.hurray") == []


class _Boastful:
    """A file object whose readinto() says it read one byte more than it was given room for."""

    def seek(self, offset: int) -> int:
        return offset

    def readinto(self, b: Any) -> int:
        b[:] = bytes(len(b))
        return len(b) + 1


def test_a_read_of_more_bytes_than_asked_is_refused() -> None:
    read = reading.file_reader(_Boastful(), 0)  # type: ignore[arg-type]
    with pytest.raises(OSError, match=r"readinto\(\) returned 9 for 8 bytes") as e:
        read(0, memoryview(bytearray(8)))
    assert e.value.errno == errno.EIO


# ---------------------------------------------------------- temporaries of the dead
# The first write waits for the signal; later ones (a cleanup's) go through at once. The
# wait is well under _interrupted_save's 60 s: a write on another thread than the main one
# is waited for by the save before it raises (no write may follow its return), so a wait as
# long as the parent's made the test fail on a loaded machine. SIGINT is made Python's own
# again: a shell's background job inherits it ignored.
SLOW_SAVE = """
import os, signal, sys, time
import numpy as np
import hurray_bridge as hb
signal.signal(signal.SIGINT, signal.default_int_handler)
real = os.write
waited = []
def slow(fd, data):
    n = real(fd, data)
    if not waited:
        waited.append(True)
        print("writing", flush=True)
        time.sleep(20)
    return n
os.write = slow
hb.save(sys.argv[1], {"new": np.ones(1 << 20)})
"""


def _interrupted_save(path: pathlib.Path, sig: int) -> subprocess.Popen[str]:
    with subprocess.Popen([sys.executable, "-c", SLOW_SAVE, str(path)], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:  # closes the pipes at the end
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
            proc.send_signal(sig)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc


@pytest.mark.skipif(not POSIX, reason="signals")
def test_sigint_during_save_leaves_no_temporary(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "k.hurray"
    hb.save(path, {"old": np.arange(10)})
    before = path.read_bytes()
    proc = _interrupted_save(path, signal.SIGINT)
    assert proc.returncode != 0
    assert path.read_bytes() == before and others(tmp_path, "k.hurray") == []


@pytest.mark.skipif(not POSIX, reason="SIGKILL")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_next_save_removes_a_killed_saves_temporary(tmp_path: pathlib.Path,
                                                        sig: int) -> None:
    path = tmp_path / "k.hurray"
    hb.save(path, {"old": np.arange(10)})
    before = path.read_bytes()
    proc = _interrupted_save(path, sig)
    assert proc.returncode == -sig
    (stale,) = others(tmp_path, "k.hurray")  # the dead writer's temporary
    assert stale.startswith(".k.hurray.") and path.read_bytes() == before
    found = _disk.stale_temporaries(path)
    assert [os.path.basename(p) for p in found] == [stale]
    hb.save(path, {"new": np.ones(2)})
    assert others(tmp_path, "k.hurray") == []
    assert _disk.stale_temporaries(path) == []


@pytest.mark.skipif(not POSIX, reason="process ids")
def test_temporaries_of_the_living_and_of_strangers_are_left_alone(
        tmp_path: pathlib.Path) -> None:
    path = tmp_path / "k.hurray"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tag = _disk._host_tag()
        live = f".k.hurray.{sleeper.pid}-{tag}-0123456789ab.tmp"
        elsewhere = ".k.hurray.1-deadbeef-0123456789ab.tmp"  # another host (or pid namespace)
        stranger = ".k.hurray.mine.tmp"  # not our pattern
        longer = f".k.hurray.x.{sleeper.pid}-{tag}-0123456789ab.tmp"  # k.hurray.x's, live
        for name in (live, elsewhere, stranger, longer):
            (tmp_path / name).write_bytes(b"x")
        assert _disk.stale_temporaries(path) == []
        hb.save(path, {"w": np.ones(2)})
        assert others(tmp_path, "k.hurray") == sorted([live, elsewhere, stranger, longer])
    finally:
        sleeper.kill()
        sleeper.wait()
    # their writer gone, the first is k.hurray's stale temporary; the last is k.hurray.x's
    assert [os.path.basename(p) for p in _disk.stale_temporaries(path)] == [live]
    assert [os.path.basename(p) for p in _disk.stale_temporaries(
        tmp_path / "k.hurray.x")] == [longer]


@pytest.mark.skipif(not POSIX, reason="process ids")
def test_a_save_removes_the_stale_temporaries_of_every_file_in_its_folder(
        tmp_path: pathlib.Path, dead_pid: int) -> None:
    dead, tag = dead_pid, _disk._host_tag()
    for name in ("a.hurray", "b.safetensors", "c.7"):
        (tmp_path / f".{name}.{dead}-{tag}-0123456789ab.tmp").write_bytes(b"x")
    (tmp_path / "c.7").write_bytes(b"not ours")
    hb.save(tmp_path / "a.hurray", {"w": np.ones(2)})
    assert others(tmp_path) == ["a.hurray", "c.7"]


def test_scans_of_a_big_folder_are_amortised(tmp_path: pathlib.Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[str] = []
    real = _disk._stale_in

    def counting(directory: str, prefix: str = ".") -> tuple[list[str], int]:
        scans.append(directory)
        return real(directory, prefix)

    monkeypatch.setattr(_disk, "_stale_in", counting)
    monkeypatch.setitem(_disk._SCANS, str(tmp_path), (time.monotonic(), 0.5))
    hb.save(tmp_path / "x.hurray", {"w": np.ones(2)})  # its last scan took 0.5 s: not again yet
    assert scans == []
    monkeypatch.setitem(_disk._SCANS, str(tmp_path), (0.0, 0.5))  # long ago
    hb.save(tmp_path / "x.hurray", {"w": np.ones(2)})
    assert scans == [str(tmp_path)]
    hb.save(tmp_path / "x.hurray", {"w": np.ones(2)})  # a small folder: scanned every time
    assert scans == [str(tmp_path)] * 2


# ------------------------------------------------------------------- what load opens
@pytest.mark.parametrize("reader", ["load", "load_copy", "read_index", "verify"])
def test_an_int_path_is_refused_and_the_descriptor_stays_open(tmp_path: pathlib.Path,
                                                              reader: str) -> None:
    path = tmp_path / "f.hurray"
    hb.save(path, {"w": np.ones(3)})
    call: Any = {"load": lambda p: hb.load(p), "load_copy": lambda p: hb.load(p, mmap=False),
            "read_index": container.read_index, "verify": container.verify}[reader]
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(hb.UnsupportedError) as e:
            call(fd)
        assert f"file descriptor {fd}" in str(e.value) and "path" in str(e.value)
        os.fstat(fd)  # still open: the caller's descriptor is the caller's
    finally:
        os.close(fd)


def test_save_refuses_an_int_path(tmp_path: pathlib.Path) -> None:
    with pytest.raises(hb.UnsupportedError, match="file descriptor 3"):
        hb.save(3, {"w": np.ones(3)})  # type: ignore[arg-type]


@pytest.mark.skipif(not POSIX, reason="FIFOs are POSIX")
def test_readers_refuse_a_fifo_instead_of_hanging(tmp_path: pathlib.Path) -> None:
    fifo = tmp_path / "pipe.hurray"
    os.mkfifo(fifo)  # nobody ever writes to it: opening it to read would wait forever
    r = child(f"""
        import hurray_bridge as hb
        from hurray_bridge import container, safetensors_io
        calls = [lambda p: hb.load(p), lambda p: hb.load(p, mmap=False), container.read_index,
                 container.verify, safetensors_io.read_header,
                 lambda p: safetensors_io.safetensors_to_hurray(p, p + ".out")]
        for call in calls:
            try:
                call({str(fifo)!r})
            except hb.UnsupportedError as exc:
                print("refused:", exc)
        """, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 6 and all("FIFO" in x and str(fifo) in x for x in lines), r.stdout


@pytest.mark.skipif(not POSIX or os.geteuid() != 0,
                    reason="making a device node (os.mknod) needs root")
def test_readers_refuse_a_device_node(tmp_path: pathlib.Path) -> None:
    node = tmp_path / "zero"
    os.mknod(node, 0o444 | stat.S_IFCHR, os.makedev(1, 5))  # a zero device of our own
    for call in (hb.load, container.read_index, container.verify, sio.read_header):
        with pytest.raises(hb.UnsupportedError, match="character device"):
            call(node)


def test_readers_of_a_directory_raise_is_a_directory(tmp_path: pathlib.Path) -> None:
    for read in (hb.container.read_index, hb.container.verify):
        with pytest.raises(IsADirectoryError) as e:
            read(tmp_path)
        assert e.value.filename == str(tmp_path)
    # hb.load reads a folder as a checkpoint of several files (container.md §12)
    with pytest.raises(hb.FormatError, match=f"{re.escape(str(tmp_path))} holds no checkpoint"):
        hb.load(tmp_path)


# --------------------------------------------- shrinking under a map (§8.1, documented)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGBUS semantics of Linux")
def test_a_file_truncated_while_mapped_faults_and_a_copy_does_not(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "t.hurray"
    hb.save(path, {"w": np.ones(1 << 16, np.float32)})
    r = child(f"""
        import os, numpy as np, hurray_bridge as hb
        copied = hb.load({str(path)!r}, mmap=False)["w"]
        mapped = hb.load({str(path)!r})["w"]
        os.truncate({str(path)!r}, 4096)  # another writer shrinks the file in place
        print("copy", float(np.asarray(copied).sum()), flush=True)
        print("map", float(np.asarray(mapped).sum()), flush=True)
        """)
    assert "copy 65536.0" in r.stdout and "map" not in r.stdout
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGBUS semantics of Linux")
def test_a_shared_segment_truncated_by_a_peer_faults(tmp_path: pathlib.Path) -> None:
    r = child("""
        import os, numpy as np, hurray_bridge as hb
        from hurray_bridge import shm
        handle = shm.share(hb.asarray(np.ones(1 << 16, np.float32)))
        try:
            t = shm.attach(handle)
            os.truncate("/dev/shm/" + handle.name, 0)  # what a hostile peer can do
            print("touching", flush=True)
            print("sum", float(np.asarray(t).sum()), flush=True)
        finally:
            handle.unlink()
        """)
    assert "touching" in r.stdout and "sum" not in r.stdout
    assert r.returncode == -signal.SIGBUS, (r.returncode, r.stderr)


# Both scripts below: a small file saved in two halves at once, then what the script's
# on_interrupt() does when the save raises KeyboardInterrupt.
_SPLIT_SETUP = """
import os, signal, sys, threading, time, types
import numpy as np
import hurray_bridge as hb
from hurray_bridge.files import engine
signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started ignoring it
engine._SPLIT_BYTES = 0  # two halves at once, even for a small file
engine._THREADED_CRC_BYTES = None
engine.CHUNK = 1 << 16
"""
_SPLIT_SAVE = """
tensors = {f"w{k}": np.full(1 << 16, k, np.float32) for k in range(8)}
try:
    hb.save(sys.argv[1], tensors, fsync=False)
    print("not interrupted")
except KeyboardInterrupt:
    on_interrupt()
"""

SPLIT_INTERRUPTED = _SPLIT_SETUP + textwrap.dedent("""
    real, seen, late = os.pwrite, [0], []
    done = threading.Event()
    def slow(fd, data, offset):
        if threading.current_thread().name.startswith("hurray-write"):
            seen[0] += 1
            if seen[0] == 2:
                print("writing", flush=True)
                time.sleep(2)  # the caller's half is done: it waits for this one
            if done.is_set():
                late.append(fd)
        return real(fd, data, offset)
    os.pwrite = slow
    def on_interrupt():
        done.set()
        fd = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT)  # the closed descriptor's number
        os.write(fd, b"keep")
        time.sleep(2.5)
        os.close(fd)
        print("late writes", len(late), "threads", threading.active_count(), flush=True)
""") + _SPLIT_SAVE


SIGNAL_AFTER_THE_WAIT = _SPLIT_SETUP + textwrap.dedent("""
    class SignalledOnceTaken:
        # A signal (KeyboardInterrupt) that lands when the wait for the other half has
        # got the lock, before the next line: Python runs handlers between bytecodes.
        def __init__(self):
            self.lock, self.taken = threading.Lock(), 0
        def acquire(self, *args, **kwargs):
            got = self.lock.acquire(*args, **kwargs)
            self.taken += got
            if got and self.taken == 2:  # the first is the one made before the helper starts
                raise KeyboardInterrupt
            return got
        def release(self):
            self.lock.release()

    engine.threading = types.SimpleNamespace(**vars(threading))
    engine.threading.Lock = SignalledOnceTaken
    real, slowed = os.pwrite, []
    def slow(fd, data, offset):  # the other half is still writing when the wait begins
        if threading.current_thread().name.startswith("hurray-write") and not slowed:
            slowed.append(1)
            time.sleep(2)  # (0.5 s was not always enough for the caller's half on a loaded CI)
        return real(fd, data, offset)
    os.pwrite = slow
    def on_interrupt():
        print("interrupted")
""") + _SPLIT_SAVE


def test_a_signal_just_after_the_split_write_wait_ends_it(tmp_path: pathlib.Path) -> None:
    # The wait took the lock, the signal came before it noticed, and it went back to
    # wait for a lock it now held itself: hurray convert hung for good (a review's
    # repeated Ctrl-C, 1 hang in 35 tries), SIGTERM no longer ended it.
    out = subprocess.run([sys.executable, "-c", SIGNAL_AFTER_THE_WAIT, str(tmp_path / "o.hurray")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["interrupted"], out.stdout + out.stderr
    assert list(tmp_path.iterdir()) == []  # no temporary left


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_an_interrupted_split_write_returns_only_once_its_helper_stopped(
        tmp_path: pathlib.Path) -> None:
    out, other = tmp_path / "out.hurray", tmp_path / "other.bin"
    with subprocess.Popen([sys.executable, "-c", SPLIT_INTERRUPTED, str(out), str(other)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
            time.sleep(0.3)  # the caller's half ends and waits for the helper's
            proc.send_signal(signal.SIGINT)
            stdout, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert stdout.split() == ["late", "writes", "0", "threads", "1"], (stdout, err)
    assert other.read_bytes() == b"keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.bin"]  # no temporary


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGBUS semantics of Linux")
@pytest.mark.parametrize("how", ["container.verify", "hb.load(mmap=False, verify=True)",
                                 "hurray verify"])
def test_a_file_cut_while_it_is_verified_is_an_error_not_a_crash(
        tmp_path: pathlib.Path, how: str) -> None:
    """Verification reads the file in pieces, not through a memory map, which a file cut
    meanwhile (by another writer) turns into SIGBUS."""
    path = tmp_path / "t.hurray"
    hb.save(path, {"w": np.ones(1 << 20, np.float32)})
    call = {"container.verify": f"container.verify({str(path)!r})",
            "hb.load(mmap=False, verify=True)": f"hb.load({str(path)!r}, mmap=False, verify=True)",
            "hurray verify": f"sys.exit(main(['verify', {str(path)!r}]))"}[how]
    r = child(f"""
        import os, sys, hurray_bridge as hb
        from hurray_bridge import container
        from hurray_bridge.__main__ import main
        from hurray_bridge.files import data_checks, reading
        real = data_checks.check_head_padding
        def cut_then_check(*args):  # the file is opened and its index read: now it is cut
            os.truncate({str(path)!r}, 8192)
            return real(*args)
        # (verify checks it in data_checks; a load that reads and checks at once, in reading)
        data_checks.check_head_padding = reading.check_head_padding = cut_then_check
        try:
            {call}
        except hb.FormatError as exc:
            print("refused", exc.field, flush=True)
        """)
    if how == "hurray verify":
        assert r.returncode == 2 and "file_size: truncated" in r.stderr, (r.returncode, r.stderr)
    else:
        assert r.returncode == 0 and "refused file_size" in r.stdout, (r.returncode, r.stderr)


@pytest.mark.parametrize("how", ["container.verify", "hb.load(mmap=False, verify=True)"])
def test_a_file_grown_while_it_is_verified_is_refused(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    path = tmp_path / "t.hurray"
    hb.save(path, {"w": np.ones(1000, np.float32)}, fsync=False)
    real = data_checks.check_head_padding

    def grow_then_check(*args: Any) -> None:  # the index is read: now a byte is appended
        with open(path, "ab") as f:
            f.write(b"\0")
        real(*args)

    monkeypatch.setattr(data_checks, "check_head_padding", grow_then_check)  # verify
    monkeypatch.setattr(reading, "check_head_padding", grow_then_check)  # a load that checks
    with pytest.raises(hb.FormatError, match="changed size") as err:
        if how == "container.verify":
            container.verify(path)
        else:
            hb.load(path, mmap=False, verify=True)
    assert err.value.field == "file_size"


def test_a_file_emptied_before_it_is_mapped_is_a_format_error(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.hurray"
    hb.save(path, {"w": np.ones(1000, np.float32)}, fsync=False)
    real = reading.read_raw_index

    def read_then_empty(f: Any, *size: int) -> Any:
        got = real(f, *size)
        os.truncate(path, 0)
        return got

    monkeypatch.setattr(reading, "read_raw_index", read_then_empty)
    with pytest.raises(hb.FormatError, match="changed size") as err:
        hb.load(path)
    assert err.value.field == "file_size"
