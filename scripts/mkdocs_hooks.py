"""mkdocs hooks: the pages the docs site makes at build time, and links to repository files.

* ``index.md`` is the repository's README.md and ``overview.md`` is docs/README.md
  (mkdocs would take docs/README.md as the index, and the README is the better front page).
* ``reference/<module>.md``: one page per public module (``scripts/public_api.py``), each
  an mkdocstrings block that renders exactly that module's ``__all__``.
* ``matrix.md`` and ``matrix.html``: ``hurray matrix --format html`` run with the
  interpreter that builds the site, so the page reports the frameworks installed there.
* A link from a page to a repository file outside docs/ (``../../fuzz/README.md``) works
  on GitHub but not on the site: on the site it becomes a link into the repository when
  mkdocs.yml sets ``repo_url``, and the path as code otherwise. The Markdown stays as
  written, so it keeps working on GitHub.

mkdocs is imported inside the hooks only, so tests can import this file without it.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import public_api  # scripts/ is not a package: found through the path set above

log = logging.getLogger("mkdocs.hooks.hurray")

ROOT = public_api.ROOT
MATRIX_TIMEOUT_S = 300
# A Markdown inline link or image: [text](target) with an optional "title".
_LINK = re.compile(r"(?<!\!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)")


def reference_markdown(module: public_api.PublicModule) -> str:
    """The reference page of one public module: its ``__all__``, rendered by mkdocstrings."""
    names = public_api.all_names(public_api.parse(module.source))
    members = "\n".join(f"        - {n}" for n in names)
    lines = [
        f"# `{module.name}`",
        "",
        f"::: {module.griffe_path}",
        "    options:",
        f"      heading: \"{module.name}\"",
        "      show_root_heading: false",
        "      members:",
        members,
    ]
    if module.name == "hurray_bridge":
        subs = ", ".join(f"[`{m.name}`]({m.name}.md)" for m in public_api.public_modules()[1:]
                         if m.name.count(".") == 1)
        lines[1:1] = ["", f"The package's submodules have their own pages: {subs}.", ""]
    if module.name.startswith("hurray_bridge.adapters."):
        where = f"`{module.source.relative_to(ROOT).as_posix()}`"
        if module.source.name == "__init__.py":
            where = f"`{module.source.parent.relative_to(ROOT).as_posix()}/`"
        lines[1:1] = ["", f"Installed as `{module.name}`, from {where} in the repository."
                      " It imports its framework when imported.", ""]
    return "\n".join(lines) + "\n"


def _matrix_html() -> tuple[str, float]:
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hurray_bridge", "matrix", "--format", "html"],
                         capture_output=True, text=True, timeout=MATRIX_TIMEOUT_S, cwd=ROOT)
    took = time.perf_counter() - started
    if out.returncode != 0:
        # exit 1 is a "wrong" cell: the values changed in a hand-off. The page still shows it,
        # and the warning fails a strict build.
        log.warning("hurray matrix exited %d: %s", out.returncode, out.stderr.strip()[-2000:])
    return out.stdout, took


MATRIX_PAGE = """---
hide:
  - toc
---

# Which framework does what

The compatibility report, measured when this site was built: every element type handed
across every ordered pair of the CPU frameworks installed on the build machine, with
`hb.convert(x, target)`. Each cell says whether the hand-off was zero-copy, copied (and why),
or refused. [The report's rules](impl/compat-report.md) say what each mark means and why the
report is the same every run; `hurray matrix` prints it on your own machine.

<iframe src="../matrix.html" title="hurray matrix --format html" class="hurray-matrix"></iframe>

[Open the report on its own page](matrix.html){{ .md-button }}
(made by `hurray matrix --format html` in {seconds:.1f} s).
"""


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages, and move docs/README.md aside for the README."""
    from mkdocs.structure.files import File

    readme = files.get_file_from_path("README.md")
    if readme is not None:
        files.remove(readme)
        files.append(File.generated(config, "overview.md", abs_src_path=readme.abs_src_path))
    index = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=_index_links(index)))
    for module in public_api.public_modules():
        files.append(File.generated(config, module.page, content=reference_markdown(module)))
    html, seconds = _matrix_html()
    files.append(File.generated(config, "matrix.html", content=html))
    files.append(File.generated(config, "matrix.md", content=MATRIX_PAGE.format(seconds=seconds)))
    return files


def _index_links(text: str) -> str:
    """The README's links as seen from docs/: docs/x.md is x.md, the rest is the repository."""
    def fix(m: re.Match[str]) -> str:
        target = m["target"]
        if "://" in target or target.startswith(("#", "mailto:")):
            return m[0]
        if target == "docs/README.md":
            target = "overview.md"
        elif target.startswith("docs/"):
            target = target[len("docs/"):]
        else:
            target = "../" + target  # outside docs/: on_page_markdown turns it into a repo link
        return f"[{m['text']}]({target}{m['title'] or ''})"
    return _LINK.sub(fix, text)


def _outside_docs(page_src: str, target: str) -> str | None:
    """The repository path a page's relative link points to, when that is outside docs/."""
    if "://" in target or target.startswith(("#", "/", "mailto:")):
        return None
    path = target.split("#", 1)[0]
    if not path:
        return None
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_src), path))
    if joined.startswith("docs/") or joined.startswith("../"):
        return None
    return joined if (ROOT / joined).exists() else None


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Links to repository files outside docs/: to the repository, or the path as code."""
    repo_url = (config.get("repo_url") or "").rstrip("/")

    def fix(m: re.Match[str]) -> str:
        path = _outside_docs(page.file.src_uri, m["target"])
        if path is None:
            return m[0]
        if repo_url:
            return f"[{m['text']}]({repo_url}/blob/main/{path})"
        text = m["text"]
        return text if text.startswith("`") and text.endswith("`") else f"{text} (`{path}`)"

    return _LINK.sub(fix, markdown)
