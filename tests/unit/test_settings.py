"""Producer settings: the design's defaults, and invalid values refused at start by their variable."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from dedupe_store.connection import data_client
from dedupe_store.sessions import new_session
from dedupe_store.settings import EMULATOR_CREDENTIALS, LedgerSettings, SettingNotes
from producer.clients import kinesis_client, kinesis_read_client
from producer.protocol import LeasePolicy
from producer.retries import PUT_MAX_ATTEMPTS, PUT_RETRY_INITIAL_MS, PUT_RETRY_MAX_MS
from producer.settings import ProducerSettings, PutFence


@pytest.fixture(autouse=True)
def clean_keo_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read KEO_* variables: none from the shell may leak into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("KEO_"):
            monkeypatch.delenv(name)


# --- defaults -----------------------------------------------------------------------------------


def test_defaults_match_the_design_table() -> None:
    # GIVEN no KEO_* variable set
    # WHEN settings are read
    settings = ProducerSettings()
    # THEN they are the design's defaults
    assert settings.put_connect_timeout_s == 2.0
    assert settings.put_read_timeout_s == 5.0
    assert settings.clock_skew_s == 5.0
    assert settings.put_fence is PutFence.SIGNATURE
    assert settings.signature_window_s == 300.0  # AWS's
    assert settings.lease_s == 360.0  # with the fence
    assert settings.dedupe_ttl_s == 7 * 24 * 3600
    assert settings.inflight_buckets == 16
    assert settings.ledger_concurrency == 32
    assert settings.wait_initial_s == 0.1  # waiting on another owner: 100 ms ...
    assert settings.wait_max_s == 5.0  # ... doubling to 5 s
    # AND no endpoint override: real AWS unless told otherwise
    assert settings.kinesis_endpoint_url is None
    assert settings.dynamodb_endpoint_url is None


def test_the_put_max_attempts_setting_says_how_long_its_default_sends_wait_at_most() -> None:
    # GIVEN the put_max_attempts setting, whose default and backoff the producers share
    notes = SettingNotes.of("put_max_attempts", ProducerSettings.model_fields["put_max_attempts"])
    # WHEN the waits between its default number of sends are summed, each at its cap
    caps_ms = [
        min(PUT_RETRY_MAX_MS, PUT_RETRY_INITIAL_MS * 2**attempt)
        for attempt in range(PUT_MAX_ATTEMPTS - 1)
    ]
    # THEN its why says that longest wait, in whole seconds
    assert f"{PUT_MAX_ATTEMPTS} sends wait up to {sum(caps_ms) // 1000} s in all" in notes.why


def test_a_keyword_that_is_no_setting_is_refused_naming_the_nearest_one() -> None:
    # GIVEN a misspelled setting, which ignored would keep the default (key mode)
    # WHEN settings are made with it
    with pytest.raises(ValidationError) as refused:
        ProducerSettings(stream="orders", dedup="replay")
    # THEN they are refused, naming the one meant; a name near none is named alone
    assert "unknown setting 'dedup' (did you mean 'dedupe'?)" in str(refused.value)
    with pytest.raises(ValidationError, match=r"settings 'colour', 'tabel' \(did you mean 'table'"):
        LedgerSettings(colour="blue", tabel="orders")


def test_keo_variables_that_are_no_setting_are_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the tools' KEO_* variables in the environment (endpoints.env exports some)
    monkeypatch.setenv("KEO_QUOTAS", "aws")
    monkeypatch.setenv("KEO_STATE_DIR", ".keo")
    # WHEN settings are read, from the environment or from such values (a Spark executor's)
    from spark_jobs.writer import producer_settings

    settings = producer_settings({"KEO_STREAM": "orders", "KEO_DYNAMODB_EMULATOR": "dynalite"})
    # THEN they are not settings, and nothing is refused
    assert settings.stream == "orders"
    assert ProducerSettings(stream="orders").stream == "orders"


def test_default_lease_policy_in_milliseconds() -> None:
    # GIVEN the default settings
    # WHEN the lease policy is derived
    # THEN the put timeout is connect + read, and the fence's window is AWS's, all in ms
    assert ProducerSettings().lease_policy() == LeasePolicy(
        lease_ms=360_000, put_timeout_ms=7_000, skew_ms=5_000, signature_window_ms=300_000
    )


def test_without_the_fence_the_default_lease_is_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN the fence turned off, and no lease set
    monkeypatch.setenv("KEO_PUT_FENCE", "off")
    # WHEN settings are read
    settings = ProducerSettings()
    # THEN the lease defaults to 60 s and the policy has no signature window
    assert settings.lease_s == 60.0
    assert settings.lease_policy() == LeasePolicy(
        lease_ms=60_000, put_timeout_ms=7_000, skew_ms=5_000
    )


@pytest.mark.parametrize("fence", ["signature", "off"])
def test_a_lease_that_is_set_wins_over_the_default_of_either_fence(
    monkeypatch: pytest.MonkeyPatch, fence: str
) -> None:
    # GIVEN a lease set explicitly, long enough for either fence
    monkeypatch.setenv("KEO_PUT_FENCE", fence)
    monkeypatch.setenv("KEO_LEASE_S", "600")
    # WHEN settings are read
    # THEN that lease is used, whatever the fence's default would be
    assert ProducerSettings().lease_s == 600.0


def test_an_unknown_fence_is_refused_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a fence that does not exist
    monkeypatch.setenv("KEO_PUT_FENCE", "lease")
    # WHEN settings are read
    with pytest.raises(ValidationError) as excinfo:
        ProducerSettings()
    # THEN the error is on put_fence (KEO_PUT_FENCE) and lists the accepted values
    (error,) = excinfo.value.errors()
    assert error["loc"] == ("put_fence",)
    assert "'signature' or 'off'" in error["msg"]


# --- the lease ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fence", "lease", "expected"),
    [
        # without the fence: below connect + read + 2 x skew (2 + 5 + 10 = 17 s)
        ("off", "16", ["KEO_LEASE_S=16 is too short", "= 17 s"]),
        # with it (the default): 1 s short of 300 + 2 + 5 + 2 x 5 = 317 s
        (
            "signature",
            "316",
            [
                "KEO_LEASE_S=316 is too short for the signature fence",
                "= 317 s",
                "KEO_SIGNATURE_WINDOW_S",
                "KEO_PUT_FENCE=off",
            ],
        ),
    ],
    ids=["fence-off", "fence-on"],
)
def test_lease_too_short_from_the_environment_is_refused_naming_keo_lease_s(
    monkeypatch: pytest.MonkeyPatch, fence: str, lease: str, expected: list[str]
) -> None:
    # GIVEN KEO_LEASE_S below its minimum
    monkeypatch.setenv("KEO_PUT_FENCE", fence)
    monkeypatch.setenv("KEO_LEASE_S", lease)
    # WHEN settings are read
    with pytest.raises(ValidationError) as excinfo:
        ProducerSettings()
    # THEN the error names the variable, its value, the minimum, what goes into it (and,
    # with the fence, the way out)
    message = str(excinfo.value)
    for fragment in [*expected, "KEO_PUT_CONNECT_TIMEOUT_S", "KEO_PUT_READ_TIMEOUT_S"]:
        assert fragment in message
    assert "KEO_CLOCK_SKEW_S" in message


@pytest.mark.parametrize(("fence", "minimum_s"), [("signature", 317), ("off", 17)])
def test_lease_exactly_at_the_minimum_is_accepted(fence: str, minimum_s: int) -> None:
    # GIVEN a lease of exactly connect + read + 2 x skew (+ the window, with the fence)
    # WHEN settings are made
    settings = ProducerSettings(put_fence=fence, lease_s=minimum_s)
    # THEN they are valid, and so is the lease policy derived from them
    assert settings.lease_policy().lease_ms == settings.lease_policy().minimum_lease_ms


def test_shorter_timeouts_allow_a_shorter_lease() -> None:
    # GIVEN the fence off, short put timeouts and skew: 1 + 1 + 2 x 1 = 4 s
    # WHEN a 4 s lease is configured
    settings = ProducerSettings(
        put_fence="off", put_connect_timeout_s=1, put_read_timeout_s=1, clock_skew_s=1, lease_s=4
    )
    # THEN it is accepted
    assert settings.lease_policy() == LeasePolicy(4_000, 2_000, 1_000)


def test_a_short_window_behind_an_endpoint_that_enforces_it_allows_a_short_fenced_lease() -> None:
    # GIVEN the fence on, a 4 s window (the fault proxy's), short timeouts: 4 + 1 + 1 + 2 x 1
    # WHEN an 8 s lease is configured, Kinesis reached through the proxy
    settings = ProducerSettings(
        kinesis_endpoint_url="http://127.0.0.1:4599",
        signature_window_s=4,
        put_connect_timeout_s=1,
        put_read_timeout_s=1,
        clock_skew_s=1,
        lease_s=8,
    )
    # THEN it is accepted
    assert settings.lease_policy() == LeasePolicy(8_000, 2_000, 1_000, signature_window_ms=4_000)


def test_a_window_shorter_than_aws_against_real_aws_is_refused_naming_it() -> None:
    # GIVEN the fence on, real AWS (no endpoint override), and a window below AWS's 300 s
    # WHEN settings are made
    # THEN they are refused: AWS would still accept a stalled put the fence let go
    with pytest.raises(ValidationError, match="KEO_SIGNATURE_WINDOW_S=60 is shorter than the 300"):
        ProducerSettings(signature_window_s=60, lease_s=600)


def test_without_the_fence_the_window_is_not_looked_at() -> None:
    # GIVEN the fence off, and a window that would be refused with it
    # WHEN settings are made
    settings = ProducerSettings(put_fence="off", signature_window_s=60)
    # THEN they are valid and the policy ignores the window
    assert settings.lease_policy().signature_window_ms is None


@pytest.mark.parametrize("fence", ["signature", "off"])
def test_longer_timeouts_make_the_default_lease_too_short(fence: str) -> None:
    # GIVEN a read timeout raised to 60 s with the default lease (360 s, or 60 s without fence)
    # WHEN settings are made
    # THEN they are refused: a put could land after the lease expired
    with pytest.raises(ValidationError, match=r"KEO_LEASE_S=(360|60) is too short"):
        ProducerSettings(put_fence=fence, put_read_timeout_s=60 if fence == "off" else 120)


ms_seconds = st.integers(1, 60_000).map(lambda ms: ms / 1000)


@given(
    connect_s=ms_seconds,
    read_s=ms_seconds,
    skew_s=st.integers(0, 60_000).map(lambda ms: ms / 1000),
    lease_s=st.integers(1, 3_600_000).map(lambda ms: ms / 1000),
    fence=st.sampled_from(["signature", "off"]),
    window_s=st.integers(1_000, 600_000).map(lambda ms: ms / 1000),
)
def test_settings_that_validate_always_give_a_valid_lease_policy(
    connect_s: float, read_s: float, skew_s: float, lease_s: float, fence: str, window_s: float
) -> None:
    # GIVEN any timeouts, skew, lease and window with millisecond resolution, either fence
    try:
        settings = ProducerSettings(
            kinesis_endpoint_url="http://127.0.0.1:4599",
            put_connect_timeout_s=connect_s,
            put_read_timeout_s=read_s,
            clock_skew_s=skew_s,
            lease_s=lease_s,
            put_fence=fence,
            signature_window_s=window_s,
        )
    except ValidationError:
        return
    # WHEN they pass validation
    # THEN the protocol accepts their lease policy too: start-up never lets a bad lease through
    policy = settings.lease_policy()
    assert policy.lease_ms >= policy.minimum_lease_ms
    assert policy.fenced is (fence == "signature")


def test_wait_max_below_wait_initial_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a waiting backoff whose cap is below its first step
    monkeypatch.setenv("KEO_WAIT_INITIAL_S", "2")
    monkeypatch.setenv("KEO_WAIT_MAX_S", "1")
    # WHEN settings are read
    # THEN the error names both variables
    with pytest.raises(ValidationError, match="KEO_WAIT_MAX_S must be >= KEO_WAIT_INITIAL_S"):
        ProducerSettings()


# --- endpoints ----------------------------------------------------------------------------------

NOT_HTTP_URLS = ["localhost:4567", "127.0.0.1:4567", "ftp://127.0.0.1:4567", "HTTP"]
NORMALIZED_ENDPOINTS = [
    pytest.param("http://127.0.0.1:4567/", "http://127.0.0.1:4567", id="trailing-slash"),
    pytest.param("", None, id="empty-means-aws"),
]
PLAIN_ENDPOINTS = [
    pytest.param("http://127.0.0.1:4567", "http://127.0.0.1:4567", id="http"),
    pytest.param(
        "https://kinesis.eu-west-1.amazonaws.com",
        "https://kinesis.eu-west-1.amazonaws.com",
        id="https",
    ),
]


@pytest.mark.parametrize("value", NOT_HTTP_URLS)
def test_kinesis_endpoint_that_is_not_an_http_url_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # GIVEN a Kinesis endpoint that is not an http(s) URL
    monkeypatch.setenv("KEO_KINESIS_ENDPOINT_URL", value)
    # WHEN settings are read
    with pytest.raises(ValidationError) as excinfo:
        ProducerSettings()
    # THEN the error names the variable and repeats the value
    message = str(excinfo.value)
    assert "KEO_KINESIS_ENDPOINT_URL must be an http(s) URL" in message
    assert value in message


@pytest.mark.parametrize(("value", "expected"), PLAIN_ENDPOINTS + NORMALIZED_ENDPOINTS)
def test_kinesis_endpoint_http_urls_are_accepted_without_trailing_slash(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str | None
) -> None:
    # GIVEN an http(s) Kinesis endpoint (or an empty variable)
    monkeypatch.setenv("KEO_KINESIS_ENDPOINT_URL", value)
    # WHEN settings are read
    # THEN it is used without a trailing slash; empty means the AWS default
    assert ProducerSettings().kinesis_endpoint_url == expected


@pytest.mark.parametrize(("value", "expected"), PLAIN_ENDPOINTS)
def test_dynamodb_endpoint_http_urls_are_accepted(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    # GIVEN an http(s) DynamoDB endpoint
    monkeypatch.setenv("KEO_DYNAMODB_ENDPOINT_URL", value)
    # WHEN the producer's settings are read
    # THEN the ledger is reached there
    assert ProducerSettings().dynamodb_endpoint_url == expected


@pytest.mark.parametrize("value", NOT_HTTP_URLS)
def test_dynamodb_endpoint_that_is_not_an_http_url_is_refused_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # GIVEN a DynamoDB endpoint that is not an http(s) URL
    monkeypatch.setenv("KEO_DYNAMODB_ENDPOINT_URL", value)
    # WHEN the producer's settings are read
    with pytest.raises(ValidationError) as excinfo:
        ProducerSettings()
    # THEN they are refused at start, naming the variable
    assert "KEO_DYNAMODB_ENDPOINT_URL must be an http(s) URL" in str(excinfo.value)


@pytest.mark.parametrize(("value", "expected"), NORMALIZED_ENDPOINTS)
def test_dynamodb_endpoint_is_normalized_like_the_kinesis_one(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str | None
) -> None:
    # GIVEN a DynamoDB endpoint with a trailing slash, or set but empty
    monkeypatch.setenv("KEO_DYNAMODB_ENDPOINT_URL", value)
    # WHEN the producer's settings are read
    # THEN the slash is dropped and empty means real AWS (not an endpoint "" with dummy keys)
    assert ProducerSettings().dynamodb_endpoint_url == expected


def test_ledger_settings_alone_do_validate_the_dynamodb_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN the ledger's own settings (what the API reads), with a bad DynamoDB endpoint
    monkeypatch.setenv("KEO_DYNAMODB_ENDPOINT_URL", "localhost:8000")
    # WHEN read
    # THEN they are refused: only the producer's subclass loses the check
    with pytest.raises(ValidationError, match="KEO_DYNAMODB_ENDPOINT_URL must be an http"):
        LedgerSettings()


# --- other limits -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", ["", "has space", "a" * 129, "slash/stream"])
def test_invalid_stream_name_is_refused(monkeypatch: pytest.MonkeyPatch, stream: str) -> None:
    # GIVEN a stream name Kinesis would refuse
    monkeypatch.setenv("KEO_STREAM", stream)
    # WHEN settings are read
    # THEN they are refused at start, not at the first put
    with pytest.raises(ValidationError, match="stream"):
        ProducerSettings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KEO_PUT_CONNECT_TIMEOUT_S", "0"),
        ("KEO_PUT_READ_TIMEOUT_S", "-1"),
        ("KEO_CLOCK_SKEW_S", "-0.5"),
        ("KEO_PUT_MAX_ATTEMPTS", "0"),
        ("KEO_INFLIGHT_BUCKETS", "0"),
        ("KEO_LEDGER_CONCURRENCY", "0"),
        ("KEO_DEDUPE_TTL_S", "0"),
        ("KEO_PUT_CONNECT_TIMEOUT_S", "61"),
        ("KEO_PUT_READ_TIMEOUT_S", "121"),
        ("KEO_LEDGER_CONNECT_TIMEOUT_S", "61"),
        ("KEO_LEDGER_READ_TIMEOUT_S", "121"),
        ("KEO_SIGNATURE_WINDOW_S", "0"),
        ("KEO_SIGNATURE_WINDOW_S", "3001"),
    ],
)
def test_values_out_of_their_bounds_are_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    # GIVEN a timeout, count or TTL that cannot work, or a timeout longer than a call is worth
    monkeypatch.setenv(variable, value)
    # WHEN settings are read
    # THEN they are refused
    with pytest.raises(ValidationError):
        ProducerSettings()


def test_zero_clock_skew_is_allowed() -> None:
    # GIVEN clocks trusted to agree (a single host)
    # WHEN the skew margin is 0
    settings = ProducerSettings(clock_skew_s=0)
    # THEN it is accepted
    assert settings.lease_policy().skew_ms == 0


# --- the ledger's client ---------------------------------------------------------------------------


def test_the_ledger_pool_holds_every_call_a_producer_has_in_flight() -> None:
    # GIVEN a producer with 32 claim workers and 2 groups in flight (each opening, renewing or
    # settling its group beside the claims)
    producer = ProducerSettings(region="eu-west-1", ledger_concurrency=32, groups_in_flight=2)
    # WHEN its ledger connection is sized
    # THEN every call in flight finds a pooled connection (none opened and thrown away)
    assert producer.ledger_connection().max_pool_connections == 34
    # AND a process without groups (the API, the reconciler) sizes it by its concurrency
    assert (
        LedgerSettings(region="eu-west-1", ledger_concurrency=48)
        .ledger_connection()
        .max_pool_connections
        == 48
    )


def test_the_ledger_client_has_the_settings_retries_and_a_fixed_user_agent() -> None:
    # GIVEN the ledger settings of a process
    options = ProducerSettings(
        region="eu-west-1", ledger_max_retry_attempts=4, ledger_concurrency=16
    ).ledger_connection()
    # WHEN the ledger's client is made (no call is sent)
    config = data_client(options).meta.config
    # THEN SDK retries are the settings' (standard mode), the pool is the settings', and the
    # user agent names the product, built once
    assert config.retries == {"total_max_attempts": 5, "mode": "standard"}
    assert config.max_pool_connections == options.max_pool_connections
    assert config.user_agent.startswith("kinesis-exactly-once/")
    assert "Botocore/" in config.user_agent


def test_the_ledgers_and_kinesis_clients_read_the_sdks_data_once_a_process() -> None:
    # GIVEN the ledger's client and the producer's Kinesis put and read clients of a process
    settings = ProducerSettings(region="eu-west-1")
    clients = [
        data_client(settings.ledger_connection()),
        kinesis_client(settings, for_put=True),
        kinesis_read_client(settings),
    ]
    # WHEN their sessions' data loaders are looked at (no call is sent)
    loaders = {id(client._loader) for client in clients}
    # THEN each client has its own events, but all read the SDK's data through one loader,
    # a later session's too: the endpoints and each service's model parsed once, not once a
    # client
    assert len({id(client.meta.events) for client in clients}) == 3
    assert loaders == {id(new_session().get_component("data_loader"))}


# --- emulator credentials -----------------------------------------------------------------------


def test_emulators_get_the_same_dummy_credentials_when_the_environment_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN both endpoints on an emulator and no AWS credentials in the environment
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    settings = ProducerSettings(
        kinesis_endpoint_url="http://127.0.0.1:4567", dynamodb_endpoint_url="http://127.0.0.1:4568"
    )
    # WHEN the clients' credentials are chosen
    connection = settings.ledger_connection()
    # THEN Kinesis and the ledger sign with the one pair of dummy credentials
    assert settings.emulator_credentials() == EMULATOR_CREDENTIALS
    assert (connection.aws_access_key_id, connection.aws_secret_access_key) == EMULATOR_CREDENTIALS


def test_real_aws_never_gets_dummy_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN no endpoint override (real AWS) and no AWS credentials in the environment
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    settings = ProducerSettings(region="eu-west-1")
    # WHEN the clients' credentials are chosen
    connection = settings.ledger_connection()
    # THEN none are made up: the standard AWS chain decides
    assert settings.emulator_credentials() is None
    assert connection.aws_access_key_id is None


def test_an_emulator_endpoint_keeps_the_credentials_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # GIVEN an emulator endpoint and AWS credentials in the environment
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    # WHEN the Kinesis client's credentials are chosen
    # THEN the environment's are used
    assert (
        ProducerSettings(kinesis_endpoint_url="http://127.0.0.1:4567").emulator_credentials()
        is None
    )
