"""The package layout of DESIGN.md ("Where things live") holds: dependencies point one way.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); import-linter reads every
import statement, those inside functions included, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]


def test_every_dependency_contract_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the project's import contracts
    monkeypatch.chdir(ROOT)
    # WHEN import-linter checks the tree
    exit_code = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    # THEN no contract is broken (the report above names any import that breaks one)
    assert exit_code == 0
