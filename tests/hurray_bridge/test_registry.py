"""The registry's declarations of frameworks that cannot share a process (``not_with``):
read both ways, and a framework kept out of a process that imported its counterpart,
refused by name instead of imported into a crash."""

from __future__ import annotations

import sys
import types

import pytest

import hurray_bridge as hb
from hurray_bridge import _registry
from hurray_bridge._registry import AdapterSpec, apart, conflicts, get_adapter, kept_apart

WHY = "the two crash together (a stand-in declaration)"


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two stand-in adapters whose frameworks (never installed) cannot share a process;
    only the second's line says so."""
    monkeypatch.setitem(_registry.ADAPTERS, "alpha", AdapterSpec("alpha", "hb_test_alpha", "a"))
    monkeypatch.setitem(_registry.ADAPTERS, "beta", AdapterSpec(
        "beta", "hb_test_beta", "b", not_with=(("alpha", WHY),)))


def test_paddle_and_tensorflow_are_declared_apart_both_ways() -> None:
    assert "segmentation fault" in conflicts("paddle")["tensorflow"]
    assert conflicts("tensorflow")["paddle"] == conflicts("paddle")["tensorflow"]
    assert conflicts("numpy") == {}


def test_a_declaration_is_read_from_either_line(pair: None) -> None:
    assert conflicts("beta") == {"alpha": WHY}
    assert conflicts("alpha") == {"beta": WHY}


def test_the_second_of_a_pair_is_refused_naming_the_first(pair: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    assert kept_apart("beta") is None  # neither is imported: either may come first
    monkeypatch.setitem(sys.modules, "hb_test_alpha", types.ModuleType("hb_test_alpha"))
    why = kept_apart("beta")
    assert why is not None and "alpha is imported already" in why and WHY in why
    with pytest.raises(hb.UnsupportedError, match="separate processes"):
        get_adapter("beta")
    assert kept_apart("alpha") is None, "a framework imported already is not kept out"


def test_apart_keeps_an_imported_framework_else_the_first_named(
        pair: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert apart(["numpy", "beta", "alpha"]) == (["numpy", "beta"], {"alpha": ("beta", WHY)})
    monkeypatch.setitem(sys.modules, "hb_test_alpha", types.ModuleType("hb_test_alpha"))
    assert apart(["numpy", "beta", "alpha"]) == (["numpy", "alpha"], {"beta": ("alpha", WHY)})
