"""The optional compiled part: hb.convert's shortcut front and the dense descriptor decoder
(hurray_bridge/_speedups.c, with c/src/descriptor.c).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds and hurray_bridge uses the same steps written in Python.
"""

from setuptools import Extension, setup

# The dense descriptor decoder of _speedups.c is the C library's (c/src/descriptor.c): one
# copy of the wire rules in C, shared with c/ (docs/impl/c-api.md).
setup(ext_modules=[Extension("hurray_bridge._speedups",
                             ["hurray_bridge/_speedups.c", "c/src/descriptor.c"],
                             include_dirs=["c/include", "c/src"],
                             depends=["c/include/hurray.h", "c/src/internal.h"],
                             optional=True)])
