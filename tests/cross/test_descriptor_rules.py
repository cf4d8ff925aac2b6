"""descriptor.RULES, held to one table of cases (tests/descriptor_cases.py) by every
implementation: the Python constructor, the Python decoder (general path and dense fast
path), the compiled decoder and the C library each accept a case or refuse it with the
same field; the constructor also names the rule. Every rule has a refusing case."""

from __future__ import annotations

import pathlib
import re

import pytest

import hurray_bridge as hb
from hurray_bridge import descriptor, wire
from tests.descriptor_cases import CASES, Case

WIRE_CASES = [c for c in CASES if c.on_wire]


def _id(case: Case) -> str:
    return case.name.replace(" ", "-")


def _construct(case: Case) -> str:
    try:
        case.wire.build(**case.kwargs)
    except hb.FormatError as exc:
        return f"err {exc.field} {exc.rule}"
    return "ok"


def _decode(raw: bytes) -> str:
    try:
        d = wire.decode(raw)
    except hb.FormatError as exc:
        return f"err {exc.field}"
    return f"ok {d!r}"


def test_every_rule_has_a_refusing_case_and_every_case_names_a_real_rule() -> None:
    names = [r.name for r in descriptor.RULES]
    assert len(set(names)) == len(names)
    named = {c.rule for c in CASES if c.rule is not None}
    assert set(names) - named == set(), "rules without a refusing case"
    assert named - set(names) == set(), "cases naming no rule of descriptor.RULES"
    for case in CASES:
        if case.rule is not None:
            assert case.field == descriptor.RULES[names.index(case.rule)].field, case.name


@pytest.mark.parametrize("case", [c for c in CASES if c.patch is None], ids=_id)
def test_the_constructor_answers_as_the_table_says(case: Case) -> None:
    want = "ok" if case.field is None else f"err {case.field} {case.rule}"
    assert _construct(case) == want


@pytest.mark.parametrize("case", WIRE_CASES, ids=_id)
def test_the_python_decoder_answers_as_the_table_says(case: Case) -> None:
    raw = case.raw()
    got = _decode(raw)
    if case.field is None:
        d = case.wire.build()
        assert got == f"ok {d!r}"
        assert raw == d.to_bytes()  # the table's own encoder writes what the library writes
    else:
        assert got == f"err {case.field}"


@pytest.mark.parametrize("case", WIRE_CASES, ids=_id)
def test_the_dense_fast_path_accepts_only_what_the_general_decoder_accepts(case: Case) -> None:
    # A prefix decoder: bytes after the descriptor are its caller's, so it is held to the
    # general prefix decoder (with the fast path out of its way), not to decode().
    raw = case.raw()
    fast = wire._decode_dense_python(raw, len(raw))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(wire, "_decode_dense", lambda data, n: None)
            d, table, size = wire.decode_prefix(raw)
    except hb.FormatError:
        assert fast is None  # it never accepts what the rules refuse
    else:
        dense = d.layout in (hb.Layout.ROW_MAJOR, hb.Layout.STRIDED) and not d.is_dynamic \
            and d.quantization is None and d.shard is None
        assert fast == ((d, table[0].offset, table[0].length, size) if dense else None)


def test_the_compiled_decoder_agrees_with_the_python_one_on_every_case() -> None:
    try:
        from hurray_bridge import _speedups
    except ImportError:
        pytest.skip("hurray_bridge._speedups was not built (no C compiler at install time)")
    dense_accepted = 0
    for case in WIRE_CASES:
        raw = case.raw()
        got = _speedups.decode_dense(raw, len(raw))
        assert got == wire._decode_dense_python(raw, len(raw)), case.name
        dense_accepted += got is not None
    assert dense_accepted >= 8  # the dense cases reach it, not only refusals


def test_the_c_library_answers_every_case_with_the_same_field(c_build: pathlib.Path) -> None:
    from tests.c.test_c_library import _ok, _py_decode, _run

    raws = [c.raw() for c in WIRE_CASES]
    got = _ok(_run(c_build / "test_hurray", "decode",
                   stdin="".join(r.hex() + "\n" for r in raws))).splitlines()
    assert len(got) == len(raws)
    for case, raw, c_line in zip(WIRE_CASES, raws, got, strict=True):
        want = "ok" if case.field is None else f"err {case.field}"
        assert c_line.split(" ")[0:2 if case.field else 1] == want.split(" "), (
            f"{case.name}: C says {c_line!r}, the table {want!r}")
        assert c_line == _py_decode(raw, False), case.name  # and the same bytes back


@pytest.mark.parametrize("case", [c for c in CASES if c.patch is None], ids=_id)
def test_skipping_the_rules_a_descriptor_has_no_part_for_changes_no_answer(
        case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    # Descriptor() runs only the rules whose Rule.needs the descriptor has: every rule
    # must give the same answer as all of them.
    filtered = _construct(case)
    monkeypatch.setattr(descriptor, "_rules_for", lambda d: descriptor._DESCRIPTOR_RULES)
    assert _construct(case) == filtered


def test_the_rules_page_lists_every_rule() -> None:
    page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "impl"
            / "descriptor-rules.md").read_text()
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", page, flags=re.MULTILINE))
    assert listed == {r.name for r in descriptor.RULES}
