"""hurray_bridge.testing: the producer checks on every CPU framework, the broken producers,
assert_round_trip, the pytest plugin (pytester) and ``hurray check`` (subprocess).

Our own adapters and hb.Tensor must pass their own kit. Where a framework
deviates from the standard the kit must say so ("fail", or "skip" when it
cannot observe), and every such deviation is listed, with its upstream
reason, in the one table :data:`DEVIATIONS`.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
import hurray_bridge.testing as kit
import hurray_bridge.testing._round_trip as round_trip
from hurray_bridge.testing import CHECKS, CheckResult, Report, assert_round_trip, check_producer

np = pytest.importorskip("numpy", reason="numpy is not installed")

from tests import broken_producers  # noqa: E402 - NumPy arrays underneath
from tests.broken_producers import BROKEN, HandMade, IgnoresCopy  # noqa: E402
from tests.dlpack_producers import DLPackOnly  # noqa: E402

pytest_plugins = ["pytester"]
# The kit collects garbage before it calls a deleter missing; a broken producer makes it
# do so in nearly every check: let it walk only what this file's tests make.
pytestmark = pytest.mark.usefixtures("frozen_heap")

REPO = Path(__file__).resolve().parents[3]

CHECK_NAMES = [
    "factory", "versioned_capsule", "legacy_capsule", "rename_on_consume", "deleter_once",
    "unconsumed_capsule", "dlpack_device", "shape_and_dtype", "strides", "empty_tensors",
    "rank_0", "rank_64", "read_only_flag", "copy_true", "copy_false", "dl_device",
    "stream_none",
]


# ------------------------------------------------------------------- framework factories

def _np(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    nd = hb.get_adapter("numpy").native_dtype(hb.dtypes.dtype_from_name(dtype))
    return np.arange(math.prod(shape)).astype(nd).reshape(shape)


def _np_readonly(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    a = _np(shape, dtype)
    a.flags.writeable = False
    return a


def _torch(shape: tuple[int, ...], dtype: str) -> Any:
    import torch

    native = getattr(torch, hb.dtypes.dtype_from_name(dtype).torch)
    return torch.arange(math.prod(shape)).to(native).reshape(shape)


def _jax(shape: tuple[int, ...], dtype: str) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(_np(shape, dtype))


def _arrow_tensor(shape: tuple[int, ...], dtype: str) -> Any:
    import pyarrow as pa

    return pa.Tensor.from_numpy(_np(shape, dtype))


def _arrow_array(shape: tuple[int, ...], dtype: str) -> Any:
    import pyarrow as pa

    if len(shape) != 1:
        raise NotImplementedError("pyarrow.Array is one-dimensional")
    return pa.array(_np(shape, dtype))


def _hb(shape: tuple[int, ...], dtype: str) -> hb.Tensor:
    return hb.asarray(_np(shape, dtype))


def _hb_readonly(shape: tuple[int, ...], dtype: str) -> hb.Tensor:
    return hb.asarray(_np_readonly(shape, dtype))


FACTORIES: dict[str, Callable[[tuple[int, ...], str], Any]] = {
    "numpy": _np,
    "numpy_readonly": _np_readonly,
    "torch": _torch,
    "jax": _jax,
    "arrow_tensor": _arrow_tensor,
    "arrow_array": _arrow_array,
    "hb": _hb,
    "hb_readonly": _hb_readonly,
}
_NEEDS = {"torch": "torch", "jax": "jax", "arrow_tensor": "pyarrow", "arrow_array": "pyarrow"}

# Where a producer deviates from the standard (or the kit cannot observe it), with the
# upstream reason. Every other (producer, check) must pass. Versions: torch 2.13 CPU,
# jax/jaxlib 0.10.2 CPU, pyarrow 26.0.1, NumPy 2.4.
DEVIATIONS: dict[tuple[str, str], tuple[str, str]] = {
    ("numpy_readonly", "legacy_capsule"): (
        "skip", "NumPy refuses a legacy export of a read-only array with BufferError, since a "
                "legacy capsule cannot say read-only (numpy#20742; allowed since 2024.12)"),
    ("torch", "copy_true"): (
        "fail", "torch's DLPack export always writes flags = 0: copy=True copies but never sets "
                "IS_COPIED (aten/src/ATen/DLConvertor.cpp)"),
    ("torch", "dl_device"): (
        "fail", "torch raises ValueError for copy=False across devices (pytorch#194267, open) "
                "and, on a CPU-only build, NotImplementedError from aten::empty_strided for "
                "copy=None, instead of BufferError"),
    ("jax", "versioned_capsule"): (
        "fail", "JAX accepts max_version but always answers a legacy 'dltensor' capsule "
                "(jax-ml/jax#20198; jax/_src/dlpack.py)"),
    ("jax", "read_only_flag"): (
        "fail", "JAX arrays are immutable, but a legacy capsule has no READ_ONLY flag, so "
                "consumers get writable memory (note in jax/_src/dlpack.py)"),
    ("jax", "copy_true"): (
        "skip", "a legacy capsule cannot carry IS_COPIED; the kit sees the data move and skips"),
    ("jax", "unconsumed_capsule"): (
        "skip", "jaxlib's capsule destructor calls DLPackTensorDeleter directly, not through "
                "the struct's deleter field, and the capsule does not hold the jax.Array, so "
                "the release is not observable (xla/python/dlpack.cc)"),
    ("jax", "dl_device"): (
        "fail", "a CPU-only jaxlib raises RuntimeError('Unknown backend cuda') for "
                "dl_device=(2, 0) instead of BufferError"),
    ("arrow_array", "rank_0"): ("skip", "pyarrow.Array is one-dimensional"),
    ("arrow_array", "rank_64"): ("skip", "pyarrow.Array is one-dimensional"),
    ("arrow_array", "read_only_flag"): (
        "fail", "pyarrow answers a legacy request (no max_version) for its immutable memory "
                "with a 'dltensor' capsule of that memory, which cannot say read-only; it only "
                "warns DeprecationWarning (pyarrow/array.pxi)"),
    ("hb_readonly", "legacy_capsule"): (
        "skip", "hb.Tensor refuses a legacy export of read-only memory with BufferError, as "
                "NumPy does (docs/spec/buffer-protocol.md §6.1)"),
}


def _factory(name: str) -> Callable[[tuple[int, ...], str], Any]:
    if name in _NEEDS:
        pytest.importorskip(_NEEDS[name])
    return FACTORIES[name]


def _mismatches(producer: str, report: Report) -> list[str]:
    out = []
    for r in report:
        want = DEVIATIONS.get((producer, r.name), ("pass", ""))[0]
        if r.status != want:
            out.append(f"{r.name}: expected {want}, got {r.status}: {r.why}")
    return out


def test_check_names_are_stable() -> None:
    """The names are an interface: test ids, --only, docs/testing.md."""
    assert list(CHECKS) == CHECK_NAMES
    assert all(CHECKS.values())


@pytest.mark.parametrize("producer", FACTORIES)
def test_framework_producers_pass_their_kit(producer: str) -> None:
    report = check_producer(_factory(producer), label=producer)
    assert [r.name for r in report] == CHECK_NAMES
    bad = _mismatches(producer, report)
    assert not bad, "\n".join(bad) + "\n\n" + str(report)


def test_deviation_table_is_well_formed() -> None:
    """Each row names a known producer, a fail or skip, and a reason. (A deviation that
    disappears upstream makes test_framework_producers_pass_their_kit fail: "expected fail,
    got pass", so the row must go.)"""
    producers = {p for p, _c in DEVIATIONS}
    assert producers <= set(FACTORIES)
    assert all(status in ("fail", "skip") and why for status, why in DEVIATIONS.values())


SWEEP = ["bool8", "int8", "uint16", "int64", "float16", "float64", "complex128"]


@pytest.mark.parametrize("dtype", SWEEP)
@pytest.mark.parametrize("producer", ["numpy", "torch", "hb"])
def test_dtype_sweep(producer: str, dtype: str) -> None:
    report = check_producer(_factory(producer), dtype=dtype, label=producer)
    assert report.dtype == dtype
    bad = _mismatches(producer, report)
    assert not bad, "\n".join(bad) + "\n\n" + str(report)


# ---------------------------------------------------------------------- broken producers

@pytest.mark.parametrize("cls", BROKEN, ids=lambda c: c.__name__)
def test_broken_producers_fail_exactly_their_checks(cls: type[HandMade]) -> None:
    report = check_producer(cls.factory, label=cls.__name__)
    assert {r.name for r in report.failed} == BROKEN[cls], str(report)
    if cls is broken_producers.WrongCapsuleName:
        # nothing else can be consumed: the dependent checks say so instead of failing
        assert "dltensor_version'" in report.result("versioned_capsule").why
        assert {r.name for r in report.passed} == {"factory", "legacy_capsule"}
        assert all("needs a consumable capsule" in r.why for r in report.skipped)
    else:
        # Read-only memory refuses a legacy request (it could not say read-only): a skip.
        ro = not cls.factory((2, 3), "float32").array.flags.writeable
        refused = ["legacy_capsule"] if ro and cls is not broken_producers.LegacyReadOnly else []
        assert [r.name for r in report.skipped] == refused, str(report)


def test_broken_reasons_name_the_defect() -> None:
    why = {c.__name__: {r.name: r.why for r in check_producer(c.factory).failed} for c in BROKEN}
    assert "no copy was made" in why["IgnoresCopy"]["copy_true"]
    assert "IS_COPIED is not set" in why["IgnoresCopy"]["copy_true"]
    assert "garbage strides" in why["GarbageEmptyStrides"]["empty_tensors"]
    assert "(0,)" in why["GarbageEmptyStrides"]["empty_tensors"]
    assert "cuda:0" in why["DeviceLie"]["dlpack_device"]
    assert "leak" in why["LeakyDestructor"]["unconsumed_capsule"]
    assert "does not release it" in why["LeakyDeleter"]["deleter_once"]
    assert "READ_ONLY is clear" in why["DropsReadOnly"]["read_only_flag"]
    assert "legacy request" in why["LegacyReadOnly"]["read_only_flag"]


def test_read_only_memory_in_a_legacy_capsule_fails_the_read_only_check() -> None:
    """What hb.Tensor did before its legacy export refused read-only memory: the same
    memory, READ_ONLY in the versioned capsule, none in the legacy one."""
    from hurray_bridge.tensor import for_immutable_consumer

    def old_hb(shape: tuple[int, ...], dtype: str) -> Any:
        return for_immutable_consumer(_hb_readonly(shape, dtype))  # legacy export allowed

    report = check_producer(old_hb, readonly=True)
    assert [r.name for r in report.failed] == ["read_only_flag"], str(report)
    why = report.result("read_only_flag").why
    assert "legacy request" in why and "write access" in why and "BufferError" in why
    # Today's hb.Tensor refuses it: the check passes and says so.
    ok = check_producer(_hb_readonly, checks=["read_only_flag", "legacy_capsule"])
    assert ok.result("read_only_flag").status == "pass", str(ok)
    assert "legacy request refused" in ok.result("read_only_flag").why
    assert ok.result("legacy_capsule").status == "skip"


def test_a_legacy_private_copy_of_read_only_memory_passes() -> None:
    class CopiesForLegacy(broken_producers.ReadOnlyHandMade):
        def __dlpack__(self, **kw: Any) -> object:
            if kw.get("max_version") is None:
                kw["copy"] = True  # a private copy for a consumer that cannot be told
            return super().__dlpack__(**kw)

    report = check_producer(CopiesForLegacy.factory, checks=["read_only_flag"])
    assert report.ok, str(report)
    assert "private copy" in report.result("read_only_flag").why


def test_readonly_override() -> None:
    """readonly= is what the producer claims when the object cannot say."""
    class Opaque:  # forwards the protocol only: no flags, no readonly attribute
        def __init__(self, a: np.ndarray) -> None:
            self._a = a

        def __dlpack__(self, **kw: Any) -> object:
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self) -> tuple[int, int]:
            return self._a.__dlpack_device__()

    def make(shape: tuple[int, ...], dtype: str) -> Opaque:
        return Opaque(_np(shape, dtype))

    assert check_producer(make, checks=["read_only_flag"])[0].status == "skip"
    assert check_producer(make, readonly=False, checks=["read_only_flag"])[0].status == "pass"
    r = check_producer(make, readonly=True, checks=["read_only_flag"])[0]
    assert r.status == "fail" and "READ_ONLY is clear" in r.why


