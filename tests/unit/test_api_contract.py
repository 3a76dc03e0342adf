"""The API's contract pieces that need no ledger: settings, states, times, the window."""

from __future__ import annotations

import datetime as dt

import pytest
from pydantic import SecretStr, ValidationError

from api.schemas import (
    DeliveryState,
    LookupRequest,
    ReplayState,
    exactly_once_window,
    from_epoch_ms,
)
from api.settings import ApiSettings
from dedupe_store.states import LedgerState, RunState


def test_every_ledger_state_has_an_api_state() -> None:
    assert [state.value for state in LedgerState] == [state.value for state in DeliveryState]
    assert [state.value for state in RunState] == [state.value for state in ReplayState]


def test_times_keep_their_milliseconds_exactly() -> None:
    assert from_epoch_ms(1_700_000_000_123) == dt.datetime(
        2023, 11, 14, 22, 13, 20, 123_000, tzinfo=dt.UTC
    )
    assert from_epoch_ms(None) is None


@pytest.mark.parametrize(
    ("ttl_s", "retention_h", "window_s", "limited_by"),
    [
        (7 * 86400, 24, 86400, "stream_retention"),
        (3600, 24, 3600, "dedupe_ttl"),
        (86400, 24, 86400, "dedupe_ttl"),
        (86400, None, None, None),
    ],
)
def test_the_exactly_once_window_is_the_smaller_bound(
    ttl_s: int, retention_h: int | None, window_s: int | None, limited_by: str | None
) -> None:
    window = exactly_once_window(ttl_s, retention_h)

    assert (window.window_seconds, window.limited_by) == (window_s, limited_by)
    assert window.dedupe_ttl_seconds == ttl_s


def test_a_short_token_is_refused_without_echoing_it() -> None:
    with pytest.raises(ValidationError, match="at least 16 characters") as caught:
        ApiSettings(api_token=SecretStr("guessable"))

    assert "guessable" not in str(caught.value)


@pytest.mark.parametrize("token", ["", None])
def test_an_empty_token_means_none(token: str | None) -> None:
    assert ApiSettings(api_token=token).api_token is None


def test_a_token_with_surrounding_whitespace_is_refused() -> None:
    with pytest.raises(ValidationError, match="whitespace"):
        ApiSettings(api_token=SecretStr(" 0123456789abcdef0123 "))


def test_retention_outside_what_kinesis_allows_is_refused() -> None:
    with pytest.raises(ValidationError):
        ApiSettings(stream_retention_hours=23)
    with pytest.raises(ValidationError):
        ApiSettings(stream_retention_hours=8761)


def test_lookup_refuses_a_lone_surrogate_key() -> None:
    # JSON can carry "\ud800"; it is not text, and not a key Kinesis would accept
    with pytest.raises(ValidationError, match=r"keys\.1"):
        LookupRequest(keys=["ok", "\ud800"])
