"""Dependencies of the routes: the ledger (read side only), the settings, the clock, the
streams' retention, the token.

``create_app`` puts the wired objects on ``app.state``; routes take them through the
``Annotated`` aliases below, so a test swaps any of them by building the app with its own.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import UnauthorizedError
from api.retention import RetentionLookup
from api.settings import ApiSettings
from dedupe_store.clock import Clock
from dedupe_store.contract import LedgerReader


def get_ledger(request: Request) -> LedgerReader:
    ledger: LedgerReader = request.app.state.ledger
    return ledger


def get_settings(request: Request) -> ApiSettings:
    settings: ApiSettings = request.app.state.settings
    return settings


def get_clock(request: Request) -> Clock:
    clock: Clock = request.app.state.clock
    return clock


def get_retention(request: Request) -> RetentionLookup:
    retention: RetentionLookup = request.app.state.retention
    return retention


LedgerDep = Annotated[LedgerReader, Depends(get_ledger)]
RetentionDep = Annotated[RetentionLookup, Depends(get_retention)]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
ClockDep = Annotated[Clock, Depends(get_clock)]

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="the token configured as KEO_API_TOKEN: `Authorization: Bearer <token>`",
)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def require_token(settings: SettingsDep, credentials: BearerDep) -> None:
    """Let the request through only with the configured bearer token."""
    expected = settings.api_token
    if expected is None:
        # create_app refuses this unless auth is off, and then this dependency is not installed
        raise UnauthorizedError("the API has no token configured")
    if credentials is None:
        raise UnauthorizedError("missing bearer token: send 'Authorization: Bearer <token>'")
    # constant time: the comparison must not reveal how much of a guess was right
    if not hmac.compare_digest(
        credentials.credentials.encode("utf-8"), expected.get_secret_value().encode("utf-8")
    ):
        raise UnauthorizedError("wrong bearer token")
