"""The README, the changelog and docs/ link only to files of the repository, and every such
file exists; every test they name as the evidence for a claim exists under that name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
# [text](target) with a target that is not a URL, an anchor or a mail address
LOCAL_LINK = re.compile(r"\]\((?![a-z]+:|#)([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_local_links_stay_in_the_repository_and_resolve(page: Path) -> None:
    # GIVEN the links of a page that point at files rather than at the web
    targets = LOCAL_LINK.findall(page.read_text(encoding="utf-8"))
    # WHEN each is resolved from the page's folder
    resolved = {target: (page.parent / target.split("#")[0]).resolve() for target in targets}
    # THEN it stays inside the repository (a reader of the repository alone can follow it)
    assert [t for t, path in resolved.items() if not path.is_relative_to(ROOT)] == []
    # AND the file is there
    assert [t for t, path in resolved.items() if not path.exists()] == []


# `integration/test_x.py::test_name` (a path from tests/), or `::test_name` after another
# reference; a parametrized id (`test_name[case]`) names its function
TEST_REFERENCE = re.compile(r"`((?:[\w./-]+\.py)?)::(test_\w+)(?:\[[^\]`]*\])?`")
TESTS = ROOT / "tests"


def _defined_tests(path: Path) -> set[str]:
    """The tests a file defines, and those it takes with ``from module import *`` (a module or
    a package of tests/, its ``__init__`` taking in its modules' the same way)."""
    text = path.read_text("utf-8")
    names = set(re.findall(r"^(?:async )?def (test_\w+)\(", text, re.MULTILINE))
    for module in re.findall(r"^from ([\w.]+) import \*", text, re.MULTILINE):
        base = TESTS.joinpath(*module.split("."))
        for source in (base.with_suffix(".py"), base / "__init__.py"):
            if source.is_file():
                names |= _defined_tests(source)
    return names


def _defined_tests_of(file: str) -> set[str]:
    path = TESTS / file
    return _defined_tests(path) if path.is_file() else set()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_tests_named_as_evidence_exist_under_those_names(page: Path) -> None:
    # GIVEN the tests a page names as the evidence for a claim
    references = TEST_REFERENCE.findall(page.read_text(encoding="utf-8"))
    everywhere = set().union(*(_defined_tests(path) for path in TESTS.rglob("test_*.py")))
    # WHEN each is looked up: in the file it names, or (`::name` alone) in any test file
    missing = [
        f"{file}::{name}"
        for file, name in references
        if not (name in everywhere if not file else name in _defined_tests_of(file))
    ]
    # THEN every one is there: a renamed test leaves no claim pointing at nothing
    assert missing == []
