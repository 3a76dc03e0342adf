"""Settings of the delivery-state API: the ledger's, plus the bearer token and the window.

Read from the environment with the ``KEO_`` prefix (``KEO_API_TOKEN``,
``KEO_STREAM_RETENTION_HOURS``, ...) and validated at start; ``keo serve`` flags override them.
"""

from __future__ import annotations

from pydantic import SecretStr, field_validator

from dedupe_store.settings import ENDPOINT_URL_RULE, EndpointUrl, LedgerSettings, setting

# 128 bits of entropy as hex is 32 characters; anything shorter than this is guessable.
MIN_API_TOKEN_LENGTH = 16
# Kinesis retention is 24 h by default and can be raised to 365 days.
MIN_RETENTION_HOURS = 24
MAX_RETENTION_HOURS = 8760


class ApiSettings(LedgerSettings):
    """The delivery-state API (``keo serve``): the ledger's settings, plus the bearer token and
    what the exactly-once window is reported from (a retention, or the streams' Kinesis)."""

    api_token: SecretStr | None = setting(
        None,
        rule=f"at least {MIN_API_TOKEN_LENGTH} characters, no surrounding white space",
        description=(
            "bearer token every /v1 request must present; the API refuses to start without "
            "one unless started with --no-auth (loopback addresses only)"
        ),
        why="no default: a token is chosen per deployment (e.g. `openssl rand -hex 32`)",
    )
    stream_retention_hours: int | None = setting(
        None,
        ge=MIN_RETENTION_HOURS,
        le=MAX_RETENTION_HOURS,
        description=(
            "retention of the streams, for the exactly-once window the API reports; unset: "
            "each stream's own, read from Kinesis (DescribeStreamSummary, kept 5 minutes)"
        ),
        why=(
            "a stream knows its retention: reading it keeps the window right when it changes; "
            "set it where the API may not call Kinesis (the window is unknown, at most the "
            "dedupe TTL, when neither works); the bounds are Kinesis's (24 h to 365 days)"
        ),
    )
    kinesis_endpoint_url: EndpointUrl = setting(
        None,
        rule=ENDPOINT_URL_RULE,
        description=(
            "Kinesis endpoint override, where the API reads the streams' retention "
            "(the same variable as the producer's)"
        ),
        why="unset reaches real AWS: an emulator is opted into, never the default",
    )
    summary_count_cap: int = setting(
        100_000,
        ge=1,
        le=10_000_000,
        description="the summary stops counting in-flight claims past this many, and says so",
        why="a summary answers in bounded time however many claims a crash left in flight",
    )

    @field_validator("api_token", mode="before")
    @classmethod
    def _token_is_strong_enough(cls, value: object) -> object:
        raw = value.get_secret_value() if isinstance(value, SecretStr) else value
        if raw is None or raw == "":
            return None
        if isinstance(raw, str):
            if raw != raw.strip():
                raise ValueError("KEO_API_TOKEN must not start or end with whitespace")
            if len(raw) < MIN_API_TOKEN_LENGTH:
                raise ValueError(
                    f"KEO_API_TOKEN must be at least {MIN_API_TOKEN_LENGTH} characters "
                    "(e.g. 'openssl rand -hex 32')"
                )
        return value
