"""hb.convert's shortcuts answer exactly what the full path answers, input by input.

Each case converts the same source twice - through the full path
(``hb.convert.general``) and through a shortcut front (compiled and Python) - and
compares everything a user can observe: result type, dtype, shape, strides, data
pointer, writability, bytes, warnings, and for refusals the error type and message.
The "plain" cases must take the shortcut (the full path is not called); the edge
cases must fall through to it.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _shortcuts

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
pa = pytest.importorskip("pyarrow")
ml_dtypes = pytest.importorskip("ml_dtypes")

import hurray_bridge.adapters.torch as hb_torch  # noqa: E402
from tests.frameworks import optional  # noqa: E402

tf = optional("tensorflow")  # its cases join where it is installed

GENERAL = hb.convert.general  # type: ignore[attr-defined]

IMPLS = ["python"] + (["compiled"] if _shortcuts.compiled else [])


def _aligned(n: int, dtype: Any = "float32") -> Any:
    dt = np.dtype(dtype)
    raw = np.empty(n * dt.itemsize + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off:off + n * dt.itemsize].view(dt)


def _np(dtype: Any = "float32", shape: tuple[int, ...] = (6,)) -> Any:
    a = _aligned(int(np.prod(shape)), dtype).reshape(shape)
    a[...] = np.arange(a.size).reshape(shape).astype(dtype)
    return a


def _readonly(a: Any) -> Any:
    a.flags.writeable = False
    return a


def _misaligned() -> Any:
    raw = _aligned(33, np.uint8)
    return raw[1:].view(np.float32)


def _torch_aligned(dtype: Any, shape: tuple[int, ...]) -> Any:
    """A torch tensor of counting values whose memory is 64-byte aligned (JAX aliases
    only such CPU memory; torch's allocator gives 64 anyway, but not by contract)."""
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(nbytes + 64, dtype=torch.uint8)
    off = -raw.data_ptr() % 64
    mem = raw[off:off + nbytes]
    # Small bytes: valid values of every type (bool8 holds 0 and 1 only; JAX gets any
    # other byte normalised in a copy).
    mem.copy_(torch.arange(nbytes) % (2 if dtype is torch.bool else 61))
    return mem.view(dtype).reshape(shape)


def _torch_quantized() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 deprecates its quantized tensors
        return torch.quantize_per_tensor(torch.ones(3), 0.5, 0, torch.qint8)


def _deleted_jax() -> Any:
    x = jnp.arange(3.0)
    x.delete()
    return x


# JAX -> NumPy: the full path's own memoryview pin. JAX -> torch: JAX's own capsule
# into torch.from_dlpack, plus the read-only notice.
# (label, source factory, takes the shortcut to NumPy, to torch)
_JAX_INPUTS: list[tuple[str, Callable[[], Any], bool, bool]] = [
    ("jax f32", lambda: jnp.arange(6, dtype=jnp.float32), True, True),
    ("jax 2-D", lambda: jnp.ones((2, 3), jnp.int32), True, True),
    ("jax 0-d", lambda: jnp.float32(3), True, True),
    ("jax empty", lambda: jnp.zeros((0, 2)), True, True),
    ("jax empty (3, 0)", lambda: jnp.zeros((3, 0)), True, True),
    ("jax bool", lambda: jnp.array([True, False]), True, True),
    ("jax f16", lambda: jnp.arange(3, dtype=jnp.float16), True, True),
    ("jax u32", lambda: jnp.arange(3, dtype=jnp.uint32), True, True),
    ("jax c64", lambda: jnp.arange(3, dtype=jnp.complex64), True, True),
    ("jax bf16", lambda: jnp.arange(3, dtype=jnp.bfloat16), False, True),  # no buffer format
    ("jax int4", lambda: jnp.arange(3, dtype=jnp.int4), False, False),
    ("jax deleted", _deleted_jax, False, False),
]

# (label, source factory, target, takes the shortcut)
CASES: list[tuple[str, Callable[[], Any], str, bool]] = [
    *[(label, make, "numpy", to_np) for label, make, to_np, _ in _JAX_INPUTS],
    *[(label, make, "torch", to_torch) for label, make, _, to_torch in _JAX_INPUTS],
    # NumPy -> torch: torch.from_numpy for writable arrays
    ("np f32", lambda: _np(), "torch", True),
    ("np 2-D", lambda: _np(shape=(2, 3)), "torch", True),
    ("np fortran", lambda: np.asfortranarray(_np(shape=(2, 3))), "torch", True),
    ("np strided", lambda: _np(shape=(8,))[::2], "torch", True),
    ("np 0-d", lambda: _np(shape=()), "torch", True),
    ("np empty", lambda: _np(shape=(0,)), "torch", True),
    ("np bool", lambda: _np(bool), "torch", True),
    ("np f16", lambda: _np(np.float16), "torch", True),
    ("np u16", lambda: _np(np.uint16), "torch", True),
    ("np u64", lambda: _np(np.uint64), "torch", True),
    ("np c64", lambda: _np(np.complex64), "torch", True),
    ("np misaligned", _misaligned, "torch", True),
    ("np empty 2-D", lambda: np.zeros((0, 3), np.float32), "torch", True),
    ("np size-1 dim", lambda: np.arange(3.0).reshape(1, 3).T, "torch", True),
    ("np one element strided", lambda: np.arange(5.0)[::5], "torch", True),
    ("np read-only", lambda: _readonly(_np()), "torch", False),
    ("np reversed", lambda: _np()[::-1], "torch", False),
    ("np big-endian", lambda: _np(">f4"), "torch", False),
    ("np bfloat16", lambda: _np(ml_dtypes.bfloat16), "torch", False),
    ("np datetime", lambda: np.zeros(3, "datetime64[s]"), "torch", False),
    # NumPy -> Arrow: Array.from_dlpack for rank 1
    ("np f32", lambda: _np(), "arrow", True),
    ("np i64", lambda: _np(np.int64), "arrow", True),
    ("np f16", lambda: _np(np.float16), "arrow", True),
    ("np read-only", lambda: _readonly(_np()), "arrow", True),
    ("np empty", lambda: _np(shape=(0,)), "arrow", True),
    ("np 2-D", lambda: _np(shape=(2, 3)), "arrow", False),
    ("np 0-d", lambda: _np(shape=()), "arrow", False),
    ("np strided", lambda: _np(shape=(8,))[::2], "arrow", False),
    ("np bool", lambda: _np(bool), "arrow", False),
    ("np c64", lambda: _np(np.complex64), "arrow", False),
    # torch -> NumPy: Tensor.numpy
    ("torch f32", lambda: torch.arange(6, dtype=torch.float32), "numpy", True),
    ("torch 2-D.T", lambda: torch.arange(6.0).reshape(2, 3).T, "numpy", True),
    ("torch offset", lambda: torch.arange(8.0)[3:], "numpy", True),
    ("torch expanded", lambda: torch.arange(3.0).expand(2, 3), "numpy", True),
    ("torch 0-d", lambda: torch.tensor(2.5), "numpy", True),
    ("torch empty", lambda: torch.empty(0), "numpy", False),
    ("torch bool", lambda: torch.tensor([True, False]), "numpy", True),
    ("torch u16", lambda: torch.arange(4).to(torch.uint16), "numpy", True),
    ("torch c64", lambda: torch.arange(4).to(torch.complex64), "numpy", True),
    ("torch size-1 dim", lambda: torch.arange(3.0).reshape(1, 3).T, "numpy", True),
    ("torch requires_grad", lambda: torch.ones(3, requires_grad=True), "numpy", False),
    ("torch conj", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), "numpy", False),
    ("torch neg", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj().imag, "numpy", False),
    ("torch bf16", lambda: torch.arange(4.0).to(torch.bfloat16), "numpy", False),
    ("torch float8", lambda: torch.arange(4.0).to(torch.float8_e4m3fn), "numpy", False),
    ("torch Parameter", lambda: torch.nn.Parameter(torch.ones(2)), "numpy", False),
    # torch -> Arrow: Array.from_dlpack for rank 1
    ("torch f32", lambda: torch.arange(6, dtype=torch.float32), "arrow", True),
    ("torch offset", lambda: torch.arange(8.0)[3:], "arrow", True),
    ("torch i8", lambda: torch.arange(6, dtype=torch.int8), "arrow", True),
    ("torch 2-D", lambda: torch.ones(2, 3), "arrow", False),
    ("torch strided", lambda: torch.arange(8.0)[::2], "arrow", False),
    ("torch bool", lambda: torch.tensor([True, False]), "arrow", False),
    ("torch requires_grad", lambda: torch.ones(3, requires_grad=True), "arrow", False),
    # neg-bit views: torch's __dlpack__ would export the memory without the sign
    ("torch neg view", lambda: torch.arange(1.0, 4.0)._neg_view(), "arrow", False),
    ("torch neg imag", lambda: torch.tensor([1 + 2j, 3 + 4j]).conj().imag, "arrow", False),
    # Arrow -> NumPy: np.from_dlpack (copy=False: no legacy retry on refusal)
    ("arrow f32", lambda: pa.array(np.arange(6, dtype=np.float32)), "numpy", True),
    ("arrow i64 sliced", lambda: pa.array(np.arange(8))[3:], "numpy", True),
    ("arrow f16", lambda: pa.array(np.arange(3, dtype=np.float16)), "numpy", True),
    ("arrow u8", lambda: pa.array(np.arange(3, dtype=np.uint8)), "numpy", True),
    ("arrow empty", lambda: pa.array([], pa.float64()), "numpy", False),
    ("arrow nulls", lambda: pa.array([1.0, None], pa.float32()), "numpy", False),
    ("arrow bool", lambda: pa.array([True, False]), "numpy", False),
    ("arrow timestamp", lambda: pa.array([1], pa.timestamp("s")), "numpy", False),
    # Arrow -> torch: a capsule into torch.from_dlpack, plus the read-only notice
    ("arrow f32", lambda: pa.array(np.arange(6, dtype=np.float32)), "torch", True),
    ("arrow i64 sliced", lambda: pa.array(np.arange(8))[3:], "torch", True),
    ("arrow empty", lambda: pa.array([], pa.float64()), "torch", True),
    ("arrow nulls", lambda: pa.array([1.0, None], pa.float32()), "torch", False),
    ("arrow bool", lambda: pa.array([True, False]), "torch", False),
    # torch -> JAX: jnp.from_dlpack's own calls with torch's capsule
    *[(label, make, "jax", shortcut) for label, make, shortcut in [
        ("torch f32", lambda: _torch_aligned(torch.float32, (6,)), True),
        ("torch 2-D", lambda: _torch_aligned(torch.int32, (2, 3)), True),
        ("torch 2-D.T", lambda: _torch_aligned(torch.float32, (2, 3)).T, True),
        ("torch 3-D permuted", lambda: _torch_aligned(torch.int16, (2, 3, 4)).permute(2, 0, 1),
         True),
        ("torch 0-d", lambda: _torch_aligned(torch.float32, ()), True),
        ("torch empty", lambda: torch.empty(0), True),
        ("torch empty 3-D", lambda: torch.empty(3, 0, 5), True),
        ("torch size-1 dim", lambda: _torch_aligned(torch.float32, (3, 1)).T, True),
        # contiguous, with torch's own strides on the size-1 dimension: JAX must get
        # compact ones (another layout otherwise, which memoryview then refuses)
        ("torch column vector", lambda: _torch_aligned(torch.float32, (1, 3)).T, True),
        ("torch HWC -> CHW, C=1", lambda: _torch_aligned(torch.float32, (4, 5, 1))
         .permute(2, 0, 1), True),
        ("torch from_numpy", lambda: torch.from_numpy(_np(shape=(2, 3))), True),
        ("torch bool", lambda: _torch_aligned(torch.bool, (5,)), True),
        ("torch u8", lambda: _torch_aligned(torch.uint8, (5,)), True),
        ("torch u16", lambda: _torch_aligned(torch.uint16, (5,)), True),
        ("torch f16", lambda: _torch_aligned(torch.float16, (5,)), True),
        ("torch bf16", lambda: _torch_aligned(torch.bfloat16, (5,)), True),
        ("torch float8 e4m3fn", lambda: _torch_aligned(torch.float8_e4m3fn, (5,)), True),
        ("torch float8 e5m2", lambda: _torch_aligned(torch.float8_e5m2, (5,)), True),
        ("torch c64", lambda: _torch_aligned(torch.complex64, (5,)), True),
        ("torch offset (misaligned)", lambda: _torch_aligned(torch.float32, (8,))[1:], False),
        ("torch strided", lambda: _torch_aligned(torch.float32, (8,))[::2], False),
        ("torch expanded", lambda: _torch_aligned(torch.float32, (3,)).expand(2, 3), False),
        ("torch column slice", lambda: _torch_aligned(torch.float32, (4, 4))[:, :2], False),
        ("torch i64 (x64 off)", lambda: _torch_aligned(torch.int64, (3,)), False),
        ("torch f64 (x64 off)", lambda: _torch_aligned(torch.float64, (3,)), False),
        ("torch requires_grad", lambda: _torch_aligned(torch.float32, (3,)).requires_grad_(),
         False),
        ("torch conj", lambda: _torch_aligned(torch.complex64, (3,)).conj(), False),
        ("torch neg view", lambda: _torch_aligned(torch.float32, (3,))._neg_view(), False),
        ("torch Parameter", lambda: torch.nn.Parameter(_torch_aligned(torch.float32, (2,))),
         False),
        ("torch fp4 x2", lambda: _torch_aligned(torch.uint8, (4,)).view(torch.float4_e2m1fn_x2),
         False),
        ("torch quantized", _torch_quantized, False),
    ]],
    # hb.Tensor -> NumPy: the core's host view, for compact whole-byte host tensors
    ("hb f32", lambda: hb.asarray(_np()), "numpy", True),
    ("hb 2-D", lambda: hb.asarray(_np(shape=(2, 3))), "numpy", True),
    ("hb 0-d", lambda: hb.asarray(_np(shape=())), "numpy", True),
    ("hb read-only", lambda: hb.asarray(_readonly(_np())), "numpy", True),
    ("hb bool", lambda: hb.asarray(_np(bool)), "numpy", True),
    ("hb bfloat16", lambda: hb.asarray(_np(ml_dtypes.bfloat16)), "numpy", True),
    ("hb empty", lambda: hb.asarray(_np(shape=(0,))), "numpy", False),
    ("hb strided", lambda: hb.asarray(_np(shape=(8,))[::2]), "numpy", False),
    ("hb int4 padded", lambda: hb.asarray(_np(ml_dtypes.int4)), "numpy", False),
    ("hb torch bf16", lambda: hb.asarray(torch.arange(4.0).to(torch.bfloat16)), "numpy", True),
    # hb.Tensor -> other targets: their from_hurray has rules of its own (full path)
    ("hb f32", lambda: hb.asarray(_np()), "torch", False),
    ("hb f32", lambda: hb.asarray(_np()), "arrow", False),
]


