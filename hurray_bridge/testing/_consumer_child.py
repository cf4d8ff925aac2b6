"""The child process of the consumer checks: it imports the consumer under test, hands
its ``from_dlpack`` the kit's producer, and reports what it observed.

Run as ``python -m hurray_bridge.testing._consumer_child ARGS`` (``ARGS``: JSON with the
consumer's and the write's ``MODULE:ATTR`` names, the checks to run and the parent's
``sys.path``). Every report is one line of JSON on stdout after :data:`TAG`; a step
that may crash the process is announced before it starts, so that the parent can say
where the child died. The verdicts are the parent's (:mod:`._consumer`): the child only
observes.

The producer exports one float32 tensor of shape (2, 3) from a page of its own
(``mmap``), through :func:`hurray_bridge._capsule.make_capsule`, the one place that
builds capsules. For the read-only duty the page is ``mprotect``'ed ``PROT_READ`` and
the capsule carries ``READ_ONLY``: a consumer that writes anyway kills the process with
SIGSEGV (SIGBUS on some kernels), which is the observation.
"""

from __future__ import annotations

import ctypes
import gc
import json
import mmap
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from .._capsule import capsule_name, make_capsule
from .._dlpack import FLAG_IS_COPIED, FLAG_READ_ONLY
from .._memory import alloc_aligned
from ..dtypes import dtype_from_name
from ..tensor import CPU, canonical_bytes, from_dlpack
from ._raw import Watch, peek
from ._report import short

TAG = "hurray-kit "
SHAPE = (2, 3)
STRIDES = (3, 1)
_FLOAT32 = dtype_from_name("float32")
VALUES = struct.pack("=6f", *range(6))
NBYTES = len(VALUES)
RELEASE_WAIT_S = 2.0  # how long a release may lag the array's death (collections included)


def emit(**event: Any) -> None:
    sys.stdout.write(TAG + json.dumps(event) + "\n")
    sys.stdout.flush()


class Page:
    """One page of anonymous memory holding :data:`VALUES`; :meth:`protect` makes it
    read-only for the whole process, so that any write to it faults."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._mmap = libc.mmap
        self._mmap.restype = ctypes.c_void_p
        self._mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                               ctypes.c_int, ctypes.c_long]
        self._mprotect = libc.mprotect
        self._mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.size = mmap.PAGESIZE
        addr = self._mmap(None, self.size, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap of one anonymous page failed")
        self.address: int = addr
        ctypes.memmove(addr, VALUES, NBYTES)

    def protect(self) -> None:
        if self._mprotect(self.address, self.size, mmap.PROT_READ) != 0:
            raise OSError(ctypes.get_errno(), "mprotect(PROT_READ) failed")

    def read(self) -> bytes:
        return ctypes.string_at(self.address, NBYTES)

    def holds(self, pointer: int | None) -> bool | None:
        if pointer is None:
            return None
        return self.address <= pointer < self.address + self.size


class Producer:
    """A DLPack-only producer over a :class:`Page`: what a conforming producer of read-only
    (or writable) host memory does, with every request and deleter call recorded."""

    def __init__(self, page: Page, readonly: bool) -> None:
        self.page = page
        self.readonly = readonly
        self.requests: list[dict[str, Any]] = []
        self.capsules: list[object] = []
        self.watches: list[Watch] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return CPU

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> object:
        self.requests.append({"max_version": None if max_version is None else
                              [int(v) for v in max_version], "copy": copy})
        versioned = max_version is not None and int(max_version[0]) >= 1
        if dl_device is not None and tuple(dl_device) != CPU:
            raise BufferError(f"the kit's producer lives on the CPU, not {tuple(dl_device)}")
        if self.readonly and not versioned:
            raise BufferError("read-only memory cannot travel in a legacy capsule (it has no "
                              "READ_ONLY flag): ask with max_version=(1, 0) or later")
        data, flags = self.page.address, 0
        owner: object = self
        if copy:
            alloc = alloc_aligned(NBYTES)
            assert alloc is not None
            ctypes.memmove(alloc.ptr, self.page.address, NBYTES)
            data, owner, flags = alloc.ptr, alloc, FLAG_IS_COPIED
        elif self.readonly:
            flags = FLAG_READ_ONLY
        code, bits = _FLOAT32.dlpack  # type: ignore[misc]
        cap = make_capsule(data=data, shape=SHAPE, strides=STRIDES, code=code, bits=bits,
                           device_type=CPU.type, device_id=CPU.id, flags=flags, owner=owner,
                           versioned=versioned)
        self.watches.append(Watch(peek(cap)))
        self.capsules.append(cap)
        return cap

    @property
    def calls(self) -> int:
        return sum(w.calls for w in self.watches)

    def names(self) -> list[str | None]:
        """The names of the capsules handed out, and let them go (they were kept only to
        read these)."""
        names = [capsule_name(c) for c in self.capsules]
        self.capsules.clear()
        return names


def _error(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "text": short(exc, 300)}


def _pointer(x: Any) -> int | None:
    """Where the consumer's array lives, read through its own ``__dlpack__``."""
    try:
        return from_dlpack(x).data_ptr
    except Exception:
        return None


