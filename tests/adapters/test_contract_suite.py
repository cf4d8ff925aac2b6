"""The shared adapter suite: every adapter in the registry, tested by what it declares.

An adapter is tested here by declaring itself: its line in ``_registry.ADAPTERS`` puts it
in the suite, and its declarations (``native_dtypes()``, ``DEVICES``, ``HOLDS``, the two
fast hooks) decide the cases. For each declared element type (each sub-byte form) and
each shape of ``SHAPES``, an ``hb.Tensor`` goes through ``from_hurray`` and back through
``to_hurray`` and must keep its bytes, shape and element type; where the contract
promises zero-copy (compact host memory, 64-byte aligned) the data address survives the
trip, and where it does not, the copy is reported. Then: read-only memory never comes
back writable and shared (torch, which has no read-only tensors, is held to what
buffer-protocol.md §6.3 documents instead), the copy policy (``copy=True`` gives fresh
memory; ``copy=False`` refuses where a copy is needed and shares otherwise), the host
device, the element-type table against its two lookups, ``special_kind`` and the fast
hooks.

``GAPS`` is the one table of what an adapter declares but cannot take: its cases are
strict xfails that must end in a HurrayError refusal (a fix turns one into a failure, and
the table shrinks). ``COPIES`` is the one table of round trips that copy by design;
``DEVICE_ONLY`` names the adapters whose objects never live in host memory (their host
cases skip, saying so; every other adapter must declare the host). A case this
configuration cannot run (the framework not installed, ml_dtypes absent, JAX without
x64) is a skip that says so.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _shortcuts
from hurray_bridge._contract import KINDS
from hurray_bridge._registry import ADAPTERS, get_adapter, kept_apart
from hurray_bridge.descriptor import dense_descriptor
from hurray_bridge.layout import BufferRole
from hurray_bridge.tensor import canonical_bytes

np = pytest.importorskip("numpy", reason="numpy is not installed")
from tests.cross.test_roundtrip_matrix import WIDE, reference  # noqa: E402
from tests.frameworks import optional  # noqa: E402

jax = optional("jax")
X64 = bool(jax and jax.config.jax_enable_x64)

SHAPES: dict[str, tuple[int, ...]] = {
    "scalar": (), "empty_0": (0,), "empty_0x3": (0, 3), "vector_5": (5,), "rank3": (2, 3, 4)}

# A case's sub-byte form: "padded" (one element per byte, as NumPy's ml_dtypes holds
# them) or "packed" (two or four per byte); 1-bit bool is always packed; whole-byte types
# have one form, "".
Hit = Callable[[hb.DType, tuple[int, ...], str], bool]


def _even_packed_fp4(d: hb.DType, s: tuple[int, ...], form: str) -> bool:
    return d is hb.float4_e2m1fn and form == "packed" and bool(s) and s[-1] % 2 == 0


# What an adapter declares (in native_dtypes) but cannot take in some form or shape:
# (adapter, applies to (dtype, shape, form), why). Each matching case is a strict xfail
# that must end in a HurrayError refusal.
GAPS: tuple[tuple[str, Hit, str], ...] = (
    ("arrow", lambda d, s, f: d in (hb.bool, hb.bool8) and len(s) != 1,
     "Arrow holds booleans only as 1-D arrays: a pa.Tensor holds numbers only"),
    ("torch", lambda d, s, f: d.is_subbyte and d.bits != 1 and not _even_packed_fp4(d, s, f),
     "torch holds sub-byte data only as packed float4_e2m1fn_x2: two fp4 per byte along an "
     "even last dimension"),
)

# Round trips that copy by design: (adapter, applies to (dtype, shape, form), why). Every
# other host round trip of a 64-byte aligned tensor must give back the very same memory.
COPIES: tuple[tuple[str, Hit, str], ...] = (
    ("dask", lambda d, s, f: True, "to_hurray computes the Dask graph into one new array"),
    ("jax", lambda d, s, f: d.is_subbyte,
     "JAX's DLPack has no sub-byte types: the array is built from the values"),
    ("mlx", lambda d, s, f: True,
     "MLX copies every import of host memory (mx.from_dlpack(copy=False): 'Cannot import "
     "a CPU array without a copy', mlx 0.32.4)"),
    ("numpy", lambda d, s, f: f == "packed",
     "NumPy (ml_dtypes) holds sub-byte types one per byte: packed data is unpacked"),
    ("torch", lambda d, s, f: d.bits == 1, "torch has no 1-bit bool: unpacked to torch.bool"),
    ("tensorflow", lambda d, s, f: d.is_subbyte or d.name.startswith("float8"),
     "TensorFlow's DLPack has no float8 and sub-byte types: tf.constant builds the tensor"),
    ("paddle", lambda d, s, f: d.bits == 1, "Paddle has no 1-bit bool: unpacked to paddle.bool"),
)

# A source that needs a copy, per adapter that has one: what the refusal of copy=False
# must say, and how the source is made. The others must take an aligned host tensor with
# copy=False and share it.
NEEDS_COPY: dict[str, tuple[str, dict[str, Any]]] = {
    "jax": ("64-byte aligned", {"offset": 16}),
    # TensorFlow aliases any address, then its kernels abort on one below 64 bytes.
    "tensorflow": ("64-byte aligned", {"offset": 16}),
}
# Adapters whose to_hurray always copies (copy=False refuses every object).
TO_HURRAY_COPIES = {"dask": "to_hurray computes the Dask graph into one new array"}
# Adapters whose from_hurray copies every tensor that holds elements (copy=False refuses it):
# what the refusal must say.
FROM_HURRAY_COPIES = {"mlx": "MLX copies every import of host memory"}
# Adapters whose objects never live in host memory; every other must declare the host.
DEVICE_ONLY = {"cupy": "CuPy arrays live in GPU memory"}
# torch has no read-only tensors: a read-only hb.Tensor not tracked by autograd reaches
# torch as a writable view, with a once-per-process UserWarning (buffer-protocol.md §6.3).
SHARES_READ_ONLY_WRITABLE = {"torch": "torch has no read-only tensors (buffer-protocol.md §6.3)"}


def _gap(name: str, dtype: hb.DType, shape: tuple[int, ...], form: str) -> str | None:
    return next((why for who, hit, why in GAPS if who == name and hit(dtype, shape, form)),
                None)


def _copies(name: str, dtype: hb.DType, shape: tuple[int, ...], form: str) -> str | None:
    return next((why for who, hit, why in COPIES if who == name and hit(dtype, shape, form)),
                None)


def _installed(name: str) -> str | None:
    """Why adapter ``name`` cannot run here, or None: its framework is not installed, or
    it cannot share this process with a framework imported already (the registry's
    ``not_with``: the first of such a pair runs, the second skips naming why)."""
    framework = ADAPTERS[name].framework
    if not importlib.util.find_spec(framework):
        return f"{framework} is not installed"
    return kept_apart(name)


def _adapter(name: str) -> ModuleType:
    why = _installed(name)
    if why:
        pytest.skip(why)
    return get_adapter(name)


def _host_adapter(name: str) -> ModuleType:
    """The adapter, for a case that hands it host memory to hold as it is."""
    mod = _adapter(name)
    if name in DEVICE_ONLY:
        assert 1 not in mod.DEVICES, f"{name} is in DEVICE_ONLY yet declares the host"
        pytest.skip(f"{DEVICE_ONLY[name]} (DEVICES={sorted(mod.DEVICES)}): host tensors are "
                    "copied to its device, which gpu_tests/ cover")
    assert 1 in mod.DEVICES, f"{name} must declare host memory (1) in DEVICES"
    return mod


def _names() -> list[Any]:
    return [pytest.param(n, id=n) for n in ADAPTERS]


def _forms(dtype: hb.DType) -> tuple[str, ...]:
    if not dtype.is_subbyte:
        return ("",)
    return ("packed",) if dtype.bits == 1 else ("padded", "packed")


def _dtype_cases(shapes: tuple[str, ...] = tuple(SHAPES)) -> list[Any]:
    """adapter x its declared element types (x sub-byte forms) x shapes; one skip for an
    adapter whose framework is absent."""
    cases = []
    for name in ADAPTERS:
        why = _installed(name)
        if why:
            cases.append(pytest.param(name, None, "-", "", id=f"{name}-absent",
                                      marks=pytest.mark.skip(reason=why)))
            continue
        for dtype in get_adapter(name).native_dtypes():
            for form in _forms(dtype):
                for shape_name in shapes:
                    gap = _gap(name, dtype, SHAPES[shape_name], form)
                    marks = [pytest.mark.xfail(strict=True, raises=hb.HurrayError, reason=gap)
                             ] if gap else []
                    label = "-".join(p for p in (name, dtype.name, form, shape_name) if p)
                    cases.append(pytest.param(name, dtype, shape_name, form, marks=marks,
                                              id=label))
    return cases


def source(dtype: hb.DType, shape: tuple[int, ...], *, form: str = "", offset: int = 0,
           readonly: bool = False) -> hb.Tensor:
    """A host hb.Tensor of ``reference`` values, at ``offset`` bytes past a 64-byte
    boundary, in its sub-byte ``form`` (see ``_forms``)."""
    if (dtype.numpy or "").startswith("ml_dtypes:") and not importlib.util.find_spec(
            "ml_dtypes"):
        pytest.skip("ml_dtypes is not installed: the reference values are built with it")
    if form == "packed":
        # 1-bit bool is bool8 packed; the others are their padded values packed.
        padded = reference(hb.bool8 if dtype.bits == 1 else dtype, shape)
        packed = hb.quant.pack_subbyte(hb.asarray(padded))
        data = bytes(packed.memoryview()) if packed.nbytes else b""
    else:
        data = reference(dtype, shape).tobytes()
    desc = dense_descriptor(shape, dtype, padded=form == "padded")
    assert desc.nbytes == len(data), (desc, len(data))
    buf = np.zeros(len(data) + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + offset
    buf[start:start + len(data)] = np.frombuffer(data, np.uint8)
    return hb.Tensor(desc, [(BufferRole.DATA, buf.ctypes.data + start, len(data))], owner=buf,
                     readonly=readonly)


def _round_trip(mod: ModuleType, t: hb.Tensor, **kw: Any) -> tuple[Any, hb.Tensor, list[Any]]:
    """from_hurray then to_hurray; the CopyWarnings raised on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = mod.from_hurray(t, **kw)
        u = mod.to_hurray(x)
    return x, u, [w for w in caught if issubclass(w.category, hb.CopyWarning)]