# ------------------------------------------------------------------------ factory forms

def test_fixed_object_factory() -> None:
    report = check_producer(lambda: np.arange(6, dtype=np.float32))
    assert report.result("factory").why.startswith("factory() making a fixed object")
    assert {r.name for r in report.skipped} == {"empty_tensors", "rank_0", "rank_64"}
    assert all("takes no (shape, dtype_name)" in r.why for r in report.skipped)
    assert report.ok


def test_one_shared_object_is_checked_by_call_count() -> None:
    x = np.arange(6, dtype=np.float32)
    report = check_producer(lambda: x)
    assert report.ok, str(report)
    assert "only the call count" in report.result("deleter_once").why


def test_factory_without_visible_signature_is_tried_with_shape() -> None:
    report = check_producer(np.zeros)  # a builtin: inspect.signature cannot read it
    assert report.result("factory").why.startswith("factory(shape, dtype_name)"), str(report)
    assert report.ok, str(report)


def test_factory_falls_back_to_one_dimensional() -> None:
    report = check_producer(_factory("arrow_array"), checks=["factory"])
    assert "base shape (6,)" in report[0].why and "cannot make (2, 3)" in report[0].why


def test_broken_factory_fails_once_and_skips_the_rest() -> None:
    def make(shape: tuple[int, ...], dtype: str) -> Any:
        raise RuntimeError("out of widgets")

    report = check_producer(make)
    assert [r.name for r in report.failed] == ["factory"]
    assert "out of widgets" in report.failed[0].why
    assert len(report.skipped) == len(CHECKS) - 1


