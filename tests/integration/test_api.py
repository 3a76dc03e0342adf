"""The delivery-state API against dynalite, with ledger items written through the ledger's API.

Most tests call the app in-process (ASGI); ``test_keo_serve_*`` start the real server with
uvicorn on a free loopback port and talk HTTP to it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import boto3
import httpx
import planting
import pytest
import schemathesis
import stacks
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import positive_data_acceptance

from api import ApiConfigError, ApiSettings, create_app
from api.cursor import CURSOR_PATTERN
from api.schemas import from_epoch_ms
from dedupe_store.clock import SystemClock
from dedupe_store.ledger import DynamoDBLedger
from dedupe_store.records import (
    ClaimRequest,
    ClaimStatus,
    Group,
    LedgerRecord,
    Position,
    RunAttempt,
)
from kinesis_store.provisioning import create_stream, wait_active
from producer.retries import poll_until

TOKEN = "test-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LEASE_MS = 60_000
DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
PROBLEM = "application/problem+json"
CLOCK = SystemClock()


class AsgiClient:
    """A blocking client for the app in-process (no socket): one event loop per request."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
                return await client.request(method, url, **kwargs)

        return asyncio.run(send())

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)


# --- fixtures --------------------------------------------------------------------------------


# One table for the module (creating one takes seconds); every test has a stream of its own.


@pytest.fixture(scope="module")
def api_settings(emulators: Any) -> ApiSettings:
    return ApiSettings(
        table=f"api-{uuid.uuid4().hex[:12]}",
        dynamodb_endpoint_url=emulators.dynamodb,
        api_token=TOKEN,
        dedupe_ttl_s=7 * 24 * 3600,
        stream_retention_hours=24,
        inflight_buckets=4,
        summary_count_cap=100_000,
    )


@pytest.fixture(scope="module")
def ledger(api_settings: ApiSettings) -> DynamoDBLedger:
    ledger = DynamoDBLedger(
        api_settings.ledger_connection(),
        dedupe_ttl_s=api_settings.dedupe_ttl_s,
        inflight_buckets=api_settings.inflight_buckets,
    )
    ledger.create_table()
    return ledger


@pytest.fixture(scope="module")
def app(api_settings: ApiSettings, ledger: DynamoDBLedger) -> FastAPI:
    return create_app(api_settings, ledger)


@pytest.fixture(scope="module")
def client(app: FastAPI) -> AsgiClient:
    return AsgiClient(app)


@pytest.fixture
def stream(names: Any) -> str:
    return str(names.stream)


def request(stream: str, key: str, payload: bytes | None = None) -> ClaimRequest:
    return ClaimRequest(stream, key, DIGEST, "12345678901234567890", payload)


def claim_group(
    ledger: DynamoDBLedger,
    stream: str,
    keys: list[str],
    *,
    ago_ms: int = 0,
    payload: bytes | None = None,
) -> Group:
    """A claim group opened and its keys claimed ``ago_ms`` before now: older than the lease,
    they are stale. Its producer has not settled it (yet)."""
    group, _ = planting.plant_requests(
        ledger,
        [request(stream, key, payload) for key in keys],
        owner="producer-1",
        now_ms=CLOCK.now_ms() - ago_ms,
        lease_ms=LEASE_MS,
    )
    return group


def claim(
    ledger: DynamoDBLedger,
    stream: str,
    key: str,
    *,
    ago_ms: int = 0,
    payload: bytes | None = None,
) -> Group:
    """One key claimed in a group of its own (see ``claim_group``)."""
    return claim_group(ledger, stream, [key], ago_ms=ago_ms, payload=payload)


def deliver(ledger: DynamoDBLedger, stream: str, key: str, seq: str = "4965") -> LedgerRecord:
    group = claim(ledger, stream, key)
    position = Position("shardId-000000000001", seq)
    planting.plant_delivery(ledger, group, {key: position}, now_ms=CLOCK.now_ms())
    record = ledger.get(stream, key)
    assert record is not None
    return record


def message_url(stream: str, key: str) -> str:
    return f"/v1/streams/{stream}/messages/{quote(key, safe='')}"


