"""CopyWarning texts name the reason, never an address, so Python's warning filter
shows each copying line once (buffer-protocol.md: a CopyWarning names the caller's line)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numpy")
pytest.importorskip("jax")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import hurray_bridge as hb

    keep = []  # every source stays alive: 20,000 distinct addresses
    for i in range(20000):
        raw = np.zeros(64 + 16, np.uint8)
        off = 8 if raw.ctypes.data % 64 != 8 else 16
        a = np.frombuffer(raw, np.float32, count=4, offset=off)
        assert a.ctypes.data % 64
        keep.append(a)
        hb.convert(a, "jax")                 # line A: one location, many addresses
    for a in keep[:50]:
        hb.convert(a, "jax")                 # line B: a second location, seen addresses
    print("done")
""")


def test_unaligned_copies_warn_once_per_line_under_the_default_filter() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "done"
    lines = [ln for ln in res.stderr.splitlines() if "CopyWarning" in ln]
    # Python's default action shows a warning once per (text, category, line): one per line
    # of the script that copies, whatever the addresses.
    assert len(lines) == 2, res.stderr[:2000]
    assert all("not 64-byte aligned" in ln for ln in lines)
    assert not any("0x" in ln for ln in lines), lines
