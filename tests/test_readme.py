"""The ``$ fitprof ...`` examples of the README and the pages under ``docs/``, run on the files the project ships:
the output shown is the output given, line by line (so an example cannot rot, and never needs ``../shared``)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from fitprof.cli import main

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```\n(\$ fitprof [^\n]*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_EXAMPLES = BLOCK.findall((ROOT / "README.md").read_text())
EXAMPLES = [example for page in PAGES for example in BLOCK.findall(page.read_text())]


def test_the_readme_has_fitprof_examples() -> None:
    commands = [command for command, _ in README_EXAMPLES]
    assert any(c.startswith("$ fitprof analyze tests/data/") for c in commands), commands
    assert len(commands) >= 2


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_output(
    command: str, shown: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)  # the examples run from the checkout
    for path in re.findall(r"tests/data/\S+", command):
        assert (ROOT / path).is_file(), path  # shipped files only
    capsys.readouterr()
    rc = main(shlex.split(command)[2:])
    out, err = capsys.readouterr()
    assert rc == (2 if err else 0)
    assert (out + err).rstrip("\n").splitlines() == shown.rstrip("\n").splitlines()
