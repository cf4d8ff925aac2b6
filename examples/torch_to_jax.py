"""Hand a model-sized torch state dict to JAX and back without copying a byte.

Builds a few hundred tensors of mixed dtypes (some empty), converts each one
torch -> JAX with ``hb.convert``, proves zero-copy by comparing data pointers,
converts back JAX -> torch (again zero-copy), and times the hand-off per
tensor against ``jax.numpy.from_dlpack`` called directly: warm calls, the two
interleaved round by round, the median of many rounds (as ``benchmarks/`` does,
with its helper when the script runs from the repository).

Run: python examples/torch_to_jax.py
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch

import hurray_bridge as hb

jax.config.update("jax_enable_x64", True)  # keep int64/float64 64-bit, as torch has them

ROUNDS = 31


def _compare(fn_a: Callable[[], object], fn_b: Callable[[], object]) -> tuple[float, float, float]:
    """(median us of a, median us of b, median ratio a/b) over interleaved warm rounds."""
    root = pathlib.Path(__file__).resolve().parents[1]
    if (root / "benchmarks" / "_timing.py").is_file():  # in the repository: its one helper
        sys.path.insert(0, str(root))
        from benchmarks._timing import compare

        a, b, r = compare("a", fn_a, "b", fn_b, rounds=ROUNDS)
        return a.median_us, b.median_us, r
    fn_a(), fn_b()  # warm up: the first call learns the path, later ones take it
    sa, sb = [], []
    for i in range(ROUNDS):
        for fn, out in ((fn_a, sa), (fn_b, sb)) if i % 2 == 0 else ((fn_b, sb), (fn_a, sa)):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e6)
    return (statistics.median(sa), statistics.median(sb),
            statistics.median(a / b for a, b in zip(sa, sb)))


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
        jx = {k: hb.convert(v, "jax") for k, v in sd.items()}
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
    refused = []
    for k, v in sd.items():
        try:
            jnp.from_dlpack(v)
        except Exception:  # JAX refuses some dtypes torch has
            refused.append(k)
    both = [v for k, v in sd.items() if k not in refused]  # compared on what both take

    # Warm calls only, each side's batch next to the other's in every round, and the
    # median over the rounds: one cold pass measures imports and first-call setup.
    us_bridge, us_direct, ratio = _compare(lambda: [hb.convert(v, "jax") for v in both],
                                           lambda: [jnp.from_dlpack(v) for v in both])
    print(f"time per tensor, median of {ROUNDS} warm rounds over the {len(both)} tensors both "
          f"take: hb.convert {us_bridge / len(both):.2f} us, jax.numpy.from_dlpack "
          f"{us_direct / len(both):.2f} us (ratio {ratio:.2f})")
    if refused:
        print(f"jax.numpy.from_dlpack refused {len(refused)} tensors the bridge handed over, "
              f"e.g. {refused[0]}")
    x = sd["embed.weight"]
    us_one, us_one_direct, ratio_one = _compare(lambda: hb.convert(x, "jax"),
                                                lambda: jnp.from_dlpack(x))
    print(f"single 1000x64 float32 hand-off, median of {ROUNDS} warm rounds: "
          f"{us_one:.2f} us (jax.numpy.from_dlpack {us_one_direct:.2f} us, ratio {ratio_one:.2f})")
    ok = same_to == len(sd) and same_back == len(sd) and not copies
    print("OK: every tensor crossed zero-copy" if ok else "NOTE: some tensors were copied")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
