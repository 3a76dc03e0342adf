"""The delivery-state API: ``create_app`` wires settings, ledger, clock and routes.

The API reads the ledger and never writes it. Entry point: ``keo serve`` (uvicorn).
"""

from __future__ import annotations

import importlib.metadata
import logging
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from api.deps import require_token
from api.errors import ApiConfigError
from api.metrics import ApiMetrics, MetricsMiddleware
from api.problems import PROBLEM_MEDIA_TYPE, install_problem_handlers, problem_responses
from api.retention import RetentionLookup, retention_from
from api.routes import health, in_flight, messages, runs, summary
from api.settings import ApiSettings
from dedupe_store.clock import Clock, SystemClock
from dedupe_store.contract import LedgerReader
from dedupe_store.ledger import DynamoDBLedger

log = logging.getLogger(__name__)

DESCRIPTION = """\
Answers "was key X delivered, where, and when?" from the exactly-once ledger (DynamoDB).
The API reads the ledger; it never writes it.

Every `/v1` route needs the bearer token configured as `KEO_API_TOKEN`
(`Authorization: Bearer <token>`), unless the server was started with `--no-auth`.
`/healthz`, `/readyz` and `/metrics` are open.

**The exactly-once window** is min(dedupe TTL, stream retention): a key delivered longer ago
than that may be delivered again. `GET /v1/streams/{stream}/summary` reports it.

Replay mode (`dedupe=replay`) writes no per-key item: `GET /v1/streams/{stream}/runs/{run}`
answers per run (a Spark micro-batch `<query>/<batch id>`, or a CLI `--run-id`): committed or
not, its executions (a first run and its replays), its counts.

Errors are RFC 9457 problem details (`application/problem+json`): 401 without the right token,
404 for an unknown key or run, 422 with every reason for an invalid key, run, stream, limit or
cursor, 503 (with `Retry-After`) while the ledger is unavailable.
"""

TAGS: list[dict[str, Any]] = [
    {"name": "messages", "description": "the delivery state of message keys"},
    {"name": "in-flight", "description": "claims in flight, from the sparse in-flight index"},
    {"name": "summary", "description": "a stream at a glance"},
    {
        "name": "runs",
        "description": "replay-mode runs (dedupe=replay): committed or not, their executions",
    },
    {"name": "operations", "description": "liveness, readiness and metrics"},
]


def create_app(
    settings: ApiSettings,
    ledger: LedgerReader | None = None,
    *,
    require_auth: bool = True,
    clock: Clock | None = None,
    retention: RetentionLookup | None = None,
) -> FastAPI:
    """The app, on ``ledger`` and the streams' ``retention`` (both built from ``settings`` when
    not given).

    Raises ``ApiConfigError`` when auth is required and no token is configured: an API that
    answers anyone must be asked for explicitly (``require_auth=False``, ``keo serve --no-auth``).
    """
    if require_auth and settings.api_token is None:
        raise ApiConfigError(
            "KEO_API_TOKEN is not set: the API will not serve the ledger without a bearer token "
            "(set KEO_API_TOKEN, or start with --no-auth on a trusted machine)"
        )
    if not require_auth:
        log.warning(
            "AUTHENTICATION IS OFF: every /v1 route answers without a token (--no-auth); "
            "for local use only"
        )
    if ledger is None:
        ledger = DynamoDBLedger(
            settings.ledger_connection(),
            dedupe_ttl_s=settings.dedupe_ttl_s,
            inflight_buckets=settings.inflight_buckets,
        )
    app = FastAPI(
        title="kinesis-exactly-once delivery state",
        version=_version(),
        description=DESCRIPTION,
        openapi_tags=TAGS,
        redoc_url=None,
    )
    metrics = ApiMetrics.create()
    app.state.settings = settings
    app.state.ledger = ledger
    app.state.clock = clock if clock is not None else SystemClock()
    app.state.retention = retention if retention is not None else retention_from(settings)
    app.state.metrics = metrics
    install_problem_handlers(app)
    auth_dependencies = [Depends(require_token)] if require_auth else []
    auth_responses = problem_responses(401) if require_auth else {}
    for router in (messages.router, in_flight.router, summary.router, runs.router):
        app.include_router(router, dependencies=auth_dependencies, responses=auth_responses)
    app.include_router(health.router)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    log.info(
        "delivery-state API ready table=%s auth=%s buckets=%d",
        ledger.table_name,
        "bearer" if require_auth else "off",
        ledger.inflight_buckets,
    )
    return app


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with every error response under ``application/problem+json``."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
        tags=app.openapi_tags,
    )
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if status.isdigit() and int(status) >= 400 and "application/json" in content:
                    content[PROBLEM_MEDIA_TYPE] = content.pop("application/json")
    app.openapi_schema = schema
    return schema


def _version() -> str:
    try:
        return importlib.metadata.version("kinesis-exactly-once")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"