def _default_write(x: Any) -> None:
    x[...] = 7.0


class Child:
    def __init__(self, consumer: Callable[..., Any], write: Callable[[Any], None]) -> None:
        self.consumer = consumer
        self.write = write

    def step(self, check: str, step: str) -> None:
        emit(check=check, step=step)

    def _shares(self, x: Any, page: Page) -> tuple[bool | None, str]:
        """Whether ``x`` is the page's memory: by its own export's address, else by a write."""
        found = page.holds(_pointer(x))
        if found is not None:
            return found, "address"
        try:
            self.write(x)
        except Exception as exc:
            return None, short(exc, 120)
        return page.read() != VALUES, "write"

    def imports(self) -> dict[str, Any]:
        p = Producer(Page(), readonly=False)
        self.step("imports", "import")
        try:
            x = self.consumer(p)
        except Exception as exc:
            return {"error": _error(exc), "requests": p.requests}
        try:
            values = canonical_bytes(from_dlpack(x)) == VALUES
        except Exception:
            values = None
        return {"requests": p.requests, "values": values, "type": _type_name(x)}

    def read_only(self) -> dict[str, Any]:
        obs: dict[str, Any] = {}
        page = Page()
        self.step("read_only", "writable_import")
        try:
            x = self.consumer(Producer(page, readonly=False))
        except Exception as exc:
            return {"writable_error": _error(exc)}
        self.step("read_only", "writable_write")
        try:
            self.write(x)
            obs["writable_changed"] = page.read() != VALUES
        except Exception as exc:
            obs["writable_write_error"] = _error(exc)
        del x
        page = Page()
        page.protect()
        p = Producer(page, readonly=True)
        self.step("read_only", "import")
        try:
            x = self.consumer(p)
        except Exception as exc:
            return {**obs, "import_error": _error(exc), "requests": p.requests}
        obs["requests"] = p.requests
        self.step("read_only", "write")
        try:
            self.write(x)
        except Exception as exc:
            obs["write_error"] = _error(exc)
        obs["changed"] = page.read() != VALUES
        return obs

    def deleter_once(self) -> dict[str, Any]:
        page = Page()
        p = Producer(page, readonly=False)
        self.step("deleter_once", "import")
        try:
            x = self.consumer(p)
        except Exception as exc:
            return {"error": _error(exc)}
        obs: dict[str, Any] = {"names": p.names(), "calls_alive": p.calls,
                               "shares": self._shares(x, page)[0]}
        self.step("deleter_once", "release")
        del x
        end = time.monotonic() + RELEASE_WAIT_S
        while True:
            gc.collect()
            if p.calls or time.monotonic() > end:
                break
            time.sleep(0.02)
        time.sleep(0.02)  # a second call, if one comes, comes now
        gc.collect()
        obs["calls"] = p.calls
        return obs

    def _copy(self, check: str, copy: bool) -> dict[str, Any]:
        page = Page()
        p = Producer(page, readonly=False)
        self.step(check, "import")
        try:
            x = self.consumer(p, copy=copy)
        except Exception as exc:
            return {"error": _error(exc), "requests": p.requests}
        shares, how = self._shares(x, page)
        return {"requests": p.requests, "shares": shares, "how": how}

    def copy_true(self) -> dict[str, Any]:
        return self._copy("copy_true", True)

    def copy_false(self) -> dict[str, Any]:
        return self._copy("copy_false", False)


def _type_name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__qualname__}"


def main(argv: list[str]) -> int:
    from ._producer import load_factory

    args = json.loads(argv[0])
    sys.path[:] = args["path"]
    try:  # the crash the read-only check expects must not leave a core file behind
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, ValueError, OSError):
        pass
    try:
        consumer = load_factory(args["consumer"], what="consumer")
        write = load_factory(args["write"], what="write") if args["write"] else _default_write
    except ValueError as exc:
        emit(error=str(exc))
        return 3
    emit(loaded=True)
    child = Child(consumer, write)
    for name in args["checks"]:
        obs = getattr(child, name)()
        emit(check=name, obs=obs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