def _same_values(t: hb.Tensor, u: hb.Tensor) -> None:
    assert u.shape == t.shape, (u.shape, t.shape)
    assert u.dtype == t.dtype, (u.dtype, t.dtype)
    assert canonical_bytes(u) == canonical_bytes(t), "the values changed on the round trip"


def _skip_config(name: str, dtype: hb.DType) -> None:
    if name == "jax" and dtype in WIDE and not X64:
        pytest.skip(f"jax_enable_x64 is off: JAX holds {dtype.name} only narrowed to 32 bits "
                    "(JAX_ENABLE_X64=1 runs this case)")


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("name,dtype,shape_name,form", _dtype_cases())
def test_dense_round_trip(name: str, dtype: hb.DType, shape_name: str, form: str) -> None:
    mod = _host_adapter(name)
    _skip_config(name, dtype)
    shape = SHAPES[shape_name]
    t = source(dtype, shape, form=form)
    _x, u, copied = _round_trip(mod, t)
    _same_values(t, u)
    why = _copies(name, dtype, shape, form)
    if not t.nbytes:
        assert u.data_ptr == 0, "an empty tensor must come back without an allocation"
    elif why is None:
        assert not copied, [str(w.message) for w in copied]
        assert u.data_ptr == t.data_ptr, "zero-copy promised, but the data address changed"
    else:
        assert u.data_ptr != t.data_ptr, f"a copy was expected ({why}), yet memory is shared"
        assert copied or u.copied, f"a copy ({why}) must be reported"


