"""A PyTorch producer task hands its tensors to a JAX consumer task through Ray.

The producer builds a batch with torch (float32 activations, bfloat16 weights,
a bool mask and an empty tensor) and returns them as ``hb.Tensor``\\ s. Ray
pickles those with protocol 5: each buffer goes out of band into Ray's shared
object store once, and the consumer, another worker process, gets read-only
views of that store. The consumer hands each one to JAX through DLPack (no
copy: the JAX array points at the object store), computes with it, and reports
checksums so the driver can check that every byte arrived intact.

The tensors never pass through the driver: the producer's ObjectRef goes
straight to the consumer. Ray is an optional extra: pip install 'hurray-bridge[ray]'.

Run: python examples/ray_torch_to_jax.py
"""

from __future__ import annotations

import hashlib
from typing import Any

import ray

import hurray_bridge as hb


def digest(t: hb.Tensor) -> str:
    h = hashlib.sha256(t.descriptor.to_bytes())
    for b in t.buffers:
        h.update(t.memoryview(b.role))
    return h.hexdigest()[:16]


@ray.remote
def produce(seed: int) -> dict[str, Any]:
    """Runs in a worker: torch only."""
    import torch

    torch.manual_seed(seed)
    batch = {
        "activations": torch.randn(64, 128),
        "weights": torch.randn(128, 32).to(torch.bfloat16),
        "mask": torch.rand(64) > 0.5,
        "padding": torch.empty(0, 128),  # empty: a NULL buffer, no bytes to move
    }
    tensors = {k: hb.asarray(v) for k, v in batch.items()}  # zero-copy views of torch memory
    return {"tensors": tensors, "digests": {k: digest(t) for k, t in tensors.items()}}


@ray.remote
def consume(payload: dict[str, Any]) -> dict[str, Any]:
    """Runs in another worker: JAX only."""
    import jax.numpy as jnp

    tensors: dict[str, hb.Tensor] = payload["tensors"]
    arrays = {}
    zero_copy = {}
    for k, t in tensors.items():
        # JAX imports 64-byte aligned CPU memory without a copy (Ray's object store aligns
        # buffers to 64 bytes). The store is read-only, and jnp.from_dlpack(t) asks for a
        # legacy capsule, which cannot say so: hb.Tensor refuses it (as NumPy would), while
        # hb.convert knows JAX arrays are immutable and hands the memory over as it is.
        a = hb.convert(t, "jax")
        arrays[k] = a
        zero_copy[k] = t.nbytes == 0 or a.unsafe_buffer_pointer() == t.data_ptr
    x = arrays["activations"] * arrays["mask"][:, None]
    y = x @ arrays["weights"].astype(jnp.float32)
    return {
        "digests": {k: digest(t) for k, t in tensors.items()},
        "read_only": {k: t.readonly for k, t in tensors.items()},
        "zero_copy": zero_copy,
        "shapes": {k: tuple(a.shape) for k, a in arrays.items()},
        "dtypes": {k: str(a.dtype) for k, a in arrays.items()},
        "result": (tuple(y.shape), float(jnp.abs(y).sum())),
    }


def run(seed: int = 0) -> tuple[dict[str, Any], dict[str, str]]:
    """Producer -> consumer on the current Ray cluster: the consumer's report and the
    digests the producer computed."""
    produced = produce.remote(seed=seed)
    report = ray.get(consume.remote(produced), timeout=120)
    sent = ray.get(produced, timeout=120)["digests"]
    return report, sent


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report, sent = run()
    finally:
        ray.shutdown()
    for k in report["shapes"]:
        print(f"jax consumer got {k}: {report['dtypes'][k]}{list(report['shapes'][k])} "
              f"zero-copy={report['zero_copy'][k]} read-only={report['read_only'][k]}")
    shape, total = report["result"]
    print(f"(activations * mask) @ weights -> {list(shape)}, sum |y| = {total:.3f}")
    print(f"bit-exact: {report['digests'] == sent}")


if __name__ == "__main__":
    main()
