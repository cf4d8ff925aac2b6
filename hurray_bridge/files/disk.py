"""Files on disk, below the formats: paths, atomic replacement, stale temporaries.

What every writer of the bridge (``hb.save``, the safetensors writer, ``hurray
convert``) needs from the file system, whatever the format: a path that is a
regular file (or missing) and does not claim another format's suffix, output
written to a temporary beside the target and renamed over it only when complete
(durable with ``fsync``), the target's permission bits kept, and the temporaries
that killed writers left behind found and removed.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import re
import stat
import time
import zlib
from collections.abc import Callable
from typing import Any

from ..errors import FormatError, UnsupportedError


def bad_count(call: str, n: object, want: int) -> OSError:
    """A file that says it moved bytes it cannot have moved: nothing after can be trusted."""
    return OSError(errno.EIO, f"{call}() returned {n!r} for {want} bytes (should have been "
                              f"between 0 and {want})")


_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
               (stat.S_ISDOOR, "a door"), (stat.S_ISPORT, "an event port"))
SUFFIX_FORMATS = {".hurray": "hurray", ".hry": "hurray", ".safetensors": "safetensors",
                  ".npy": "npy", ".npz": "npz"}
"""File name suffixes whose format is known: a file's name never claims another format."""
_OWN_SUFFIX: dict[str, str] = {}
"""Each format's own suffix: the first of :data:`SUFFIX_FORMATS` that names it."""
for _suffix, _fmt in SUFFIX_FORMATS.items():
    _OWN_SUFFIX.setdefault(_fmt, _suffix)
_WRITERS = {"hurray": "hb.save(path, tensors)",
            "safetensors": "hurray_bridge.safetensors_io.save(path, tensors)",
            "npy": "numpy.save", "npz": "numpy.savez"}


def fspath(path: Any, what: str) -> str:
    """``os.fspath(path)``, refusing an ``int``: a file descriptor is the caller's to close."""
    if isinstance(path, int):
        raise UnsupportedError(
            f"{what}: got the int {path!r}, which Python's open() would take as file descriptor "
            f"{path} and close when done; pass a path (str or os.PathLike) instead "
            f"(for an open descriptor on Linux, the path /proc/self/fd/{path})")
    p = os.fspath(path)
    # bytes paths as str: one kind of name from here on (os.fsdecode is a Python call)
    return p if type(p) is str else os.fsdecode(p)


def _not_regular(path: str, st: os.stat_result, doing: str) -> None:
    """Raise for anything but a regular file (a directory is IsADirectoryError, as open says)."""
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    kind = next((k for test, k in _FILE_KINDS if test(mode)), f"a special file (mode {mode:o})")
    err = UnsupportedError(
        f"{path!r} is {kind}, not a regular file: {doing} regular files only; use a regular "
        "file's path (to send tensors through a pipe or socket, use hb.StreamWriter and "
        "hb.StreamReader)")
    err.filename = path  # type: ignore[attr-defined]  # which file, as an OSError says
    raise err


# (computed once: every load opens a file, and four lookups cost a tenth of a small one)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_READ_FLAGS = os.O_RDONLY | _NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def open_regular(path: Any, what: str = "path") -> Any:
    """Open an existing regular file for reading, never blocking on a FIFO or device.

    The path is checked with ``stat`` before it is opened (opening a FIFO with
    no writer waits forever; opening some devices has side effects), then
    opened non-blocking and checked again on the descriptor, so a file swapped
    in between is caught too.
    """
    f, _ = open_regular_raw(path, what)
    return io.BufferedReader(f)


def readinto_full(f: Any, view: memoryview) -> int:
    """Fill ``view`` from ``f``'s position, as many reads as it takes (an unbuffered file
    may give fewer bytes a read); the bytes read: fewer only where the file ends."""
    got = 0
    while got < len(view):
        want = len(view) - got
        n = f.readinto(view[got:])
        if not n:
            break
        if not 0 < n <= want:
            raise bad_count("readinto", n, want)
        got += n
    return got


def open_regular_raw(path: Any, what: str = "path") -> tuple[io.FileIO, os.stat_result]:
    """:func:`open_regular` unbuffered, with the descriptor's ``os.stat_result``: for the
    loaders, which read a header and then map or ``pread`` the rest. A buffer's set-up
    (and the ``fstat``, ``isatty`` and ``lseek`` of ``open``) was a tenth of a small load,
    and the stat answers what they asked ``fstat`` for again (the size, the stamp)."""
    p = fspath(path, what)
    _not_regular(p, os.stat(p), "Hurray reads")
    fd = os.open(p, _READ_FLAGS)
    try:
        st = os.fstat(fd)
        _not_regular(p, st, "Hurray reads")
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return io.FileIO(fd, "rb"), st
    except BaseException:
        os.close(fd)
        raise


