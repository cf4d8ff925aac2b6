"""Suite-wide fixtures."""

from __future__ import annotations

import gc
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

import hurray_bridge as hb

from .frameworks import BACKENDS, Backend, need
from .frameworks import backend as _backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each framework in turn (numpy, torch, jax, arrow, tensorflow; cupy where installed);
    a framework that is not installed skips its case with the reason "<module> is not
    installed"."""
    return _backend(request.param)


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """``gc.collect()`` walks only the objects made during the test.

    A full collection walks every object the session holds (torch, JAX, hypothesis...):
    0.3 s each, where a lifetime check collects several times per case. Frozen objects
    are roots to the collector, so everything the test makes is still collected when it
    becomes garbage; only garbage from before the test waits for the next collection.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _peak_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


@pytest.fixture
def peak_growth() -> Callable[[Callable[[], object]], int]:
    """``peak_growth(fn)``: by how many bytes calling ``fn`` raised this process's peak
    resident set (``VmHWM``, reset to the resident set first). Skips where Linux's
    ``/proc/self/clear_refs`` is missing or refuses the reset."""
    if not sys.platform.startswith("linux"):
        pytest.skip("VmHWM and /proc/self/clear_refs are Linux's")

    def growth(fn: Callable[[], object]) -> int:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # resets the peak to the resident set now
        except OSError:
            pytest.skip("cannot reset VmHWM here")
        before = _peak_kib()
        fn()
        return (_peak_kib() - before) << 10

    return growth


@pytest.fixture
def dead_pid() -> int:
    """A process id that no process has now, nor will before the test ends: the writer of a
    stale temporary.

    One past the kernel's largest pid is never given out. (The pid of a child that has
    exited can be: with pid_max at 32768 and the suite starting child processes on every
    worker, one came back within a test, and the save rightly kept the temporary of what
    was then a live process.)
    """
    try:
        with open("/proc/sys/kernel/pid_max", encoding="ascii") as f:
            return int(f.read()) + 1
    except OSError:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)
        return int(gone.stdout)  # a process that has exited


@pytest.fixture(scope="session")
def c_build(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``make -C c all test example`` (library, shared library, tool, the C test driver and
    the example), built once for the session (for each xdist worker that asks)."""
    from .c.test_c_library import CC, MAKE, _make

    if MAKE is None or CC is None:
        pytest.skip("no C compiler or make to build the C library with")
    build = tmp_path_factory.mktemp("c-build")
    _make(build, "all", "test", "example")
    return build


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # A test that reaches a framework this install lacks (torch, JAX, ml_dtypes...) is a
    # skip that names it, not a failure. Installed after all: the error is the finding.
    try:
        return (yield)
    except hb.BackendNotAvailableError as exc:
        need(exc.framework)
        raise
