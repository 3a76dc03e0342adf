"""The README, the changelog and docs/ link only to files of the repository, and every such
file exists."""

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