def test_object_without_dlpack_fails_factory() -> None:
    report = check_producer(lambda shape, dtype: [1, 2, 3])
    assert "has no __dlpack__" in report.result("factory").why
    assert report.result("factory").status == "fail"


def _docs_factory() -> Callable[[tuple[int, ...], str], Any]:
    """The factory of docs/testing.md §1, with mylib.Array standing for NumPy itself."""
    text = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert "def make_tensor(shape, dtype_name):" in code
    code = code.replace("import mylib\n", "").replace("mylib.Array(", "(")
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/testing.md", "exec"), scope)  # our own documentation
    factory: Callable[[tuple[int, ...], str], Any] = scope["make_tensor"]
    return factory


@pytest.mark.parametrize("dtype", ["bool", "bool8", "int8", "uint64", "float16", "complex64"])
def test_docs_numpy_factory_passes_for_every_byte_dtype(dtype: str) -> None:
    # bool: the 1-bit type cannot travel through DLPack; the capsules are checked for
    # bool8, what the factory's library (NumPy's bool) exports. bool8: NumPy 2 removed
    # that alias, so the factory must not pass the name to NumPy as it is.
    report = check_producer(_docs_factory(), dtype=dtype)
    assert report.dtype == dtype
    assert report.ok, str(report)
    if dtype == "bool":
        assert "bool8" in report.result("factory").why
    assert not report.skipped, str(report)