def _tf_cases() -> list[tuple[str, Callable[[], Any], str, bool]]:
    """TensorFlow -> NumPy: its buffer protocol (no bfloat16 format); -> torch: its own
    read-only capsule. NumPy and torch -> TensorFlow: its DLPack import of writable,
    compact, 64-byte aligned memory, bool bytes 0 and 1 only."""
    if tf is None:
        return []

    def bool_byte_2() -> Any:
        a = _np(np.uint8)
        a[1] = 2
        return a.view(np.bool_)

    return [
        ("tf f32", lambda: tf.constant(np.arange(6, dtype=np.float32)), "numpy", True),
        ("tf 2-D", lambda: tf.ones((2, 3), tf.int32), "numpy", True),
        ("tf 0-d", lambda: tf.constant(3.0), "numpy", True),
        ("tf empty", lambda: tf.zeros((0, 2)), "numpy", True),
        ("tf bool", lambda: tf.constant([True, False]), "numpy", True),
        ("tf c128", lambda: tf.constant([1 + 2j], tf.complex128), "numpy", True),
        ("tf bf16", lambda: tf.range(3.0, dtype=tf.bfloat16), "numpy", False),
        ("tf string", lambda: tf.constant(["a"]), "numpy", False),
        ("tf variable", lambda: tf.Variable([1.0, 2.0]), "numpy", False),
        ("tf f32", lambda: tf.constant(np.arange(6, dtype=np.float32)), "torch", True),
        ("tf bf16", lambda: tf.range(3.0, dtype=tf.bfloat16), "torch", True),
        ("tf string", lambda: tf.constant(["a"]), "torch", False),
        ("np f32", lambda: _np(), "tensorflow", True),
        ("np 2-D", lambda: _np(shape=(2, 3)), "tensorflow", True),
        ("np 0-d", lambda: _np(shape=()), "tensorflow", True),
        ("np bool", lambda: _np(bool), "tensorflow", True),
        # NumPy's own DLPack export has no bfloat16: the full path builds the capsule.
        ("np bfloat16", lambda: _np(ml_dtypes.bfloat16), "tensorflow", False),
        ("np bool byte 2", bool_byte_2, "tensorflow", False),
        ("np misaligned", _misaligned, "tensorflow", False),
        ("np read-only", lambda: _readonly(_np()), "tensorflow", False),
        ("np strided", lambda: _np(shape=(8,))[::2], "tensorflow", False),
        ("np fortran", lambda: np.asfortranarray(_np(shape=(2, 3))), "tensorflow", False),
        ("np empty", lambda: _np(shape=(0,)), "tensorflow", False),
        ("np big-endian", lambda: _np(">f4"), "tensorflow", False),
        ("np datetime", lambda: np.zeros(3, "datetime64[s]"), "tensorflow", False),
        ("torch f32", lambda: _torch_aligned(torch.float32, (2, 3)), "tensorflow", True),
        ("torch grad", lambda: torch.ones(3, requires_grad=True), "tensorflow", False),
    ]


