"""The package layout of DESIGN.md ("Where things live") holds: dependencies point one way.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``); import-linter reads every
import statement, those inside functions included, so a lazy import cannot hide a cycle.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_every_dependency_contract_is_kept() -> None:
    # GIVEN the project's import contracts
    # WHEN import-linter checks the tree, in a process of its own (it reconfigures logging,
    # which later tests of this session read)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    # THEN no contract is broken (its report names any import that breaks one)
    assert result.returncode == 0, result.stdout.decode()[-3000:]


PACKAGES = ("cli", "devstack", "spark_jobs", "producer", "kinesis_store", "dedupe_store", "api")


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_names_its_public_api(package: str) -> None:
    # GIVEN a package of the project
    module = importlib.import_module(package)
    # WHEN its public API is read
    public = getattr(module, "__all__", None)
    # THEN it is named with __all__, and every name it lists is there
    assert public, f"{package}/__init__.py has no __all__"
    assert [name for name in public if not hasattr(module, name)] == []


def _type_checking_imports(package: str) -> tuple[set[str], set[str]]:
    """The names ``package``'s ``__init__`` imports under ``if TYPE_CHECKING:``, and the
    functions and classes it defines itself."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    imported = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
        for statement in node.body
        if isinstance(statement, ast.ImportFrom)
        for alias in statement.names
    }
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
    }
    return imported, defined


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_lists_what_it_imports_lazily_as_type_checkers_see_it(package: str) -> None:
    # GIVEN a package whose names are imported on first use (dedupe_store.exports)
    module = importlib.import_module(package)
    lazy = getattr(module, "__getattr__", None)
    if lazy is None:
        pytest.skip(f"{package} imports its names at once")
    # WHEN its TYPE_CHECKING imports (what type checkers read) are compared with __all__
    checked, own = _type_checking_imports(package)
    # THEN they name the same names, but for what the package defines itself
    assert checked == set(module.__all__) - own


def test_importing_every_package_leaves_pyspark_unimported() -> None:
    # GIVEN a fresh interpreter (Spark executors and the CLI import these packages)
    code = f"import sys, {', '.join(PACKAGES)}\nsys.exit('pyspark' in sys.modules)"
    # WHEN it imports every package, warnings as errors (an import cycle warns or fails)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, check=False
    )
    # THEN it succeeds without importing pyspark
    assert result.returncode == 0, result.stderr.decode()


def test_a_process_that_reads_a_stream_does_not_import_the_ledger_or_the_producers() -> None:
    # GIVEN a fresh interpreter (a Spark task reading shards, the driver's streaming source)
    heavy = (
        "dedupe_store.ledger",
        "producer.key.producer",
        "producer.replay.producer",
        "producer.wiring",
    )
    code = (
        "import sys, kinesis_store.reader, producer.clients\n"
        f"sys.exit(sorted(m for m in {heavy!r} if m in sys.modules) or None)"
    )
    # WHEN it imports the reader and its client (each package's __init__ on the way)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, check=False
    )
    # THEN none of the write side came with them: package names are imported on first use
    assert result.returncode == 0, result.stderr.decode()


# --- docs/architecture.md -----------------------------------------------------------------------

ARCHITECTURE_DOC = ROOT / "docs" / "architecture.md"


def _fenced_block(text: str, after_heading: str, fence: str) -> list[str]:
    """The lines of the first ``fence`` block after ``after_heading``."""
    lines = text.splitlines()
    start = lines.index(after_heading)
    opening = next(i for i in range(start, len(lines)) if lines[i].startswith(fence))
    closing = lines.index("```", opening + 1)
    return lines[opening + 1 : closing]


def _modules_in_tree(block: list[str]) -> set[str]:
    """``pkg/sub/mod.py`` paths of an indented tree: a folder ends with ``/``, two spaces a level."""
    folders: list[str] = []
    modules: set[str] = set()
    for line in block:
        name = line.split()[0]
        depth = (len(line) - len(line.lstrip())) // 2
        del folders[depth:]
        if name.endswith("/"):
            folders.append(name.removesuffix("/"))
        else:
            modules.add("/".join([*folders, name]))
    return modules


def test_architecture_doc_names_every_module_and_only_modules_that_exist() -> None:
    # GIVEN the tree drawn in docs/architecture.md and the modules of the seven packages
    block = _fenced_block(ARCHITECTURE_DOC.read_text(encoding="utf-8"), "## The tree", "```")
    documented = _modules_in_tree(block)
    present = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    # WHEN they are compared
    # THEN the doc leaves none out, and names none that does not exist
    assert sorted(present - documented) == [], "modules missing from docs/architecture.md"
    assert sorted(documented - present) == [], (
        "docs/architecture.md names modules that do not exist"
    )


def test_architecture_doc_draws_the_imports_the_packages_make() -> None:
    # GIVEN the arrows of the dependency graph in docs/architecture.md
    block = _fenced_block(
        ARCHITECTURE_DOC.read_text(encoding="utf-8"), "## Dependencies", "```mermaid"
    )
    drawn = {
        (importer, imported)
        for importer, arrow, imported in (line.split() for line in block if "-->" in line)
        if arrow == "-->"
    }
    # WHEN the packages' imports (those inside functions too) are read
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False)
    made = {
        (importer, imported)
        for importer in PACKAGES
        for imported in PACKAGES
        if importer != imported
        and graph.direct_import_exists(importer=importer, imported=imported, as_packages=True)
    }
    # THEN the graph draws exactly those
    assert sorted(made - drawn) == [], "imports missing from the graph in docs/architecture.md"
    assert sorted(drawn - made) == [], "arrows in docs/architecture.md that no import makes"
