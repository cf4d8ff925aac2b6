"""Read-only memory at the DLPack edges: nothing read-only is ever handed out writable.

* A legacy capsule (DLPack < 1.0: ``__dlpack__()`` without ``max_version``) has no
  READ_ONLY flag, so ``hb.Tensor.__dlpack__`` refuses one over read-only memory
  (``BufferError``, as NumPy does) unless ``copy=True`` asks for a private copy.
  apache-tvm-ffi asks only for legacy capsules: it is the real consumer here.
* The bridge's own JAX path still hands read-only memory to JAX zero-copy: JAX
  arrays are immutable, so the legacy capsule it needs is safe there.
* A torch tensor that requires grad becomes a read-only hb.Tensor: NumPy, JAX and
  Arrow get it zero-copy and read-only; torch, which has no read-only tensors, gets a
  copy (``copy=None``, with a CopyWarning naming ``x.detach()``) or a refusal
  (``copy=False``).

Every case that writes through an export runs in a subprocess: on a read-only map
the write is a SIGSEGV (files are mapped copy-on-write so that it is not; a regression
must fail a test, not kill the suite).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _shortcuts
from hurray_bridge._capsule import capsule_name, consume_capsule
from hurray_bridge.tensor import from_dlview

np = pytest.importorskip("numpy")

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


@pytest.fixture
def saved(tmp_path: Path) -> Iterator[hb.Tensor]:
    """A read-only tensor over a file mapping (page aligned, so JAX can alias it)."""
    p = tmp_path / "w.hurray"
    hb.save(p, {"w": np.arange(64, dtype=np.float32)})
    f = hb.load(p)
    yield f["w"]


def _from_numpy() -> hb.Tensor:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    return hb.asarray(a)


class _Capsule:
    """Hands one ready-made capsule to a consumer (whatever it asks for)."""

    def __init__(self, cap: object) -> None:
        self.cap = cap

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, **kwargs: Any) -> object:
        return self.cap


# ------------------------------------------------------------- the legacy export
@pytest.mark.parametrize("request_kw", [{}, {"max_version": None}, {"max_version": (0, 8)},
                                        {"stream": None}, {"copy": None}],
                         ids=["plain", "max_version=None", "max_version=(0, 8)", "stream=None",
                              "copy=None"])
def test_legacy_export_of_read_only_memory_is_refused(saved: hb.Tensor,
                                                      request_kw: dict[str, Any]) -> None:
    for t in (saved, _from_numpy()):
        assert t.readonly
        with pytest.raises(BufferError, match="read-only") as info:
            t.__dlpack__(**request_kw)
        assert isinstance(info.value, hb.HurrayError)
        msg = str(info.value)
        assert "max_version" in msg and "copy=True" in msg and "hb.convert" in msg


def test_legacy_export_with_copy_false_is_a_copy_required_error(saved: hb.Tensor) -> None:
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        saved.__dlpack__(copy=False)


def test_legacy_export_with_copy_true_is_a_private_copy(saved: hb.Tensor) -> None:
    cap = saved.__dlpack__(copy=True)
    assert capsule_name(cap) == "dltensor"
    # (np.from_dlpack would mark it read-only: it asked for a versioned capsule.) A legacy
    # capsule cannot say "writable" either: this consumer knows that its copy is its own.
    n = hb.convert(from_dlview(consume_capsule(cap), legacy_mutable=True), "numpy")
    assert n.ctypes.data != saved.data_ptr
    assert n.tolist() == list(range(64))
    n[:] = -1  # the copy is the consumer's own
    assert np.frombuffer(saved.memoryview(), np.float32).tolist() == list(range(64))


def test_versioned_export_still_shares_read_only_memory(saved: hb.Tensor) -> None:
    n = np.from_dlpack(saved)  # NumPy asks for a versioned capsule: READ_ONLY travels
    assert n.ctypes.data == saved.data_ptr and not n.flags.writeable


def test_legacy_export_of_writable_or_empty_memory_is_unchanged() -> None:
    a = np.arange(4, dtype=np.float32)
    cap = hb.asarray(a).__dlpack__()
    assert capsule_name(cap) == "dltensor"
    assert np.from_dlpack(_Capsule(cap)).ctypes.data == a.ctypes.data
    # No element, no byte anyone could write: the legacy export stays allowed.
    e = hb.loads(hb.dumps({"e": np.zeros((3, 0), np.float32)}))["e"]
    assert e.readonly
    assert np.from_dlpack(_Capsule(e.__dlpack__())).shape == (3, 0)


def test_jnp_from_dlpack_of_read_only_memory_is_refused_like_numpys(saved: hb.Tensor) -> None:
    # jnp.from_dlpack asks only for legacy capsules; NumPy's read-only arrays refuse
    # it the same way. hb.convert(t, "jax") is the way (next test).
    jnp = pytest.importorskip("jax.numpy")
    ro = np.arange(4.0)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        jnp.from_dlpack(ro)
    with pytest.raises(BufferError, match="read-only"):
        jnp.from_dlpack(saved)


# --------------------------------------------------------- the bridge's JAX path
@pytest.mark.parametrize("route", ["raw import", "jnp.from_dlpack"])
def test_convert_read_only_memory_to_jax_stays_zero_copy(saved: hb.Tensor, route: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("jax")
    hj = hb.get_adapter("jax")
    if route == "jnp.from_dlpack":
        monkeypatch.setattr(hj, "_RAW_IMPORT", None)  # the public API, as on a new jaxlib
    elif hj._RAW_IMPORT is None:
        pytest.skip("this jaxlib has no raw DLPack import; the other route covers it")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CopyWarning, no other notice
        j = hb.convert(saved, "jax")
    assert j.unsafe_buffer_pointer() == saved.data_ptr
    assert np.asarray(j).tolist() == list(range(64))


def test_sharded_read_only_memory_to_jax_stays_zero_copy(saved: hb.Tensor) -> None:
    jax = pytest.importorskip("jax")
    from jax.sharding import SingleDeviceSharding

    from hurray_bridge.shards import to_jax

    st = hb.split(saved, hb.grid_boxes(saved.shape, (1,)))
    assert all(s.readonly for s in st.shards)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no CopyWarning
        j = to_jax(st, SingleDeviceSharding(jax.devices()[0]))
    assert j.addressable_shards[0].data.unsafe_buffer_pointer() == saved.data_ptr


# ------------------------------------------------------------ apache-tvm-ffi
@pytest.mark.parametrize("source", ["file", "bytes"])
def test_tvm_ffi_never_gets_a_writable_view_of_read_only_memory(source: str,
                                                                tmp_path: Path) -> None:
    pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is in the test extra")
    p = tmp_path / "w.hurray"
    r = _run(f"""
        import numpy as np, tvm_ffi, hurray_bridge as hb
        raw = hb.dumps({{"w": np.arange(16, dtype=np.float32)}})
        if {source!r} == "file":
            with open({str(p)!r}, "wb") as f:
                f.write(raw)
            t = hb.load({str(p)!r})["w"]
        else:
            t = hb.loads(raw)["w"]
        try:
            x = tvm_ffi.from_dlpack(t)  # a legacy-only consumer
        except BufferError as exc:
            print("refused:", exc)
        else:
            np.from_dlpack(x)[0] = 42.0  # SIGSEGV on a read-only map; changes bytes otherwise
            print("wrote; bytes changed:", np.frombuffer(raw, np.uint8).tobytes()
                  != hb.dumps({{"w": np.arange(16, dtype=np.float32)}}))
    """)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    if source == "file":
        assert r.stdout.startswith("refused:") and "read-only" in r.stdout, r.stdout
    else:  # hb.loads copied the bytes: tvm-ffi writes a private copy, never the bytes
        assert r.stdout == "wrote; bytes changed: False\n", r.stdout


def test_tvm_ffi_shares_writable_memory() -> None:
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is in the test extra")
    a = np.arange(8, dtype=np.float32)
    x = tvm_ffi.from_dlpack(hb.asarray(a))
    n = np.from_dlpack(x)
    assert n.ctypes.data == a.ctypes.data
    n[0] = 7.0
    assert a[0] == 7.0


# ----------------------------------------------------------------- autograd
IMPLS = ["python"] + (["compiled"] if _shortcuts.compiled else [])


@pytest.fixture(params=IMPLS)
def convert(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """hb.convert through a shortcut front of each kind, with the torch pairs learned."""
    torch = pytest.importorskip("torch")
    general = hb.convert.general  # type: ignore[attr-defined]  # the front's full path
    f = _shortcuts.front(general, use_compiled=request.param == "compiled")
    for to in ("numpy", "jax", "arrow", "torch"):
        f(torch.ones(3), to)  # learns (torch.Tensor, to): the shortcuts are in front now
    return f


def _grad_after(write: Callable[[Any], None], make: Callable[[], Any]) -> Any:
    x = make()
    z = (x * x).sum()
    write(x)
    z.backward()
    return x.grad


def _requires_grad() -> Any:
    import torch

    return torch.ones(3, requires_grad=True)


def _parameter() -> Any:
    import torch

    return torch.nn.Parameter(torch.ones(3))


LEAVES = {"requires_grad": _requires_grad, "Parameter": _parameter}


@pytest.mark.parametrize("leaf", LEAVES)
def test_requires_grad_to_numpy_is_a_read_only_view(convert: Callable[..., Any],
                                                    leaf: str) -> None:
    def write(x: Any) -> None:
        n = convert(x, "numpy")
        assert n.ctypes.data == x.data_ptr()  # zero-copy
        assert not n.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            n[:] = 5

    assert _grad_after(write, LEAVES[leaf]).tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("leaf", LEAVES)
def test_requires_grad_to_jax_and_arrow_stays_zero_copy(convert: Callable[..., Any],
                                                        leaf: str) -> None:
    pytest.importorskip("jax")
    pa = pytest.importorskip("pyarrow")
    x = LEAVES[leaf]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        j = convert(x, "jax")
        a = convert(x, "arrow")
    assert j.unsafe_buffer_pointer() == x.data_ptr()
    assert isinstance(a, pa.Array) and a.buffers()[1].address == x.data_ptr()
    assert x.requires_grad  # nothing was detached on the caller's side


@pytest.mark.parametrize("leaf", LEAVES)
def test_requires_grad_to_torch_is_a_copy_never_a_writable_view(convert: Callable[..., Any],
                                                                leaf: str) -> None:
    def write(x: Any) -> None:
        with pytest.warns(hb.CopyWarning, match=r"x\.detach\(\)"):
            y = convert(x, "torch")
        assert y.data_ptr() != x.data_ptr() and not y.requires_grad
        y[:] = 5  # the caller's own copy
        with pytest.raises(hb.CopyRequiredError, match=r"x\.detach\(\)"):
            convert(x, "torch", copy=False)
        z = convert(x, "torch", copy=True)
        assert z.data_ptr() != x.data_ptr()

    assert _grad_after(write, LEAVES[leaf]).tolist() == [2.0, 2.0, 2.0]
    # Sharing stays one explicit call away, as torch's own export says.
    x = LEAVES[leaf]()
    assert convert(x.detach(), "torch").data_ptr() == x.data_ptr()


def test_requires_grad_hb_tensor_is_read_only_everywhere() -> None:
    torch = pytest.importorskip("torch")
    x = torch.ones(4, requires_grad=True)
    t = hb.asarray(x)
    assert t.readonly and t.data_ptr == x.data_ptr() and not t.copied
    with pytest.raises(BufferError, match="read-only"):
        t.__dlpack__()  # a legacy consumer could not be told
    n = np.from_dlpack(t)
    assert not n.flags.writeable and n.ctypes.data == x.data_ptr()
    # A view of it, made by the bridge, stays what it was.
    with pytest.warns(hb.CopyWarning, match=r"x\.detach\(\)"):
        y = hb.convert(hb.asarray(x[1:]), "torch")
    assert y.data_ptr() != x[1:].data_ptr()


SPARSE = ["coo", "csr", "csc"]
# torch says once per process that its CSR support is in beta, on whichever CSR call is first.
_CSR_BETA = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support:UserWarning")


def _sparse_leaf(layout: str) -> Any:
    torch = pytest.importorskip("torch")
    pytest.importorskip("scipy")
    dense = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]])
    x = {"coo": dense.to_sparse, "csr": dense.to_sparse_csr, "csc": dense.to_sparse_csc}[layout]()
    return x.requires_grad_(True)


@_CSR_BETA
@pytest.mark.parametrize("layout", SPARSE)
def test_sparse_requires_grad_to_scipy_is_read_only(layout: str) -> None:
    """The sparse components of a ``requires_grad`` tensor are shared read-only, like a
    dense one's: a write through scipy's ``.data`` would change what autograd sees."""
    x = _sparse_leaf(layout)
    values = x._values() if layout == "coo" else x.values()
    s = hb.convert(x, "numpy")
    assert s.data.ctypes.data == values.data_ptr()  # still zero-copy
    assert not s.data.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        s.data[0] = 5
    assert x.to_dense().tolist() == [[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]
    assert hb.asarray(x).readonly


@_CSR_BETA
@pytest.mark.parametrize("layout", SPARSE)
def test_sparse_requires_grad_to_torch_is_a_copy(layout: str) -> None:
    x = _sparse_leaf(layout)
    values = x._values() if layout == "coo" else x.values()
    with pytest.warns(hb.CopyWarning, match=r"x\.detach\(\)"):
        y = hb.convert(x, "torch")
    y_values = y._values() if layout == "coo" else y.values()
    assert y_values.data_ptr() != values.data_ptr() and not y.requires_grad
    assert y.to_dense().tolist() == x.detach().to_dense().tolist()
    # the detached tensor is shared, as a dense one is
    d = hb.convert(x.detach(), "torch")
    assert (d._values() if layout == "coo" else d.values()).data_ptr() == values.data_ptr()


# ------------------------------------------------------------- legacy imports
# A legacy capsule cannot say "read-only" either way: NumPy reads every one as read-only,
# and so does the bridge, unless the producer's adapter declares that its framework's
# legacy exports hand out mutable memory (LEGACY_EXPORTS_MUTABLE).
class _LegacyOnlyProducer:
    """A DLPack producer of an unknown framework that answers legacy capsules only (what
    TensorFlow and mlx do): the memory may be a constant of that framework."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __dlpack__(self, stream: Any = None) -> object:
        return self._wrapped.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def test_a_legacy_import_from_an_unknown_producer_is_read_only(convert: Callable[..., Any]
                                                               ) -> None:
    a = np.arange(3.0)
    t = hb.asarray(_LegacyOnlyProducer(a))
    assert t.readonly and t.data_ptr == a.ctypes.data and not t.copied
    for _ in range(2):  # the second call may take a learned shortcut
        n = convert(_LegacyOnlyProducer(a), "numpy")
        assert n.ctypes.data == a.ctypes.data and not n.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            n[0] = 99.0
    assert a.tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(BufferError, match="read-only"):
        hb.from_dlpack(_LegacyOnlyProducer(a)).__dlpack__()  # nor passed on writable


