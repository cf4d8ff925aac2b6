"""The optional compiled part: hb.convert's shortcut front, the deleters of our DLPack
exports, the dense descriptor decoder and DLPack import/export through the C exchange
API (hurray_bridge/_speedups_c/, with c/src/descriptor.c).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the
install still succeeds and hurray_bridge uses the same steps written in Python.
"""

from setuptools import Extension, setup

_SRC = "hurray_bridge/_speedups_c"

# The dense descriptor decoder (decoder.c) is the C library's (c/src/descriptor.c): one
# copy of the wire rules in C, shared with c/ (docs/impl/c-api.md). So is the CRC-32
# (c/src/crc32.c), which _speedups_c/crc32.c only wraps.
setup(ext_modules=[Extension("hurray_bridge._speedups",
                             [f"{_SRC}/module.c", f"{_SRC}/front.c", f"{_SRC}/deleters.c",
                              f"{_SRC}/arrow_release.c",
                              f"{_SRC}/decoder.c", f"{_SRC}/tensor.c", f"{_SRC}/xapi_in.c",
                              f"{_SRC}/xapi_out.c", f"{_SRC}/crc32.c", f"{_SRC}/st_header.c",
                              f"{_SRC}/hry_index.c", f"{_SRC}/small_files.c",
                              "c/src/descriptor.c", "c/src/crc32.c"],
                             include_dirs=[_SRC, "c/include", "c/src"],
                             depends=[f"{_SRC}/speedups.h", f"{_SRC}/dlpack_abi.h",
                                      "c/include/hurray.h",
                                      "c/src/internal.h"],
                             optional=True)])
