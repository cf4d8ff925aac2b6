"""``import hurray_bridge`` must load no framework (checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("numpy", "torch", "jax", "cupy", "pyarrow", "ml_dtypes", "scipy", "tensorflow",
              "mlx")

SCRIPT = """
import json, sys
import hurray_bridge as hb
import hurray_bridge.adapters
d = hb.Descriptor([2, 3], hb.float32)
hb.Descriptor.from_bytes(d.to_bytes())
{extra}
print(json.dumps(sorted(m for m in {frameworks!r} if m in sys.modules)))
"""


def _loaded(extra: str = "") -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(frameworks=FRAMEWORKS, extra=extra)],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_loads_no_framework() -> None:
    assert _loaded() == []


def test_descriptor_work_loads_no_framework() -> None:
    assert _loaded("hb.Descriptor([hb.DYNAMIC], hb.int4).resolve([3]).to_bytes()") == []
