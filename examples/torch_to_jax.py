"""Hand a model-sized torch state dict to JAX and back without copying a byte.

Builds a few hundred tensors of mixed dtypes (some empty), converts each one
torch -> JAX with ``hb.convert``, proves zero-copy by comparing data pointers,
converts back JAX -> torch (again zero-copy), and times the hand-off per
tensor against ``jax.numpy.from_dlpack`` called directly.

Run: python examples/torch_to_jax.py
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import torch

import hurray_bridge as hb

jax.config.update("jax_enable_x64", True)  # keep int64/float64 64-bit, as torch has them


def make_state_dict(layers: int = 48) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    sd: dict[str, torch.Tensor] = {}
    for i in range(layers):
        p = f"layers.{i}"
        sd[f"{p}.attn.qkv.weight"] = torch.randn(192, 64, dtype=torch.bfloat16)
        sd[f"{p}.attn.qkv.bias"] = torch.randn(192, dtype=torch.float32)
        sd[f"{p}.attn.out.weight"] = torch.randn(64, 64, dtype=torch.float16)
        sd[f"{p}.mlp.up.weight"] = torch.randn(256, 64)
        sd[f"{p}.mlp.down.weight"] = torch.randn(64, 256).to(torch.float8_e4m3fn)
        sd[f"{p}.norm.weight"] = torch.ones(64)
        sd[f"{p}.pruned_heads"] = torch.empty(0, dtype=torch.int64)  # empty, as in real checkpoints
    sd["embed.weight"] = torch.randn(1000, 64)
    sd["step"] = torch.tensor(12345, dtype=torch.int64)
    sd["mask"] = torch.rand(7, 9) > 0.5
    return sd


def pointer(x: object) -> int:
    return hb.asarray(x).data_ptr


def main() -> int:
    sd = make_state_dict()
    print(f"state dict: {len(sd)} tensors, "
          f"{sum(t.numel() * t.element_size() for t in sd.values()) / 2**20:.1f} MiB, "
          f"dtypes {sorted({str(t.dtype).removeprefix('torch.') for t in sd.values()})}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", hb.CopyWarning)
        t0 = time.perf_counter()
        jx = {k: hb.convert(v, "jax") for k, v in sd.items()}
        t_bridge = time.perf_counter() - t0
        back = {k: hb.convert(v, "torch") for k, v in jx.items()}
    # JAX memory is immutable, so torch warns once that it shares read-only memory:
    # that is a note, not a copy. Only CopyWarning reports a copy.
    copies = [str(w.message) for w in caught if issubclass(w.category, hb.CopyWarning)]

    same_to, same_back = 0, 0
    for k, v in sd.items():
        if v.numel() == 0:
            assert pointer(jx[k]) == 0 and back[k].data_ptr() == 0, k  # NULL, no allocation
            same_to += 1
            same_back += 1
            continue
        same_to += pointer(jx[k]) == v.data_ptr()
        same_back += back[k].data_ptr() == v.data_ptr()
        assert torch.equal(back[k].view(torch.uint8), v.view(torch.uint8)) if v.dim() else \
            back[k].item() == v.item(), k
    print(f"torch -> jax: {same_to}/{len(sd)} zero-copy (same data pointer)")
    print(f"jax -> torch: {same_back}/{len(sd)} zero-copy (same data pointer)")
    for c in copies:
        print(f"  copy reported: {c}")

    # Direct path for comparison: what a user would write without the bridge.
    t0 = time.perf_counter()
    direct = {}
    for k, v in sd.items():
        try:
            direct[k] = jnp.from_dlpack(v)
        except Exception as exc:  # JAX refuses some dtypes torch has
            direct[k] = exc
    t_direct = time.perf_counter() - t0
    refused = [k for k, v in direct.items() if isinstance(v, Exception)]

    per_bridge = t_bridge / len(sd) * 1e6
    per_direct = t_direct / len(sd) * 1e6
    print(f"time per tensor: hb.convert {per_bridge:.1f} us, "
          f"jax.numpy.from_dlpack {per_direct:.1f} us (ratio {per_bridge / per_direct:.2f})")
    if refused:
        print(f"jax.numpy.from_dlpack refused {len(refused)} tensors the bridge handed over, "
              f"e.g. {refused[0]}")
    samples = []
    x = sd["embed.weight"]
    for _ in range(200):
        t0 = time.perf_counter()
        hb.convert(x, "jax")
        samples.append(time.perf_counter() - t0)
    print(f"single 1000x64 float32 hand-off: median {statistics.median(samples) * 1e6:.1f} us")
    ok = same_to == len(sd) and same_back == len(sd) and not copies
    print("OK: every tensor crossed zero-copy" if ok else "NOTE: some tensors were copied")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