CASES += _tf_cases()




def _pointer(out: Any) -> int:
    if isinstance(out, np.ndarray):
        return int(out.__array_interface__["data"][0])
    if isinstance(out, torch.Tensor):
        return int(out.data_ptr())
    buf = out.buffers()[1]
    return int(buf.address) + out.offset * out.type.bit_width // 8


def _strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int | None, ...]:
    """Strides where they mean something: a dimension of size 1 is never stepped over,
    and an empty array has no elements to step to, so frameworks record any value there
    (torch.from_numpy keeps NumPy's, the full path writes compact ones)."""
    if 0 in shape:
        return (None,) * len(shape)
    return tuple(s if d > 1 else None for d, s in zip(shape, strides))


def _observe(out: Any) -> tuple[Any, ...]:
    """Everything a caller can see of a result (pointer only where there is memory)."""
    if isinstance(out, np.ndarray):
        return ("numpy", out.dtype.str, out.shape, _strides(out.shape, out.strides),
                out.flags.writeable, out.tobytes(), _pointer(out) if out.size else None)
    if isinstance(out, torch.Tensor):
        flat = out.detach().flatten().clone(memory_format=torch.contiguous_format)
        data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        shape = tuple(out.shape)
        return ("torch", out.dtype, shape, _strides(shape, out.stride()), out.requires_grad,
                out.is_neg(), data, _pointer(out) if out.numel() else None)
    if isinstance(out, jax.Array):
        host = np.asarray(out)
        return ("jax", str(out.dtype), out.shape, repr(out.format), out.committed,
                host.tobytes(), out.unsafe_buffer_pointer() if out.size else None)
    if tf is not None and isinstance(out, tf.Tensor):
        size = int(tf.size(out))
        return ("tensorflow", out.dtype.name, tuple(out.shape), out.numpy().tobytes(),
                _tf_pointer(out) if size else None)
    if isinstance(out, (pa.Array, pa.Tensor)):
        return (type(out), str(out.type), out.to_pylist() if isinstance(out, pa.Array)
                else out.to_numpy().tolist(), _pointer(out) if isinstance(out, pa.Array)
                and len(out) else None)
    return (type(out), repr(out))


