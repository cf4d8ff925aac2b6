"""``python -m benchmarks [--json FILE] [suite ...]``: print a table, write JSON."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import platform
import sys
import time

SUITES = ("handoff", "size", "statedict", "codec", "c_decoder", "files", "convert", "peers",
          "shards", "flight", "checkpoint_dir", "arrow_capsule", "jax_restore", "dcp",
          "many_tensors", "startup", "mlx", "paddle")


def _machine() -> dict[str, object]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    versions = {}
    for mod in ("numpy", "torch", "jax", "jaxlib", "pyarrow", "ml_dtypes", "safetensors",
                "tvm_ffi", "mlx"):
        try:
            from importlib.metadata import version

            dist = {"tvm_ffi": "apache-tvm-ffi"}.get(mod, mod)
            versions[mod] = version(dist)
        except Exception:
            continue
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "processor": cpu, "cpus": os.cpu_count(), "versions": versions,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks")
    p.add_argument("suites", nargs="*", default=list(SUITES), help=f"any of {SUITES}")
    p.add_argument("--json", default="benchmarks/results/latest.json")
    p.add_argument("--small", action="store_true",
                   help="quick runs at reduced sizes (suites whose run() takes small=)")
    args = p.parse_args()
    out: dict[str, object] = {"machine": _machine()}
    for name in args.suites:
        run = importlib.import_module(f"benchmarks.{name}").run
        takes_small = "small" in inspect.signature(run).parameters
        res = run(small=True) if args.small and takes_small else run()
        out[name] = res
        print(f"== {name}")
        for note in res.get("notes", ()):
            print(f"  note: {note}")
        for t in res["timings"]:
            print(f"  {t['name']:<48} {t['median_us']:10.2f} us  (IQR {t['iqr_us']:.2f})")
        for k, r in res["ratios"].items():
            value = "n/a" if r["value"] is None else f"{r['value']:.3f}"
            met = {True: "met", False: "NOT MET", None: ""}[r.get("met")]
            print(f"  ratio {k:<42} {value:>10}   goal {r['goal']:<7} {met}")
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
