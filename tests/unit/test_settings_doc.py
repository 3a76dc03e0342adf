"""docs/settings.md is generated from the settings classes, and documents every KEO_* variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings

from dedupe_store.settings import SettingNotes
from devstack import settings_doc

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("cli", "devstack", "spark_jobs", "producer", "kinesis_store", "dedupe_store", "api")
KEO_VARIABLE = re.compile(r"\bKEO_[A-Z0-9_]+\b")


def test_docs_settings_md_is_what_the_settings_classes_render() -> None:
    # GIVEN the settings classes, each field carrying its description, bounds and why
    # WHEN the page is rendered
    expected = settings_doc.render()
    # THEN docs/settings.md is exactly that, or the failure says how to regenerate it
    current = (ROOT / settings_doc.DOC_PATH).read_text(encoding="utf-8")
    assert current == expected, (
        f"docs/settings.md is stale: regenerate it with {settings_doc.REGENERATE}"
    )


def test_every_keo_variable_named_in_the_code_is_documented() -> None:
    # GIVEN every KEO_* variable the packages name
    named = {
        match
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for match in KEO_VARIABLE.findall(path.read_text(encoding="utf-8"))
    }
    # WHEN the settings page is rendered
    page = settings_doc.render()
    # THEN each of them has a row on it
    assert named, "no KEO_* variable found: the scan is broken"
    assert sorted(name for name in named if f"`{name}`" not in page) == []


def test_a_setting_declared_without_its_why_is_refused_by_name() -> None:
    # GIVEN a settings class with a field that has a description but no reason for its default
    class Careless(BaseSettings):
        batch_size: int = Field(default=10, description="rows per batch")

    # WHEN its notes are read (as render() reads every setting's)
    # THEN it is refused, naming the setting
    with pytest.raises(ValueError, match="batch_size"):
        SettingNotes.of("batch_size", Careless.model_fields["batch_size"])


def test_check_fails_on_a_stale_page_and_write_repairs_it(tmp_path: Path) -> None:
    # GIVEN a settings page edited by hand
    page = tmp_path / "settings.md"
    page.write_text("# Settings\n\nhand-edited\n", encoding="utf-8")
    # WHEN it is checked, rewritten, and checked again
    stale = settings_doc.main(["--check", "--path", str(page)])
    settings_doc.main(["--write", "--path", str(page)])
    fresh = settings_doc.main(["--check", "--path", str(page)])
    # THEN the first check fails and the second passes
    assert (stale, fresh) == (1, 0)


def test_the_readme_names_only_documented_variables() -> None:
    # GIVEN the KEO_* variables the README's short configuration table and examples name
    named = set(KEO_VARIABLE.findall((ROOT / "README.md").read_text(encoding="utf-8")))
    # WHEN the settings page is rendered
    page = settings_doc.render()
    # THEN each of them is a real, documented variable
    assert sorted(name for name in named if f"`{name}`" not in page) == []
