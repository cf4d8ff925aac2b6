"""The compatibility report (``hurray matrix``, hurray_bridge.matrix): reproducible,
readable in 100 columns, and machine-readable (JSON) and viewable offline (HTML)."""

from __future__ import annotations

import html.parser
import json
import re
import subprocess
import sys
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import matrix

np = pytest.importorskip("numpy")

CLI = [sys.executable, "-m", "hurray_bridge"]


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report() -> matrix.Report:
    """Every installed CPU framework, every type: the full report, measured once."""
    return matrix.build_report(n=64, repeat=2)


def _key(cells: list[matrix.Cell]) -> list[tuple[str, str, str, str, str]]:
    return [(c.source, c.target, c.dtype, c.outcome, c.detail) for c in cells]


# ------------------------------------------------------------ reproducible
def test_numpy_to_jax_depends_on_alignment_and_says_so() -> None:
    pytest.importorskip("jax")
    cells = matrix.run_matrix(["numpy", "jax"], [hb.float32, hb.int8, hb.int16], n=64, repeat=3)
    to_jax = [c for c in cells if (c.source, c.target) == ("numpy", "jax")]
    assert len(to_jax) == 3
    for c in to_jax:
        assert c.outcome == "zero-copy if aligned", c
        assert "not 64-byte aligned" in c.detail
        assert c.microseconds is not None and c.unaligned_microseconds is not None
    assert matrix.OUTCOMES["zero-copy if aligned"][0] == "A"