def _tf_pointer(x: Any) -> int:
    from hurray_bridge import _capsule

    return int(_capsule.consume_capsule(tf.experimental.dlpack.to_dlpack(x)).data)


def _source_pointer(obj: Any) -> int | None:
    try:
        if tf is not None and isinstance(obj, tf.Tensor):
            return _tf_pointer(obj)
        if isinstance(obj, hb.Tensor):
            return obj.data_ptr
        if isinstance(obj, (np.ndarray, torch.Tensor, pa.Array)):
            return _pointer(obj)
        return int(obj.unsafe_buffer_pointer())
    except Exception:
        return None


def _run(fn: Callable[..., Any], obj: Any, to: str) -> tuple[Any, ...]:
    hb_torch._readonly_warned = False  # the notice is once per process: reset for both runs
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(obj, to)
        except Exception as exc:
            res: tuple[Any, ...] = ("error", type(exc), str(exc))
        else:
            # Copies land at different addresses: what must match is whether the
            # result shares the source's memory.
            *rest, ptr = _observe(out)
            res = (*rest, None if ptr is None else ptr == _source_pointer(obj))
    return (res, sorted((w.category.__name__, str(w.message)) for w in caught))


@pytest.fixture(params=IMPLS)
def front(request: pytest.FixtureRequest) -> Any:
    calls: list[Any] = []

    def general(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return GENERAL(*args, **kwargs)

    f = _shortcuts.front(general, use_compiled=request.param == "compiled")
    f.calls = calls
    return f


@pytest.mark.parametrize("label,make,to,shortcut", CASES,
                         ids=[f"{c[0]}->{c[2]}" for c in CASES])
def test_shortcut_answers_as_the_full_path(front: Any, label: str, make: Callable[[], Any],
                                           to: str, shortcut: bool) -> None:
    obj = make()
    expected = _run(GENERAL, obj, to)
    if expected[0][0] != "error":
        # The full path has converted this type to this target once: the pair is learned.
        assert to in _shortcuts.TABLE[type(obj)]
    front.calls.clear()
    got = _run(front, obj, to)
    assert got == expected
    taken = not front.calls
    assert taken is shortcut, f"{label} -> {to}: shortcut taken={taken}, expected {shortcut}"
    # copy=False ("never copy") is served too: the same answer as the full path's, a
    # CopyRequiredError included, and the same inputs take the shortcut.
    strict = _run(lambda o, t: GENERAL(o, t, copy=False), obj, to)
    front.calls.clear()
    assert _run(lambda o, t: front(o, t, copy=False), obj, to) == strict
    assert (not front.calls) is shortcut


PLAIN = [c for c in CASES if c[3] and "empty" not in c[0]]


@pytest.mark.parametrize("label,make,to,shortcut", PLAIN, ids=[f"{c[0]}->{c[2]}" for c in PLAIN])
def test_shortcut_result_keeps_its_source_alive(frozen_heap: None, front: Any, label: str,
                                                make: Callable[[], Any], to: str,
                                                shortcut: bool) -> None:
    obj = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        GENERAL(obj, to)  # learn
        out = front(obj, to)
    want = _observe(out)
    assert not front.calls
    del obj
    for _ in range(3):
        gc.collect()
    junk = [np.full(64, 7.0) for _ in range(64)]  # reuse of freed memory would show
    assert _observe(out) == want
    del junk


def test_hb_convert_learns_and_takes_the_shortcut() -> None:
    _shortcuts.clear()
    x = _np()
    assert np.ndarray not in _shortcuts.TABLE
    a = hb.convert(x, "torch")
    entry = _shortcuts.TABLE[np.ndarray]["torch"]
    assert entry is not None
    b = hb.convert(x, "torch")
    assert a.data_ptr() == b.data_ptr() == x.ctypes.data
    # copy=None/False keep the shortcut; other forms take the full path: same answer.
    assert hb.convert(x, "torch", copy=False).data_ptr() == x.ctypes.data
    assert hb.convert(x, "torch", None).data_ptr() == x.ctypes.data
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(x[::-1], "torch", copy=False)  # declined: the full path refuses


def test_aliases_are_learned_separately() -> None:
    _shortcuts.clear()
    x = _np()
    hb.convert(x, "pa")
    assert "pa" in _shortcuts.TABLE[np.ndarray] and "arrow" not in _shortcuts.TABLE[np.ndarray]
    assert hb.convert(x, "pa").type == pa.float32()


def test_a_pair_without_a_shortcut_is_remembered_as_none() -> None:
    _shortcuts.clear()
    hb.convert(_np(), "jax")
    assert _shortcuts.TABLE[np.ndarray]["jax"] is None


def test_copy_and_device_calls_never_learn() -> None:
    _shortcuts.clear()
    hb.convert(_np(), "torch", copy=True)
    hb.convert(_np(), "torch", device="cpu")
    assert np.ndarray not in _shortcuts.TABLE
    hb.convert(_np(), "torch", copy=False)  # "never copy" learns, as plain calls do
    assert _shortcuts.TABLE[np.ndarray]["torch"] is not None


def test_front_looks_like_convert() -> None:
    import inspect

    assert hb.convert.__name__ == "convert"
    assert "zero-copy" in (hb.convert.__doc__ or "")
    assert list(inspect.signature(hb.convert).parameters) == [
        "obj", "to", "device", "copy", "densify", "options"]


# ------------------------------------------------------------- the front's contract
class Thing:
    flag = 1


@pytest.mark.parametrize("impl", IMPLS)
def test_front_contract(impl: str) -> None:
    seen: list[Any] = []

    def general(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, kwargs))
        return "general"

    E = _shortcuts.entry
    table: dict[type, dict[str, Any]] = {}
    f = (_shortcuts._Dispatcher(general, table) if impl == "compiled"
         else _shortcuts._python_front(general, table))
    t = Thing()
    assert f(t, "x") == "general"  # miss
    table[Thing] = {"x": E(lambda o: "short")}
    assert f(t, "x") == "short"
    assert f(t, "x", None) == "general" and f(t, "x", device=None) == "general"
    assert f(t, "x", copy=None) == "short" and f(t, "x", copy=False) == "short"
    assert f(t, "x", copy=True) == "general" and f(t, "x", copy=0) == "general"
    assert f(t, "x", copy=False, device=None) == "general"
    assert f(t, to="x") == "general"
    # guard: attr must equal value
    table[Thing]["g"] = E(lambda o: "guarded", guard=("flag", 1))
    assert f(t, "g") == "guarded"
    table[Thing]["h"] = E(lambda o: "guarded", guard=("flag", 2))
    assert f(t, "h") == "general"
    table[Thing]["m"] = E(lambda o: "guarded", guard=("missing", 2))
    assert f(t, "m") == "general"
    # keyword arguments for fn
    table[Thing]["k"] = E(lambda o, *, a, b: (a, b), kwargs={"a": 1, "b": 2})
    assert f(t, "k") == (1, 2)
    assert E(len, kwargs={"a": 1}) == (len, None, None, ("a",), (1,), False)
    with pytest.raises(ValueError, match="at most 4"):
        E(len, kwargs={str(i): i for i in range(5)})
    # nonempty: len(obj) > 0, and an object without a length falls through
    table[list] = {"l": E(lambda o: "full", nonempty=True)}
    assert f([1], "l") == "full" and f([], "l") == "general"
    table[Thing]["l"] = table[list]["l"]
    assert f(t, "l") == "general"
    # NotImplemented and Exceptions fall through; other BaseExceptions do not
    table[Thing]["n"] = E(lambda o: NotImplemented)
    assert f(t, "n") == "general"

    def boom(o: Any) -> Any:
        raise ValueError("no")

    table[Thing]["e"] = E(boom)
    assert f(t, "e") == "general"

    def stop(o: Any) -> Any:
        raise KeyboardInterrupt

    table[Thing]["s"] = E(stop)
    with pytest.raises(KeyboardInterrupt):
        f(t, "s")
    table[Thing]["none"] = None
    assert f(t, "none") == "general"
    assert f(t, 3) == "general"  # not a target name
    # Anything but entry()'s shape is ignored alike by both fronts.
    for bad in [(lambda o: "short",), (lambda o: "short", None, None),
                (lambda o: "short", None, None, ("a",), (), False),
                (lambda o: "short", None, None, (), (), False, 7), [E(len)]]:
        table[Thing]["bad"] = bad
        assert f(t, "bad") == "general", bad
    assert len(seen) == 20


