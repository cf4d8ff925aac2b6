"""The how-to pages run as written: each page's ```python blocks, in order, in a fresh
interpreter and an empty folder (a page may write files there)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

from tests.frameworks import need

HOWTO = pathlib.Path(__file__).resolve().parents[2] / "docs" / "howto"
# What each page needs installed (module names).
NEEDS = {
    "torch-to-jax.md": ("torch", "jax"),
    "load-a-model-file.md": ("torch", "safetensors"),
    "sharded-checkpoints.md": ("numpy",),
}


def python_blocks(text: str) -> list[str]:
    """The page's fenced ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_every_howto_page_is_listed() -> None:
    assert {p.name for p in HOWTO.glob("*.md")} == set(NEEDS)


@pytest.mark.parametrize("page", sorted(NEEDS))
def test_howto_runs(page: str, tmp_path: pathlib.Path) -> None:
    need(*NEEDS[page])
    blocks = python_blocks((HOWTO / page).read_text(encoding="utf-8"))
    assert len(blocks) >= 2, f"{page}: expected its code in several ```python blocks"
    code = "\n".join(blocks) + "\nprint('HOWTO-DONE')\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.rstrip().endswith("HOWTO-DONE"), out.stdout


def test_blocks_are_found_as_written() -> None:
    text = "a\n```python\nx = 1\n```\nb\n```sh\nls\n```\n```python\ny = 2\n```\n"
    assert python_blocks(text) == ["x = 1\n", "y = 2\n"]