def test_numpy_dtype_helper() -> None:
    assert kit.numpy_dtype("bool") == np.bool_ == kit.numpy_dtype("bool8")
    assert kit.numpy_dtype("float32") == np.float32
    assert kit.numpy_dtype("bfloat16").name == "bfloat16"  # ml_dtypes
    with pytest.raises(hb.UnsupportedError, match="float99"):
        kit.numpy_dtype("float99")


def test_unknown_dtype_and_check_are_refused() -> None:
    with pytest.raises(hb.UnsupportedError, match="float99"):
        check_producer(_np, dtype="float99")
    with pytest.raises(ValueError, match="'nope'"):
        check_producer(_np, checks=["nope"])


# ------------------------------------------------------------------------------ Report

def test_report_api_and_table() -> None:
    report = check_producer(IgnoresCopy.factory, label="x:y", checks=["copy_false", "copy_true"])
    assert [r.name for r in report] == ["copy_true", "copy_false"]  # documented order
    assert isinstance(report[0], CheckResult) and report[0].status == "fail"
    assert report.failed == [report[0]] and report.passed == [report[1]]
    assert not report.ok and report.result("copy_false").status == "pass"
    text = str(report)
    assert text.splitlines()[0] == "DLPack producer checks: x:y (float32)"
    assert re.search(r"^copy_true\s+FAIL\s+copy=True shares", text, re.M)
    assert text.rstrip().endswith("2 checks: 1 passed, 1 failed, 0 skipped")
    assert all(len(line) <= 100 for line in text.splitlines())
    with pytest.raises(AssertionError, match=r"1 DLPack producer check\(s\) failed for x:y"):
        report.raise_if_failed()
    check_producer(HandMade.factory).raise_if_failed()
    with pytest.raises(KeyError):
        report.result("factory")