def test_same_installation_same_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outcomes do not follow the allocator: runs interleaved with allocations of every
    size (which move where NumPy puts the next array) agree cell for cell."""
    names = matrix.available_frameworks()
    dtypes = [hb.float32, hb.uint8, hb.int16, hb.bfloat16, hb.int4]
    first = _key(matrix.run_matrix(names, dtypes, n=48, repeat=1))
    keep = []
    for i in range(8):
        keep.append(np.empty(i * 8 + 1, np.uint8))  # shifts the allocator by 16 bytes or so
        assert _key(matrix.run_matrix(names, dtypes, n=48, repeat=1)) == first


def test_cli_json_is_the_same_on_every_run() -> None:
    pytest.importorskip("jax")
    runs = []
    for _ in range(2):
        res = cli("matrix", "--format", "json", "--frameworks", "numpy", "jax",
                  "--dtypes", "float32", "uint16", "--repeat", "1")
        assert res.returncode == 0, res.stderr
        runs.append([{k: v for k, v in c.items() if "microseconds" not in k}
                     for c in json.loads(res.stdout)["cells"]])
    assert runs[0] == runs[1]


# -------------------------------------------------------- versions, settings
def test_versions_and_jax_x64_are_named(report: matrix.Report) -> None:
    doc = report.to_dict()
    v = doc["versions"]
    assert v["hurray-bridge"] == hb.__version__ and v["numpy"] == np.__version__
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    text = matrix.format_report(report)
    assert f"numpy {np.__version__}" in text
    if "jax" in matrix.available_frameworks():
        import jax

        x64 = bool(jax.config.read("jax_enable_x64"))
        assert doc["settings"]["jax_enable_x64"] is x64 and v["jax"] == jax.__version__
        assert f"jax_enable_x64 {'on' if x64 else 'off'}" in text
    if "torch" in matrix.available_frameworks():
        import torch

        assert v["torch"] == torch.__version__ and f"torch {torch.__version__}" in text


def test_timing_header_follows_size_and_repeat() -> None:
    res = cli("matrix", "--frameworks", "numpy", "--dtypes", "float32", "--size", "100",
              "--repeat", "3")
    assert res.returncode == 0, res.stderr
    assert "Hand-off time, float32 x 100 (median of 3 calls" in res.stdout
    assert "x 1024" not in res.stdout and "100 elements per tensor" in res.stdout


@pytest.mark.parametrize("argv, words", [
    (["--repeat", "0"], ("argument --repeat", ">= 1", "0")),
    (["--size", "0"], ("argument --size", ">= 1")),
    (["--size", "ten"], ("argument --size", "'ten'")),
    (["--frameworks", "theano"], ("argument --frameworks", "'theano'", "'numpy'",
                                  "'arrow'")),
    (["--format", "pdf"], ("argument --format", "'pdf'", "'html'")),
])
def test_bad_arguments_are_refused_naming_the_option(argv: list[str],
                                                     words: tuple[str, ...]) -> None:
    res = cli("matrix", *argv)
    assert res.returncode == 2 and res.stdout == ""
    assert "Traceback" not in res.stderr and "usage: hurray matrix" in res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"repeat": 0}, hb.FormatError, ("repeat", ">= 1", "0")),
    ({"n": -3}, hb.FormatError, ("size", ">= 1", "-3")),
    ({"n": 2.5}, hb.FormatError, ("size", "2.5")),
    ({"frameworks": ["numpy", "theano"]}, hb.UnsupportedError,
     ("'theano'", "numpy, torch, jax, arrow, cupy")),
])
def test_run_matrix_refuses_bad_arguments(kwargs: dict[str, Any], error: type[Exception],
                                          words: tuple[str, ...]) -> None:
    with pytest.raises(error) as e:
        matrix.run_matrix(**{"frameworks": ["numpy"], "dtypes": [hb.float32], **kwargs})
    for w in words:
        assert w in str(e.value)


# ------------------------------------------------------------------- text
def test_text_fits_100_columns_and_groups_reasons(report: matrix.Report) -> None:
    text = matrix.format_report(report)
    long = [ln for ln in text.splitlines() if len(ln) > 100]
    assert long == []
    groups = matrix.reason_groups(report.cells)
    if not groups:  # NumPy alone: every cell zero-copy, nothing to explain
        assert "Why (" not in text
        return
    why = text.split("Why (", 1)[1].split("\nTotals", 1)[0].splitlines()[1:]
    reasons = [ln for ln in why if re.match(r"  \S", ln)]
    assert len(reasons) == len(groups)
    # one paragraph per reason: no (outcome, reason) twice
    assert len({(g["outcome"], g["reason"]) for g in groups}) == len(groups)
    # far fewer reasons than cells that need one
    noted = [c for c in report.cells if c.outcome not in ("zero-copy", "n/a")]
    assert len(groups) < len(noted) / 2 or len(noted) < 6


@pytest.mark.parametrize("count", [4, 5, 6, 7, 9])
def test_text_fits_100_columns_for_any_number_of_frameworks(count: int) -> None:
    """Every framework of the registry is a column group: the marks close up, and then the
    sources wrap into further tables, each with the same heads, never past 100 columns."""
    names = ["numpy", "torch", "jax", "arrow", "mlx", "tensorflow", "paddle", "fw8", "fw9"]
    fws = names[:count]
    cells = [matrix.Cell(s, t, d, "zero-copy" if s == t else "copy", "" if s == t else "why")
             for d in ("float32", "float8_e4m3fnuz") for s in fws for t in fws]
    text = matrix.format_report(matrix.Report(cells))
    assert max(len(ln) for ln in text.splitlines()) <= 100
    rows = [ln for ln in text.splitlines() if ln.startswith("float8_e4m3fnuz ")]
    heads = [ln for ln in text.splitlines() if ln.startswith("dtype ")]
    assert len(rows) == len(heads) >= 1 + (count > 6)  # one row per table
    assert sum(row.count("Z") for row in rows) == count  # every source's own column
    assert sum(row.count("C") for row in rows) == count * (count - 1)


def test_every_noted_cell_is_covered_exactly_once(report: matrix.Report) -> None:
    covered: list[tuple[str, str, str]] = []
    for g in matrix.reason_groups(report.cells):
        for cover in g["covers"]:
            covered += [(s, t, d) for s, t in cover["pairs"] for d in cover["dtypes"]]
    noted = [(c.source, c.target, c.dtype) for c in report.cells
             if c.outcome not in ("zero-copy", "n/a")]
    assert sorted(covered) == sorted(noted)
    by = {(c.source, c.target, c.dtype): c for c in report.cells}
    for g in matrix.reason_groups(report.cells):
        for cover in g["covers"]:
            for (s, t), d in ((p, d) for p in cover["pairs"] for d in cover["dtypes"]):
                c = by[(s, t, d)]
                assert c.outcome == g["outcome"]
                assert c.detail == g["reason"].replace("<type>", d)


def test_table_marks_match_the_cells() -> None:
    pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")  # NumPy's int4
    rep = matrix.build_report(["numpy"], [hb.float32, hb.int4], n=8, repeat=1)
    rows = {ln.split()[0]: ln.split()[1:] for ln in matrix.format_report(rep).splitlines()
            if ln.split() and ln.split()[0] in ("float32", "int4")}
    assert rows == {"float32": ["Z"], "int4": ["Z"]}


BOOL_NOTE = ("bool is the 1-bit packed boolean (eight per byte, as Arrow stores it); "
             "bool8 is the boolean with one byte per element")


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_legend_says_bool_is_the_packed_type_and_bool8_the_byte_one(fmt: str) -> None:
    # A newcomer saw "." on NumPy's bool row and no word why: the legend names the two types.
    res = cli("matrix", "--format", fmt, "--frameworks", "numpy", "--dtypes", "bool", "bool8",
              "--repeat", "1")
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())  # text and markdown wrap the note at 100 columns
    assert BOOL_NOTE in flat, res.stdout
    assert "numpy.bool_, torch.bool, jax.numpy.bool_" in flat, res.stdout
    doc = json.loads(cli("matrix", "--format", "json", "--frameworks", "numpy", "--dtypes",
                         "bool", "--repeat", "1").stdout)
    assert BOOL_NOTE in " ".join(doc["notes"]["bool"].split())


def test_legend_has_no_bool_note_without_a_bool_row() -> None:
    rep = matrix.build_report(["numpy"], [hb.float32], n=8, repeat=1)
    assert "1-bit packed" not in matrix.format_report(rep)
    assert json.loads(matrix.format_report(rep, "json"))["notes"] == {}


# ---------------------------------------------------------------- markdown
def test_markdown_has_a_table_per_source(report: matrix.Report) -> None:
    md = matrix.format_report(report, "markdown")
    sources = list(dict.fromkeys(c.source for c in report.cells))
    for s in sources:
        assert f"## From {s}" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| float32 |")]
    assert len(rows) == len(sources)
    assert all(len(ln) <= 100 for ln in md.splitlines())


# -------------------------------------------------------------------- json
def test_json_has_versions_settings_and_every_cell(report: matrix.Report) -> None:
    doc = json.loads(matrix.format_report(report, "json"))
    assert set(doc) >= {"versions", "settings", "cells", "reasons", "totals", "outcomes"}
    assert doc["settings"]["size"] == 64 and doc["settings"]["repeat"] == 2
    assert len(doc["cells"]) == len(report.cells)
    for c, d in zip(report.cells, doc["cells"]):
        assert d["source"] == c.source and d["outcome"] == c.outcome
        assert d["detail"] == c.detail and d["microseconds"] == c.microseconds
        if d["outcome"] in ("copy", "refused", "zero-copy if aligned"):
            assert d["detail"]
    assert sum(doc["totals"].values()) == len(report.cells)


def test_cli_json_file_and_exit_status(tmp_path: Any) -> None:
    out = tmp_path / "m.json"
    res = cli("matrix", "--frameworks", "numpy", "--dtypes", "int8", "--repeat", "1",
              "--json", str(out))
    assert res.returncode == 0 and "Hand-off matrix" in res.stdout
    doc = json.loads(out.read_text())
    assert [c["dtype"] for c in doc["cells"]] == ["int8"]


# -------------------------------------------------------------------- html
class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.style = ""
        self._in_style = False
        self.decl = ""

    def handle_decl(self, decl: str) -> None:
        self.decl = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data


def test_html_is_a_self_contained_colour_grid(report: matrix.Report) -> None:
    page = _Page()
    page.feed(matrix.format_report(report, "html"))
    page.close()
    assert page.decl.lower() == "doctype html"
    names = [t for t, _ in page.tags]
    assert names[0] == "html" and "table" in names and "title" in names
    # nothing to fetch: no scripts, links, images, frames or url() in the style
    assert not {"script", "link", "img", "iframe", "object", "embed"} & set(names)
    for _, attrs in page.tags:
        for k, v in attrs.items():
            assert k not in ("src", "href", "srcset"), (k, v)
    assert "url(" not in page.style and "@import" not in page.style
    grid = [a for t, a in page.tags if t == "td" and "data-outcome" in a]
    assert len(grid) == len(report.cells)
    by = {(c.source, c.target, c.dtype): c for c in report.cells}
    colours = dict(re.findall(r"\.(o-[a-z-]+)\{background:(#[0-9a-f]{6})\}", page.style))
    for a in grid:
        c = by[(a["data-source"], a["data-target"], a["data-dtype"])]  # type: ignore[index]
        assert a["data-outcome"] == c.outcome
        cls = [k for k in (a["class"] or "").split() if k.startswith("o-")]
        assert len(cls) == 1 and cls[0] in colours
        if c.detail:
            assert c.detail in (a["title"] or "")
    assert len(set(colours.values())) == len(matrix.OUTCOMES)  # one colour per outcome


def test_cli_html(tmp_path: Any) -> None:
    res = cli("matrix", "--format", "html", "--frameworks", "numpy", "--dtypes", "float32",
              "--repeat", "1")
    assert res.returncode == 0 and res.stdout.startswith("<!DOCTYPE html>")
    assert res.stdout.rstrip().endswith("</html>") and res.stderr == ""


# ------------------------------------------- frameworks that cannot share a process
STAND_IN = "they crash together (a stand-in declaration for this test)"


def test_a_pair_that_cannot_share_a_process_is_reported_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a declared pair, one is measured here and the other in a child process; their
    own cells say why they were not measured, and no cell of either is lost."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    from hurray_bridge import _registry

    spec = _registry.ADAPTERS["jax"]
    monkeypatch.setitem(_registry.ADAPTERS, "jax", spec._replace(
        not_with=(("torch", STAND_IN),)))
    names = ["numpy", "torch", "jax"]
    cells = matrix.run_matrix(names, [hb.float32], n=16, repeat=1)
    by = {(c.source, c.target): c for c in cells}
    assert sorted(by) == sorted((s, t) for s in names for t in names)
    for pair in (("torch", "jax"), ("jax", "torch")):
        assert by[pair].outcome == "apart" and STAND_IN in by[pair].detail, by[pair]
    for pair, c in by.items():
        if "torch" not in pair or "jax" not in pair:
            assert c.outcome in ("zero-copy", "zero-copy if aligned"), c
    text = matrix.format_report(matrix.Report(cells))
    assert "x the two frameworks cannot share a process" in " ".join(text.split())
    assert "apart 2" in text


def test_matrix_finishes_where_paddle_and_tensorflow_are_both_installed() -> None:
    """PaddlePaddle 3.3.1 and TensorFlow 2.21 crash in one process (the registry's
    ``not_with``): the report, run where both are installed, finishes and says so. Runs in
    the Python HURRAY_PAIR_PYTHON names, else this one, where both are installed."""
    import os
    from pathlib import Path

    python = os.environ.get("HURRAY_PAIR_PYTHON") or sys.executable
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(all(u.find_spec(m) "
                            "for m in ('paddle', 'tensorflow', 'numpy')))"],
                           capture_output=True, text=True, timeout=60)
    if probe.stdout.strip() != "True":
        pytest.skip("paddle and tensorflow are not installed in one Python "
                    "(HURRAY_PAIR_PYTHON may name one)")
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    res = subprocess.run([python, "-m", "hurray_bridge", "matrix", "--format", "json",
                          "--dtypes", "float32", "int32", "--repeat", "1", "--size", "64"],
                         capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    cells = json.loads(res.stdout)["cells"]
    frameworks = {c["source"] for c in cells}
    assert "paddle" in frameworks
    assert not [c for c in cells if c["outcome"] == "wrong"]
    if "tensorflow" not in frameworks:
        pytest.skip("no tensorflow adapter is registered in this tree: paddle's cells were "
                    "measured, the pair's were not")
    for c in cells:
        pair = {c["source"], c["target"]}
        if pair == {"paddle", "tensorflow"}:
            assert c["outcome"] == "apart" and "segmentation fault" in c["detail"], c
        else:
            assert c["outcome"] != "apart" and "child process" not in c["detail"], c
