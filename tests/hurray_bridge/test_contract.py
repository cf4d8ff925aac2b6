"""The adapter contract's machinery, on stand-in adapters (no framework needed): how
shortcuts are composed from fast hooks, and what the core reads from an adapter that
declares less than the contract (one being written)."""

from __future__ import annotations

import types
from typing import Any

import pytest

from hurray_bridge import _registry, _shortcuts
from hurray_bridge._contract import KINDS, NAMES
from hurray_bridge._shortcuts import EXPORTER, NDARRAY, RAW, compose, entry


def test_the_contract_names_its_declarations_and_functions() -> None:
    assert {"NAME", "HOLDS", "DEVICES", "to_hurray", "from_hurray", "fast_import",
            "fast_export", "special_kind", "native_dtypes"} <= set(NAMES)
    assert list(NAMES) == sorted(set(NAMES))
    assert KINDS == {"dense", "sparse", "quantized", "sharded"}


def test_an_identity_side_leaves_the_other_entry_as_it_is() -> None:
    e = entry(len, guard=("ndim", 1), nonempty=True)
    assert compose(None, e) is e and compose(e, None) is e


def _run(e: Any, x: Any) -> Any:
    fn, attr, _value, kwnames, kwvalues, nonempty = e
    assert attr is None and not nonempty
    return fn(x, **dict(zip(kwnames, kwvalues)))


def test_composed_entry_reads_then_builds_and_checks_the_exports_guards_on_the_raw_form(
) -> None:
    class Raw:
        def __init__(self, ndim: int) -> None:
            self.ndim = ndim

    read = entry(lambda x, scale: Raw(x * scale) if x >= 0 else NotImplemented,
                 kwargs={"scale": 1})
    build = entry(lambda raw, tag: (tag, raw.ndim), guard=("ndim", 1), kwargs={"tag": "out"})
    both = compose(read, build)
    assert both is not None and _shortcuts._valid(both)
    assert _run(both, 1) == ("out", 1)
    assert _run(both, 2) is NotImplemented  # the export's guard, on the raw form
    assert _run(both, -1) is NotImplemented  # the import declined: the export never runs


def test_the_imports_guards_stay_on_the_source_object() -> None:
    read = entry(lambda x: x, guard=("real", 3), nonempty=False)
    build = entry(lambda raw: raw + 1)
    both = compose(read, build)
    assert both is not None and both[1:3] == ("real", 3) and both[0](3) == 4


def test_the_first_form_the_target_takes_that_the_source_gives_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    src = types.SimpleNamespace(fast_import=lambda tp: {EXPORTER: None, RAW: entry(str)})
    dst = types.SimpleNamespace(fast_export=lambda: {NDARRAY: None, RAW: entry(repr),
                                                     EXPORTER: entry(seen.append)})
    monkeypatch.setattr(_shortcuts, "_hooks", {"src": src, "dst": dst}.__getitem__)
    got = _shortcuts.maker(int, "src", "dst")
    assert got is not None and got[0](5) == "'5'"  # RAW comes before EXPORTER for dst
    assert seen == []


def test_an_adapter_without_hooks_has_no_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = types.SimpleNamespace()  # an adapter still being written: no hooks at all
    full = types.SimpleNamespace(fast_import=lambda tp: {NDARRAY: None},
                                 fast_export=lambda: {NDARRAY: None})
    hooks = {"bare": bare, "full": full}
    monkeypatch.setattr(_shortcuts, "_hooks", hooks.__getitem__)
    assert _shortcuts.maker(int, "bare", "full") is None
    assert _shortcuts.maker(int, "full", "bare") is None
    assert _shortcuts.maker(int, "full", "full") is None  # never a shortcut to itself


def test_an_adapter_that_declares_nothing_holds_dense_objects_and_tells_no_kind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    bare = types.ModuleType("bare")
    torchlike = types.ModuleType("torchlike")
    torchlike.HOLDS = frozenset({"dense", "quantized"})  # type: ignore[attr-defined]
    torchlike.special_kind = lambda obj: "quantized" if obj == "q" else None  # type: ignore[attr-defined]
    monkeypatch.setattr(_registry, "get_adapter", {"bare": bare, "tl": torchlike}.__getitem__)
    assert not _registry.holds("bare", "quantized") and _registry.holds("bare", "dense")
    assert _registry.special_kind("bare", "q") is None
    assert _registry.holds("tl", "quantized")
    assert _registry.special_kind("tl", "q") == "quantized"
    assert _registry.special_kind("tl", "x") is None
