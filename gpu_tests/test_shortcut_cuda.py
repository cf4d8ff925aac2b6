"""The torch -> JAX shortcut on CUDA answers exactly as the full path does.

``hb.convert(x, "jax")`` for a CUDA torch tensor is served by the shortcut in
``hurray_bridge/_shortcuts.py`` once the pair is learned; the full path
(``hb.convert.general``) is the reference. For every Tier 1 type and layout both
must give the same dtype, shape, JAX layout, values and data pointer (or the same
error), and the shortcut must serve exactly the inputs it is meant to: a shortcut
that raised on a real GPU would otherwise fall back to the full path unseen.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb
from gpu_tests._fw import LAYOUTS, TIER1, reference
from hurray_bridge import _shortcuts

# 64-bit types take the full path (JAX's x64 setting decides how they import).
_X64 = frozenset({"int64", "uint64", "float64", "complex128"})


def _observe(J: Any, y: Any) -> tuple[Any, ...]:
    return (str(y.dtype), tuple(y.shape), repr(y.format), np.asarray(y).tobytes(),
            J.ptr(y) if y.size else None)


def _answer(J: Any, convert: Any, x: Any) -> tuple[Any, ...]:
    try:
        return ("ok", _observe(J, convert(x, "jax")))
    except hb.HurrayError as exc:
        return ("error", type(exc), str(exc))


def _torch_jax_entry() -> Any:
    import torch

    return _shortcuts.TABLE.get(torch.Tensor, {}).get("jax")


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", TIER1, ids=lambda d: d.name)
def test_torch_to_jax_shortcut_matches_the_full_path(fws: Any, dtype: hb.DType,
                                                     layout: str) -> None:
    T, J = fws("torch"), fws("jax")
    for fw in (T, J):
        if not fw.supports(dtype):
            pytest.skip(f"{fw.name} has no {dtype.name} here")
    shape, view = LAYOUTS[layout]
    x = T.make(reference(dtype, shape, zlib.crc32(f"{dtype.name}/{layout}".encode())), view)
    expected = _answer(J, hb.convert.general, x)  # type: ignore[attr-defined]
    if expected[0] == "ok":
        assert _torch_jax_entry() is not None, "the full path did not learn torch -> jax"
    assert _answer(J, hb.convert, x) == expected
    # Served: compact and permuted layouts of the 8-to-32-bit types. Declined: views JAX
    # refuses ("step": the full path's refusal) and the 64-bit types.
    should_serve = dtype.name not in _X64 and view != "step"
    served = _shortcuts.serves(x, "jax")
    assert served is should_serve, (
        f"{dtype.name} {layout}: shortcut served={served}, expected {should_serve}")


def test_torch_to_jax_shortcut_declines_requires_grad(fws: Any, torch: Any) -> None:
    T, J = fws("torch"), fws("jax")
    x = torch.arange(64, dtype=torch.float32, device="cuda:0").requires_grad_()
    hb.convert.general(x.detach(), "jax")  # type: ignore[attr-defined]  # learn the pair
    assert not _shortcuts.serves(x, "jax"), "torch's export refuses requires_grad"
    y = hb.convert(x, "jax")  # the full path detaches
    assert J.ptr(y) == T.ptr(x)
    assert np.array_equal(np.asarray(y), np.arange(64, dtype=np.float32))