def test_a_versioned_import_keeps_the_producers_word() -> None:
    # The rule is for legacy capsules only: a versioned one says read-only or not itself.
    from tests.dlpack_producers import DLPackOnly

    a = np.arange(3.0)
    assert not hb.from_dlpack(DLPackOnly(a)).readonly
    a.flags.writeable = False
    assert hb.from_dlpack(DLPackOnly(a)).readonly


@pytest.mark.parametrize("impl", ["compiled", "python"])
def test_a_legacy_import_is_read_only_in_either_build(impl: str) -> None:
    if impl == "compiled" and not _shortcuts.compiled:
        pytest.skip("hurray_bridge._speedups was not built")
    r = _run(f"""
        import sys
        if {impl == "python"!r}:
            sys.modules["hurray_bridge._speedups"] = None
        import numpy as np, hurray_bridge as hb
        from hurray_bridge import _exchange
        class Legacy:
            def __init__(self, a): self.a = a
            def __dlpack__(self, stream=None): return self.a.__dlpack__()
            def __dlpack_device__(self): return (1, 0)
        a = np.arange(3.0)
        outs = [hb.convert(Legacy(a), "numpy") for _ in range(2)]
        print(_exchange.compiled, [n.flags.writeable for n in outs], hb.asarray(Legacy(a)).readonly)
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(impl == "compiled"), "[False,", "False]", "True"]


def test_adapters_declare_whether_their_legacy_exports_are_mutable() -> None:
    from hurray_bridge._registry import ADAPTERS, get_adapter

    declared = {}
    for name in ADAPTERS:
        try:
            declared[name] = get_adapter(name).LEGACY_EXPORTS_MUTABLE
        except hb.BackendNotAvailableError:
            continue
    # NumPy refuses a legacy export of a read-only array; torch has no read-only tensors;
    # JAX and Arrow memory is immutable; TensorFlow exports a constant's own buffer; MLX
    # writes its own memory in place (tests/adapters/mlx measures it).
    expected = {"numpy": True, "torch": True, "jax": False, "arrow": False, "cupy": True,
                "dask": False, "tensorflow": False, "mlx": True, "paddle": True}
    assert declared == {k: v for k, v in expected.items() if k in declared}
    assert "numpy" in declared


def test_a_legacy_import_from_a_mutable_framework_stays_writable(convert: Callable[..., Any]
                                                                 ) -> None:
    import torch

    # Producers of a framework whose adapter declares its legacy exports mutable, asked
    # for a legacy capsule (an older release, or a subclass that predates max_version).
    class LegacyTorch(torch.Tensor):
        def __dlpack__(self, stream: Any = None) -> object:  # type: ignore[override]
            return super().__dlpack__()

    class LegacyNumpy(np.ndarray):
        def __dlpack__(self, stream: Any = None) -> object:  # type: ignore[override]
            return super().__dlpack__()

    x = torch.arange(3.0).as_subclass(LegacyTorch)
    a = np.arange(3.0).view(LegacyNumpy)
    for producer, ptr in ((x, x.data_ptr()), (a, a.ctypes.data)):
        t = hb.from_dlpack(producer)
        assert not t.readonly and t.data_ptr == ptr
    # The everyday hand-off: torch -> NumPy stays a writable view.
    y = torch.arange(3.0)
    for _ in range(2):
        n = convert(y, "numpy")
        assert n.flags.writeable and n.ctypes.data == y.data_ptr()
    n[0] = 5.0
    assert y[0] == 5.0