def assert_problem(response: httpx.Response, status: int, type_suffix: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"].endswith(type_suffix)
    assert body["title"]
    return body


# --- one key ---------------------------------------------------------------------------------


def test_delivered_key_reports_position_times_and_digest_never_payload(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a key claimed with its payload stored, then delivered
    group = claim(ledger, stream, "order-1", payload=b"top-secret-payload")
    planting.plant_delivery(
        ledger,
        group,
        {"order-1": Position("shardId-000000000003", "49650000000000000000001", 2)},
        now_ms=CLOCK.now_ms(),
    )

    # WHEN an operator asks for it
    response = client.get(message_url(stream, "order-1"), headers=AUTH)

    # THEN the state, position, times and digest come back, and the payload does not
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["state"] == "DELIVERED"
    assert body["attempt"] == 1
    assert body["shard_id"] == "shardId-000000000003"
    assert body["sequence_number"] == "49650000000000000000001"
    assert body["sub_sequence_number"] == 2
    assert body["payload_digest"] == DIGEST
    assert body["claimed_at"].endswith("Z")
    assert body["delivered_at"] is not None
    assert body["dedupe_expires_at"] is not None
    assert body["stale"] is False
    assert "payload" not in body
    assert "top-secret-payload" not in response.text


@pytest.mark.parametrize("key", ["orders/2024/05/1", "ключ-🚀 with space", "a%b?c#d", "x" * 256])
def test_any_unicode_key_up_to_256_chars_is_found(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str, key: str
) -> None:
    # GIVEN a key with slashes, non-ASCII or URL-special characters
    deliver(ledger, stream, key)

    # WHEN it is asked for percent-encoded
    response = client.get(message_url(stream, key), headers=AUTH)

    # THEN it is that key
    assert response.status_code == 200, response.text
    assert response.json()["key"] == key


def test_in_flight_key_reports_its_lease_and_staleness(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    claim(ledger, stream, "fresh")
    claim(ledger, stream, "stale", ago_ms=2 * LEASE_MS)

    fresh = client.get(message_url(stream, "fresh"), headers=AUTH).json()
    stale = client.get(message_url(stream, "stale"), headers=AUTH).json()

    assert (fresh["state"], fresh["stale"], fresh["shard_id"]) == ("IN_FLIGHT", False, None)
    assert fresh["lease_expires_at"] is not None
    assert (stale["state"], stale["stale"]) == ("IN_FLIGHT", True)


def test_unknown_key_is_404_problem_naming_stream_and_key(client: AsgiClient, stream: str) -> None:
    response = client.get(message_url(stream, "never-sent"), headers=AUTH)

    body = assert_problem(response, 404, "unknown-key")
    assert body["stream"] == stream
    assert body["key"] == "never-sent"
    assert "never-sent" in body["instance"]


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("/v1/streams/s/messages/" + "k" * 257, ["path", "key"]),
        ("/v1/streams/s/messages/", ["path", "key"]),
        ("/v1/streams/bad%20stream/messages/k", ["path", "stream"]),
        ("/v1/streams/" + "s" * 129 + "/messages/k", ["path", "stream"]),
    ],
)
def test_invalid_key_or_stream_is_422_with_the_reason(
    client: AsgiClient, url: str, where: list[str]
) -> None:
    response = client.get(url, headers=AUTH)

    body = assert_problem(response, 422, "validation")
    assert [error["loc"] for error in body["errors"]] == [where]
    assert body["errors"][0]["msg"]
    assert ".".join(where) in body["detail"]


# --- many keys -------------------------------------------------------------------------------


def test_lookup_answers_each_key_in_request_order(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN one delivered key, one in flight, and one never sent
    deliver(ledger, stream, "delivered", seq="777")
    claim(ledger, stream, "in/flight")

    # WHEN they are looked up together
    keys = ["missing", "delivered", "in/flight"]
    response = client.post(
        f"/v1/streams/{stream}/messages:lookup", json={"keys": keys}, headers=AUTH
    )

    # THEN there is one result per key, in request order
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [result["key"] for result in results] == keys
    assert [result["found"] for result in results] == [False, True, True]
    assert results[0]["message"] is None
    assert results[1]["message"]["sequence_number"] == "777"
    assert results[2]["message"]["state"] == "IN_FLIGHT"


def test_lookup_of_100_keys_reads_them_all(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    for index in range(0, 100, 10):
        deliver(ledger, stream, f"k{index}")
    keys = [f"k{index}" for index in range(100)]

    response = client.post(
        f"/v1/streams/{stream}/messages:lookup", json={"keys": keys}, headers=AUTH
    )

    assert response.status_code == 200, response.text
    found = [result["key"] for result in response.json()["results"] if result["found"]]
    assert found == [f"k{index}" for index in range(0, 100, 10)]


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"keys": [f"k{index}" for index in range(101)]}, ["body", "keys"]),
        ({"keys": []}, ["body", "keys"]),
        ({"keys": ["a", "b", "a"]}, ["body", "keys"]),
        ({"keys": ["ok", "k" * 257]}, ["body", "keys", 1]),
        ({"keys": ["ok", ""]}, ["body", "keys", 1]),
        ({"keys": ["ok"], "extra": 1}, ["body", "extra"]),
        ({}, ["body", "keys"]),
    ],
)
def test_lookup_refuses_bad_key_lists_with_422(
    client: AsgiClient, stream: str, body: dict[str, Any], loc: list[Any]
) -> None:
    response = client.post(f"/v1/streams/{stream}/messages:lookup", json=body, headers=AUTH)

    problem = assert_problem(response, 422, "validation")
    assert loc in [error["loc"] for error in problem["errors"]]


def test_lookup_refuses_a_body_that_is_not_json(client: AsgiClient, stream: str) -> None:
    response = client.post(
        f"/v1/streams/{stream}/messages:lookup",
        content=b"{not json",
        headers={**AUTH, "Content-Type": "application/json"},
    )

    assert_problem(response, 422, "validation")


# --- in flight -------------------------------------------------------------------------------