@pytest.mark.skipif(not _shortcuts.compiled, reason="hurray_bridge._speedups was not built")
def test_compiled_cache_is_dropped_by_forget() -> None:
    table: dict[type, dict[str, Any]] = {Thing: {"x": _shortcuts.entry(lambda o: "short")}}
    f = _shortcuts._Dispatcher(lambda *a, **k: "general", table)
    t = Thing()
    assert f(t, "x") == "short"
    table.clear()
    assert f(t, "x") == "short"  # served from the last-entry cache
    f.forget()
    assert f(t, "x") == "general"
    assert "compiled shortcut front" in repr(f)


# ------------------------------------------------ copies made on the source side
@pytest.mark.parametrize("label,make,to", [
    ("numpy big-endian", lambda: np.arange(4, dtype=">f4"), "torch"),
    ("numpy big-endian", lambda: np.arange(4, dtype=">f4"), "numpy"),
    ("torch conj", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), "numpy"),
    ("torch neg", lambda: torch.tensor([1 + 2j, 3 - 1j]).conj().imag, "arrow"),
    ("arrow chunks", lambda: pa.chunked_array([[1.0, 2.0], [3.0]], pa.float32()), "torch"),
])
def test_a_copy_on_the_source_side_is_reported(label: str, make: Callable[[], Any],
                                               to: str) -> None:
    # A framework result has no ``copied`` flag: the warning is the only report.
    x = make()
    assert hb.asarray(x).copied
    with pytest.warns(hb.CopyWarning, match="could not be read in place") as rec:
        hb.convert(x, to)
    assert rec[0].filename == __file__  # points at the caller
    with pytest.raises(hb.CopyRequiredError):
        hb.convert(x, to, copy=False)


