"""The consumer side of the kit: :func:`check_consumer` hands a library's ``from_dlpack``
the kit's own producer in a child process and judges what the child saw.

A consumer that writes to read-only memory is caught writing: the memory is a page
``mprotect``'ed ``PROT_READ``, so the write kills the child (SIGSEGV, or SIGBUS), and the
parent reads that from the exit status. Every check runs in the same child until one
kills it; the next child resumes after that check. Each child is bounded in time.
The child's side is :mod:`._consumer_child`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ._report import FAIL, PASS, SKIP, CheckResult, Report

CONSUMER_CHECKS: dict[str, str] = {
    "imports": "from_dlpack imports the kit's producer (writable host memory) with the right "
               "values",
    "read_only": "a READ_ONLY capsule over a write-protected page is refused, imported "
                 "read-only (the write raises) or copied; never written",
    "deleter_once": "the deleter is called exactly once, not before the array is done with "
                    "the memory, and the capsule is renamed used_*",
    "copy_true": "from_dlpack(x, copy=True) gives an array that does not share the producer's "
                 "memory",
    "copy_false": "from_dlpack(x, copy=False) gives an array that shares the producer's memory",
}
"""Every consumer check's name and what it verifies, in the order the checks run."""

DEFAULT_TIMEOUT_S = 60.0
_CRASH_SIGNALS = ("SIGSEGV", "SIGBUS")
_DEFAULT_WRITE = "x[...] = 7.0"


def _spec_of(fn: Callable[..., Any], what: str) -> str:
    """``MODULE:QUALNAME`` of a callable, when importing that name gives it back."""
    from ._producer import load_factory

    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", None)
    spec = f"{mod}:{qual}" if mod and qual and "<" not in qual else None
    if spec is not None:
        try:
            if load_factory(spec, what=what) is fn:
                return spec
        except ValueError:
            pass
    raise ValueError(f"the {what} {fn!r:.80} is not importable by name (the checks run in a "
                     "child process, which imports it): pass 'MODULE:FUNCTION', for example "
                     "'mylib:from_dlpack'")


def check_consumer(
    consumer: str | Callable[..., Any],
    *,
    write: str | Callable[[Any], None] | None = None,
    checks: Iterable[str] | str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    label: str | None = None,
) -> Report:
    """Run the DLPack consumer checks on ``consumer``, a ``from_dlpack`` function.

    ``consumer`` is ``"MODULE:FUNCTION"`` or a function importable by its name (the
    checks run in child processes). ``write`` is how to write into one of its arrays,
    ``"MODULE:FUNCTION"`` taking the array; by default ``x[...] = 7.0``. ``timeout``
    bounds each check, in seconds (the child's start and the consumer's import count
    as one more). Never raises for a failing check; ``ValueError`` for a name that does
    not import or an unknown check.
    """
    spec = consumer if isinstance(consumer, str) else _spec_of(consumer, "consumer")
    write_spec = write if write is None or isinstance(write, str) else _spec_of(write, "write")
    if isinstance(checks, str):
        checks = (checks,)
    asked = list(CONSUMER_CHECKS) if checks is None else list(checks)
    unknown = [n for n in asked if n not in CONSUMER_CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(map(repr, unknown))}; the consumer "
                         f"checks are {', '.join(CONSUMER_CHECKS)}")
    names = [n for n in CONSUMER_CHECKS if n in asked]
    results = _Run(spec, write_spec, timeout).results(names)
    return Report(results, producer=label or spec, kind="consumer")


