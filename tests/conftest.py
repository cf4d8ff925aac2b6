"""Suite-wide fixtures."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from .frameworks import BACKENDS, Backend
from .frameworks import backend as _backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Backend:
    """Each framework in turn (numpy, torch, jax, arrow; cupy where installed); a framework
    that is not installed skips its case with the reason "<module> is not installed"."""
    return _backend(request.param)


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """``gc.collect()`` walks only the objects made during the test.

    A full collection walks every object the session holds (torch, JAX, hypothesis...):
    0.3 s each, where a lifetime check collects several times per case. Frozen objects
    are roots to the collector, so everything the test makes is still collected when it
    becomes garbage; only garbage from before the test waits for the next collection.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
