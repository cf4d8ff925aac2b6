"""The public names, read from the source without importing anything.

The public interface is the ``__all__`` of ``hurray_bridge``, of the submodules it
exports (``hurray_bridge.shards`` ...), of ``hurray_bridge.testing`` and of each
adapter (``adapters/<fw>/__init__.py``, installed as ``hurray_bridge.adapters.<fw>``).
The adapters import their framework at the top, so the names are read from the
syntax tree: this works where torch, JAX or CuPy are not installed. The docs site
(``scripts/mkdocs_hooks.py``) makes one reference page per module listed here, and
``tests/docs/`` checks that each name has a docstring and a place in the built site.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]

ADAPTERS = ("numpy", "torch", "jax", "arrow", "cupy", "dask", "tensorflow", "mlx", "paddle")
# Adapter modules imported by name (not through the adapter's __init__), each its own page.
ADAPTER_SUBMODULES = (("arrow", "flight"), ("torch", "checkpoint"))
# hurray_bridge's own submodules that its __all__ exports as modules.
SUBMODULES = ("dtypes", "quant", "shards", "shm", "sparse", "stream")


@dataclass(frozen=True)
class PublicModule:
    """One module of the public interface."""

    name: str  # the import name a user writes
    griffe_path: str  # what mkdocstrings loads (adapters/ is a top-level folder in the tree)
    source: pathlib.Path

    @property
    def page(self) -> str:
        """The reference page's path inside the site's docs folder."""
        return f"reference/{self.name}.md"


def public_modules() -> list[PublicModule]:
    """Every module whose ``__all__`` is public interface, in reference order."""
    mods = [PublicModule("hurray_bridge", "hurray_bridge", ROOT / "hurray_bridge/__init__.py")]
    mods += [PublicModule(f"hurray_bridge.{m}", f"hurray_bridge.{m}",
                          ROOT / f"hurray_bridge/{m}.py") for m in SUBMODULES]
    mods.append(PublicModule("hurray_bridge.testing", "hurray_bridge.testing",
                             ROOT / "hurray_bridge/testing/__init__.py"))
    mods += [PublicModule(f"hurray_bridge.adapters.{fw}", f"adapters.{fw}",
                          ROOT / f"adapters/{fw}/__init__.py") for fw in ADAPTERS]
    mods += [PublicModule(f"hurray_bridge.adapters.{fw}.{m}", f"adapters.{fw}.{m}",
                          ROOT / f"adapters/{fw}/{m}.py") for fw, m in ADAPTER_SUBMODULES]
    return mods


def parse(path: pathlib.Path) -> ast.Module:
    """The syntax tree of a source file."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def all_names(tree: ast.Module) -> list[str]:
    """The module's ``__all__``, a literal list of strings."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            value = ast.literal_eval(node.value)  # type: ignore[union-attr]
            return [str(v) for v in value]
    raise LookupError("no literal __all__")


def public_names() -> dict[str, list[str]]:
    """Each public module's name and its ``__all__``."""
    return {m.name: all_names(parse(m.source)) for m in public_modules()}
