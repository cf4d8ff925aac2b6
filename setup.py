"""The optional compiled part: hb.convert's shortcut front (hurray_bridge/_speedups.c).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds and hurray_bridge uses the same steps written in Python.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("hurray_bridge._speedups", ["hurray_bridge/_speedups.c"],
                             optional=True)])
