"""hurray_bridge.testing.check_consumer: the consumer side of the conformance kit.

A consumer's ``from_dlpack`` is handed the kit's producer in a child process: a
read-only versioned capsule over an mprotect'ed page (a write kills the child), and
writable pages for the deleter and ``copy=`` duties. The verdicts on the installed
libraries are pinned in :data:`EXPECTED`, with the reason for each one that is not a
pass; the hand-made consumers of ``tests/dlpack_consumers.py`` each break one duty.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from hurray_bridge.testing import CONSUMER_CHECKS, Report, check_consumer

np = pytest.importorskip("numpy", reason="numpy is not installed")

from tests.frameworks import need  # noqa: E402

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]
FAKES = "tests.dlpack_consumers"
NAMES = ["imports", "read_only", "deleter_once", "copy_true", "copy_false"]

# The verdicts on the installed consumers (numpy 2.4, torch 2.13 CPU, jax 0.10,
# apache-tvm-ffi, array-api-strict 2.6): every check not named here passes.
EXPECTED: dict[str, dict[str, tuple[str, str]]] = {
    "numpy:from_dlpack": {},
    # A true verdict: torch asks for DLPack 1.x, receives READ_ONLY and imports the
    # memory as an ordinary writable tensor (torch has no read-only tensors).
    "torch:from_dlpack": {"read_only": ("fail", r"killed by SIG(SEGV|BUS)")},
    # Legacy-only consumers (no max_version): READ_ONLY cannot reach them, and the kit's
    # read-only producer refuses their request, as a producer of read-only memory must.
    # jax/_src/dlpack.py hands copy to jaxlib (dlpack_managed_tensor_to_buffer) and then
    # drops it ("copy was already handled"); a CPU jaxlib 0.10.2 aliases 64-byte aligned
    # memory anyway (test_jax_ignores_copy_true_on_aligned_cpu_memory sees it without the kit).
    "jax.numpy:from_dlpack": {
        "read_only": ("skip", r"asks only for legacy capsules"),
        "copy_true": ("fail", r"shares the producer's memory"),
    },
    "tvm_ffi:from_dlpack": {
        "read_only": ("skip", r"asks only for legacy capsules"),
        "copy_true": ("skip", r"takes no copy="),
        "copy_false": ("skip", r"takes no copy="),
    },
    "array_api_strict:from_dlpack": {},
}


def _need(spec: str) -> None:
    need(spec.partition(":")[0].partition(".")[0])


@functools.cache
def _report(spec: str, write: str | None = None) -> Report:
    return check_consumer(spec, write=write)


def _verdicts(report: Report) -> dict[str, str]:
    return {r.name: r.status for r in report}


def test_consumer_check_names_are_stable() -> None:
    assert list(CONSUMER_CHECKS) == NAMES
    assert all(CONSUMER_CHECKS.values())


@pytest.mark.parametrize("spec", list(EXPECTED))
def test_installed_consumers_get_their_true_verdicts(spec: str) -> None:
    _need(spec)
    report = _report(spec)
    assert report.kind == "consumer"
    wrong = []
    for r in report:
        status, pattern = EXPECTED[spec].get(r.name, ("pass", ""))
        if r.status != status or not re.search(pattern, r.why):
            wrong.append(f"{r.name}: expected {status} /{pattern}/, got {r.status}: {r.why}")
    assert not wrong, "\n".join(wrong)


def test_torch_writes_read_only_memory_without_the_kit() -> None:
    """The torch verdict is true: a READ_ONLY capsule of a read-only NumPy array comes out
    as a writable tensor, and an in-place add changes the array."""
    need("torch")
    import torch

    import hurray_bridge as hb

    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    torch.from_dlpack(hb.asarray(a)).add_(1)
    assert a.tolist() == [1.0] * 4


def test_jax_ignores_copy_true_on_aligned_cpu_memory() -> None:
    """The JAX copy_true verdict is true: ``copy=True`` on 64-byte aligned host memory
    gives an array over that same memory, which sees a later write to it."""
    need("jax")
    import jax.numpy as jnp

    from hurray_bridge._memory import aligned_zeros

    a = aligned_zeros((4,), np.float32)
    x = jnp.from_dlpack(a, copy=True)
    a[0] = 5.0
    assert float(x[0]) == 5.0


def test_numpy_notes_say_what_was_observed() -> None:
    report = _report("numpy:from_dlpack")
    assert "max_version=(1, 0)" in report.result("imports").why
    assert "ValueError" in report.result("read_only").why  # imported read-only, write refused
    assert "forwarded copy=True" in report.result("copy_true").why
    assert "called once" in report.result("deleter_once").why


def test_ignoring_read_only_fails_and_the_rest_still_runs() -> None:
    """The PaddlePaddle stand-in: the write kills its child; a fresh child runs the rest."""
    report = _report(f"{FAKES}:ignores_read_only")
    assert _verdicts(report) == {"imports": "pass", "read_only": "fail", "deleter_once": "pass",
                                 "copy_true": "skip", "copy_false": "skip"}
    why = report.result("read_only").why
    assert re.search(r"killed by SIG(SEGV|BUS)", why) and "READ_ONLY" in why, why


def test_ignoring_copy_true_fails() -> None:
    report = _report(f"{FAKES}:ignores_copy")
    assert report.result("copy_true").status == "fail"
    assert "shares the producer's memory" in report.result("copy_true").why
    assert report.result("copy_false").status == "pass"


def test_a_consumer_that_always_copies() -> None:
    report = _report(f"{FAKES}:copies")
    v = _verdicts(report)
    assert (v["read_only"], v["copy_true"], v["deleter_once"]) == ("pass", "pass", "pass"), report
    assert "copy" in report.result("read_only").why
    assert v["copy_false"] == "fail"
    assert "a copy" in report.result("copy_false").why


@pytest.mark.parametrize("fake, message", [
    ("never_releases", "not called"),
    ("releases_twice", "2 times"),
    ("no_deleter_rename", "used_dltensor_versioned"),
])
def test_deleter_duties(fake: str, message: str) -> None:
    result = check_consumer(f"{FAKES}:{fake}", checks="deleter_once")[0]
    assert result.status == "fail" and message in result.why, result


def test_a_consumer_that_crashes_fails_every_check_it_reaches() -> None:
    report = check_consumer(f"{FAKES}:crashes", checks=["imports", "read_only"])
    assert _verdicts(report) == {"imports": "fail", "read_only": "fail"}
    assert "killed by SIGSEGV" in report.result("imports").why


def test_a_hanging_consumer_is_stopped() -> None:
    (result,) = check_consumer(f"{FAKES}:hangs", checks=["imports"], timeout=3)
    assert result.status == "fail" and "did not finish within 3 s" in result.why, result


def test_a_named_write() -> None:
    good = _report("numpy:from_dlpack", f"{FAKES}:write_first").result("read_only")
    assert good.status == "pass" and "write_first" in good.why, good
    bad = check_consumer(f"{FAKES}:ignores_read_only", write=f"{FAKES}:write_first",
                         checks="read_only")[0]
    assert bad.status == "fail" and "write_first" in bad.why, bad


def test_a_callable_is_named_by_where_it_is_imported_from() -> None:
    report = check_consumer(np.from_dlpack, checks="imports")
    assert report.producer == "numpy:from_dlpack" and report.ok
    with pytest.raises(ValueError, match="importable"):
        check_consumer(lambda x: x)


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "is not MODULE:FUNCTION"),
    ("nosuchmodule_xyz:f", "cannot import 'nosuchmodule_xyz'"),
    (f"{FAKES}:nope", "has no attribute 'nope'"),
    (f"{FAKES}:_KEPT", "not a callable"),
])
def test_bad_consumer_names_raise_value_error(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_consumer(spec)


def test_unknown_check_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown check"):
        check_consumer("numpy:from_dlpack", checks=["factory"])


# ----------------------------------------------------------------------------------- CLI

def _hurray(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hurray_bridge", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_cli_check_consumer() -> None:
    out = _hurray("check", "--consumer", "numpy:from_dlpack")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "DLPack consumer checks: numpy:from_dlpack"
    assert lines[-1] == f"{len(NAMES)} checks: {len(NAMES)} passed, 0 failed, 0 skipped"
    out = _hurray("check", "--consumer", f"{FAKES}:ignores_read_only", "--only", "read_only")
    assert out.returncode == 1, out.stdout + out.stderr
    assert re.search(r"^read_only\s+FAIL\s+wrote to read-only memory", out.stdout, re.M)


def test_cli_check_producer_and_consumer_together() -> None:
    out = _hurray("check", "tests.broken_producers:HandMade.factory", "--consumer",
                  f"{FAKES}:copies", "--only", "copy_true", "copy_false")
    assert out.returncode == 1, out.stdout + out.stderr  # the consumer's copy_false fails
    assert "DLPack producer checks:" in out.stdout and "DLPack consumer checks:" in out.stdout
    assert out.stdout.count("2 checks:") == 2


@pytest.mark.parametrize("args, message", [
    (["--consumer", "nosuchmodule_xyz:f"], "cannot import 'nosuchmodule_xyz'"),
    (["--consumer", "numpy:from_dlpack", "--only", "nope"], "unknown check(s) nope"),
    ([], "MODULE:FACTORY, --consumer or both"),
])
def test_cli_check_consumer_bad_input_exits_2(args: list[str], message: str) -> None:
    out = _hurray("check", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("hurray: error: ") and message in out.stderr, out.stderr
    assert out.stdout == ""


# ------------------------------------------------------------------------- pytest plugin

def _plugin_args() -> list[str]:
    registered = any(ep.value == "hurray_bridge._pytest_plugin"
                     for ep in entry_points(group="pytest11"))
    return [] if registered else ["-p", "hurray_bridge._pytest_plugin"]


@pytest.fixture
def fakes(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(dlpack_consumers=(REPO / "tests" / "dlpack_consumers.py").read_text())
    pytester.syspathinsert()
    return pytester


def test_plugin_one_test_per_consumer_check(fakes: pytest.Pytester) -> None:
    result = fakes.runpytest("--hurray-consumer", "numpy:from_dlpack", "-v", *_plugin_args())
    result.assert_outcomes(passed=len(NAMES))
    result.stdout.fnmatch_lines([f"numpy:from_dlpack::{n} PASSED*" for n in NAMES])


def test_plugin_consumer_failure_and_skips(fakes: pytest.Pytester) -> None:
    result = fakes.runpytest("--hurray-consumer", "dlpack_consumers:ignores_read_only", "-rs",
                             *_plugin_args())
    result.assert_outcomes(passed=2, failed=1, skipped=2)
    result.stdout.fnmatch_lines([
        "*hurray consumer check 'read_only' failed for dlpack_consumers:ignores_read_only:",
        "*wrote to read-only memory*",
        "*takes no copy=*",
    ], consecutive=False)
    result = fakes.runpytest("--hurray-consumer", "dlpack_consumers:ignores_read_only",
                             "-k", "copy_true", *_plugin_args())
    result.assert_outcomes(skipped=1, deselected=len(NAMES) - 1)


def test_plugin_bad_consumer_is_a_usage_error(fakes: pytest.Pytester) -> None:
    result = fakes.runpytest("--hurray-consumer", "nosuchmodule_xyz:f", *_plugin_args())
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot import 'nosuchmodule_xyz'" in result.stderr.str()
