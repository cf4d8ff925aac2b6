"""TensorFlow hand-offs: ``hb.convert`` against TensorFlow's own zero-copy paths.

One small tensor (1000 float32), every pair with TensorFlow on one side that is zero-copy
both ways, timed interleaved in the same run (``compare``) against the peer a user would
write without the bridge:

- tensorflow -> numpy: ``np.asarray(x)`` (TensorFlow's ``__array__``: a read-only view);
- tensorflow -> torch: ``torch.from_dlpack(x)``;
- tensorflow -> jax: ``jax.numpy.from_dlpack(x)``;
- numpy -> tensorflow and torch -> tensorflow: ``tf.experimental.dlpack.from_dlpack`` of
  the source's own capsule (the NumPy source 64-byte aligned, so that neither side copies:
  TensorFlow's kernels would abort on NumPy's usual 16-byte alignment, which the bridge
  copies and TensorFlow's import does not).

Before timing, both results are checked to alias the source (data pointers equal), and
hb.CopyWarning is an error. The bridge's side does more than the peer on the way in
(alignment, strides and read-only checks; a bool scan): the ratio is its price.

Not in ``python -m benchmarks``' default suites (TensorFlow is not in the test extra);
``python -m benchmarks tensorflow``.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import hurray_bridge as hb

from ._timing import compare, ratio

N = 1000


def _pointer(x: Any) -> int:
    """The data address of a NumPy, torch, JAX or TensorFlow array, read with its own API
    (TensorFlow's through its DLPack export, which the bridge does not touch here)."""
    mod = type(x).__module__
    if mod.startswith("tensorflow"):
        import tensorflow as tf

        from hurray_bridge import _capsule

        return int(_capsule.consume_capsule(tf.experimental.dlpack.to_dlpack(x)).data)
    if mod.startswith("torch"):
        return int(x.data_ptr())
    if mod.startswith(("jax", "jaxlib")):
        return int(x.unsafe_buffer_pointer())
    return int(x.__array_interface__["data"][0])


def _pairs(tf: Any, np: Any) -> list[tuple[str, Any, str, Callable[[Any], Any]]]:
    """(pair, source, peer name, peer) for each pair whose frameworks are installed."""
    from hurray_bridge._memory import aligned_zeros

    x = tf.constant(np.arange(N, dtype=np.float32))
    a = aligned_zeros((N,), np.float32)
    a[:] = np.arange(N)
    tfd = tf.experimental.dlpack
    pairs: list[tuple[str, Any, str, Callable[[Any], Any]]] = [
        ("tensorflow->numpy", x, "np.asarray", np.asarray),
        ("numpy->tensorflow", a, "tfd.from_dlpack(a.__dlpack__())",
         lambda s: tfd.from_dlpack(s.__dlpack__())),
    ]
    if importlib.util.find_spec("torch") is not None:
        import torch

        pairs += [
            ("tensorflow->torch", x, "torch.from_dlpack", torch.from_dlpack),
            ("torch->tensorflow", torch.arange(N, dtype=torch.float32),
             "tfd.from_dlpack(torch.utils.dlpack.to_dlpack)",
             lambda s: tfd.from_dlpack(torch.utils.dlpack.to_dlpack(s))),
        ]
    if importlib.util.find_spec("jax") is not None:
        import jax.numpy as jnp

        pairs.append(("tensorflow->jax", x, "jnp.from_dlpack", jnp.from_dlpack))
    return pairs


def run(small: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    if importlib.util.find_spec("tensorflow") is None:
        results["notes"].append("tensorflow is not installed: nothing measured")
        return results
    import numpy as np
    import tensorflow as tf

    rounds = 11 if small else 21
    for pair, src, peer_name, peer in _pairs(tf, np):
        target = pair.split("->")[1]
        want = _pointer(src)
        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)
            warnings.simplefilter("ignore", UserWarning)  # torch's once-per-process read-only note
            ours = hb.convert(src, target)
            theirs = peer(src)
        if _pointer(ours) != want or _pointer(theirs) != want:
            results["notes"].append(f"{pair}: not zero-copy on both sides, not timed")
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            a, b, r = compare(f"{pair} hb.convert", lambda s=src, t=target: hb.convert(s, t),
                              f"{pair} {peer_name}", lambda s=src, f=peer: f(s), rounds=rounds)
        results["timings"] += [a.as_dict(), b.as_dict()]
        results["ratios"][pair] = ratio(r, "<= 1.3", peer=peer_name)
    return results


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=1))
