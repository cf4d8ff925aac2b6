"""Descriptor codec: encode/decode of rank-1, rank-4 and rank-64 descriptors.

Goal (issue 8): decoding a rank-4 descriptor is no slower than ``json.loads``
of the equivalent safetensors header entry, measured in the same run.
"""

from __future__ import annotations

import json
from typing import Any

import hurray_bridge as hb

from ._timing import compare, measure, ratio


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
    raw4 = descs["rank4"].to_bytes()
    # Interleaved in the same run (see _timing.compare): the ratio is the median per round.
    dec4, js, r = compare("decode rank4 (paired)", lambda: hb.Descriptor.from_bytes(raw4),
                          "json.loads safetensors entry (rank 4)", lambda: json.loads(header))
    results["timings"] += [dec4.as_dict(), js.as_dict()]
    results["ratios"]["decode_rank4_vs_json_loads"] = ratio(r, "<= 1.0")
    return results
