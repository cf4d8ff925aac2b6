"""GPU benchmarks: torch -> JAX hand-off on CUDA, against jax.numpy.from_dlpack directly.

Goals (issue 10): hb.convert(x, "jax") at most 1.0x the direct import, and
hand-off time independent of size up to 8 GiB (zero-copy: JAX's pointer is
torch's). Run on a CUDA machine from the repository root:
``python -m benchmarks.gpu_bench`` (``gpu_tests/run.sh`` does). With ``$OUT`` set,
the figures are also written to ``$OUT/gpu_bench.json``.

The ratio is the median of per-round ratios, each round timing a batch of both
sides back to back (``benchmarks._timing.compare``), as the CPU benchmarks do.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from benchmarks._timing import Timing, compare, measure, ratio


def _line(t: Timing) -> str:
    return f"{t.median_us:.1f} us (IQR {t.spread_us:.1f})"


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device (torch.cuda.is_available() is False): GPU benchmarks skipped")
        return 0
    import jax
    import jax.numpy as jnp

    import hurray_bridge as hb
    from hurray_bridge import _shortcuts
    from hurray_bridge.adapters import jax as hj

    convert = hb.convert
    from_dlpack = jnp.from_dlpack
    results: dict[str, object] = {"device": torch.cuda.get_device_name(0),
                                  "compiled_front": _shortcuts.compiled}
    x = torch.arange(1000, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    y = convert(x, "jax")  # learns the pair; checked zero-copy before any timing
    if y.unsafe_buffer_pointer() != x.data_ptr():
        print("torch -> JAX on CUDA was not zero-copy: nothing to time")
        return 1
    served = _shortcuts.serves(x, "jax")
    general = convert.general  # type: ignore[attr-defined]
    bridge, direct, r = compare("hb.convert", lambda: convert(x, "jax"),
                                "jnp.from_dlpack", lambda: from_dlpack(x))
    results["handoff_small"] = {"bridge": bridge.as_dict(), "direct": direct.as_dict(),
                                "served_by": "shortcut" if served else "full path",
                                **ratio(r, "<= 1.0")}
    print(f"torch->jax CUDA, 1000 float32: hb.convert {_line(bridge)} "
          f"({'shortcut' if served else 'full path'}), jnp.from_dlpack {_line(direct)}: "
          f"ratio {r:.2f} (goal <= 1.0)")

    # The layers under the shortcut, in the same run: the full path (hb.Tensor and both
    # adapters around jaxlib's import) and the full path through jnp.from_dlpack (the
    # raw jaxlib import switched off).
    full, _, r_full = compare("full path", lambda: general(x, "jax"),
                                    "jnp.from_dlpack", lambda: from_dlpack(x))
    raw = hj._RAW_IMPORT
    hj._RAW_IMPORT = None
    try:
        public, _, r_public = compare("full path, public API", lambda: general(x, "jax"),
                                            "jnp.from_dlpack", lambda: from_dlpack(x))
    finally:
        hj._RAW_IMPORT = raw
    results["layers"] = {"full_path": {**full.as_dict(), "ratio": r_full},
                         "full_path_public_api": {**public.as_dict(), "ratio": r_public},
                         "raw_import": raw is not None}
    print(f"  full path {_line(full)}: ratio {r_full:.2f}; through jnp.from_dlpack "
          f"(raw import off) {_line(public)}: ratio {r_public:.2f}; raw import "
          f"{'on' if raw is not None else 'unavailable'}")

    # Where the time goes (for the note): the hand-off under cProfile.
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        convert(x, "jax")
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    print("profile of 300 x hb.convert(cuda tensor, 'jax'), by own time:")
    print("\n".join(buf.getvalue().splitlines()[6:24]))

    sizes: dict[str, dict[str, object]] = {}
    for gib in (1 / 2**20, 1 / 1024, 1, 4, 8):
        n = int(gib * 2**30) // 4
        try:
            big = torch.empty(n, dtype=torch.float32, device="cuda")
            big.fill_(1.0)
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print(f"  {gib:g} GiB: cannot allocate ({exc})")
            continue
        before = torch.cuda.memory_allocated()
        t = measure(f"{gib:g} GiB", lambda big=big: convert(big, "jax"), repeat=11)
        y = convert(big, "jax")
        same = y.unsafe_buffer_pointer() == big.data_ptr()
        grown = torch.cuda.memory_allocated() - before
        stats = jax.devices()[0].memory_stats() or {}
        sizes[f"{gib:g}GiB"] = {**t.as_dict(), "zero_copy": same,
                                "torch_alloc_growth_bytes": grown,
                                "jax_bytes_in_use": stats.get("bytes_in_use")}
        print(f"  {gib:>10g} GiB: {_line(t)} zero-copy={same} torch alloc growth {grown} B")
        del y, big
        torch.cuda.empty_cache()
    results["size_independence"] = sizes
    keys = list(sizes)
    if len(keys) >= 2:
        first, last = sizes[keys[0]]["median_us"], sizes[keys[-1]]["median_us"]
        growth = last / first  # type: ignore[operator]
        results["largest_vs_smallest"] = ratio(growth, "<= 1.2")
        print(f"  time ratio {keys[-1]} / {keys[0]}: {growth:.2f} (goal <= 1.2)")
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_bench.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
