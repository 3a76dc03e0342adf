"""Shared fixtures: one local stack per test run, unique resource names per test.

The emulators start once per session (about a second) in a state directory under pytest's
temporary directory, and stop at the end. Tests never share a stream or a table: ask ``names``.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from devstack import emulators as local_stack

# CI shares 2 cores with the emulators and Spark: a Hypothesis example that takes longer than
# the default 200 ms deadline there is not a bug, nor is generating data slowly (the too_slow
# health check times the generation on the wall clock).
settings.register_profile("keo", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("keo")

# markers by directory: tests/integration/... is `integration`, and so on
_DIRECTORY_MARKERS = {"integration": "integration", "e2e": "e2e", "spark": "spark"}
_TESTS_DIR = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            parts = item.path.relative_to(_TESTS_DIR).parts
        except ValueError:
            continue
        for part in parts[:-1]:
            marker = _DIRECTORY_MARKERS.get(part)
            if marker is not None:
                item.add_marker(marker)


@pytest.fixture(scope="session")
def emulator_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The session's stack lives here; whatever was started in it stops at the end."""
    state_dir = tmp_path_factory.mktemp("keo-state")
    yield state_dir
    local_stack.down(state_dir)


@pytest.fixture(scope="session")
def emulators(emulator_state_dir: Path) -> local_stack.Endpoints:
    """kinesalite and dynalite on 127.0.0.1, for the whole run."""
    return local_stack.up(emulator_state_dir)


@pytest.fixture(scope="session")
def kinesis_local_endpoint(emulator_state_dir: Path) -> str:
    """kinesis-local (UpdateShardCount, ChildShards), started only if a test asks for it."""
    endpoint = local_stack.up(emulator_state_dir, kinesis_local=True).kinesis_local
    assert endpoint is not None
    return endpoint


@pytest.fixture(scope="session")
def dynamodb_local_endpoint(emulators: local_stack.Endpoints, emulator_state_dir: Path) -> str:
    """Amazon's DynamoDB Local (a JVM), started only if a test asks for it: the ledger
    contract and the produce path run on it too, nothing else (CI's time). In memory: its
    SQLite on disk would sync every write."""
    stack = local_stack.up(emulator_state_dir, dynamodb=local_stack.DYNAMODB_LOCAL, in_memory=True)
    return stack.dynamodb


@dataclass(frozen=True)
class Names:
    """Unique names for one test; ``prefix`` makes more (``f"{names.prefix}-dlq"``)."""

    prefix: str
    stream: str
    table: str


_counter = itertools.count(1)


@pytest.fixture
def names(request: pytest.FixtureRequest) -> Names:
    # Kinesis stream names: [a-zA-Z0-9_.-]{1,128}; DynamoDB tables: [a-zA-Z0-9_.-]{3,255}
    label = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-.")[:80]
    prefix = f"t{next(_counter):04d}-{label}"
    return Names(prefix=prefix, stream=f"{prefix}-stream", table=f"{prefix}-table")


@pytest.fixture
def env(emulators: local_stack.Endpoints) -> dict[str, str]:
    """The environment for a subprocess (``keo ...``) that uses the session's stack."""
    return {**os.environ, **emulators.as_env()}


@pytest.fixture
def keo_env(emulators: local_stack.Endpoints) -> Iterator[dict[str, str]]:
    """Set the stack's KEO_* and AWS_* variables in os.environ for this test, then restore them.

    For in-process code that reads settings from the environment.
    """
    values = emulators.as_env()
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield values
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