def test_without_the_compiled_module_convert_runs_the_same_steps_in_python() -> None:
    import json
    import subprocess
    import sys

    code = (
        "import sys, json; sys.modules['hurray_bridge._speedups'] = None\n"
        "import numpy as np, hurray_bridge as hb\n"
        "from hurray_bridge import _shortcuts\n"
        "x = np.arange(6, dtype=np.float32)\n"
        "a = hb.convert(x, 'torch'); b = hb.convert(x, 'torch')\n"
        "print(json.dumps([_shortcuts.compiled, type(hb.convert).__name__,\n"
        "  _shortcuts.TABLE[np.ndarray]['torch'] is not None,\n"
        "  a.data_ptr() == b.data_ptr() == x.ctypes.data]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, "function", True, True]


@pytest.mark.parametrize("impl", IMPLS)
def test_device_memory_never_takes_a_shortcut(impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: the shortcuts' device checks are read from the objects, so objects
    # that say they live elsewhere must reach the full path untouched.
    calls: list[Any] = []

    def general(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return "full path"

    f = _shortcuts.front(general, use_compiled=impl == "compiled")
    j = jnp.arange(3.0)
    hb.convert(j, "torch")  # learn jax -> torch
    t = torch.arange(3.0)
    hb.convert(t, "arrow")  # learn torch -> arrow

    class NotCpu:
        """Forwards everything to the real array but reports another platform."""

        def __init__(self, x: Any) -> None:
            self.x = x

        def platform(self) -> str:
            return "gpu"

        def __getattr__(self, name: str) -> Any:
            return getattr(self.x, name)

    _shortcuts.TABLE[NotCpu] = {"torch": _shortcuts.TABLE[type(j)]["torch"]}
    assert f(NotCpu(j), "torch") == "full path"
    monkeypatch.setattr(torch.Tensor, "is_cpu", property(lambda self: False))
    assert f(t, "arrow") == "full path"
    assert len(calls) == 2


def test_warnings_as_errors_reach_the_caller_through_either_path() -> None:
    # Under -W error a shortcut's warning is an exception, so the front retries the full
    # path, which must raise it again (the once-per-process notice counts as given only
    # when it went out).
    x = pa.array(np.arange(4, dtype=np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hb.convert.general(x, "torch")  # learn the pair
    assert _shortcuts.TABLE[type(x)]["torch"] is not None
    hb_torch._readonly_warned = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(UserWarning, match="read-only memory"):
                hb.convert(x, "torch")
    assert not hb_torch._readonly_warned
    with pytest.warns(UserWarning, match="read-only memory") as rec:
        hb.convert(x, "torch")
    assert rec[0].filename == __file__  # the caller's line, not the library's


def test_serves_tells_a_served_call_from_a_declined_one() -> None:
    _shortcuts.clear()
    x = _np()
    assert not _shortcuts.serves(x, "torch")  # nothing learned yet
    hb.convert(x, "torch")
    assert _shortcuts.serves(x, "torch")
    # The entry exists for np.ndarray, but read-only arrays are declined.
    assert not _shortcuts.serves(_readonly(_np()), "torch")
    assert not _shortcuts.serves(x, "jax")  # learned as "no shortcut"
