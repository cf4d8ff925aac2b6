"""Let a source checkout find ``hurray_bridge.adapters`` in the top-level ``adapters/``.

The package maps the repository's ``adapters/`` folder to
``hurray_bridge.adapters`` at install time. Run from a source checkout without
that mapping (a path-based editable install, or the repository root first on
``sys.path``) the import system would not find it; this adds the repository
root to the package's search path in exactly that case. Installed wheels carry
``hurray_bridge/adapters/`` and are left alone.
"""

from __future__ import annotations

import os
import sys

_package = sys.modules[__package__]
_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "adapters")) and os.path.isfile(
    os.path.join(_root, "adapters", "__init__.py")
):
    _package.__path__.append(_root)
