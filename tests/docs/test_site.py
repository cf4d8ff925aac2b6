"""The reference site builds in strict mode, renders in a browser, and finds every public name.

The site is built with ``mkdocs build --strict`` (mkdocs.yml; the tools are pinned in
docs/requirements.txt), or taken from ``HURRAY_DOCS_SITE`` when CI has built it already,
served on 127.0.0.1 from this process, and opened in headless Chromium. Without mkdocs
or Chromium these tests skip and say which is missing; CI sets ``HURRAY_DOCS_REQUIRED=1``,
which turns that skip into a failure.
"""

from __future__ import annotations

import functools
import html
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from typing import Any

import pytest

from scripts import public_api

ROOT = public_api.ROOT
DOCS_TOOLS = ("mkdocs", "material", "mkdocstrings_handlers.python")


def _unavailable(reason: str) -> None:
    if os.environ.get("HURRAY_DOCS_REQUIRED") == "1":
        pytest.fail(f"{reason} (HURRAY_DOCS_REQUIRED=1)")
    pytest.skip(reason)


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    built = os.environ.get("HURRAY_DOCS_SITE")
    if built:
        path = pathlib.Path(built)
        assert (path / "search" / "search_index.json").is_file(), f"no built site in {path}"
        return path
    missing = [m for m in DOCS_TOOLS if find_spec(m.split(".")[0]) is None]
    if missing:
        _unavailable(f"the docs tools are not installed ({', '.join(missing)}): "
                     "pip install -r docs/requirements.txt")
    out = tmp_path_factory.mktemp("docs") / "site"
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                          "-d", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-5000:]
    return out


@pytest.fixture(scope="module")
def search_index(site: pathlib.Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = json.loads(
        (site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    return docs


@pytest.fixture(scope="module")
def served(site: pathlib.Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # port 0: a free one
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # pytest's output stays the test's


def dump_dom(url: str) -> str:
    """The page's DOM after its scripts ran, as headless Chromium sees it."""
    chromium = _chromium()
    if chromium is None:
        _unavailable("chromium is not installed (apt-get install chromium)")
    assert chromium is not None
    with tempfile.TemporaryDirectory() as profile:
        res = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", url],
            capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_every_public_name_is_in_the_search_index(search_index: list[dict[str, Any]]) -> None:
    """Each public name has its entry in the reference, and the entry says something
    besides its signature or value (its docstring)."""
    texts = {d["location"]: d["text"] for d in search_index}
    submodules = {f"hurray_bridge.{m}" for m in public_api.SUBMODULES}
    missing, bare = [], []
    for module in public_api.public_modules():
        page = f"reference/{module.name}/"
        assert page in texts, f"no reference page for {module.name}"
        for name in public_api.all_names(public_api.parse(module.source)):
            if f"{module.name}.{name}" in submodules:
                entry = f"reference/{module.name}.{name}/"  # a module: its own page
            else:
                entry = f"{page}#{module.griffe_path}.{name}"
            if entry not in texts:
                missing.append(f"{module.name}.{name}")
            elif not re.sub(r"<pre>.*?</pre>", "", texts[entry], flags=re.S).strip():
                bare.append(f"{module.name}.{name}")
    assert not missing, f"public names without an entry in the site's reference: {missing}"
    assert not bare, f"public names the reference shows without a word: {bare}"


def test_the_search_index_holds_the_pages(search_index: list[dict[str, Any]]) -> None:
    pages = {d["location"] for d in search_index if "#" not in d["location"]}
    for page in ("", "howto/torch-to-jax/", "howto/load-a-model-file/",
                 "howto/sharded-checkpoints/", "matrix/", "overview/", "spec/container/",
                 "impl/robustness/", "adr/ADR-007-permit-empty-tensors/", "testing/"):
        assert page in pages, page
    # a docstring's words are searchable, not only the names
    text = " ".join(d["text"] for d in search_index if d["location"].startswith("reference/"))
    assert "zero-copy when possible" in text


PAGES = {
    "": "hurray-bridge",
    "reference/hurray_bridge/": "hurray_bridge",
    "reference/hurray_bridge.adapters.torch/": "hurray_bridge.adapters.torch",
    "howto/torch-to-jax/": "Hand a torch model to JAX without copying",
    "spec/container/": "Container: the Hurray file format",
    "matrix/": "Which framework does what",
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_renders_in_chromium(served: str, page: str) -> None:
    dom = dump_dom(served + page)
    title = re.search(r"<title>(.*?)</title>", dom, flags=re.S)
    assert title and html.unescape(title[1]).startswith(
        (PAGES[page] + " - ", "hurray_bridge")), title
    h1 = re.search(r"<h1[^>]*>(.*?)</h1>", dom, flags=re.S)
    assert h1 and PAGES[page] in html.unescape(re.sub(r"<[^>]+>", "", h1[1])), h1
    # the theme's script ran: it builds the navigation and marks the page in it
    assert 'class="md-nav__link md-nav__link--active"' in dom
    assert "404 - Not found" not in dom


def test_reference_shows_signatures_and_docstrings(served: str) -> None:
    dom = dump_dom(served + "reference/hurray_bridge/")
    assert 'id="hurray_bridge.convert"' in dom
    text = html.unescape(re.sub(r"<[^>]+>", "", dom))
    # hb.convert is a dispatch front: shown with the signature and docstring it wraps
    assert re.search(r"convert\(\s*obj", text), "no signature for hb.convert"
    assert "Hand obj (native or hb.Tensor) to framework to" in re.sub(r"\s+", " ", text)


def test_matrix_page_is_the_report(served: str) -> None:
    dom = dump_dom(served + "matrix.html")
    assert "<h1>Hurray hand-off matrix</h1>" in dom
    assert re.search(r'data-source="numpy" data-target="numpy" data-dtype="float32" '
                     r'data-outcome="zero-copy"', dom), "no numpy -> numpy float32 cell"

