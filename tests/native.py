"""Native helpers that tests build for themselves: a consumer or thread written in C or C++,
compiled into a shared library the test loads with ctypes."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def shared_library(tmp_path_factory: pytest.TempPathFactory, name: str, source: str, *,
                   cxx: bool = False) -> str:
    """``source`` (C, or C++ with ``cxx``) built into a shared library, for a test's
    native helper; the test is skipped, saying why, where no compiler can build it."""
    tried = ("c++", "g++", "clang++") if cxx else ("cc", "gcc", "clang")
    compiler = next((c for c in tried if shutil.which(c)), None)
    if compiler is None:
        pytest.skip(f"no {'C++' if cxx else 'C'} compiler ({', '.join(tried)}) to build the "
                    f"{name} helper")
    d = tmp_path_factory.mktemp(name)
    src = d / ("helper.cc" if cxx else "helper.c")
    src.write_text(source)
    lib = d / "libhelper.so"
    out = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-pthread", str(src), "-o",
                          str(lib)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        pytest.skip(f"{compiler} could not build the {name} helper: {out.stderr[-500:]}")
    return str(lib)
