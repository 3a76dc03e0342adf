"""The stream-name rule (``dedupe_store.names``): written once, used by the settings, the API
and the ledger where it builds an item's key."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fakes.ledger import InMemoryLedger
from pydantic import ValidationError

from api.main import create_app
from api.settings import ApiSettings
from dedupe_store.batches import reconcile_run_pk, spark_batch_pk
from dedupe_store.errors import ConfigurationError, InvalidStreamNameError, KeoError
from dedupe_store.ledger import group_pk, ledger_pk
from dedupe_store.names import MAX_STREAM_NAME_CHARS, STREAM_NAME_PATTERN, check_stream_name
from producer.settings import ProducerSettings

VALID = [
    "orders",
    "a",
    "orders.v2",
    "my_stream-1",
    ".hidden",
    "s" * MAX_STREAM_NAME_CHARS,
    "-",
    "._",
]
INVALID = [
    ("", "is empty"),
    ("s" * (MAX_STREAM_NAME_CHARS + 1), "longer than 128"),
    ("orders/eu", "may hold only"),
    ("orders#eu", "may hold only"),
    ("orders eu", "may hold only"),
    ("orders\n", "may hold only"),
    ("ördérs", "may hold only"),
    (".", "not dots only"),
    ("..", "not dots only"),
]


@pytest.mark.parametrize("name", VALID)
def test_a_name_kinesis_takes_passes_as_it_is(name: str) -> None:
    assert check_stream_name(name) == name


@pytest.mark.parametrize(("name", "reason"), INVALID)
def test_a_name_outside_the_rule_is_refused_with_the_name_and_why(name: str, reason: str) -> None:
    # GIVEN a name Kinesis refuses, or of dots only (the API cannot name it in a URL)
    # WHEN checked
    with pytest.raises(InvalidStreamNameError, match=reason) as caught:
        check_stream_name(name)
    # THEN the error carries the name, and is a configuration error of keo's tree
    assert caught.value.name == name
    assert isinstance(caught.value, ConfigurationError)
    assert isinstance(caught.value, KeoError)
    assert not caught.value.retriable


@pytest.mark.parametrize(
    "build",
    [
        lambda stream: ledger_pk(stream, "k-1"),
        lambda stream: group_pk(stream, "g-1"),
        reconcile_run_pk,
        lambda stream: spark_batch_pk(stream, "query", 7),
    ],
    ids=["key item", "group item", "run record", "batch record"],
)
@pytest.mark.parametrize("stream", ["orders/eu", "orders#eu", "", ".."])
def test_every_item_key_is_built_from_a_checked_name(
    build: Callable[[str], str], stream: str
) -> None:
    # GIVEN a stream name whose "/" or "#" could make one item's key another's
    # WHEN the ledger builds a key of any kind of item from it
    # THEN it is refused, rather than written where another item lives
    with pytest.raises(InvalidStreamNameError):
        build(stream)


def test_keys_of_a_valid_name_are_spelled_as_the_design_says() -> None:
    assert ledger_pk("orders", "k-1") == "orders#k-1"
    assert group_pk("orders", "g-1") == "__keo__/group/orders/g-1"


def test_a_checked_name_is_remembered_and_a_refused_one_is_not() -> None:
    # GIVEN a cleared cache
    check_stream_name.cache_clear()
    # WHEN a valid name is checked twice and an invalid one once
    check_stream_name("orders")
    check_stream_name("orders")
    with pytest.raises(InvalidStreamNameError):
        check_stream_name("a/b")
    # THEN the second check of the valid name is a cache hit, and only it is kept
    info = check_stream_name.cache_info()
    assert (info.hits, info.currsize) == (1, 1)


@pytest.mark.parametrize(("name", "_reason"), INVALID[1:])
def test_the_settings_refuse_what_the_rule_refuses(name: str, _reason: str) -> None:
    # GIVEN a stream name outside the rule
    # WHEN the producer's settings are read with it
    # THEN they refuse it naming the field
    with pytest.raises(ValidationError, match="stream"):
        ProducerSettings(stream=name)


def test_the_api_publishes_the_same_rule_for_every_stream_in_a_path() -> None:
    # GIVEN the API on an in-memory ledger
    app = create_app(
        ApiSettings(), InMemoryLedger(), require_auth=False, retention=lambda _stream: None
    )
    # WHEN its OpenAPI document is read
    parameters = [
        parameter
        for path in app.openapi()["paths"].values()
        for operation in path.values()
        for parameter in operation.get("parameters", [])
        if parameter["name"] == "stream"
    ]
    # THEN every {stream} of a path is bound by the rule of dedupe_store.names
    assert parameters
    for parameter in parameters:
        schema = parameter["schema"]
        assert (schema["pattern"], schema["maxLength"]) == (
            STREAM_NAME_PATTERN,
            MAX_STREAM_NAME_CHARS,
        )


@pytest.mark.parametrize("name", VALID)
def test_the_settings_take_what_the_rule_takes(name: str) -> None:
    assert ProducerSettings(stream=name).stream == name
