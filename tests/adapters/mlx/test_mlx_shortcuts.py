"""hb.convert's shortcuts from MLX answer exactly what the full path answers.

MLX's fast import reads an array as the ndarray the full path gives of it (its export,
seen through the core's host view); composed with NumPy's and torch's fast exports it
is the whole hand-off. Each case converts one MLX
array through the full path (``hb.convert.general``) and through a shortcut front
(compiled and Python) and compares what a user can observe: type, dtype, shape, strides,
writability, bytes, whether the memory is the array's, and the warnings. The plain cases
must take the shortcut; bfloat16 (no buffer format NumPy reads) must fall through.
The lazy case is one a shortcut could get wrong: the values must be the computed ones.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _shortcuts

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (extra 'mlx')")
np = pytest.importorskip("numpy", reason="numpy is not installed")
torch = pytest.importorskip("torch", reason="torch is not installed")

GENERAL = hb.convert.general  # type: ignore[attr-defined]
IMPLS = ["python"] + (["compiled"] if _shortcuts.compiled else [])


def _addr(a: Any) -> int:
    return int(hb.asarray(a).data_ptr)


def _ev(a: Any) -> Any:
    mx.eval(a)
    return a


M = mx.arange(12, dtype=mx.float32).reshape(3, 4)
BOTH, NONE = frozenset({"numpy", "torch"}), frozenset()
# (label, source, the targets whose shortcut takes it): the core's host view declines
# strided and empty memory, which the full path takes.
CASES: list[tuple[str, Callable[[], Any], frozenset[str]]] = [
    ("f32", lambda: _ev(mx.arange(6, dtype=mx.float32)), BOTH),
    ("int8", lambda: _ev(mx.arange(6, dtype=mx.int8)), BOTH),
    ("uint64", lambda: _ev(mx.arange(6, dtype=mx.uint64)), BOTH),
    ("bool", lambda: _ev(mx.arange(6) % 2 == 0), BOTH),
    ("float16", lambda: _ev(mx.arange(6, dtype=mx.float16)), BOTH),
    ("complex64", lambda: _ev(mx.arange(6, dtype=mx.complex64)), BOTH),
    ("rank 0", lambda: _ev(mx.array(3.0)), BOTH),
    ("empty", lambda: _ev(mx.zeros((2, 0))), NONE),
    ("transposed", lambda: _ev(M.T), NONE),
    ("negative strides", lambda: _ev(M[::-1]), NONE),
    ("gaps", lambda: _ev(M[:, ::2]), NONE),
    ("lazy", lambda: mx.arange(6, dtype=mx.float32) * 3, BOTH),
    ("bfloat16", lambda: _ev(mx.arange(6, dtype=mx.bfloat16)), NONE),
]
TARGETS = ("numpy", "torch")


def _observe(out: Any, src: Any) -> tuple[Any, ...]:
    if isinstance(out, np.ndarray):
        arr, ptr, writable = out, out.__array_interface__["data"][0], out.flags.writeable
        strides = tuple(s // out.itemsize for s in out.strides)
    else:
        arr = out.numpy() if out.dtype != torch.bfloat16 else out.view(torch.int16).numpy()
        ptr, writable, strides = out.data_ptr(), True, tuple(out.stride())
    strides = tuple(s if d > 1 else None for d, s in zip(arr.shape, strides))
    shared = ptr == hb.asarray(src).data_ptr if arr.size else None
    return (type(out), str(arr.dtype), arr.shape, None if 0 in arr.shape else strides,
            writable, arr.tolist(), shared)


def _run(fn: Callable[..., Any], obj: Any, to: str) -> tuple[Any, ...]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res: tuple[Any, ...] = _observe(fn(obj, to), obj)
        except Exception as exc:
            res = ("error", type(exc), str(exc))
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


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("label,make,takes", CASES, ids=[c[0] for c in CASES])
def test_shortcut_answers_as_the_full_path(front: Any, label: str, make: Callable[[], Any],
                                           takes: frozenset[str], to: str) -> None:
    expected = _run(GENERAL, make(), to)
    assert expected[0][0] != "error", expected
    assert to in _shortcuts.TABLE[mx.array]  # the full path learned the pair
    front.calls.clear()
    got = _run(front, make(), to)
    assert got == expected
    assert (not front.calls) is (to in takes), f"{label} -> {to}: taken={not front.calls}"
    copied = any(w[0] == "CopyWarning" for w in expected[1])  # torch: negative strides
    if expected[0][-1] is not None:
        assert expected[0][-1] is not copied, "the export shares the array's memory, or says"


def test_the_shortcut_result_keeps_the_array_alive() -> None:
    a = _ev(mx.arange(1000, dtype=mx.float32))
    GENERAL(a, "torch")  # learn
    f = _shortcuts.front(GENERAL, use_compiled=False)
    t = f(a, "torch")
    assert t.data_ptr() == _addr(a)
    del a
    junk = [mx.full((1000,), 7.0) for _ in range(32)]
    mx.eval(*junk)
    assert t[999].item() == 999.0 and t[0].item() == 0.0