def check_suffix(path: str | os.PathLike[str], fmt: str) -> None:
    """Refuse to write ``fmt`` content under a name whose suffix says another format."""
    p = os.fspath(path)
    own = _OWN_SUFFIX.get(fmt)
    if own is not None and type(p) is str and p.endswith(own):
        return  # the usual name, its own format's (splitext is Python calls, cold each save)
    claimed = SUFFIX_FORMATS.get(os.path.splitext(p)[1].lower())
    if claimed is None or claimed == fmt:
        return
    names = {"hurray": "Hurray", "npy": ".npy", "npz": ".npz"}
    suffix = _OWN_SUFFIX[fmt]
    raise FormatError(
        f"{p!r} names a {names.get(claimed, claimed)} file but this writes "
        f"{names.get(fmt, fmt)}: a {names.get(claimed, claimed)} reader would refuse it; write "
        f"{names.get(claimed, claimed)} with {_WRITERS[claimed]}, or give the file the {suffix} "
        "suffix", field="path")


# Signals during a long file operation (hurray convert). A handler may raise only where
# nothing but this package's own frames surround the interrupted call: the functions
# marked interruptible, whose frames hold no resource. Anywhere else it notes the signal,
# and the checkpoints below (every data read and write, the rename, the planning loops)
# raise it: raised wherever the main thread was, it could land in a weak-reference or
# collector callback, where Python drops it, or in a lock of the standard library.
_INTERRUPTIBLE: set[Any] = set()  # code objects
_CHECKPOINT: Callable[[], None] | None = None  # the check a command installed, if any


def interruptible(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as a blocking call a signal handler may end at once by raising."""
    _INTERRUPTIBLE.add(fn.__code__)
    return fn


def interrupted_in_io(frame: Any) -> bool:
    """Whether a signal handler's ``frame`` is one of the :func:`interruptible` calls."""
    return frame is not None and frame.f_code in _INTERRUPTIBLE


def set_checkpoint(check: Callable[[], None] | None) -> None:
    """Install ``check`` (it raises to stop the operation), or remove it with None."""
    global _CHECKPOINT
    _CHECKPOINT = check


def checkpoint() -> None:
    """A point where a long file operation may stop: runs the installed check, if any."""
    check = _CHECKPOINT
    if check is not None:
        check()


@interruptible
def _flush(fd: int) -> None:
    os.fsync(fd)


@interruptible
def write_all(fd: int, data: memoryview | bytes, offset: int | None = None) -> None:
    """All of ``data`` written to ``fd``: at its file position, or with os.pwrite at
    ``offset`` (the file position left alone, so threads can write one file at once)."""
    checkpoint()
    view = memoryview(data)
    call = "write" if offset is None else "pwrite"
    while len(view):
        n = os.write(fd, view) if offset is None else os.pwrite(fd, view, offset)
        if not 0 < n <= len(view):  # 0 would loop forever
            raise bad_count(call, n, len(view))
        view = view[n:]
        if offset is not None:
            offset += n


WRITES_VECTORS = hasattr(os, "writev") and hasattr(os, "pwritev")
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 16, 1024) \
    if WRITES_VECTORS else 1


@interruptible
def write_vectors(fd: int, views: list[memoryview], offset: int | None = None) -> None:
    """:func:`write_all` of the views' bytes one after another, in as few calls as the
    system allows (``os.writev``; where ``WRITES_VECTORS``), at most ``_IOV_MAX`` views each."""
    checkpoint()
    call = "writev" if offset is None else "pwritev"
    n = 0
    if offset is None and len(views) <= _IOV_MAX:
        # A small file's views, empty ones included, in one call: the list copied and
        # summed again only after a short write.
        want = sum(map(len, views))
        n = os.writev(fd, views)
        if n == want:
            return
        if not 0 < n <= want:
            raise bad_count(call, n, want)
    views = list(filter(len, views))  # (a copy: a short write replaces the view it ends in)
    i = 0
    while True:
        while n and n >= len(views[i]):  # the views written whole
            n -= len(views[i])
            i += 1
        if n:  # a short write ended inside one: the rest of it goes next
            views[i] = views[i][n:]
        if i >= len(views):
            return
        batch = views[i:i + _IOV_MAX]
        want = sum(map(len, batch))
        n = os.writev(fd, batch) if offset is None else os.pwritev(fd, batch, offset)
        if not 0 < n <= want:
            raise bad_count(call, n, want)
        if offset is not None:
            offset += n


TEMP_NAME = re.compile(r"(?P<pid>[0-9]+)-(?P<host>[0-9a-f]{8})-[0-9a-f]{12}\.tmp\Z")


