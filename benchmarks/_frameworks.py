"""Sources, direct imports and data pointers of the CPU frameworks the suites compare.

Everything here is imported lazily and per framework: a suite runs with whatever
subset of NumPy, torch, JAX and pyarrow is installed and says what it skipped.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

FRAMEWORKS = ("numpy", "torch", "jax", "arrow")
_MODULES = {"numpy": "numpy", "torch": "torch", "jax": "jax.numpy", "arrow": "pyarrow"}


def available() -> tuple[str, ...]:
    out = []
    for name in FRAMEWORKS:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError:
            continue
        out.append(name)
    return tuple(out)


def aligned_numpy(n: int, dtype: Any = "float32", align: int = 64) -> Any:
    """A NumPy array of ``n`` elements on an ``align``-byte boundary, filled (pages touched).

    NumPy's own allocations are 16-byte aligned, and JAX aliases CPU memory only at
    64 bytes: without this the JAX targets would compare a copy against a copy.
    """
    import numpy as np

    dt = np.dtype(dtype)
    raw = np.empty(n * dt.itemsize + align, np.uint8)
    off = -raw.ctypes.data % align
    a = raw[off : off + n * dt.itemsize].view(dt)
    a[...] = 1
    return a


def sources(base: Any) -> dict[str, Any]:
    """The same 1-D float32 memory as a NumPy array, torch tensor, JAX array and Arrow array.

    Every source aliases ``base`` (checked), so one allocation serves all of them.
    """
    out: dict[str, Any] = {}
    have = available()
    if "numpy" in have:
        out["numpy"] = base
    if "torch" in have:
        import torch

        out["torch"] = torch.from_numpy(base)
    if "jax" in have:
        import jax.numpy as jnp

        out["jax"] = jnp.from_dlpack(base)
    if "arrow" in have:
        import pyarrow as pa

        out["arrow"] = pa.Array.from_dlpack(base)
    want = pointer("numpy", base)
    for name, x in out.items():
        if pointer(name, x) != want:
            raise RuntimeError(f"benchmark setup: the {name} source is a copy")
    return out


def native_sources(n: int) -> dict[str, Any]:
    """``n`` float32 values made by each framework itself (its own allocator and alignment)."""
    out: dict[str, Any] = {}
    have = available()
    if "numpy" in have:
        out["numpy"] = aligned_numpy(n)
    if "torch" in have:
        import torch

        out["torch"] = torch.ones(n, dtype=torch.float32)
    if "jax" in have:
        import jax.numpy as jnp

        out["jax"] = jnp.ones(n, dtype=jnp.float32).block_until_ready()
    if "arrow" in have:
        import pyarrow as pa

        out["arrow"] = pa.array([1.0] * n, type=pa.float32())
    return out


def pointer(framework: str, x: Any) -> int:
    """Address of element 0 of a native array (how zero-copy is proven)."""
    if framework == "numpy":
        return int(x.__array_interface__["data"][0])
    if framework == "torch":
        return int(x.data_ptr())
    if framework == "jax":
        return int(x.unsafe_buffer_pointer())
    if framework == "arrow":
        buf = x.buffers()[1]
        return int(buf.address) + x.offset * x.type.bit_width // 8
    raise ValueError(framework)


def direct(target: str) -> tuple[str, Callable[[Any], Any]]:
    """The target framework's own DLPack import: its name and the function."""
    if target == "numpy":
        import numpy as np

        return "np.from_dlpack", np.from_dlpack
    if target == "torch":
        import torch

        return "torch.from_dlpack", torch.from_dlpack
    if target == "jax":
        import jax.numpy as jnp

        return "jnp.from_dlpack", jnp.from_dlpack
    if target == "arrow":
        import pyarrow as pa

        return "pa.Array.from_dlpack", pa.Array.from_dlpack
    raise ValueError(target)


def direct_fallback(target: str) -> tuple[str, Callable[[Any], Any]] | None:
    """A second-best direct route where the first one fails for some producers.

    pyarrow 26.0.1's ``Array.from_dlpack`` cannot read JAX's legacy capsule ("PyCapsule_
    GetPointer called with incorrect name"): the closest direct route is through NumPy.
    """
    if target == "arrow":
        import numpy as np
        import pyarrow as pa

        return "pa.array(np.from_dlpack(x))", lambda x: pa.array(np.from_dlpack(x))
    return None