def test_importing_the_kit_loads_no_framework() -> None:
    code = ("import sys, hurray_bridge.testing, hurray_bridge._pytest_plugin\n"
            "print([m for m in ('numpy', 'torch', 'jax', 'pyarrow', 'cupy', 'ml_dtypes') "
            "if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------- assert_round_trip

def _aligned(shape: tuple[int, ...], dtype: Any = np.float32, offset: int = 0) -> np.ndarray:
    """Data on a 64-byte boundary plus ``offset`` bytes (JAX aliases only aligned memory)."""
    n = math.prod(shape) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    a = raw[start:start + n].view(dtype).reshape(shape)
    a[...] = np.arange(math.prod(shape)).reshape(shape)
    return a


def _need(*frameworks: str) -> None:
    for f in frameworks:
        if f != "hb":
            pytest.importorskip({"arrow": "pyarrow"}.get(f, f))


@pytest.mark.parametrize("via", [("torch",), ("jax",), ("arrow",), ("hb",),
                                 ("torch", "jax", "arrow", "hb")], ids="-".join)
@pytest.mark.parametrize("zero_copy", [True, None, False])
def test_round_trip_numpy(via: tuple[str, ...], zero_copy: bool | None) -> None:
    _need(*via)
    a = _aligned((2, 3))
    out = assert_round_trip(a, via=via, zero_copy=zero_copy)
    assert isinstance(out, np.ndarray) and out.tobytes() == a.tobytes()
    same = out.__array_interface__["data"][0] == a.ctypes.data
    assert same is (zero_copy is not False)


@pytest.mark.parametrize("shape", [(0,), (3, 0, 5), (), (1,) * 62 + (2, 3)],
                         ids=["0", "3x0x5", "rank0", "rank64"])
def test_round_trip_shapes(shape: tuple[int, ...]) -> None:
    _need("torch", "jax")
    assert_round_trip(_aligned(shape), via=("torch", "jax"), zero_copy=True)


def test_round_trip_is_bit_exact_for_nan_payloads() -> None:
    _need("torch", "jax", "arrow")
    bits = np.array([0x7FC00001, 0xFFC00000, 0x80000000, 0x3F800000], np.uint32)
    a = bits.view(np.float32)
    out = assert_round_trip(a, via=("torch", "jax", "arrow"))
    assert out.view(np.uint32).tolist() == bits.tolist()


def test_round_trip_from_torch_hb_and_plain_producers() -> None:
    torch = pytest.importorskip("torch")
    x = torch.arange(6.0).reshape(2, 3)
    assert isinstance(assert_round_trip(x, via="numpy", zero_copy=True), torch.Tensor)
    t = hb.asarray(_aligned((4,)))
    assert isinstance(assert_round_trip(t, via=("numpy", "torch"), zero_copy=True), hb.Tensor)
    back = assert_round_trip(DLPackOnly(_aligned((4,))), via=("torch",), zero_copy=True)
    assert isinstance(back, hb.Tensor)  # a plain DLPack producer comes back as hb.Tensor


def test_round_trip_names_the_hop_that_copied() -> None:
    _need("torch", "jax")
    a = _aligned((2, 3), offset=4)  # 4 bytes past a 64-byte boundary: JAX must copy
    with pytest.raises(AssertionError, match=(
            r"^hop 2: torch -> jax: data pointer changed 0x[0-9a-f]+ -> 0x[0-9a-f]+ "
            r"\(copied for jax: .*not 64-byte aligned")):
        assert_round_trip(a, via=("torch", "jax"), zero_copy=True)
    assert_round_trip(a, via=("torch", "jax"))  # values survive the copy


def test_round_trip_names_a_failed_conversion() -> None:
    _need("arrow")
    a = np.zeros((2, 3), np.complex64)  # Arrow has no complex type
    with pytest.raises(AssertionError, match=r"^hop 1: numpy -> arrow: conversion failed: "
                                             r"UnsupportedError"):
        assert_round_trip(a, via=("arrow",))


@pytest.mark.parametrize("corrupt, message", [
    (lambda x: x.astype(np.float64), r"hop 2: hb -> numpy: dtype changed float32 -> float64"),
    (lambda x: x.reshape(-1), r"hop 2: hb -> numpy: shape changed \(2, 3\) -> \(6,\)"),
    (lambda x: np.where(np.arange(6).reshape(2, 3) == 4, np.float32(-1), x),
     r"hop 2: hb -> numpy: values differ: element 4 \(flat\) is 00008040 before and "
     r"000080bf after"),
], ids=["dtype", "shape", "values"])
def test_round_trip_reports_what_changed(monkeypatch: pytest.MonkeyPatch, corrupt: Any,
                                         message: str) -> None:
    real = round_trip._hop

    def hop(obj: Any, target: str, copy: bool | None) -> Any:
        out = real(obj, target, copy)
        return corrupt(out) if target == "numpy" else out

    monkeypatch.setattr(round_trip, "_hop", hop)
    with pytest.raises(AssertionError, match=message):
        assert_round_trip(_aligned((2, 3)), via=("hb",))


def test_round_trip_copy_that_keeps_the_pointer_is_caught(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(round_trip, "_hop", lambda obj, target, copy: hb.asarray(obj)
                        if target == "hb" else hb.convert(obj, target))
    with pytest.raises(AssertionError, match=r"^hop 1: numpy -> hb: copy=True kept the data "
                                             r"pointer 0x"):
        assert_round_trip(_aligned((2, 3)), via=("hb",), zero_copy=False)


def test_round_trip_missing_framework_raises_backend_error() -> None:
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("cupy is installed here")
    with pytest.raises(hb.BackendNotAvailableError):
        assert_round_trip(_aligned((3,)), via=("cupy",))


def test_round_trip_default_via_is_every_installed_framework() -> None:
    _need("torch", "jax", "arrow")
    if importlib.util.find_spec("tensorflow") is not None:
        # TensorFlow is in the chain, after JAX and Arrow: their read-only memory reaches it
        # as a copy (its in-place ops would write it), so the chain keeps the values only.
        with pytest.raises(AssertionError, match=r"arrow -> tensorflow: data pointer changed"):
            assert_round_trip(_aligned((2, 3)), zero_copy=True)
    elif importlib.util.find_spec("mlx") is not None:
        # MLX is on the way, and its import always copies: the zero-copy check names that
        # hop and MLX's reason.
        with pytest.raises(AssertionError, match=r"-> mlx: data pointer changed .*MLX copies"):
            assert_round_trip(_aligned((2, 3)), zero_copy=True)
    elif importlib.util.find_spec("paddle") is None:
        assert isinstance(assert_round_trip(_aligned((2, 3)), zero_copy=True), np.ndarray)
    # else Paddle is last in the chain and copies what JAX and Arrow hand it (read-only
    # memory; tests/adapters/paddle): the values must survive, not the address.
    with warnings.catch_warnings():  # the values survive every hop, copied or not
        warnings.simplefilter("ignore", hb.CopyWarning)
        assert isinstance(assert_round_trip(_aligned((2, 3))), np.ndarray)


# ------------------------------------------------------------------------- pytest plugin

def _plugin_args() -> list[str]:
    registered = any(ep.value == "hurray_bridge._pytest_plugin"
                     for ep in entry_points(group="pytest11"))
    return [] if registered else ["-p", "hurray_bridge._pytest_plugin"]


def test_plugin_is_registered_as_entry_point() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    if "hurray" not in eps:
        pytest.skip("this environment predates the entry point: pip install -e . again")
    assert eps["hurray"] == "hurray_bridge._pytest_plugin"


@pytest.fixture
def producers(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(
        goodprod="""
        import math, numpy as np
        def make(shape, dtype):
            return np.arange(math.prod(shape)).astype(dtype).reshape(shape)
        FIXED = np.arange(4.0)
        def fixed():
            return FIXED
        """,
        brokenprod=Path(broken_producers.__file__).read_text(),
    )
    pytester.syspathinsert()
    return pytester


def test_plugin_one_passing_test_per_check(producers: pytest.Pytester) -> None:
    result = producers.runpytest("--hurray-producer", "goodprod:make", "-v", *_plugin_args())
    result.assert_outcomes(passed=len(CHECKS))
    result.stdout.fnmatch_lines([f"goodprod:make::{n} PASSED*" for n in CHECKS])
    result.stdout.fnmatch_lines([f"*collected {len(CHECKS)} items*"])


def test_plugin_failure_shows_the_checks_reason(producers: pytest.Pytester) -> None:
    result = producers.runpytest("--hurray-producer", "brokenprod:IgnoresCopy.factory",
                                 *_plugin_args())
    result.assert_outcomes(passed=len(CHECKS) - 1, failed=1)
    result.stdout.fnmatch_lines([
        "*hurray check 'copy_true' failed for brokenprod:IgnoresCopy.factory (float32):",
        "*copy=True shares the memory at 0x*: no copy was made*",
        "FAILED brokenprod:IgnoresCopy.factory::copy_true*",
    ])


def test_plugin_skips_and_dtypes_and_selection(producers: pytest.Pytester) -> None:
    producers.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = producers.runpytest("--hurray-producer", "goodprod:fixed", "-rs", *_plugin_args())
    result.assert_outcomes(passed=len(CHECKS) - 3 + 1, skipped=3)
    result.stdout.fnmatch_lines(["*takes no (shape, dtype_name) arguments*"])
    result = producers.runpytest("--hurray-producer", "goodprod:make", "--hurray-dtype", "int8",
                                 "--hurray-dtype", "float64", "-m", "hurray_check", "-v",
                                 *_plugin_args())
    result.assert_outcomes(passed=2 * len(CHECKS))
    result.stdout.fnmatch_lines(["goodprod:make[[]int8[]]::factory PASSED*",
                                 "goodprod:make[[]float64[]]::stream_none PASSED*"])
    result = producers.runpytest("--hurray-producer", "goodprod:make", "-k", "rank",
                                 *_plugin_args())
    result.assert_outcomes(passed=2, deselected=len(CHECKS) - 2 + 1)


def test_plugin_failure_headers_name_the_dtype(producers: pytest.Pytester) -> None:
    result = producers.runpytest("--hurray-producer", "brokenprod:IgnoresCopy.factory",
                                 "--hurray-dtype", "int8", "--hurray-dtype", "float64",
                                 *_plugin_args())
    result.assert_outcomes(passed=2 * (len(CHECKS) - 1), failed=2)
    result.stdout.fnmatch_lines([
        "_* brokenprod:IgnoresCopy.factory[[]int8[]]::copy_true _*",
        "*hurray check 'copy_true' failed for brokenprod:IgnoresCopy.factory (int8):",
        "_* brokenprod:IgnoresCopy.factory[[]float64[]]::copy_true _*",
        "*hurray check 'copy_true' failed for brokenprod:IgnoresCopy.factory (float64):",
    ], consecutive=False)
    # One dtype: the header stays the plain id.
    result = producers.runpytest("--hurray-producer", "brokenprod:IgnoresCopy.factory",
                                 *_plugin_args())
    result.stdout.fnmatch_lines(["_* brokenprod:IgnoresCopy.factory::copy_true _*"])


def test_plugin_is_inert_without_the_option(producers: pytest.Pytester) -> None:
    producers.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = producers.runpytest("-v", *_plugin_args())
    result.assert_outcomes(passed=1)
    assert "::factory" not in result.stdout.str()


@pytest.mark.parametrize("args, message", [
    (["--hurray-producer", "goodprod"], "is not MODULE:FACTORY"),
    (["--hurray-producer", "nosuchmodule_xyz:make"], "cannot import 'nosuchmodule_xyz'"),
    (["--hurray-producer", "goodprod:nope"], "has no attribute 'nope'"),
    (["--hurray-producer", "goodprod:FIXED"], "not a callable factory"),
    (["--hurray-producer", "goodprod:make", "--hurray-dtype", "float99"], "float99"),
])
def test_plugin_bad_options_are_usage_errors(producers: pytest.Pytester, args: list[str],
                                             message: str) -> None:
    result = producers.runpytest(*args, *_plugin_args())
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


# ----------------------------------------------------------------------------------- CLI

def _hurray(*args: str, exe: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = exe or [sys.executable, "-m", "hurray_bridge"]
    return subprocess.run([*cmd, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_check_passes_a_good_producer() -> None:
    out = _hurray("check", "tests.broken_producers:HandMade.factory")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "DLPack producer checks: tests.broken_producers:HandMade.factory (float32)"
    assert lines[-1] == f"{len(CHECKS)} checks: {len(CHECKS)} passed, 0 failed, 0 skipped"
    for name in CHECKS:
        assert any(re.match(rf"{name}\s+pass\b", line) for line in lines), name


def test_cli_check_fails_a_broken_producer() -> None:
    out = _hurray("check", "tests.broken_producers:DeviceLie.factory")
    assert out.returncode == 1
    assert re.search(r"^dlpack_device\s+FAIL\s+__dlpack_device__\(\) says cuda:0", out.stdout,
                     re.M)
    assert out.stdout.rstrip().endswith("15 passed, 2 failed, 0 skipped")


def test_cli_check_only_and_dtype() -> None:
    out = _hurray("check", "tests.broken_producers:IgnoresCopy.factory", "--dtype", "int16",
                  "--only", "copy_true", "copy_false")
    assert out.returncode == 1
    assert "(int16)" in out.stdout.splitlines()[0]
    assert out.stdout.rstrip().endswith("2 checks: 1 passed, 1 failed, 0 skipped")


@pytest.mark.parametrize("args, message", [
    (["no_colon"], "is not MODULE:FACTORY"),
    (["nosuchmodule_xyz:f"], "cannot import 'nosuchmodule_xyz'"),
    (["tests.broken_producers:Nope"], "has no attribute 'Nope'"),
    (["tests.broken_producers:BROKEN"], "not a callable factory"),
    (["tests.broken_producers:HandMade.factory", "--dtype", "float99"], "float99"),
    (["tests.broken_producers:HandMade.factory", "--only", "nope"], "unknown check(s) nope"),
])
def test_cli_check_bad_input_exits_2(args: list[str], message: str) -> None:
    out = _hurray("check", *args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.startswith("hurray: error: ") and message in out.stderr
    assert out.stdout == ""


def test_cli_console_script_imports_from_the_current_directory() -> None:
    script = Path(sys.executable).with_name("hurray")
    if not script.exists():
        pytest.skip("the hurray console script is not installed in this environment")
    out = _hurray("check", "tests.broken_producers:IgnoresCopy.factory", exe=[str(script)])
    assert out.returncode == 1, out.stderr
    assert re.search(r"^copy_true\s+FAIL", out.stdout, re.M)


def test_cli_report_matches_the_api() -> None:
    """The CLI prints exactly the Report's table."""
    out = _hurray("check", "tests.broken_producers:HandMade.factory", "--only", "factory")
    api = check_producer(HandMade.factory, checks=["factory"],
                         label="tests.broken_producers:HandMade.factory")
    assert out.stdout.rstrip("\n") == str(api)
    assert json.dumps(list(api))  # results are plain tuples