@functools.lru_cache(maxsize=1)
def _host_tag() -> str:
    """8 hex digits naming this host and PID namespace: where a temporary's pid means something.

    Two machines sharing a folder (NFS), or two containers sharing a volume
    and a host name, each see the other's process ids as dead; the tag keeps a
    process from judging a temporary whose writer it cannot see.
    """
    import socket  # here: saves and their clean-up need it, ``hurray inspect`` starts without

    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{zlib.crc32(f'{socket.gethostname()}|{namespace}'.encode()):08x}"


def _temp_prefix(target: str) -> str:
    return f".{os.path.basename(target)[:200]}."


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no harmless way to ask (os.kill(pid, 0) would stop it): never stale
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def stale_temporaries(path: str | os.PathLike[str]) -> list[str]:
    """The temporary files that interrupted saves of ``path`` left beside it.

    A temporary is stale only if it is provably ours and its writer is gone:
    its name is ``.NAME.PID-HOST-RANDOM.tmp`` as :func:`atomic_output` makes
    it, for this target, with this host's tag (:func:`_host_tag`), and no
    process with that pid exists. A temporary of a live process, of another
    host or PID namespace, or of another name is never listed. Saves into the
    folder remove these; ``hurray verify`` reports them.
    """
    target = fspath(path, "path")
    directory = os.path.dirname(os.path.abspath(target))
    return _stale_in(directory, _temp_prefix(target))[0]


