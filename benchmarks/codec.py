"""Descriptor codec: encode/decode of rank-1, rank-4 and rank-64 descriptors.

Goal (issue 8): decoding a rank-4 descriptor is no slower than ``json.loads``
of the equivalent safetensors header entry, measured in the same run.
"""

from __future__ import annotations

import json
from typing import Any

import hurray_bridge as hb

from ._timing import measure


def run() -> dict[str, Any]:
    results: dict[str, Any] = {"timings": [], "ratios": {}}
    descs = {
        "rank1": hb.Descriptor([1000], hb.float32),
        "rank4": hb.Descriptor([8, 64, 56, 56], hb.bfloat16),
        "rank64": hb.Descriptor([1] * 62 + [3, 5], hb.int8),
    }
    for name, d in descs.items():
        raw = d.to_bytes()
        enc = measure(f"encode {name}", d.to_bytes)
        dec = measure(f"decode {name}", lambda raw=raw: hb.Descriptor.from_bytes(raw))
        results["timings"] += [enc.as_dict(), dec.as_dict()]
    header = json.dumps({"conv.weight": {"dtype": "BF16", "shape": [8, 64, 56, 56],
                                         "data_offsets": [0, 3211264]}})
    js = measure("json.loads safetensors entry (rank 4)", lambda: json.loads(header))
    raw4 = descs["rank4"].to_bytes()
    dec4 = measure("decode rank4 (again, paired)", lambda: hb.Descriptor.from_bytes(raw4))
    results["timings"].append(js.as_dict())
    results["ratios"]["decode_rank4_vs_json_loads"] = {
        "value": dec4.median_us / js.median_us, "goal": "<= 1.0"}
    return results
