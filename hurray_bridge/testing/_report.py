"""What a check run hands back: one :class:`CheckResult` per check, gathered in a :class:`Report`.

A check ends in one of three ways: it returns a note (a pass), or raises :class:`Fail`
or :class:`Skip` with the reason.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from typing import NamedTuple

PASS, FAIL, SKIP = "pass", "fail", "skip"


class CheckResult(NamedTuple):
    """One check: its name, ``"pass"``, ``"fail"`` or ``"skip"``, and why (a note on a pass)."""

    name: str
    status: str
    why: str = ""


class Report(list[CheckResult]):
    """The results of :func:`check_producer` or :func:`check_consumer`, in check order;
    ``str()`` is a table. ``producer`` names what was checked (a consumer too), and
    ``kind`` says which side: ``"producer"`` or ``"consumer"``."""

    def __init__(
        self, results: Iterable[CheckResult] = (), *, producer: str = "", dtype: str = "",
        kind: str = "producer",
    ) -> None:
        super().__init__(results)
        self.producer = producer
        self.dtype = dtype
        self.kind = kind

    @property
    def passed(self) -> list[CheckResult]:
        return [r for r in self if r.status == PASS]

    @property
    def failed(self) -> list[CheckResult]:
        return [r for r in self if r.status == FAIL]

    @property
    def skipped(self) -> list[CheckResult]:
        return [r for r in self if r.status == SKIP]

    @property
    def ok(self) -> bool:
        """No check failed (skips are not failures)."""
        return not self.failed

    def result(self, name: str) -> CheckResult:
        """The result of the check called ``name``."""
        for r in self:
            if r.name == name:
                return r
        names = ", ".join(r.name for r in self)
        raise KeyError(f"no check {name!r} in this report; it has {names}")

    def raise_if_failed(self) -> None:
        """Raise ``AssertionError`` listing every failed check and why."""
        if self.failed:
            lines = [f"{r.name}: {r.why}" for r in self.failed]
            raise AssertionError(
                f"{len(lines)} DLPack {self.kind} check(s) failed for "
                f"{self.producer or self.kind}:\n"
                + "\n".join(f"  {line}" for line in lines)
            )

    def __str__(self, width: int = 100) -> str:
        name_w = max([len("check"), *(len(r.name) for r in self)])
        head = f"DLPack {self.kind} checks: {self.producer}"
        if self.dtype:
            head += f" ({self.dtype})"
        out = [head, "", f"{'check':<{name_w}}  result  why", f"{'-' * name_w}  ------  {'-' * 40}"]
        indent = " " * (name_w + 10)
        for r in self:
            label = r.status.upper() if r.status == FAIL else r.status
            why = textwrap.wrap(r.why, max(30, width - len(indent))) or [""]
            out.append(f"{r.name:<{name_w}}  {label:<6}  {why[0]}")
            out.extend(indent + w for w in why[1:])
        out += ["", f"{len(self)} checks: {len(self.passed)} passed, {len(self.failed)} failed, "
                    f"{len(self.skipped)} skipped"]
        return "\n".join(out)

    def __repr__(self) -> str:
        return (f"<Report {self.producer or self.kind}: {len(self.passed)} passed, "
                f"{len(self.failed)} failed, {len(self.skipped)} skipped>")


class Fail(Exception):
    """The check found a defect; the message says which."""


class Skip(Exception):
    """The check cannot run on this producer; the message says why."""


def short(exc: BaseException, limit: int = 160) -> str:
    """``exc`` in one line of at most ``limit`` characters, for a result's reason."""
    text = str(exc).strip().splitlines()
    msg = text[0] if text else ""
    if len(msg) > limit:
        msg = msg[: limit - 3] + "..."
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__

