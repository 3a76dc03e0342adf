"""The package layout of DESIGN.md ("Where things live") holds: dependencies point one way.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); import-linter reads every
import statement, those inside functions included, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
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


PACKAGES = ("cli", "devstack", "spark_jobs", "producer", "dedupe_store", "api")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_names_its_public_api(package: str) -> None:
    # GIVEN a package of the project
    module = importlib.import_module(package)
    # WHEN its public API is read
    public = getattr(module, "__all__", None)
    # THEN it is named with __all__, and every name it lists is there
    assert public, f"{package}/__init__.py has no __all__"
    assert [name for name in public if not hasattr(module, name)] == []


def test_importing_every_package_leaves_pyspark_unimported() -> None:
    # GIVEN a fresh interpreter (Spark executors and the CLI import these packages)
    code = f"import sys, {', '.join(PACKAGES)}\nsys.exit('pyspark' in sys.modules)"
    # WHEN it imports every package, warnings as errors (an import cycle warns or fails)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, check=False
    )
    # THEN it succeeds without importing pyspark
    assert result.returncode == 0, result.stderr.decode()
