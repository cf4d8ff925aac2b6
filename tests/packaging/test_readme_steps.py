"""The README's Quickstart reads in the order a reader runs it, and CI runs its test command.

A reader on a CPU machine runs the commands top to bottom: torch's CPU build has to be in the
virtual environment before the first install that would pull torch (from PyPI, the CUDA build).
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _quickstart_commands() -> list[str]:
    """The Quickstart's shell commands in reading order, ``&&`` chains split into steps."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            commands += [c.strip() for c in line.split("&&") if c.strip()]
    return commands


def test_torchs_cpu_build_comes_before_the_first_install_that_pulls_torch() -> None:
    steps = _quickstart_commands()
    venv = [i for i, c in enumerate(steps) if c == "python3 -m venv .venv"]
    cpu = [i for i, c in enumerate(steps) if "download.pytorch.org/whl/cpu" in c]
    installs = [i for i, c in enumerate(steps) if re.search(r"pip install .*-e '\.\[", c)]
    assert len(venv) == 1, f"one virtual environment, made once: {steps}"
    assert len(cpu) == 1 and installs, steps
    assert venv[0] < cpu[0] < min(installs), (
        f"the order a reader runs: venv, torch's CPU build, then the project; got {steps}")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    test_lines = [ln for ln in section.splitlines() if "-m pytest" in ln]
    assert len(test_lines) == 1, test_lines
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert test_lines[0] in ci, f"{test_lines[0]!r} is not a line of .ci/run"
    venv = ci.index("python3 -m venv .venv")
    assert venv < ci.index(test_lines[0]), "CI makes the environment before the test command"
