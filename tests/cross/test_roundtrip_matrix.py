"""The round-trip matrix: producer x consumer x dtype x shape over NumPy, torch, JAX, Arrow,
TensorFlow, MLX and, where it is installed, Paddle.

Every cell hands one tensor over with ``hb.convert`` and checks three things:
the values are bit-exact; the outcome (zero-copy, reported copy, or refusal)
is the one the compatibility contract below predicts; and on a zero-copy
outcome the consumer's data pointer is the producer's. Sources are built with
each framework's own API from one NumPy reference, never through the bridge.

``contract`` is the one table of what cannot be zero-copy and why.
``cannot_hold`` is the one table of what a producer can never make: those cells
are not generated, so every cell collected hands a tensor over and asserts. A
cell this configuration cannot run (a framework or ml_dtypes not installed,
JAX without ``jax_enable_x64``) is a skip that says so.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from tests.frameworks import need, optional

np = pytest.importorskip("numpy", reason="numpy is not installed")
# Every other framework is optional: a cell runs when both of its ends are installed.
torch = optional("torch")
jax = optional("jax")
jnp = optional("jax.numpy")
pa = optional("pyarrow")
mx = optional("mlx.core")
ml_dtypes = optional("ml_dtypes")
# Paddle only where it is installed (a large wheel, outside the test extra), as CuPy in
# tests/frameworks.py; None also where it cannot share this process (its cells then skip).
paddle = optional("paddle")

from hurray_bridge.adapters import numpy as np_adapter  # noqa: E402

FRAMEWORKS = ("numpy", "torch", "jax", "arrow", "tensorflow", "mlx") + (
    ("paddle",) if importlib.util.find_spec("paddle") is not None else ())
SPELT = {"numpy": "NumPy", "torch": "torch", "jax": "JAX", "arrow": "Arrow",
         "tensorflow": "TensorFlow", "mlx": "MLX", "paddle": "Paddle"}
# TensorFlow's element types (the table has no TensorFlow column); those of TF_BY_VALUE
# its DLPack refuses, so they reach it through tf.constant, a copy.
TF_BY_VALUE = frozenset({"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                         "float4_e2m1fn", "int4", "uint4", "int2", "uint2"})
TF_TYPES = frozenset({"bool8", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                      "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                      "complex128"}) | TF_BY_VALUE
# Sources whose memory is read-only: TensorFlow gets a copy of it (its in-place ops write).
# (An n-D Arrow source is a pa.Tensor, which is writable: only 1-D Arrow arrays are here.)
READ_ONLY = {"jax": "JAX arrays are immutable", "arrow": "Arrow arrays are immutable",
             "tensorflow": "TensorFlow's exports are read-only"}

# MLX has no column in the element-type table (its adapter derives its types from their
# names): the types mlx 0.32.4 holds, which tests/adapters/mlx checks against the adapter.
MLX_TYPES = frozenset({"bool8", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                       "uint64", "float16", "bfloat16", "float32", "float64", "complex64"})

# The types Paddle 3.3.1 holds (measured: tests/adapters/paddle). The element-type table has
# no Paddle column; Paddle's uint16/32/64 have no kernels and are refused.
PADDLE_TYPES = frozenset({"bool8", "int8", "int16", "int32", "int64", "uint8", "float16",
                          "bfloat16", "float32", "float64", "complex64", "complex128",
                          "float8_e4m3fn", "float8_e5m2"})
PADDLE_MAX_RANK = 9

def _tf() -> Any:
    """TensorFlow, imported only by the cells that use it (a 2-3 s import, kept out of the
    collection of every other cell and of the modules that import this one)."""
    import tensorflow

    return tensorflow


X64 = bool(jax and jax.config.jax_enable_x64)

SHAPES: dict[str, tuple[int, ...]] = {
    "empty_0": (0,),
    "empty_3_0_5": (3, 0, 5),
    "rank_0": (),
    "vector_7": (7,),
    "matrix_2x3": (2, 3),
    "transposed_3x4": (4, 3),  # built as a (3, 4) array, then transposed: a strided view
    "rank_32": (1,) * 30 + (2, 3),
}
DTYPES = [d for d in hb.dtypes.all_dtypes()]


def _c(a: np.ndarray) -> np.ndarray:
    """A C-contiguous copy that keeps rank 0 (np.ascontiguousarray makes it rank 1)."""
    return np.array(a, order="C")


def reference(dtype: hb.DType, shape: tuple[int, ...]) -> np.ndarray:
    """Distinct, representable values of ``dtype`` (one code per byte for sub-byte types)."""
    n = int(np.prod(shape)) if shape else 1
    if dtype.bits == 1 or dtype is hb.bool8:
        return (np.arange(n) % 3 == 0).reshape(shape)
    nd = np_adapter.native_dtype(dtype)
    if dtype.is_subbyte:
        return (np.arange(n) % (1 << dtype.bits)).astype(np.uint8).view(nd).reshape(shape)
    vals = np.arange(n, dtype=np.int64) % 7 + 1
    if dtype.kind == hb.dtypes.Kind.COMPLEX:
        return (vals + 2j * vals).astype(nd).reshape(shape)
    return vals.astype(nd).reshape(shape)


def _strided(shape_name: str, a: np.ndarray) -> np.ndarray:
    return a.T if shape_name.startswith("transposed") else a


# ------------------------------------------------------------------ sources
def make_numpy(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    return _strided(shape_name, reference(dtype, base))


def make_torch(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    ref = reference(dtype, base)
    tdt = getattr(torch, dtype.torch)
    if (
        ref.dtype.kind == "V"
        or (ml_dtypes is not None and ref.dtype.name in vars(ml_dtypes))
        or (dtype.kind.name == "FLOAT" and ref.dtype.itemsize == 1)
    ):
        raw = torch.from_numpy(_c(ref).view(f"u{ref.dtype.itemsize}")).clone()
        x = raw.view(tdt)
    else:
        x = torch.from_numpy(_c(ref)).clone()
    return x.T if shape_name.startswith("transposed") else x


def make_jax(dtype: hb.DType, shape_name: str) -> Any:
    return jnp.asarray(reference(dtype, SHAPES[shape_name]))


def make_paddle(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    transposed = shape_name.startswith("transposed")
    ref = _c(reference(dtype, shape[::-1] if transposed else shape))
    pdt = getattr(paddle, "bool" if dtype is hb.bool8 else dtype.name)
    if ml_dtypes is not None and ref.dtype.name in vars(ml_dtypes):
        # paddle.to_tensor reads neither ml_dtypes nor uint16 (it makes bfloat16 of it):
        # the codes as signed integers, re-typed by Paddle's own view.
        x = paddle.to_tensor(ref.view(f"i{ref.dtype.itemsize}")).view(pdt)
    else:
        x = paddle.to_tensor(ref)
    assert x.dtype == pdt, (x.dtype, pdt)
    return x.T if transposed else x


def make_arrow(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    if dtype.bits == 1:
        return pa.array(reference(dtype, shape).tolist(), pa.bool_())
    if dtype is hb.bool8:
        storage = pa.array(reference(dtype, shape).astype(np.int8))
        return pa.ExtensionArray.from_storage(pa.bool8(), storage)
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    ref = reference(dtype, base)
    if len(shape) == 1:
        return pa.array(ref)
    return pa.Tensor.from_numpy(_strided(shape_name, ref))


def make_tensorflow(dtype: hb.DType, shape_name: str) -> Any:
    return _tf().constant(reference(dtype, SHAPES[shape_name]))


def make_mlx(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    # dtype= named: MLX narrows float64 to float32 when left to choose.
    x = mx.array(reference(dtype, base), dtype=getattr(mx, "bool_" if dtype is hb.bool8
                                                        else dtype.name))
    return x.T if shape_name.startswith("transposed") else x  # an MLX strided view


MAKERS: dict[str, Callable[[hb.DType, str], Any]] = {
    "numpy": make_numpy,
    "torch": make_torch,
    "jax": make_jax,
    "arrow": make_arrow,
    "tensorflow": make_tensorflow,
    "mlx": make_mlx,
    "paddle": make_paddle,
}


# ------------------------------------------------------- what a producer holds
def cannot_hold(fw: str, dtype: hb.DType, shape_name: str) -> str | None:
    """Why ``fw`` can never hold ``dtype`` in this shape, whatever its version or
    settings, or None. The element types are the framework's column of the project's
    element-type table (``hb.dtypes``, fields named as the frameworks are); the shapes
    follow each framework's array model. A producer's cells for these are not
    generated; a consumer's are refusals (``contract``).
    """
    if fw == "tensorflow":
        if dtype.name not in TF_TYPES:
            return f"TensorFlow has no {dtype.name}"
        if shape_name.startswith("transposed"):
            return "TensorFlow tensors are always compact: a strided view cannot be made"
        return None
    if fw == "mlx":
        return None if dtype.name in MLX_TYPES else f"MLX has no {dtype.name}"
    if fw == "paddle":
        if dtype.name not in PADDLE_TYPES:
            return f"Paddle has no {dtype.name}"
        if len(SHAPES[shape_name]) > PADDLE_MAX_RANK:
            return f"Paddle holds at most {PADDLE_MAX_RANK} dimensions"
        return None
    if getattr(dtype, fw) is None:
        return f"{SPELT[fw]} has no {dtype.name}"
    if fw == "torch" and dtype.is_subbyte:
        return (f"torch holds {dtype.name} only as packed pairs ({dtype.torch}), "
                "which tests/adapters/torch covers")
    if fw == "jax" and shape_name.startswith("transposed"):
        return "JAX arrays are always compact: a strided view cannot be made"
    if fw == "arrow" and len(SHAPES[shape_name]) != 1:
        if dtype.bits == 1:
            return "Arrow booleans are 1-D arrays"
        if dtype is hb.bool8:
            return "Arrow tensors hold no booleans"
    return None


def config_gap(src: str, dtype: hb.DType) -> str | None:
    """Why this configuration cannot make the source, where another one can."""
    if src == "jax" and dtype in WIDE and not X64:
        return (f"jax_enable_x64 is off: JAX holds {dtype.name} only narrowed to 32 bits "
                "(JAX_ENABLE_X64=1 runs this cell)")
    return None


def pointer(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0] if x.size else 0
    if torch and isinstance(x, torch.Tensor):
        return x.data_ptr()
    if jax and isinstance(x, jax.Array):
        return x.unsafe_buffer_pointer() if x.size else 0
    if paddle and isinstance(x, paddle.Tensor):
        return int(x.data_ptr())
    return hb.asarray(x).data_ptr  # pyarrow and TensorFlow expose no address


def logical(x: Any) -> np.ndarray:
    """The consumer's values as a NumPy array of element codes, read with its own API."""
    if torch and isinstance(x, torch.Tensor):
        x = x.contiguous()
        if x.dtype == torch.bool or x.element_size() == 0:
            return x.numpy().astype(np.uint8)
        return (
            x.view(getattr(torch, f"uint{8 * x.element_size()}")).numpy()
            if x.element_size() in (1, 2, 4, 8)
            else x.numpy()
        )
    if jax and isinstance(x, jax.Array):
        x = np.asarray(x)
    if type(x).__module__.startswith("tensorflow."):
        x = x.numpy()
    if mx and isinstance(x, mx.array):  # (NumPy reads no bfloat16 from MLX: its bits)
        x = np.array(x.view(mx.uint16) if x.dtype == mx.bfloat16 else x)
    if paddle and isinstance(x, paddle.Tensor):
        x = x.numpy()  # bfloat16 as uint16 codes, float8 as int8 codes: still the bytes
    if pa and isinstance(x, pa.Tensor):
        x = x.to_numpy()
    if pa and isinstance(x, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_boolean(x.type) or isinstance(x.type, pa.Bool8Type):
            return np.array(x.to_pylist(), np.uint8)
        x = x.to_numpy(zero_copy_only=False)
    a = _c(x)
    if a.dtype == np.bool_:
        return a.astype(np.uint8)
    if a.dtype.itemsize == 1 and a.dtype.name in (
        "int4",
        "uint4",
        "int2",
        "uint2",
        "float4_e2m1fn",
    ):
        bits = 2 if "2" in a.dtype.name[-1] and "float" not in a.dtype.name else 4
        return a.view(np.uint8) & np.uint8((1 << bits) - 1)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.itemsize in (1, 2, 4, 8) else a


# --------------------------------------------------------------- the contract
WIDE = frozenset({hb.int64, hb.uint64, hb.float64, hb.complex128})


def contract(src: str, dst: str, dtype: hb.DType, shape_name: str, x: Any) -> tuple[str, str]:
    """("zero-copy" | "copy" | "refused", why) for one hand-off.

    Sub-byte elements arrive packed from JAX (XLA stores int4/int2/fp4 packed on
    CPU) and padded, one per byte, from NumPy/ml_dtypes.
    """
    shape = SHAPES[shape_name]
    empty = 0 in shape
    strided = shape_name.startswith("transposed")
    packed = dtype.is_subbyte and (src == "jax" or dtype.bits == 1)
    if dst == "mlx":
        if src == "mlx":
            return "zero-copy", "a whole view of an MLX array gives the array back"
        if dtype.bits == 1:
            return "copy", "MLX has no 1-bit bool: unpacked to bool_"
        gap = cannot_hold("mlx", dtype, shape_name)
        if gap:
            return "refused", gap
        return "copy", "MLX copies every import of host memory"
    if dst == "jax":
        if dtype in WIDE and not X64:
            return "refused", "jax_enable_x64 is off: JAX would narrow 64-bit types silently"
        if dtype.bits == 1:
            return "copy", "JAX has no 1-bit bool: unpacked to bool"
        if dtype.is_subbyte:
            if src == "jax":
                return "zero-copy", "the same JAX array"
            return "copy", "JAX's DLPack has no sub-byte types: built from the values"
        if not empty and pointer(x) % 64:
            return "copy", "JAX aliases CPU memory only when it is 64-byte aligned"
        return "zero-copy", "a transpose is a layout JAX accepts" if strided else ""
    if dst == "arrow":
        gap = cannot_hold("arrow", dtype, shape_name)
        return ("refused", gap) if gap else ("zero-copy", "")
    if dst == "torch":
        if dtype is hb.float4_e2m1fn and packed and shape and shape[-1] % 2 == 0:
            return "zero-copy", "packed fp4 with an even last dim is torch's float4_e2m1fn_x2"
        if dtype.is_subbyte and dtype.bits != 1:
            return "refused", "torch has no sub-byte ints, and fp4 only as packed pairs"
        if dtype.bits == 1:
            return "copy", "torch has no 1-bit bool: unpacked to torch.bool"
        return "zero-copy", ""
    if dst == "numpy":
        if packed:
            return "copy", "NumPy (ml_dtypes) holds sub-byte types one per byte: unpacked"
        return "zero-copy", ""
    if dst == "tensorflow":
        if dtype.bits == 1:
            return "copy", "TensorFlow has no 1-bit bool: unpacked to tf.bool"
        gap = cannot_hold("tensorflow", dtype, "vector_7")
        if gap:
            return "refused", gap
        if src == "tensorflow":
            return "zero-copy", "the same tensor"
        if dtype.name in TF_BY_VALUE:
            return "copy", "TensorFlow's DLPack has no such type: built from the values"
        if src in READ_ONLY and (src != "arrow" or len(shape) == 1):
            return "copy", f"{READ_ONLY[src]}, and TensorFlow's in-place ops would write them"
        if strided:
            return "copy", "TensorFlow imports compact memory only"
        if not empty and pointer(x) % 64:
            return "copy", "TensorFlow's kernels abort on memory not 64-byte aligned"
        return "zero-copy", ""
    if dst == "paddle":
        if dtype.bits == 1:
            return "copy", "Paddle has no 1-bit bool: unpacked to paddle.bool"
        gap = cannot_hold("paddle", dtype, shape_name)
        if gap:
            return "refused", gap
        if hb.asarray(x).readonly:  # JAX arrays, Arrow arrays' buffers
            return "copy", f"{SPELT[src]} memory is read-only, and Paddle ignores READ_ONLY"
        return "zero-copy", ""
    raise AssertionError(dst)


def _cases() -> list[Any]:
    """Every producer x consumer x dtype x shape, less what the producer cannot hold."""
    return [
        pytest.param(src, dst, dtype, shape, id=f"{src}->{dst}-{dtype.name}-{shape}")
        for src in FRAMEWORKS
        for dst in FRAMEWORKS
        for dtype in DTYPES
        for shape in SHAPES
        if cannot_hold(src, dtype, shape) is None
    ]


# What a cell can conclude; hand_over returns the one it asserted.
VERDICTS = frozenset({"refused", "empty", "zero-copy", "copy"})


@pytest.mark.parametrize("src,dst,dtype,shape_name", _cases())
def test_handoff(src: str, dst: str, dtype: hb.DType, shape_name: str) -> None:
    need(src, dst)
    if (dtype.numpy or "").startswith("ml_dtypes:"):
        need("ml_dtypes")  # the reference values are built with NumPy
    gap = config_gap(src, dtype)
    if gap:
        pytest.skip(gap)
    verdict = hand_over(src, dst, dtype, shape_name)
    # A path through hand_over that ends without reaching a verdict (a bare return)
    # would make this cell a pass that tested nothing.
    assert verdict in VERDICTS, f"the hand-off ended without a verdict: {verdict!r}"


def hand_over(src: str, dst: str, dtype: hb.DType, shape_name: str) -> str:
    """Hands one tensor over, asserts the outcome, and returns the verdict asserted."""
    x = MAKERS[src](dtype, shape_name)
    want, why = contract(src, dst, dtype, shape_name, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            y = hb.convert(x, dst)
        except hb.UnsupportedError as exc:
            assert want == "refused", f"refused unexpectedly: {exc}"
            return "refused"
    copied = [w for w in caught if issubclass(w.category, hb.CopyWarning)]
    assert want != "refused", f"expected a refusal ({why}), got {type(y).__name__}"
    ref = _c(
        reference(dtype, SHAPES[shape_name][::-1]).T
        if shape_name.startswith("transposed")
        else reference(dtype, SHAPES[shape_name])
    )
    got = logical(y)
    exp = logical(ref)
    assert got.shape == exp.shape or got.size == exp.size == 0, (got.shape, exp.shape)
    assert got.reshape(-1).tobytes() == exp.reshape(-1).tobytes(), "values differ"
    if 0 in SHAPES[shape_name]:
        assert pointer(y) == 0, "an empty tensor must come out without an allocation"
        return "empty"
    if want == "zero-copy":
        assert not copied, [str(w.message) for w in copied]
        assert pointer(y) == pointer(x), "zero-copy promised but the data pointer changed"
        return "zero-copy"
    assert pointer(y) != pointer(x)
    assert copied or not hb.asarray(x).device.is_host_accessible, (
        f"a copy ({why}) must be reported with a CopyWarning"
    )
    return "copy"


def test_large_tensor_converts_without_copy() -> None:
    """A 256 MiB tensor crosses torch -> JAX -> NumPy with no copy and no memory growth."""
    import resource

    need("torch", "jax")
    x = torch.ones(64 * 2**20, dtype=torch.float32)  # 256 MiB, 64-byte aligned by torch
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    j = hb.convert(x, "jax")
    n = hb.convert(j, "numpy")
    t = hb.convert(n, "torch")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert j.unsafe_buffer_pointer() == x.data_ptr() == n.ctypes.data == t.data_ptr()
    assert grown_kib < 16 * 1024, f"peak RSS grew by {grown_kib} KiB for a 256 MiB hand-off"