@pytest.mark.parametrize("name", _names())
def test_dtype_table_agrees_with_its_lookups(name: str) -> None:
    mod = _adapter(name)
    table = mod.native_dtypes()
    assert table and "dense" in mod.HOLDS
    for dtype, native in table.items():
        assert mod.dtype_of(mod.native_dtype(dtype)) == dtype, dtype.name
        assert mod.native_dtype(dtype) == native, dtype.name


# ------------------------------------------------------------------- read-only
@pytest.mark.parametrize("name,dtype,shape_name,form", _dtype_cases(("vector_5",)))
def test_read_only_memory_never_comes_back_writable_and_shared(
        name: str, dtype: hb.DType, shape_name: str, form: str) -> None:
    mod = _host_adapter(name)
    _skip_config(name, dtype)
    shape = SHAPES[shape_name]
    t = source(dtype, shape, form=form, readonly=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notice is once per process: not asserted
        _x, u, _ = _round_trip(mod, t)
    _same_values(t, u)
    shared = u.data_ptr == t.data_ptr
    if name in SHARES_READ_ONLY_WRITABLE and _copies(name, dtype, shape, form) is None:
        assert shared and not u.readonly, SHARES_READ_ONLY_WRITABLE[name]
    else:
        assert u.readonly or not shared, "read-only memory came back writable and shared"


# ----------------------------------------------------------------- copy policy
@pytest.mark.parametrize("name,dtype,shape_name,form", _dtype_cases(("vector_5",)))
def test_copy_true_gives_fresh_memory(name: str, dtype: hb.DType, shape_name: str,
                                      form: str) -> None:
    mod = _host_adapter(name)
    _skip_config(name, dtype)
    t = source(dtype, SHAPES[shape_name], form=form)
    _x, u, _ = _round_trip(mod, t, copy=True)
    _same_values(t, u)
    assert u.data_ptr != t.data_ptr, "from_hurray(copy=True) shares the tensor's memory"
    x, shared, _ = _round_trip(mod, t)  # x's own memory, as to_hurray shares it
    v = mod.to_hurray(x, copy=True)
    _same_values(t, v)
    assert v.data_ptr != shared.data_ptr and v.copied, "to_hurray(copy=True) shares memory"


@pytest.mark.parametrize("name", _names())
def test_copy_false_refuses_a_needed_copy_and_shares_otherwise(name: str) -> None:
    mod = _host_adapter(name)
    if name in NEEDS_COPY:
        why, how = NEEDS_COPY[name]
        with pytest.raises(hb.CopyRequiredError, match=why):
            mod.from_hurray(source(hb.float32, (2, 3, 4), **how), copy=False)
    t = source(hb.float32, (2, 3, 4))
    if name in FROM_HURRAY_COPIES:
        with pytest.raises(hb.CopyRequiredError, match=FROM_HURRAY_COPIES[name]):
            mod.from_hurray(t, copy=False)
        x = mod.from_hurray(t, copy=True)
        u = mod.to_hurray(x, copy=False)  # the export of the copy shares it
        _same_values(t, u)
        assert u.data_ptr != t.data_ptr and not u.copied
        assert mod.from_hurray(u, copy=False) is x, "a whole view of x must give x back"
        return
    x = mod.from_hurray(t, copy=False)
    if name in TO_HURRAY_COPIES:
        with pytest.raises(hb.CopyRequiredError):
            mod.to_hurray(x, copy=False)
        u = mod.to_hurray(x)
        _same_values(t, u)
        assert u.copied and u.data_ptr != t.data_ptr, TO_HURRAY_COPIES[name]
    else:
        u = mod.to_hurray(x, copy=False)
        _same_values(t, u)
        assert u.data_ptr == t.data_ptr, "copy=False succeeded but the memory is not shared"


# ------------------------------------------------------- devices, kinds, hooks
@pytest.mark.parametrize("name", _names())
def test_declares_the_host_and_round_trips_there(name: str) -> None:
    devices = _adapter(name).DEVICES
    assert devices and all(type(d) is int and d > 0 for d in devices)
    mod = _host_adapter(name)
    t = source(hb.int32, (5,))
    _x, u, _ = _round_trip(mod, t)
    _same_values(t, u)
    assert u.device == hb.CPU


@pytest.mark.parametrize("name", _names())
def test_special_kind_tells_only_declared_kinds(name: str) -> None:
    mod = _adapter(name)
    assert mod.HOLDS <= KINDS
    for obj in (object(), 3, None, b"x"):
        kind = mod.special_kind(obj)
        assert kind is None or (kind in mod.HOLDS and kind != "dense"), (obj, kind)
    mod = _host_adapter(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)  # FROM_HURRAY_COPIES: not asserted here
        x = mod.from_hurray(source(hb.float32, (5,)))
    assert mod.special_kind(x) is None, "a dense object to_hurray takes has no special kind"


@pytest.mark.parametrize("name", _names())
def test_fast_hooks_are_absent_or_give_tables_of_raw_forms(name: str) -> None:
    mod = _adapter(name)
    assert (mod.fast_import is None) == (mod.fast_export is None)
    if mod.fast_import is None:
        pytest.skip(f"{name} declares no fast hooks (hb.convert takes the full path)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", hb.CopyWarning)  # FROM_HURRAY_COPIES: not asserted here
        x = _host_adapter(name).from_hurray(source(hb.float32, (5,)))
    imports = mod.fast_import(type(x))
    exports = mod.fast_export()
    for table in (imports, exports):
        assert isinstance(table, dict)
        assert set(table) <= set(_shortcuts.FORMS), sorted(table)
    # A shortcut never copies (it could not report it): an adapter whose every import
    # copies builds from no raw form, and is a source of shortcuts only.
    assert exports or name in FROM_HURRAY_COPIES, (
        f"{name} declares a fast export that builds from no raw form")
    if name in FROM_HURRAY_COPIES:
        assert not exports, f"{name} copies every import, yet a shortcut would build from one"
        assert imports, f"{name} declares a fast import that gives no raw form"
