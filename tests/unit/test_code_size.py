"""The product's code stays in pieces a reader can hold: no class over about 300 lines, no
function body over about 60, no module of the ledger over about 500 (issue #38).

A class counts from its ``class`` line to its last; a function counts its body only, after
its docstring (a typer command's signature of options is not what makes it hard to read).
The limits sit a little above those figures: "about", not a line to trim to. devstack/, the
dev toolbox, is not product.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("producer", "dedupe_store", "kinesis_store", "spark_jobs", "cli", "api")
MAX_CLASS_LINES = 320
MAX_FUNCTION_BODY_LINES = 65
MAX_LEDGER_MODULE_LINES = 520


def _product_modules() -> list[Path]:
    return sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))


def _where(path: Path, node: ast.stmt) -> str:
    return f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"


def _body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's body after its docstring."""
    body = function.body
    if ast.get_docstring(function, clean=False) is not None:
        body = body[1:]
    if not body:
        return 0
    last = body[-1].end_lineno or body[-1].lineno
    return last - body[0].lineno + 1


def _sizes() -> tuple[list[str], list[str]]:
    """Every class over the limit, and every function body, each with its lines."""
    classes: list[str] = []
    functions: list[str] = []
    for path in _product_modules():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    classes.append(f"{_where(path, node)} class {node.name}: {lines} lines")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = _body_lines(node)
                if lines > MAX_FUNCTION_BODY_LINES:
                    functions.append(f"{_where(path, node)} {node.name}: a body of {lines} lines")
    return classes, functions


def test_no_class_of_the_product_grows_past_about_300_lines() -> None:
    # GIVEN every module of the product's packages
    # WHEN their classes are measured, first line to last
    classes, _ = _sizes()
    # THEN none is over the limit (split it by what it does, as KinesisReader was)
    assert classes == [], f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(classes)


def test_no_function_of_the_product_grows_past_about_60_lines() -> None:
    # GIVEN every module of the product's packages
    # WHEN their functions and methods are measured, the body after the docstring
    _, functions = _sizes()
    # THEN none is over the limit
    assert functions == [], f"function bodies over {MAX_FUNCTION_BODY_LINES} lines:\n" + (
        "\n".join(functions)
    )


def test_no_module_of_the_ledger_grows_past_about_500_lines() -> None:
    # GIVEN the modules of dedupe_store/
    # WHEN their lines are counted
    long = [
        f"{path.relative_to(ROOT).as_posix()}: {lines} lines"
        for path in sorted((ROOT / "dedupe_store").rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LEDGER_MODULE_LINES
    ]
    # THEN none is over the limit
    assert long == [], f"dedupe_store modules over {MAX_LEDGER_MODULE_LINES} lines:\n" + (
        "\n".join(long)
    )


def test_the_measure_counts_a_body_after_its_docstring() -> None:
    # GIVEN a function of a docstring and three lines, and one of three lines alone
    tree = ast.parse(
        'def documented():\n    """Doc.\n\n    More."""\n    a = 1\n    b = 2\n    return a + b\n'
        "def bare():\n    a = 1\n    b = 2\n    return a + b\n"
    )
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    # WHEN their bodies are measured
    # THEN each counts its three lines: the docstring is not body
    assert [_body_lines(function) for function in functions] == [3, 3]
