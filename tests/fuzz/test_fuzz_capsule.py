"""Forged DLPack capsules in CI time: the capsule fuzz target, bounded.

``fuzz/fuzz_capsule.py`` reads each input as the fields of one capsule (data,
ndim, shape, strides, byte_offset, dtype, device, flags, versions) behind a
``__dlpack__`` object, hands it to ``hb.from_dlpack`` and every accepted tensor
whose memory is real to NumPy, torch, JAX and Arrow (see ``fuzz/README.md``).
Here: every committed corpus input replays through that check, then a few
thousand inputs more (mutations of the corpus and random bytes, fixed seed).
Each finding of the long runs is a named regression below.
"""

from __future__ import annotations

import importlib.util
import pathlib
import random
import sys
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("numpy")
pytest.importorskip("torch")
pytest.importorskip("jax")
pytest.importorskip("pyarrow")

import hurray_bridge as hb
from hurray_bridge.dtypes import all_dtypes

ROOT = pathlib.Path(__file__).resolve().parents[2]
FUZZ = ROOT / "fuzz"
VALID = sorted({d.dlpack for d in all_dtypes() if d.dlpack is not None})
RUNS = 3000


def _load(name: str) -> ModuleType:
    key = f"_hb_fuzz_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, FUZZ / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


@pytest.fixture(scope="module")
def target() -> ModuleType:
    return _load("fuzz_capsule")


@pytest.fixture(scope="module")
def check(target: ModuleType) -> Any:
    return target.load_check()


def _corpus() -> list[bytes]:
    return [p.read_bytes() for p in sorted((FUZZ / "corpus" / "capsule").iterdir())
            if p.is_file()]


def test_the_corpus_has_its_seeds(target: ModuleType) -> None:
    names = {p.name for p in (FUZZ / "corpus" / "capsule").iterdir()}
    assert {f"seed-{k}" for k in target.seeds(VALID)} <= names


def test_seeds_decode_to_what_they_are_named(target: ModuleType) -> None:
    seeds = target.seeds(VALID)
    f = target.decode(seeds["negative-strides"], VALID)
    assert (f["shape"], f["strides"], (f["code"], f["bits"])) == ((3, 4), (-4, 1), (4, 16))
    assert target.decode(seeds["cuda"], VALID)["device"] == (2, 0)
    assert target.decode(seeds["null-data"], VALID)["where"] == "null"
    assert target.decode(seeds["device-id-none"], VALID)["reported"] == (1, None)


def test_corpus_replays(check: Any) -> None:
    corpus = _corpus()
    assert len(corpus) >= 16
    for data in corpus:
        check(data)


def test_a_few_thousand_inputs(check: Any) -> None:
    """Mutations of the corpus (libFuzzer's cheap ones) and random bytes: no finding."""
    harness = _load("_harness")
    pool = _corpus()
    rng = random.Random(20240611)
    guard = harness.Guard(check, trace_every=0)
    for i in range(RUNS):
        if i % 3:
            data = harness._mutate(rng, rng.choice(pool), pool)
        else:
            data = rng.randbytes(rng.randrange(4, 96))
        try:
            guard(data)
        except BaseException as e:
            raise AssertionError(f"input {data.hex()} (#{i}): {e}") from e
    assert guard.runs == RUNS


# -- the long runs' findings, each a regression (docs/impl/robustness.md §2)
def test_finding_torch_never_sees_a_device_type_it_cannot_hold(target: ModuleType) -> None:
    # torch 2.13 raises internal errors for OpenCL/Vulkan/WebGPU/... capsules, and for a
    # legacy kDLOpenCL one calls the producer's deleter twice.
    from tests import broken_producers as bp

    for device in ((4, 0), (7, 0), (15, 0), (17, 0), (99, 0)):
        for versioned in (True, False):
            p = bp.Forged(data=target.FAKE, shape=(4,), device=device, versioned=versioned)
            with pytest.raises(hb.UnsupportedError, match="cannot become a torch tensor"):
                hb.convert(p, "torch")
            assert p.live() == 0
    assert not bp.STRAY_RELEASES


def test_finding_huge_stride_on_a_size_1_dimension(check: Any, target: ModuleType) -> None:
    # shape (6, 1), strides (0, 2**60): the size-1 stride means nothing, but 2**60 * 8
    # bytes overflowed NumPy's (and so t.copy()'s) byte strides: a raw OverflowError.
    import numpy as np

    from tests import broken_producers as bp

    mem = np.arange(8, dtype=np.int64)
    p = bp.Forged(data=mem.ctypes.data, shape=(6, 1), strides=(0, 2**60), code=0, bits=64,
                  keep=mem)
    t = hb.from_dlpack(p)
    np.testing.assert_array_equal(hb.convert(t, "numpy"), np.zeros((6, 1), np.int64))
    assert hb.convert(t.copy(), "numpy").tolist() == [[0]] * 6
    check(target.encode(shape=(6, 1), strides="small", small=(0, 8), dtype=VALID.index((0, 64))))


def test_finding_rank_64_strided_copy() -> None:
    # NumPy's rank limit is 64 too: t.copy() gathered with one more (byte) dimension.
    import numpy as np

    from tests import broken_producers as bp

    mem = np.arange(8, dtype=np.float32)
    p = bp.Forged(data=mem.ctypes.data, shape=(2,) + (1,) * 63, strides=(3,) + (1,) * 63,
                  keep=mem)
    assert hb.convert(hb.from_dlpack(p).copy(), "numpy").reshape(-1).tolist() == [0.0, 3.0]


def test_finding_jax_cpu_device_that_does_not_exist() -> None:
    # A capsule on cpu:1 (JAX has only cpu:0 here): a raw JaxRuntimeError before.
    jax = pytest.importorskip("jax")
    if any(d.id == 1 for d in jax.devices("cpu")):
        pytest.skip("this JAX has a cpu:1 device")
    import numpy as np

    from tests import broken_producers as bp

    mem = np.arange(4, dtype=np.float32)
    p = bp.Forged(data=mem.ctypes.data, shape=(4,), device=(1, 1), reported=(1, 0), keep=mem)
    with pytest.raises(hb.UnsupportedError, match="JAX has no cpu device with hardware id 1"):
        hb.convert(p, "jax")


def test_finding_jax_subbyte_copy_meets_numpys_limits() -> None:
    # Empty int2 [2**63 - 1, 0, 2]: XLA could hold it, the NumPy copy JAX's sub-byte path
    # takes could not (a raw ValueError 'array is too big').
    from tests import broken_producers as bp

    p = bp.Forged(data=0, shape=(2**63 - 1, 0, 2), code=0, bits=2)
    with pytest.raises(hb.UnsupportedError, match="NumPy cannot hold shape"):
        hb.convert(p, "jax")


def test_finding_broadcast_beyond_the_element_count() -> None:
    # strides 0 over 2**40 x 2**40: one element of memory, 2**80 elements, more than the
    # format's 64-bit count (t.descriptor refused it after the import had accepted it).
    import numpy as np

    from tests import broken_producers as bp

    mem = np.zeros(1, np.float32)
    p = bp.Forged(data=mem.ctypes.data, shape=(2**40, 2**40), strides=(0, 0), keep=mem)
    with pytest.raises(hb.FormatError, match="more than 2\\*\\*64 - 1"):
        hb.from_dlpack(p)
