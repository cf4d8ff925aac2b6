"""The round-trip matrix: producer x consumer x dtype x shape over NumPy, torch, JAX and Arrow.

Every cell hands one tensor over with ``hb.convert`` and checks three things:
the values are bit-exact; the outcome (zero-copy, reported copy, or refusal)
is the one the compatibility contract below predicts; and on a zero-copy
outcome the consumer's data pointer is the producer's. Sources are built with
each framework's own API from one NumPy reference, never through the bridge.

``contract`` is the one table of what cannot be zero-copy and why.
"""

from __future__ import annotations

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
ml_dtypes = optional("ml_dtypes")

from hurray_bridge.adapters import numpy as np_adapter  # noqa: E402

FRAMEWORKS = ("numpy", "torch", "jax", "arrow")
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
    if dtype.bits == 1:
        return None  # NumPy has no 1-bit bool
    shape = SHAPES[shape_name]
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    return _strided(shape_name, reference(dtype, base))


def make_torch(dtype: hb.DType, shape_name: str) -> Any:
    if dtype.torch is None or dtype.bits < 8:
        return None  # float4 x2 containers are covered by the torch adapter tests
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
    if shape_name.startswith("transposed") or dtype.jax is None or dtype.bits == 1:
        return None  # JAX arrays are always compact; no 1-bit bool
    if (dtype.bits == 64 and not X64) or (dtype is hb.complex128 and not X64):
        return None
    return jnp.asarray(reference(dtype, SHAPES[shape_name]))


def make_arrow(dtype: hb.DType, shape_name: str) -> Any:
    shape = SHAPES[shape_name]
    if dtype.arrow is None:
        return None
    if dtype.bits == 1:
        return pa.array(reference(dtype, shape).tolist(), pa.bool_()) if len(shape) == 1 else None
    if dtype is hb.bool8:
        if len(shape) != 1:
            return None
        storage = pa.array(reference(dtype, shape).astype(np.int8))
        return pa.ExtensionArray.from_storage(pa.bool8(), storage)
    base = shape[::-1] if shape_name.startswith("transposed") else shape
    ref = reference(dtype, base)
    if len(shape) == 1:
        return pa.array(ref)
    return pa.Tensor.from_numpy(_strided(shape_name, ref))


MAKERS: dict[str, Callable[[hb.DType, str], Any]] = {
    "numpy": make_numpy,
    "torch": make_torch,
    "jax": make_jax,
    "arrow": make_arrow,
}


def pointer(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return x.__array_interface__["data"][0] if x.size else 0
    if torch and isinstance(x, torch.Tensor):
        return x.data_ptr()
    if jax and isinstance(x, jax.Array):
        return x.unsafe_buffer_pointer() if x.size else 0
    return hb.asarray(x).data_ptr  # pyarrow exposes no address for a Tensor


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
        if dtype.arrow is None:
            return "refused", f"Arrow has no {dtype.name}"
        if dtype is hb.bool8 and len(shape) != 1:
            return "refused", "Arrow tensors hold no booleans"
        if dtype.bits == 1 and len(shape) != 1:
            return "refused", "Arrow booleans are 1-D arrays"
        return "zero-copy", ""
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
    raise AssertionError(dst)


def _cases() -> list[Any]:
    out = []
    for src in FRAMEWORKS:
        for dst in FRAMEWORKS:
            for dtype in DTYPES:
                for shape in SHAPES:
                    out.append(
                        pytest.param(
                            src, dst, dtype, shape, id=f"{src}->{dst}-{dtype.name}-{shape}"
                        )
                    )
    return out


@pytest.mark.parametrize("src,dst,dtype,shape_name", _cases())
def test_handoff(src: str, dst: str, dtype: hb.DType, shape_name: str) -> None:
    need(src, dst)
    if (dtype.numpy or "").startswith("ml_dtypes:"):
        need("ml_dtypes")  # the reference values are built with NumPy
    x = MAKERS[src](dtype, shape_name)
    if x is None:
        return  # the producer cannot hold this dtype/shape at all: nothing to hand over
    want, why = contract(src, dst, dtype, shape_name, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            y = hb.convert(x, dst)
        except hb.UnsupportedError as exc:
            assert want == "refused", f"refused unexpectedly: {exc}"
            return
    copied = [w for w in caught if issubclass(w.category, hb.CopyWarning)]
    assert want != "refused", f"expected a refusal ({why}), got {type(y).__name__}"
    ref = _c(
        reference(dtype, SHAPES[shape_name][::-1]).T
        if shape_name.startswith("transposed")
        else reference(dtype, SHAPES[shape_name])
    )
    got = logical(y)
    exp = logical(ref)
    assert (
        got.shape == exp.shape
        or got.size == exp.size == 0
        or (dtype.bits == 1 or dtype is hb.bool8)
    ), (got.shape, exp.shape)
    assert got.reshape(-1).tobytes() == exp.reshape(-1).tobytes(), "values differ"
    if 0 in SHAPES[shape_name]:
        assert pointer(y) == 0, "an empty tensor must come out without an allocation"
        return
    if want == "zero-copy":
        assert not copied, [str(w.message) for w in copied]
        assert pointer(y) == pointer(x), "zero-copy promised but the data pointer changed"
    else:
        assert pointer(y) != pointer(x)
        assert copied or not hb.asarray(x).device.is_host_accessible, (
            f"a copy ({why}) must be reported with a CopyWarning"
        )


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
