"""A three-framework pipeline on one GPU, with no host round trip.

    CuPy (normalise a batch) -> torch (a small MLP) -> JAX (softmax, argmax) -> CuPy (counts)

Every hand-off is ``hb.convert(..., copy=False)``: the consumer aliases the
producer's device memory, and the consumer's CUDA stream is forwarded to the
producer, which orders its work before it. The script prints the pointer chain
(equal pointers across a zero-copy hand-off) and the time of each stage, and
checks the labels against the same computation done in torch alone.

Exit status: 0 on success, and also when there is no CUDA device (it says
so); 1 if a hand-off copied or the results differ.

Run: ``python examples/gpu_pipeline.py``
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

# JAX must not reserve most of the GPU at start-up: torch and CuPy share it.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

BATCH, FEATURES, HIDDEN, CLASSES = 8192, 512, 1024, 10


def _frameworks() -> tuple[Any, Any, Any] | str:
    """(torch, cupy, jax), or why they cannot run here."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy
    except ImportError:
        return "CuPy is not installed"
    try:
        import jax
    except ImportError:
        return "JAX is not installed"
    try:
        jax.devices("gpu")
    except RuntimeError:
        return "JAX has no GPU backend (install a jax-cudaNN-plugin build)"
    return torch, cupy, jax


def main() -> int:
    found = _frameworks()
    if isinstance(found, str):
        print(f"gpu_pipeline: skipped, {found}. This example needs one CUDA GPU with "
              "torch, JAX and CuPy.")
        return 0
    torch, cupy, jax = found
    import jax.numpy as jnp

    import hurray_bridge as hb

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES),
    ).to("cuda:0").eval()
    rng = cupy.random.default_rng(0)
    raw = rng.standard_normal((BATCH, FEATURES), dtype=cupy.float32) * 3.0 + 1.0

    def sync() -> None:
        torch.cuda.synchronize()  # the whole device: CuPy's and JAX's streams too

    @jax.jit
    def postprocess(logits: Any) -> tuple[Any, Any]:
        probs = jax.nn.softmax(logits, axis=-1)
        return probs, jnp.argmax(probs, axis=-1).astype(jnp.int32)

    def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        timings: list[tuple[str, float]] = []

        def timed(name: str, fn: Callable[[], Any]) -> Any:
            sync()
            t0 = time.perf_counter()
            result = fn()
            sync()
            timings.append((name, (time.perf_counter() - t0) * 1e3))
            return result

        x = timed("cupy: normalise", lambda: (raw - raw.mean(axis=0)) / (raw.std(axis=0) + 1e-6))
        xt = timed("hand-off cupy -> torch", lambda: hb.convert(x, "torch", copy=False))

        def mlp() -> Any:
            with torch.inference_mode():
                return model(xt)

        logits = timed("torch: MLP", mlp)
        lj = timed("hand-off torch -> jax", lambda: hb.convert(logits, "jax", copy=False))
        probs, labels = timed("jax: softmax + argmax", lambda: postprocess(lj))
        lc = timed("hand-off jax -> cupy", lambda: hb.convert(labels, "cupy", copy=False))
        counts = timed("cupy: class counts", lambda: cupy.bincount(lc, minlength=CLASSES))
        out.update(x=x, xt=xt, logits=logits, lj=lj, probs=probs, labels=labels, lc=lc,
                   counts=counts, timings=timings)
        return out

    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("error", hb.CopyWarning)  # any reported copy is a failure
            run()  # warm-up: JAX compilation, cuBLAS handles, CuPy kernels
            r = run()
    except (hb.CopyRequiredError, hb.CopyWarning) as exc:
        print(f"gpu_pipeline: FAILED, a hand-off needed a copy: {exc}")
        return 1

    chain = [
        ("cupy  normalised x", r["x"].data.ptr),
        ("torch input       ", r["xt"].data_ptr()),
        ("torch logits      ", r["logits"].data_ptr()),
        ("jax   logits      ", r["lj"].unsafe_buffer_pointer()),
        ("jax   labels      ", r["labels"].unsafe_buffer_pointer()),
        ("cupy  labels      ", r["lc"].data.ptr),
    ]
    print(f"gpu_pipeline on {torch.cuda.get_device_name(0)}: batch {BATCH}x{FEATURES} -> "
          f"MLP {FEATURES}-{HIDDEN}-{CLASSES}")
    print("pointer chain (= : the same device memory, handed over without a copy)")
    ok = True
    handoffs = {1: "cupy -> torch", 3: "torch -> jax", 5: "jax -> cupy"}
    for i, (name, ptr) in enumerate(chain):
        mark = ""
        if i in handoffs:
            same = ptr == chain[i - 1][1]
            ok &= same
            mark = "  = previous (zero-copy)" if same else "  != previous: COPIED"
        print(f"  {name} 0x{ptr:012x}{mark}")
    print("time per stage (ms, device-synchronised, second run)")
    for name, ms in r["timings"]:
        print(f"  {name:<24} {ms:8.3f}")

    # The same computation in torch alone, as a check on values (not on copies).
    with torch.inference_mode():
        xr = torch.from_dlpack(r["x"])  # direct DLPack, for reference only
        ref_labels = torch.softmax(model(xr), dim=-1).argmax(dim=-1).cpu().numpy()
    labels = cupy.asnumpy(r["lc"])
    agree = float((labels == ref_labels).mean())
    counts = cupy.asnumpy(r["counts"]).tolist()
    print(f"labels agree with torch alone: {agree:.4%}; class counts {counts}")
    if not ok:
        print("gpu_pipeline: FAILED, a hand-off copied (pointers differ)")
        return 1
    if agree < 0.999:  # softmax/argmax in JAX vs torch may break exact ties differently
        print("gpu_pipeline: FAILED, labels differ from the torch-only computation")
        return 1
    if sum(counts) != BATCH:
        print("gpu_pipeline: FAILED, class counts do not add up to the batch")
        return 1
    print("gpu_pipeline: OK, no copies, no host round trip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