def validate_consumer(consumer: str, write: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Import ``consumer`` (and ``write``) in a child, as the checks will: ``ValueError``
    naming the problem when they do not import."""
    _Run(consumer, write, timeout).results([])


class _Run:
    def __init__(self, spec: str, write: str | None, timeout: float) -> None:
        from ._producer import split_spec

        split_spec(spec, what="consumer")
        if write is not None:
            split_spec(write, what="write")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (
                0 < timeout < float("inf")):
            raise ValueError(f"timeout={timeout!r}: the seconds each consumer check may take "
                             "must be a finite number above 0 (the default is "
                             f"{DEFAULT_TIMEOUT_S:g})")
        self.spec = spec
        self.write = write
        self.timeout = timeout

    def results(self, names: list[str]) -> list[CheckResult]:
        out: list[CheckResult] = []
        todo = list(names)
        while True:
            events, status, tail = self._child(todo)
            loaded = any(e.get("loaded") for e in events)
            for e in events:
                if "error" in e:
                    raise ValueError(e["error"])
            if not loaded:
                raise ValueError(f"the child process that imports {self.spec!r} "
                                 f"{_ended(status, self.timeout * (len(todo) + 1))}: {tail}")
            done = {e["check"]: e["obs"] for e in events if "obs" in e}
            for name in list(todo):
                if name not in done:
                    break
                out.append(_judge(name, done[name], self.write))
                todo.remove(name)
            if not todo:
                return out
            # The child ended inside this check: that is its result.
            name = todo.pop(0)
            steps = [e["step"] for e in events if e.get("check") == name and "step" in e]
            out.append(_died(name, steps[-1] if steps else "start", status, tail,
                             self.timeout, self.write))
            if not todo:
                return out

    def _child(self, names: list[str]) -> tuple[list[dict[str, Any]], int | None, str]:
        from ._consumer_child import TAG

        args = json.dumps({"consumer": self.spec, "write": self.write, "checks": names,
                           "path": [os.getcwd() if p == "" else p for p in sys.path]})
        cmd = [sys.executable, "-m", "hurray_bridge.testing._consumer_child", args]
        limit = self.timeout * (len(names) + 1)
        status: int | None
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                                  env={**os.environ, "PYTHONFAULTHANDLER": ""})
            stdout, stderr, status = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            stdout, stderr, status = _text(exc.stdout), _text(exc.stderr), None
        events = [json.loads(line[len(TAG):]) for line in stdout.splitlines()
                  if line.startswith(TAG)]
        lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return events, status, (lines[-1].strip()[:200] if lines else "")


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def _ended(status: int | None, limit: float) -> str:
    if status is None:
        return f"did not finish within {limit:g} s"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


def _write_named(write: str | None) -> str:
    return f"the write {write}" if write else f"the write {_DEFAULT_WRITE}"


def _died(name: str, step: str, status: int | None, tail: str, timeout: float,
          write: str | None) -> CheckResult:
    how = _ended(status, timeout)
    if status is not None and status < 0 and name == "read_only" and step == "write":
        crash = any(how.endswith(s) for s in _CRASH_SIGNALS)
        why = (f"wrote to read-only memory: the capsule carried READ_ONLY, the consumer "
               f"imported it as a writable array, and the process {how} at "
               f"{_write_named(write)}"
               + (" (the kit's page is mprotect'ed PROT_READ)" if crash else ""))
        return CheckResult(name, FAIL, why)
    where = {"import": "in from_dlpack", "writable_import": "in from_dlpack (writable memory)",
             "writable_write": f"at {_write_named(write)} (writable memory)",
             "write": f"at {_write_named(write)}", "release": "while the array was released",
             "start": "before the check began"}.get(step, f"at step {step}")
    why = f"the process {how} {where}"
    if tail and status is not None:
        why += f" ({tail})"
    return CheckResult(name, FAIL, why)


def _asked(requests: list[dict[str, Any]]) -> str:
    if not requests:
        return "never called __dlpack__"
    shown = []
    for r in requests:
        parts = [] if r["max_version"] is None else [f"max_version={tuple(r['max_version'])}"]
        if r.get("copy") is not None:
            parts.append(f"copy={r['copy']}")
        shown.append(f"__dlpack__({', '.join(parts)})")
    return "asked " + ", then ".join(shown)


def _legacy_only(requests: list[dict[str, Any]]) -> bool:
    return bool(requests) and all(r["max_version"] is None or r["max_version"][0] < 1
                                  for r in requests)


def _err(e: dict[str, str]) -> str:
    return e["text"]


def _judge(name: str, obs: dict[str, Any], write: str | None) -> CheckResult:
    try:
        status, why = _JUDGES[name](obs, write)
    except KeyError as exc:  # an observation the child did not make: the kit's own bug
        status, why = FAIL, f"the kit's child reported no {exc} for {name}"
    return CheckResult(name, status, why)


def _imports(obs: dict[str, Any], _write: str | None) -> tuple[str, str]:
    asked = _asked(obs["requests"])
    if "error" in obs:
        return FAIL, f"from_dlpack raised {_err(obs['error'])} ({asked})"
    if obs["values"] is False:
        return FAIL, f"the imported {obs['type']} reads different values ({asked})"
    notes = [asked, f"a {obs['type']}" + (" with the right values" if obs["values"] else "")]
    if obs["values"] is None:
        notes.append("values not compared (its __dlpack__ gave nothing the kit reads)")
    if _legacy_only(obs["requests"]):
        notes.append("legacy capsules only: no max_version, so it never receives READ_ONLY "
                     "or IS_COPIED")
    return PASS, "; ".join(notes)


def _read_only(obs: dict[str, Any], write: str | None) -> tuple[str, str]:
    wrote = _write_named(write)
    if "writable_error" in obs:
        return SKIP, (f"cannot import the kit's writable producer either "
                      f"({_err(obs['writable_error'])}; see 'imports')")
    if "import_error" in obs:
        if _legacy_only(obs["requests"]):
            return SKIP, ("not applicable: it asks only for legacy capsules (no max_version), "
                          "which cannot carry READ_ONLY; the kit's producer refuses those for "
                          "read-only memory with BufferError, as a producer of read-only memory "
                          "must, so read-only memory never reaches this consumer")
        return PASS, (f"refused the READ_ONLY capsule: {_err(obs['import_error'])} "
                      f"({_asked(obs['requests'])})")
    if "writable_write_error" in obs:
        return SKIP, (f"cannot observe: {wrote} raised on writable memory too "
                      f"({_err(obs['writable_write_error'])}); name a write that works on its "
                      "arrays (write= / --write)")
    if obs["changed"]:  # a PROT_READ page cannot change: the kit's own defect
        return FAIL, "the write-protected page changed (the kit could not protect it)"
    if "write_error" in obs:
        return PASS, (f"imported it read-only: {wrote} raised {_err(obs['write_error'])}; "
                      "the page is unchanged")
    return PASS, (f"imported a copy: {wrote} landed in it and the read-only page is unchanged "
                  f"({_asked(obs['requests'])})")


def _deleter_once(obs: dict[str, Any], _write: str | None) -> tuple[str, str]:
    if "error" in obs:
        return SKIP, f"from_dlpack failed ({_err(obs['error'])}; see 'imports')"
    problems = []
    fresh = [n for n in obs["names"] if n in ("dltensor", "dltensor_versioned")]
    if fresh:
        problems.append(f"left the capsule named {fresh[0]!r} instead of 'used_{fresh[0]}': "
                        "the producer's capsule destructor releases it a second time")
    if obs["calls_alive"] and obs["shares"]:
        problems.append(f"called the deleter {obs['calls_alive']} time(s) while its array still "
                        "used the producer's memory (a use after free)")
    calls = obs["calls"]
    if calls == 0 and not fresh:
        problems.append("the deleter was not called within 2 s of the array's death and "
                        "full collections (a leak)")
    elif calls > 1:
        problems.append(f"the deleter was called {calls} times (a double free; the kit "
                        "forwarded only the first call)")
    if problems:
        return FAIL, "; ".join(problems)
    when = "at import (its array does not share the memory)" if obs["calls_alive"] else (
        "after its array died")
    return PASS, f"called once, {when}; the capsule renamed {obs['names'][0]!r}"


def _copy(copy: bool) -> Callable[[dict[str, Any], str | None], tuple[str, str]]:
    def judge(obs: dict[str, Any], _write: str | None) -> tuple[str, str]:
        asked = _asked(obs["requests"])
        if "error" in obs:
            e = obs["error"]
            if e["type"] == "TypeError" and "copy" in e["text"]:
                return SKIP, (f"not applicable: from_dlpack takes no copy= (a keyword of the "
                              f"2023.12 array API): {e['text']}")
            return FAIL, (f"refused copy={copy} ({e['text']}), although the producer's memory "
                          "is writable, 64-byte aligned host memory it can share or copy")
        if obs["shares"] is None:
            return SKIP, (f"cannot tell whether the array shares the producer's memory: its "
                          f"__dlpack__ gave no address and the write failed ({obs['how']})")
        forwarded = any(r.get("copy") is copy for r in obs["requests"])
        note = (f"forwarded copy={copy} to __dlpack__" if forwarded else
                f"did not forward copy={copy} to __dlpack__")
        by = "by its address" if obs["how"] == "address" else "by a write through it"
        if copy and obs["shares"]:
            return FAIL, (f"copy=True gave an array that shares the producer's memory (seen "
                          f"{by}; {asked})")
        if not copy and not obs["shares"]:
            return FAIL, (f"copy=False gave a copy: the array does not share the producer's "
                          f"memory (seen {by}; {asked})")
        return PASS, f"{note}; {'a copy' if copy else 'shares the memory'} (seen {by})"

    return judge


_JUDGES: dict[str, Callable[[dict[str, Any], str | None], tuple[str, str]]] = {
    "imports": _imports,
    "read_only": _read_only,
    "deleter_once": _deleter_once,
    "copy_true": _copy(True),
    "copy_false": _copy(False),
}