def _stale_in(directory: str, prefix: str = ".") -> tuple[list[str], int]:
    """(stale temporaries in ``directory`` whose names start with ``prefix``, entries seen).

    The names come from ``os.listdir``, not ``os.scandir``: an entry object each, cold at
    every save, made the scan of a folder of ten files a tenth of a small save. Only a
    candidate (our pattern, this host, a dead writer) is looked at with ``lstat``."""
    tag, found = _host_tag(), []
    exact = prefix != "."  # one target's: the tail starts right after its prefix
    try:
        names = os.listdir(directory)
    except OSError:
        return [], 0
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        m = TEMP_NAME.match(name, len(prefix)) if exact else TEMP_NAME.search(name, 2)
        if (m is None or name[m.start() - 1] != "."
                or m["host"] != tag or _pid_alive(int(m["pid"]))):
            continue
        path = os.path.join(directory, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                found.append(path)
        except OSError:  # gone meanwhile
            continue
    return sorted(found), len(names)


# directory -> (time.monotonic() of its last scan for stale temporaries, seconds it took)
_SCANS: dict[str, tuple[float, float]] = {}


def _remove_stale(directory: str) -> None:
    """Remove the stale temporaries of every target in ``directory`` (best effort).

    A folder is scanned at every save while a scan is cheap (under a
    millisecond: up to a few thousand entries); a larger one again only after
    100 times as long as its last scan took (at most a minute), so that many
    saves into one big folder spend at most about 1% of their time here.
    """
    now = time.monotonic()
    last = _SCANS.get(directory)
    if last is not None and last[1] >= 1e-3 and now - last[0] < min(100 * last[1], 60.0):
        return
    stale, _ = _stale_in(directory)
    for p in stale:
        with contextlib.suppress(OSError):
            os.unlink(p)
    if len(_SCANS) >= 4096:
        _SCANS.clear()
    _SCANS[directory] = (now, time.monotonic() - now)


def _existing_target(target: str) -> os.stat_result | None:
    """What ``target`` is now: ``None`` if nothing (or a link, which is replaced as such)."""
    try:
        st = os.lstat(target)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return None  # os.replace replaces the link itself; what it points to is untouched
    _not_regular(target, st, "hb.save and hurray convert replace")
    return st


def _name_target(exc: OSError, target: str, tmp: str) -> None:
    """An error of the temporary (or of its bare descriptor) is reported against the target."""
    if exc.filename is None or exc.filename == tmp:
        exc.filename = target
        if exc.filename2 in (tmp, target):
            exc.filename2 = None


def atomic_output(path: str | os.PathLike[str], *, fsync: bool = True) -> _Atomic:
    """A context manager giving a file descriptor whose content replaces ``path`` only if
    the block succeeds.

    See :func:`atomic_temporary`, which this is, giving the descriptor only.
    """
    return _Atomic(path, fsync, False)


def atomic_temporary(path: str | os.PathLike[str], *, fsync: bool = True) -> _Atomic:
    """A context manager giving the file descriptor and path of a temporary whose content
    replaces ``path`` only if the block succeeds. (The path is for writers in other
    processes, as a Dask save's workers are: they open it by that name, never creating it.)

    The data goes to a temporary file in the same directory (so the rename
    cannot cross file systems), which is fsynced, renamed over ``path`` with
    ``os.replace`` (atomic on POSIX and Windows) and whose directory entry is
    then fsynced. A crash at any point leaves either the old file or the new
    one under ``path``, never a partial one. A memory map of the old file stays
    valid: the rename gives the new content a new inode.

    Only a regular file (or nothing, or a symbolic link, which is replaced as
    a link) is replaced: a FIFO, device or socket is an
    :class:`UnsupportedError` and a directory an ``IsADirectoryError``, before
    anything is written. The new file keeps the replaced file's permission bits
    (and, where allowed, its owner and group). Temporaries that interrupted
    saves of ``path`` left behind (see :func:`stale_temporaries`) are removed
    first. An ``OSError`` of the writing (a full disk, say) names ``path``. An
    exception raised while the directory is flushed, after the rename, carries
    ``output_replaced = True``: the new file is in place.
    """
    return _Atomic(path, fsync, True)


# absolute target -> (its directory, its temporaries' paths up to the random part, the pid)
_PLACES: dict[str, tuple[str, str, int]] = {}


def _place(target: str) -> tuple[str, str]:
    """The directory of ``target`` and the start of its temporaries' paths
    (``DIR/.NAME.PID-HOST-``), kept for an absolute ``target``: the path functions that
    make them were a twentieth of a small save, cold at each call."""
    got = _PLACES.get(target)
    pid = os.getpid()
    if got is None or got[2] != pid:  # (a forked child writes under its own pid)
        directory = os.path.dirname(os.path.abspath(target))
        got = (directory, os.path.join(directory, f"{_temp_prefix(target)}{pid}-{_host_tag()}-"),
               pid)
        if os.path.isabs(target):  # (a relative one depends on the working directory)
            if len(_PLACES) >= 4096:
                _PLACES.clear()
            _PLACES[target] = got
    return got[0], got[1]


class _Atomic:
    """What :func:`atomic_temporary` returns. A class, not a generator under
    ``contextlib.contextmanager``: a save of a few tensors spent a sixth of its time in
    the two generators' machinery (and in ``contextlib``'s, cold at each call)."""

    __slots__ = ("directory", "fd", "fsync", "pair", "target", "tmp")

    def __init__(self, path: str | os.PathLike[str], fsync: bool, pair: bool):
        self.target = fspath(path, "path")
        self.fsync = fsync
        self.pair = pair

    def __enter__(self) -> Any:
        target = self.target
        old = _existing_target(target)
        directory, start = _place(target)
        self.directory = directory
        _remove_stale(directory)
        # (os.urandom(6).hex(): what secrets.token_hex(6) is)
        tmp = self.tmp = f"{start}{os.urandom(6).hex()}.tmp"
        try:
            fd = self.fd = os.open(tmp, _CREATE_FLAGS, 0o666)  # the umask applies
        except OSError as exc:  # name the target, not the temporary
            _name_target(exc, target, tmp)
            raise
        if old is not None:
            try:
                _keep_attributes(fd, old)
            except BaseException as exc:
                self._abandon(exc, closed=False)
                raise
        return (fd, tmp) if self.pair else fd

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        if exc is not None:
            self._abandon(exc, closed=False)
            return  # (the block's exception goes on, its OSError naming the target)
        try:
            try:
                if self.fsync:
                    _flush(self.fd)
            finally:
                os.close(self.fd)
            _existing_target(self.target)  # still not a FIFO or a device
            checkpoint()  # the last point where the old file can stay
            os.replace(self.tmp, self.target)
        except BaseException as err:
            self._abandon(err, closed=True)
            raise
        if self.fsync:
            try:
                _fsync_dir(self.directory)
            except BaseException as err:  # a signal or an I/O error, with the new file in place
                err.output_replaced = True  # type: ignore[attr-defined]  # read by the CLI
                raise

    def _abandon(self, exc: BaseException, *, closed: bool) -> None:
        """Close (unless ``closed``) and remove the temporary; an OSError names the target."""
        if not closed:
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
        if isinstance(exc, OSError):
            _name_target(exc, self.target, self.tmp)


# A temporary's open flags, once: asking for a flag the system lacks (O_BINARY off
# Windows) builds and drops an AttributeError, a few microseconds of every save.
_CREATE_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                 | getattr(os, "O_BINARY", 0))


def _keep_attributes(fd: int, old: os.stat_result) -> None:
    """Give the new file the replaced one's owner, group and permission bits (best effort)."""
    if not hasattr(os, "fchmod"):
        return
    if hasattr(os, "fchown") and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
        with contextlib.suppress(OSError):  # only root may give a file away; a group, maybe
            os.fchown(fd, old.st_uid, old.st_gid)
    os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)


def _fsync_dir(directory: str) -> None:
    try:
        dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # Windows cannot open directories; NTFS journals the rename itself
    try:
        _flush(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