def _in_flight_pages(client: AsgiClient, stream: str, **params: Any) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    for _ in range(100):
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = client.get(f"/v1/streams/{stream}/in-flight", params=query, headers=AUTH)
        assert response.status_code == 200, response.text
        page = response.json()
        pages.append(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return pages
    raise AssertionError("the listing never ended")


def _walk_in_flight(client: AsgiClient, stream: str, **params: Any) -> list[dict[str, Any]]:
    """Every page, for claims in groups of one key each: a page holds at most ``limit``."""
    pages = _in_flight_pages(client, stream, **params)
    assert all(len(page) <= params.get("limit", 100) for page in pages)
    return [item for page in pages for item in page]


def test_in_flight_listing_pages_through_every_claim_once(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN claims in flight across the index buckets, some stale, and one delivered key
    fresh = {f"fresh-{index}" for index in range(5)}
    stale = {f"stale-{index}" for index in range(4)}
    for key in fresh:
        claim(ledger, stream, key)
    for key in stale:
        claim(ledger, stream, key, ago_ms=2 * LEASE_MS)
    deliver(ledger, stream, "done")

    # WHEN every page is read, two items at a time
    everything = _walk_in_flight(client, stream, limit=2)
    only_stale = _walk_in_flight(client, stream, limit=2, stale="true")

    # THEN each in-flight claim appears exactly once, and stale=true lists the stale ones
    keys = [item["key"] for item in everything]
    assert sorted(keys) == sorted(fresh | stale)
    assert {item["key"] for item in everything if item["stale"]} == stale
    assert sorted(item["key"] for item in only_stale) == sorted(stale)
    assert all(item["state"] == "IN_FLIGHT" for item in everything)


def test_in_flight_listing_leaves_out_claims_settled_since_the_first_page(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a stale claim that is delivered after the listing started
    group = claim(ledger, stream, "racing", ago_ms=2 * LEASE_MS)
    first = client.get(f"/v1/streams/{stream}/in-flight?stale=true", headers=AUTH).json()
    assert [item["key"] for item in first["items"]] == ["racing"]
    planting.plant_delivery(
        ledger, group, {"racing": Position("shardId-0", "1")}, now_ms=CLOCK.now_ms()
    )

    # WHEN the listing is read again
    again = client.get(f"/v1/streams/{stream}/in-flight?stale=true", headers=AUTH).json()

    # THEN the delivered key is not in flight any more
    assert again["items"] == []
    assert again["next_cursor"] is None


def test_in_flight_lists_each_key_once_under_the_group_holding_it_a_page_holding_whole_groups(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a stale group of four keys: one recorded since (the group is still OPEN), one taken
    # over into a fresh group; and a later producer's group that lists two of the same keys
    # and lost their claims
    now_ms = CLOCK.now_ms()
    stale = claim_group(ledger, stream, ["s-0", "s-1", "s-2", "s-3"], ago_ms=2 * LEASE_MS)
    recorded = ledger.record_positions(
        stale, {"s-1": Position("shardId-0", "7")}, settle=False, now_ms=now_ms
    )
    assert recorded.applied
    fresh = ledger.open_group(stream, ["s-3"], owner="producer-2", now_ms=now_ms, lease_ms=LEASE_MS)
    held = ledger.get_claim(stream, "s-3")
    assert held is not None
    assert ledger.take_over_key(held, fresh, now_ms=now_ms).status is ClaimStatus.WON
    loser = ledger.open_group(
        stream, ["s-0", "s-2"], owner="producer-3", now_ms=now_ms, lease_ms=LEASE_MS
    )
    for key in ("s-0", "s-2"):
        assert ledger.claim(request(stream, key), loser, now_ms=now_ms).status is ClaimStatus.LOST

    # WHEN the listing is read one item at a time, all of it and the stale part
    pages = _in_flight_pages(client, stream, limit=1)
    stale_pages = _in_flight_pages(client, stream, limit=1, stale="true")

    # THEN each key in flight is listed once, under the group that holds it, with its lease;
    # the recorded key is not in flight
    everything = [item for page in pages for item in page]
    assert sorted(item["key"] for item in everything) == ["s-0", "s-2", "s-3"]
    assert {item["key"]: item["stale"] for item in everything} == {
        "s-0": True,
        "s-2": True,
        "s-3": False,
    }
    assert sorted(item["key"] for page in stale_pages for item in page) == ["s-0", "s-2"]
    # AND a page holds whole groups: the stale group's two keys in flight share a page of 1
    assert ["s-0", "s-2"] in [sorted(item["key"] for item in page) for page in pages]
    # AND the summary counts the keys the open groups list: an upper bound of the claims in
    # flight (4 + 1 + 2 listed, 3 in flight), the stale count those of the stale group
    summary = client.get(f"/v1/streams/{stream}/summary", headers=AUTH).json()
    assert (summary["in_flight"], summary["stale"]) == (7, 4)


def test_in_flight_of_an_empty_stream_is_one_empty_page(client: AsgiClient, stream: str) -> None:
    response = client.get(f"/v1/streams/{stream}/in-flight", headers=AUTH)

    assert response.status_code == 200, response.text
    assert response.json()["items"] == []
    assert response.json()["next_cursor"] is None


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ("limit=0", ["query", "limit"]),
        ("limit=501", ["query", "limit"]),
        ("limit=many", ["query", "limit"]),
        ("stale=perhaps", ["query", "stale"]),
        ("cursor=not-a-cursor", ["query", "cursor"]),
        ("stal=true", ["query", "stal"]),
    ],
)
def test_in_flight_refuses_bad_limits_and_cursors_with_422(
    client: AsgiClient, stream: str, query: str, loc: list[str]
) -> None:
    response = client.get(f"/v1/streams/{stream}/in-flight?{query}", headers=AUTH)

    problem = assert_problem(response, 422, "validation")
    assert [error["loc"] for error in problem["errors"]] == [loc]


@pytest.mark.parametrize(
    "body",
    [
        {"t": 10**15},
        {"t": 10**50},
        {"t": -(10**50)},
        {"t": 1, "l": 0, "k": "STREAM#" + "k" * 300},
        {"t": 10**12, "l": -(10**50), "k": "STREAM#k"},
    ],
    ids=["t-1e15", "t-1e50", "t-minus-1e50", "key-too-long", "l-minus-1e50"],
)
def test_a_forged_cursor_with_a_field_out_of_range_is_a_422_problem(
    client: AsgiClient, stream: str, body: dict[str, Any]
) -> None:
    # GIVEN a cursor forged from the wire form, a field out of range
    fields = {"v": 1, "s": stream, "b": 0, "t": None, "l": None, "k": None, **body}
    if isinstance(fields["k"], str):
        fields["k"] = fields["k"].replace("STREAM", stream)
    raw = json.dumps(fields, separators=(",", ":")).encode()
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    # WHEN it is used on a stale listing
    response = client.get(
        f"/v1/streams/{stream}/in-flight", params={"stale": "true", "cursor": cursor}, headers=AUTH
    )
    # THEN it is refused as a validation problem naming the cursor, not a server error
    problem = assert_problem(response, 422, "validation")
    assert [error["loc"] for error in problem["errors"]] == [["query", "cursor"]]


def test_the_document_says_what_a_cursor_is(client: AsgiClient) -> None:
    # GIVEN the OpenAPI document
    document = client.get("/openapi.json").json()
    # WHEN the in-flight listing's cursor parameter is read
    (cursor,) = [
        parameter
        for parameter in document["paths"]["/v1/streams/{stream}/in-flight"]["get"]["parameters"]
        if parameter["name"] == "cursor"
    ]
    schema = cursor["schema"]["anyOf"][0] if "anyOf" in cursor["schema"] else cursor["schema"]
    # THEN it has the pattern every issued cursor matches, so "0" is invalid by the schema too
    assert schema["pattern"] == CURSOR_PATTERN
    assert not re.fullmatch(schema["pattern"], "0")
    assert "base64" in cursor["description"]


def test_a_cursor_only_continues_its_own_listing(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a cursor from a stale-only listing
    for index in range(3):
        claim(ledger, stream, f"stale-{index}", ago_ms=2 * LEASE_MS)
    page = client.get(f"/v1/streams/{stream}/in-flight?stale=true&limit=1", headers=AUTH).json()
    cursor = page["next_cursor"]
    assert cursor is not None

    # WHEN it is used for a full listing, or for another stream
    other_listing = client.get(
        f"/v1/streams/{stream}/in-flight", params={"cursor": cursor}, headers=AUTH
    )
    other_stream = client.get(
        "/v1/streams/another-stream/in-flight",
        params={"cursor": cursor, "stale": "true"},
        headers=AUTH,
    )

    # THEN both are refused with the reason
    assert "stale=true" in assert_problem(other_listing, 422, "validation")["detail"]
    assert "another stream" in assert_problem(other_stream, 422, "validation")["detail"]


# --- summary and operations -----------------------------------------------------------------


def test_summary_counts_in_flight_and_stale_and_reports_the_window(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    for index in range(3):
        claim(ledger, stream, f"fresh-{index}")
    for index in range(2):
        claim(ledger, stream, f"stale-{index}", ago_ms=2 * LEASE_MS)
    deliver(ledger, stream, "done")

    response = client.get(f"/v1/streams/{stream}/summary", headers=AUTH)

    assert response.status_code == 200, response.text
    summary = response.json()
    assert (summary["in_flight"], summary["stale"], summary["counts_complete"]) == (5, 2, True)
    assert summary["exactly_once_window"] == {
        "dedupe_ttl_seconds": 7 * 24 * 3600,
        "stream_retention_seconds": 24 * 3600,
        "window_seconds": 24 * 3600,
        "limited_by": "stream_retention",
    }
    assert summary["last_reconcile"] is None


def test_without_a_configured_retention_the_summary_reads_the_streams_own(
    api_settings: ApiSettings, ledger: DynamoDBLedger, emulators: Any, stream: str
) -> None:
    # GIVEN an API told no retention, and a stream kept 48 hours
    kinesis = boto3.session.Session().client(
        "kinesis",
        endpoint_url=emulators.kinesis,
        region_name="us-east-1",
        aws_access_key_id="keolocal",
        aws_secret_access_key="keolocal",
    )
    create_stream(kinesis, stream, 1, timeout_s=30)
    kinesis.increase_stream_retention_period(StreamName=stream, RetentionPeriodHours=48)
    wait_active(kinesis, stream, timeout_s=30)
    settings = api_settings.model_copy(
        update={"stream_retention_hours": None, "kinesis_endpoint_url": emulators.kinesis}
    )
    client = AsgiClient(create_app(settings, ledger))
    # WHEN the summaries of that stream and of a stream Kinesis does not know are asked for
    known = client.get(f"/v1/streams/{stream}/summary", headers=AUTH)
    unknown = client.get(f"/v1/streams/{stream}-missing/summary", headers=AUTH)
    # THEN the window is the stream's retention, read from Kinesis
    assert known.status_code == 200, known.text
    assert known.json()["exactly_once_window"] == {
        "dedupe_ttl_seconds": 7 * 24 * 3600,
        "stream_retention_seconds": 48 * 3600,
        "window_seconds": 48 * 3600,
        "limited_by": "stream_retention",
    }
    # AND a stream Kinesis cannot describe still has a summary, its window unknown
    assert unknown.status_code == 200, unknown.text
    assert unknown.json()["exactly_once_window"]["window_seconds"] is None


def test_summary_shows_the_last_run_the_reconciler_recorded(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN the reconciler recorded a run over this stream
    ledger.record_run(
        stream,
        started_ms=1_700_000_000_000,
        finished_ms=1_700_000_001_500,
        outcomes={"scanned": 3, "delivered": 2, "released": 1},
    )

    # WHEN the summary is asked for
    response = client.get(f"/v1/streams/{stream}/summary", headers=AUTH)

    # THEN it reports that run, and the run is not counted as a key in flight
    assert response.status_code == 200, response.text
    summary = response.json()
    assert summary["last_reconcile"]["outcomes"] == {"scanned": 3, "delivered": 2, "released": 1}
    assert summary["last_reconcile"]["finished_at"].startswith("2023-11-14T22:13:21.5")
    assert summary["in_flight"] == 0


def test_summary_says_when_counting_stopped_at_the_cap(
    api_settings: ApiSettings, ledger: DynamoDBLedger, stream: str
) -> None:
    capped = api_settings.model_copy(update={"summary_count_cap": 2})
    client = AsgiClient(create_app(capped, ledger))
    for index in range(3):
        claim(ledger, stream, f"k{index}")

    summary = client.get(f"/v1/streams/{stream}/summary", headers=AUTH).json()

    assert (summary["in_flight"], summary["counts_complete"]) == (2, False)


# --- replay-mode runs ------------------------------------------------------------------------


def register(
    ledger: DynamoDBLedger,
    stream: str,
    run: str,
    attempt_id: str,
    *,
    ago_ms: int = 0,
    task_attempt: int = 0,
    execution: str = "exec-1",
) -> RunAttempt:
    """An attempt of a replay-mode run that registered ``ago_ms`` before now, under a lease of
    LEASE_MS: older than that, its lease has ended."""
    started_at_ms = CLOCK.now_ms() - ago_ms
    attempt = RunAttempt(
        attempt_id=attempt_id,
        execution_id=execution,
        task="3",
        task_attempt=task_attempt,
        started_at_ms=started_at_ms,
        lease_expires_at_ms=started_at_ms + LEASE_MS,
    )
    assert ledger.register_attempt(stream, run, attempt).registered
    return attempt


def run_url(stream: str, run: str) -> str:
    return f"/v1/streams/{stream}/runs/{quote(run, safe='')}"


def test_a_committed_run_reports_its_executions_counts_and_commit_time(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a micro-batch whose task was retried (the first attempt superseded), then
    # replayed by another driver run that superseded the first, then committed
    first = register(ledger, stream, "orders-to-kinesis/42", "t3-a0", ago_ms=5_000)
    retry = register(ledger, stream, "orders-to-kinesis/42", "t3-a1", task_attempt=1)
    ledger.supersede_attempts(stream, "orders-to-kinesis/42", retry, ["t3-a0"])
    ledger.finish_attempt(stream, "orders-to-kinesis/42", retry)
    replay = register(ledger, stream, "orders-to-kinesis/42", "r3-a0", execution="exec-2")
    ledger.supersede_executions(stream, "orders-to-kinesis/42", ["exec-1"])
    ledger.finish_attempt(stream, "orders-to-kinesis/42", replay, late_rows=frozenset({"r"}))
    committed_ms = CLOCK.now_ms()
    ledger.complete_run(
        stream, "orders-to-kinesis/42", counts={"rows": 3, "sent": 2}, now_ms=committed_ms
    )

    # WHEN an operator asks for the run
    response = client.get(run_url(stream, "orders-to-kinesis/42"), headers=AUTH)

    # THEN it is COMPLETE with the counts and time of its commit, and both executions in order
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["stream"], body["run"], body["state"]) == (
        stream,
        "orders-to-kinesis/42",
        "COMPLETE",
    )
    assert body["left_open"] is False
    assert body["counts"] == {"rows": 3, "sent": 2}
    assert body["completed_at"] == _rfc3339(committed_ms)
    assert body["attempts"] == 3
    assert [(e["id"], e["attempts"], e["superseded"]) for e in body["executions"]] == [
        ("exec-1", 2, True),
        ("exec-2", 1, False),
    ]
    assert body["executions"][0] == {
        "id": "exec-1",
        "started_at": _rfc3339(first.started_at_ms),
        "lease_expires_at": _rfc3339(first.lease_expires_at_ms),
        "lease_expired": False,
        "attempts": 2,
        "finished": False,  # its first attempt never said it finished (superseded)
        "late_rows": 0,
        "superseded": True,
    }
    assert (body["executions"][1]["finished"], body["executions"][1]["late_rows"]) == (True, 1)


def _rfc3339(epoch_ms: int) -> str:
    return from_epoch_ms(epoch_ms).isoformat().replace("+00:00", "Z")


def test_open_runs_are_listed_and_one_left_open_past_its_leases_says_so(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN a run whose driver died before its commit (its lease long over), a run still
    # putting, and a committed one
    register(ledger, stream, "query-a/7", "a0", ago_ms=2 * LEASE_MS)
    register(ledger, stream, "query-a/8", "b0")
    register(ledger, stream, "query-a/6", "c0", ago_ms=3 * LEASE_MS)
    ledger.complete_run(stream, "query-a/6", counts={}, now_ms=CLOCK.now_ms())

    # WHEN the run left open is asked for, and the OPEN runs are listed, all and stale only
    left = client.get(run_url(stream, "query-a/7"), headers=AUTH).json()
    every = client.get(f"/v1/streams/{stream}/runs?state=open", headers=AUTH).json()
    stale = client.get(f"/v1/streams/{stream}/runs?state=open&stale=true", headers=AUTH).json()

    # THEN it is OPEN and left open, its execution's lease over
    assert (left["state"], left["left_open"], left["completed_at"]) == ("OPEN", True, None)
    assert [e["lease_expired"] for e in left["executions"]] == [True]
    # AND the listing holds the OPEN runs, never the committed one; stale=true the one left open
    assert sorted(item["run"] for item in every["items"]) == ["query-a/7", "query-a/8"]
    assert (every["stale_only"], every["complete"]) == (False, True)
    assert [item["run"] for item in stale["items"]] == ["query-a/7"]
    assert stale["items"][0] == left
    assert stale["stale_only"] is True


def test_the_open_runs_listing_says_when_limit_cut_it_short(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str
) -> None:
    for batch in range(3):
        register(ledger, stream, f"query-a/{batch}", f"a{batch}")

    page = client.get(f"/v1/streams/{stream}/runs", params={"limit": 2}, headers=AUTH).json()

    assert (len(page["items"]), page["complete"]) == (2, False)


@pytest.mark.parametrize("run", ["query/with/slashes/7", "ключ 🚀 a%b?c#d", "r" * 1024])
def test_any_run_name_is_found_percent_encoded(
    client: AsgiClient, ledger: DynamoDBLedger, stream: str, run: str
) -> None:
    register(ledger, stream, run, "a0")

    response = client.get(run_url(stream, run), headers=AUTH)

    assert response.status_code == 200, response.text
    assert response.json()["run"] == run


def test_unknown_run_is_404_problem_naming_stream_and_run(client: AsgiClient, stream: str) -> None:
    response = client.get(run_url(stream, "query-a/404"), headers=AUTH)

    body = assert_problem(response, 404, "unknown-run")
    assert (body["stream"], body["run"]) == (stream, "query-a/404")


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("/v1/streams/s/runs/" + "r" * 1025, ["path", "run"]),
        ("/v1/streams/s/runs/", ["path", "run"]),
        ("/v1/streams/s/runs?state=complete", ["query", "state"]),
        ("/v1/streams/s/runs?limit=0", ["query", "limit"]),
        ("/v1/streams/s/runs?stal=true", ["query", "stal"]),
    ],
)
def test_invalid_run_names_and_listings_are_422_with_the_reason(
    client: AsgiClient, url: str, where: list[str]
) -> None:
    response = client.get(url, headers=AUTH)

    body = assert_problem(response, 422, "validation")
    assert [error["loc"] for error in body["errors"]] == [where]


def test_health_readiness_and_metrics_need_no_token(client: AsgiClient, stream: str) -> None:
    client.get(message_url(stream, "some-key"), headers=AUTH)

    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    # labelled by route template, never by the key
    assert 'route="/v1/streams/{stream}/messages/{key:path}",status="404"' in metrics.text
    assert "some-key" not in metrics.text


# --- the ledger down -------------------------------------------------------------------------


@pytest.fixture
def client_of_a_dead_ledger(api_settings: ApiSettings) -> AsgiClient:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    dead = api_settings.model_copy(
        update={
            "dynamodb_endpoint_url": f"http://127.0.0.1:{dead_port}",
            "ledger_max_retry_attempts": 0,
            "ledger_connect_timeout_s": 1,
            "ledger_read_timeout_s": 1,
        }
    )
    return AsgiClient(create_app(dead))


@pytest.mark.parametrize(
    ("method", "url", "body"),
    [
        ("GET", "/v1/streams/s/messages/k", None),
        ("POST", "/v1/streams/s/messages:lookup", {"keys": ["k"]}),
        ("GET", "/v1/streams/s/in-flight", None),
        ("GET", "/v1/streams/s/summary", None),
        ("GET", "/v1/streams/s/runs/query-a/7", None),
        ("GET", "/v1/streams/s/runs?state=open", None),
        ("GET", "/readyz", None),
    ],
)
def test_ledger_down_is_503_with_retry_after(
    client_of_a_dead_ledger: AsgiClient, method: str, url: str, body: Any
) -> None:
    response = client_of_a_dead_ledger.request(method, url, json=body, headers=AUTH)

    assert_problem(response, 503, "ledger-unavailable")
    assert response.headers["retry-after"] == "1"


def test_missing_table_is_503_not_ready(api_settings: ApiSettings, names: Any) -> None:
    client = AsgiClient(create_app(api_settings.model_copy(update={"table": f"{names.prefix}-x"})))

    body = assert_problem(client.get("/readyz"), 503, "ledger-not-ready")
    assert "keo init" in body["detail"]
    assert_problem(client.get("/v1/streams/s/messages/k", headers=AUTH), 503, "ledger-not-ready")


def test_a_table_without_a_schema_stamp_is_503_not_ready_and_left_unstamped(
    api_settings: ApiSettings, names: Any
) -> None:
    # GIVEN a table made by other tools than keo init: no ledger schema stamp
    settings = api_settings.model_copy(update={"table": f"{names.prefix}-iac"})
    ledger = DynamoDBLedger(settings.ledger_connection(), inflight_buckets=4)
    ledger.create_table(wait=False)
    stacks.wait_table_active(ledger)
    client = AsgiClient(create_app(settings, ledger))
    # WHEN the API is asked whether it is ready
    body = assert_problem(client.get("/readyz"), 503, "ledger-not-ready")
    # THEN it says what to do, and has not written the table (the API never writes)
    assert "no ledger schema stamp" in body["detail"]
    assert f"keo init --table {settings.table}" in body["detail"]
    assert ledger.schema_version() is None


# --- auth ------------------------------------------------------------------------------------

V1_ROUTES = [
    ("GET", "/v1/streams/s/messages/k", None),
    ("POST", "/v1/streams/s/messages:lookup", {"keys": ["k"]}),
    ("GET", "/v1/streams/s/in-flight", None),
    ("GET", "/v1/streams/s/summary", None),
    ("GET", "/v1/streams/s/runs/query-a/7", None),
    ("GET", "/v1/streams/s/runs?state=open", None),
]


@pytest.mark.parametrize(("method", "url", "body"), V1_ROUTES)
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
    ],
    ids=["missing", "wrong", "longer", "shorter", "basic", "no-scheme"],
)
def test_every_v1_route_refuses_a_missing_or_wrong_token(
    client: AsgiClient, method: str, url: str, body: Any, headers: dict[str, str]
) -> None:
    response = client.request(method, url, json=body, headers=headers)

    assert_problem(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "url", "body"), V1_ROUTES)
def test_every_v1_route_answers_the_right_token(
    client: AsgiClient, method: str, url: str, body: Any
) -> None:
    response = client.request(method, url, json=body, headers=AUTH)

    assert response.status_code in {200, 404}, response.text


def test_the_app_refuses_to_start_without_a_token(api_settings: ApiSettings) -> None:
    no_token = api_settings.model_copy(update={"api_token": None})

    with pytest.raises(ApiConfigError, match="KEO_API_TOKEN"):
        create_app(no_token)


def test_no_auth_serves_v1_without_a_token_and_says_so(
    api_settings: ApiSettings, ledger: DynamoDBLedger, caplog: pytest.LogCaptureFixture
) -> None:
    no_token = api_settings.model_copy(update={"api_token": None})

    client = AsgiClient(create_app(no_token, ledger, require_auth=False))

    assert "AUTHENTICATION IS OFF" in caplog.text
    assert client.get("/v1/streams/s/summary").status_code == 200
    document = client.get("/openapi.json").json()
    assert "security" not in document["paths"]["/v1/streams/{stream}/summary"]["get"]


# --- the OpenAPI document --------------------------------------------------------------------


def test_openapi_document_declares_auth_problems_and_examples(client: AsgiClient) -> None:
    document = client.get("/openapi.json").json()

    schemes = document["components"]["securitySchemes"]
    assert list(schemes.values()) == [
        {"type": "http", "scheme": "bearer", "description": schemes["bearerToken"]["description"]}
    ]
    v1_operations = [
        operation
        for path, item in document["paths"].items()
        if path.startswith("/v1/")
        for operation in item.values()
    ]
    assert len(v1_operations) == 6
    for operation in v1_operations:
        assert operation["security"] == [{"bearerToken": []}]
        assert {"401", "422", "503"} <= set(operation["responses"])
    for item in document["paths"].values():
        for operation in item.values():
            for status, response in operation["responses"].items():
                if int(status) >= 400:
                    assert list(response["content"]) == [PROBLEM], (status, operation)
    schemas = document["components"]["schemas"]
    for name in (
        "MessageState",
        "LookupRequest",
        "LookupResponse",
        "InFlightPage",
        "ReplayRunState",
        "RunExecutionState",
        "OpenRunsPage",
    ):
        assert schemas[name]["examples"], name
    assert "StreamSummary" in schemas
    assert "HTTPValidationError" not in schemas


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_openapi_property_run_finds_no_server_error(
    app: FastAPI, ledger: DynamoDBLedger, mode: GenerationMode
) -> None:
    # GIVEN the served document, and a few items of the documented examples' stream, so
    # requests can also find keys and pages
    if ledger.get("orders", "order-2024-000123") is None:
        deliver(ledger, "orders", "order-2024-000123")
        claim(ledger, "orders", "order-2024-000124", ago_ms=2 * LEASE_MS)
        register(ledger, "orders", "orders-to-kinesis/42", "t3-a0", ago_ms=2 * LEASE_MS)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # the document is one schemathesis reads
        operations.append(result.ok())
    assert len(operations) == 9

    # WHEN each operation is called with generated requests (valid ones, then invalid ones)
    for operation in operations:
        inputs = (operation.path_parameters, operation.query, operation.headers, operation.body)
        if mode is GenerationMode.NEGATIVE and not any(len(part) for part in inputs):
            continue  # nothing to make invalid
        # THEN no answer is a server error, and every answer conforms to the document
        _property_run(operation.as_strategy(generation_mode=mode))()


def _property_run(cases: Any) -> Any:
    @given(case=cases)
    @settings(
        max_examples=int(os.environ.get("KEO_TEST_API_EXAMPLES", "12")),
        deadline=None,
        database=None,
        derandomize=True,  # the same requests on every run: a failure replays
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        # A generated cursor matches the documented pattern but was not issued by the API: it
        # is rightly refused (422). Every other valid request must be accepted.
        forged_cursor = bool(case.query) and case.query.get("cursor") is not None
        excluded = [positive_data_acceptance] if forged_cursor else []
        case.call_and_validate(headers=AUTH, excluded_checks=excluded)

    return run


# --- the real server -------------------------------------------------------------------------

# keo itself: its commands load on first use, so serve imports no other command's modules
_KEO_SERVE = "import sys; from cli.app import app; app(sys.argv[1:])"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _keo_serve(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _KEO_SERVE, "serve", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def serve_env(env: dict[str, str], api_settings: ApiSettings) -> dict[str, str]:
    cleaned = {key: value for key, value in env.items() if not key.startswith("KEO_API_")}
    return {**cleaned, "KEO_TABLE": api_settings.table}


@pytest.fixture
def running_server(serve_env: dict[str, str], ledger: DynamoDBLedger) -> Iterator[str]:
    port = _free_port()
    process = _keo_serve(["--port", str(port)], {**serve_env, "KEO_API_TOKEN": TOKEN})
    base_url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            if process.poll() is not None:
                _, stderr = process.communicate()
                raise AssertionError(f"keo serve exited {process.returncode}: {stderr}")
            try:
                return httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        assert poll_until(healthy, timeout_s=30, interval_s=0.1), "keo serve did not answer"
        yield base_url
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


def test_keo_serve_answers_over_http_on_loopback(
    running_server: str, ledger: DynamoDBLedger, stream: str
) -> None:
    # GIVEN the real server (uvicorn) and a delivered key
    deliver(ledger, stream, "over/http", seq="123456789")

    with httpx.Client(base_url=running_server, timeout=10) as http:
        # WHEN it is asked over HTTP, with and without the token
        found = http.get(message_url(stream, "over/http"), headers=AUTH)
        refused = http.get(message_url(stream, "over/http"))
        ready = http.get("/readyz")
        document = http.get("/openapi.json")

    # THEN it answers like the app in-process
    assert found.status_code == 200, found.text
    assert found.json()["sequence_number"] == "123456789"
    assert refused.status_code == 401
    assert refused.headers["content-type"] == PROBLEM
    assert ready.json() == {"status": "ready", "table": ledger.table_name}
    assert "/v1/streams/{stream}/messages/{key}" in document.json()["paths"]


def test_keo_serve_refuses_to_start_without_a_token(serve_env: dict[str, str]) -> None:
    process = _keo_serve(["--port", str(_free_port())], serve_env)
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 3
    assert "KEO_API_TOKEN" in stderr


def test_keo_serve_refuses_no_auth_off_loopback(serve_env: dict[str, str]) -> None:
    process = _keo_serve(["--no-auth", "--host", "0.0.0.0", "--port", "1"], serve_env)  # noqa: S104
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 3
    assert "--no-auth" in stderr


def test_keo_serve_refuses_a_short_token(serve_env: dict[str, str]) -> None:
    process = _keo_serve(["--port", "1"], {**serve_env, "KEO_API_TOKEN": "tooShortTok"})
    _, stderr = process.communicate(timeout=60)

    assert process.returncode == 3
    assert "at least 16 characters" in stderr
    assert "tooShortTok" not in stderr  # a secret, even a bad one, is never echoed


def test_keo_serve_announces_its_url_only_once_it_listens(serve_env: dict[str, str]) -> None:
    # GIVEN keo serve starting on a free port
    port = _free_port()
    process = _keo_serve(["--port", str(port)], {**serve_env, "KEO_API_TOKEN": TOKEN})
    try:
        # WHEN it announces its URL
        assert process.stderr is not None
        announced = process.stderr.readline()
        assert f"delivery-state API on http://127.0.0.1:{port}" in announced, announced
        # THEN the port already accepts connections
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
    finally:
        process.terminate()
        process.communicate(timeout=30)


def test_keo_serve_on_a_port_in_use_says_so_and_exits_3(serve_env: dict[str, str]) -> None:
    # GIVEN a port something else listens on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # WHEN keo serve is asked to use it
        process = _keo_serve(["--port", str(port)], {**serve_env, "KEO_API_TOKEN": TOKEN})
        _, stderr = process.communicate(timeout=60)
    # THEN it exits 3 (configuration) with one clear line, and never announced a URL
    assert process.returncode == 3, stderr
    assert stderr == (
        f"keo serve: cannot listen on 127.0.0.1:{port} (--host, --port): the port is in use\n"
    )
