"""hb.Tensor through Ray: tasks, actors and the object store on a local cluster.

One local Ray instance (``ray.init(num_cpus=2)``, no dashboard, no network
beyond the loopback) serves the whole module; every ``ray.get`` has a timeout
so a stuck cluster fails the test instead of hanging CI. The module takes
about 10 s, most of it Ray starting. Skipped only when ray is not installed
(``pip install 'hurray-bridge[ray]'``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed")

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'hurray-bridge[ray]'")

import hurray_bridge as hb  # noqa: E402
from tests.hurray_bridge.test_pickle_shm import NAMES, SAMPLES, assert_same, snapshot  # noqa: E402

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[None]:
    if ray.is_initialized():  # pragma: no cover - someone else's cluster: leave it alone
        yield
        return
    with warnings.catch_warnings():
        # Ray starts its processes with subprocess, which forks and execs at once; JAX
        # (imported by an earlier test) warns at any fork, for the child that would go on
        # running this process's code with JAX's threads gone. An exec'd child does not.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                                category=RuntimeWarning)
        ray.init(
            num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
            # Workers import the test modules (tests.hurray_bridge.test_pickle_shm, this one)
            # and the example by name.
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                [str(ROOT), str(ROOT / "examples"), os.environ.get("PYTHONPATH", "")]
            ).rstrip(os.pathsep)}},
        )
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote
def echo(t: hb.Tensor) -> tuple[hb.Tensor, Any, bool, int]:
    """A task: what the worker received, sent back as it is."""
    return t, snapshot(t), t.readonly, os.getpid()


@ray.remote
def to_torch(t: hb.Tensor) -> dict[str, Any]:
    """A worker hands what it received to torch: the view, its notice, and the copy."""
    import torch  # noqa: F401 - the adapter's framework

    from hurray_bridge.adapters import torch as ht

    ht._readonly_warned = False  # the notice is once per process: this worker may have given it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        view = hb.convert(t, "torch")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a copy asked for is no surprise: no notice
        own = hb.convert(t, "torch", copy=True)
    own[0] = -1.0  # the copy is the worker's own
    return {"readonly": t.readonly, "view_shares": view.data_ptr() == t.data_ptr,
            "copy_shares": own.data_ptr() == t.data_ptr,
            "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
            "first": float(np.asarray(t)[0])}


@ray.remote
def total(t: hb.Tensor) -> float:
    return float(np.asarray(t, dtype=np.float64).sum())


@ray.remote
class Store:
    """An actor that keeps tensors and hands them out again."""

    def __init__(self) -> None:
        self.items: dict[str, hb.Tensor] = {}

    def put(self, name: str, t: hb.Tensor) -> tuple[Any, bool]:
        self.items[name] = t
        return snapshot(t), t.readonly

    def get(self, name: str) -> hb.Tensor:
        return self.items[name]

    def scaled(self, name: str, k: float) -> hb.Tensor:
        # A tensor made in the actor process, from its own memory.
        return hb.asarray(np.asarray(self.items[name]) * k)


@pytest.mark.parametrize("name", NAMES)
def test_task_round_trip_bit_exact(name: str) -> None:
    t = SAMPLES[name]
    back, seen, seen_ro, pid = ray.get(echo.remote(t), timeout=TIMEOUT)
    assert pid != os.getpid()
    assert seen == snapshot(t)  # the worker saw our bytes exactly
    # Ray hands protocol-5 buffers out of its immutable object store: read-only views.
    assert seen_ro or all(b.nbytes == 0 for b in t.buffers)
    assert_same(back, t)


def test_object_store_put_get_is_zero_copy_read_only() -> None:
    a = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: stored in shared memory, not inline
    ref = ray.put(hb.asarray(a))
    one, two = ray.get(ref, timeout=TIMEOUT), ray.get(ref, timeout=TIMEOUT)
    assert one.readonly and two.readonly
    assert one.data_ptr == two.data_ptr != a.ctypes.data  # both map the same stored copy
    assert one.data_ptr % 64 == 0
    assert bytes(one.memoryview()) == a.tobytes()
    assert ray.get(total.remote(ref), timeout=TIMEOUT) == float(a.sum())


def test_worker_torch_view_of_the_object_store_warns_and_names_copy_true() -> None:
    # torch has no read-only tensors: the worker's hb.convert(t, "torch") is a writable
    # view of the shared object store (docs/spec/interchange.md §7.3). The notice must
    # say so and name the fix; copy=True must give the worker its own memory.
    pytest.importorskip("torch")
    a = np.arange(1 << 16, dtype=np.float32)  # 256 KiB: in shared memory, not inline
    ref = ray.put(hb.asarray(a))
    seen = ray.get(to_torch.remote(ref), timeout=TIMEOUT)
    assert seen["readonly"] and seen["view_shares"] and not seen["copy_shares"]
    assert len(seen["warnings"]) == 1, seen["warnings"]
    (w,) = seen["warnings"]
    assert w.startswith("UserWarning: ") and "read-only" in w and "copy=True" in w, w
    assert seen["first"] == 0.0  # writing the copy left the store alone
    assert float(np.asarray(ray.get(ref, timeout=TIMEOUT))[0]) == 0.0


@pytest.fixture(scope="module")
def store() -> Iterator[Any]:
    actor = Store.remote()  # type: ignore[attr-defined]
    yield actor
    ray.kill(actor)


@pytest.mark.parametrize("name", ["dense_f32", "empty_3_0_5", "strided_neg", "quant_per_axis",
                                  "csr", "csr_nnz0_0x5", "int4_packed", "scalar"])
def test_actor_keeps_and_returns_tensors(store: Any, name: str) -> None:
    t = SAMPLES[name]
    seen, _ = ray.get(store.put.remote(name, t), timeout=TIMEOUT)
    assert seen == snapshot(t)
    assert_same(ray.get(store.get.remote(name), timeout=TIMEOUT), t)


def test_actor_output_feeds_a_task(store: Any) -> None:
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    ray.get(store.put.remote("a", hb.asarray(a)), timeout=TIMEOUT)
    doubled = store.scaled.remote("a", 2.0)  # an ObjectRef, passed on without a round trip
    assert ray.get(total.remote(doubled), timeout=TIMEOUT) == 2 * a.sum()


def test_sharded_tensor_through_ray() -> None:
    a = np.arange(30, dtype=np.int32).reshape(10, 3)
    st = hb.split(a, hb.grid_boxes(a.shape, (4, 1)))
    back = ray.get(ray.put(st), timeout=TIMEOUT)
    assert back.boxes == st.boxes
    assert hb.assemble(back).tolist() == a.tolist()


def test_example_torch_producer_to_jax_consumer() -> None:
    # The example's producer and consumer, on this module's cluster (main() only adds
    # ray.init and printing; starting a second cluster would double this module's time).
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import ray_torch_to_jax as example
    finally:
        sys.path.remove(str(ROOT / "examples"))
    report, sent = example.run(seed=1)
    assert report["digests"] == sent  # bit-exact
    assert all(report["zero_copy"].values())
    assert report["shapes"]["padding"] == (0, 128)
    assert report["dtypes"]["weights"] == "bfloat16"
    assert report["result"][0] == (64, 32)
