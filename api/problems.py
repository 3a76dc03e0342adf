"""Every error leaves the API in one shape: RFC 9457 problem details (``application/problem+json``).

What maps to what::

    RequestValidationError (keys, limits, cursor, body)   422  urn:keo:problem:validation
    a body FastAPI cannot decode (its 400)                 422  urn:keo:problem:validation
    UnauthorizedError                                      401  urn:keo:problem:unauthorized
    UnknownKeyError                                        404  urn:keo:problem:unknown-key
    UnknownRunError                                        404  urn:keo:problem:unknown-run
    LedgerUnavailableError (DynamoDB down, throttled)      503  urn:keo:problem:ledger-unavailable
    LedgerSchemaError (the table is missing)               503  urn:keo:problem:ledger-not-ready
    any other HTTP error (unknown route, wrong method)     its status, type about:blank
    anything else                                          500  urn:keo:problem:internal

A 503 carries ``Retry-After``: the ledger is expected back, and the caller may try again.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.errors import UnauthorizedError, UnknownKeyError, UnknownRunError
from dedupe_store.errors import LedgerError, LedgerSchemaError, LedgerUnavailableError

log = logging.getLogger(__name__)

PROBLEM_MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_S = 1


class ProblemType:
    VALIDATION = "urn:keo:problem:validation"
    UNAUTHORIZED = "urn:keo:problem:unauthorized"
    UNKNOWN_KEY = "urn:keo:problem:unknown-key"
    UNKNOWN_RUN = "urn:keo:problem:unknown-run"
    LEDGER_UNAVAILABLE = "urn:keo:problem:ledger-unavailable"
    LEDGER_NOT_READY = "urn:keo:problem:ledger-not-ready"
    INTERNAL = "urn:keo:problem:internal"
    HTTP = "about:blank"


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": ProblemType.UNKNOWN_KEY,
                    "title": "Unknown key",
                    "status": 404,
                    "detail": "no delivery state for key 'order-1' in stream 'orders'",
                    "instance": "/v1/streams/orders/messages/order-1",
                    "stream": "orders",
                    "key": "order-1",
                }
            ]
        },
    )

    type: str = Field(description="a URI naming the kind of problem")
    title: str = Field(description="short summary of the kind of problem")
    status: int = Field(ge=400, le=599, description="the HTTP status code")
    detail: str | None = Field(default=None, description="what went wrong this time")
    instance: str | None = Field(default=None, description="the request path")


class InvalidParam(BaseModel):
    """One reason a request was refused."""

    loc: list[str | int] = Field(
        description="where: path, query or body, then the parameter or field"
    )
    msg: str = Field(description="why")
    type: str = Field(description="a stable code for the reason")


class ValidationProblem(Problem):
    """A request that did not pass validation: every reason, with where it applies."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "type": ProblemType.VALIDATION,
                    "title": "Invalid request",
                    "status": 422,
                    "detail": "query.limit: Input should be less than or equal to 500",
                    "instance": "/v1/streams/orders/in-flight",
                    "errors": [
                        {
                            "loc": ["query", "limit"],
                            "msg": "Input should be less than or equal to 500",
                            "type": "less_than_equal",
                        }
                    ],
                }
            ]
        },
    )

    errors: list[InvalidParam]


_RESPONSES: dict[int, tuple[str, dict[str, Any]]] = {
    401: (
        "missing or wrong bearer token",
        {
            "type": ProblemType.UNAUTHORIZED,
            "title": "Unauthorized",
            "status": 401,
            "detail": "wrong bearer token",
            "instance": "/v1/streams/orders/summary",
        },
    ),
    404: (
        "the key is unknown in this stream",
        {
            "type": ProblemType.UNKNOWN_KEY,
            "title": "Unknown key",
            "status": 404,
            "detail": "no delivery state for this key in stream 'orders': never claimed, "
            "or its dedupe TTL has passed",
            "instance": "/v1/streams/orders/messages/order-1",
            "stream": "orders",
            "key": "order-1",
        },
    ),
    422: (
        "invalid key, stream, limit, cursor or body: every reason, with where it applies",
        {
            "type": ProblemType.VALIDATION,
            "title": "Invalid request",
            "status": 422,
            "detail": "path.key: String should have at most 256 characters",
            "instance": "/v1/streams/orders/messages/kkkk",
            "errors": [
                {
                    "loc": ["path", "key"],
                    "msg": "String should have at most 256 characters",
                    "type": "string_too_long",
                }
            ],
        },
    ),
    503: (
        "the ledger (DynamoDB) is unavailable or its table is missing; retry later",
        {
            "type": ProblemType.LEDGER_UNAVAILABLE,
            "title": "Ledger unavailable",
            "status": 503,
            "detail": "the ledger (DynamoDB) did not answer; retry later",
            "instance": "/v1/streams/orders/summary",
        },
    ),
}
# a route answers 404 for the one thing it looks up: a key (the default), or a run
_NOT_FOUND: dict[str, tuple[str, dict[str, Any]]] = {
    "key": _RESPONSES[404],
    "run": (
        "the replay-mode run is unknown in this stream",
        {
            "type": ProblemType.UNKNOWN_RUN,
            "title": "Unknown run",
            "status": 404,
            "detail": "no replay-mode run of this name in stream 'orders': never registered, "
            "or its dedupe TTL has passed",
            "instance": "/v1/streams/orders/runs/orders-to-kinesis/42",
            "stream": "orders",
            "run": "orders-to-kinesis/42",
        },
    ),
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "the scheme to authenticate with",
            "schema": {"type": "string", "example": 'Bearer realm="keo"'},
        }
    },
    503: {
        "Retry-After": {
            "description": "seconds to wait before trying again",
            "schema": {"type": "integer", "example": RETRY_AFTER_S},
        }
    },
}


def problem_responses(*statuses: int, unknown: str = "key") -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for the problems a route can answer with, with examples; a 404
    for an ``unknown`` key or run.

    Declared under ``application/json`` here; :func:`api.main.build_openapi` moves every
    error response to ``application/problem+json``, the media type actually sent.
    """
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, example = _NOT_FOUND[unknown] if status == 404 else _RESPONSES[status]
        response: dict[str, Any] = {
            "model": ValidationProblem if status == 422 else Problem,
            "description": description,
            "content": {"application/json": {"example": example}},
        }
        if status in _HEADERS:
            response["headers"] = _HEADERS[status]
        responses[status] = response
    return responses


def problem(
    request: Request,
    status: int,
    type_: str,
    title: str,
    detail: str | None,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": type_,
        "title": title,
        "status": status,
        "instance": request.url.path,
    }
    if detail is not None:
        body["detail"] = detail
    body.update(extensions)
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_MEDIA_TYPE)


def install_problem_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_failed)  # type: ignore[arg-type]
    app.add_exception_handler(UnauthorizedError, _unauthorized)  # type: ignore[arg-type]
    app.add_exception_handler(UnknownKeyError, _unknown_key)  # type: ignore[arg-type]
    app.add_exception_handler(UnknownRunError, _unknown_run)  # type: ignore[arg-type]
    app.add_exception_handler(LedgerError, _ledger_failed)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)


async def _validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [
        {
            "loc": [part if isinstance(part, int) else str(part) for part in error.get("loc", ())],
            # pydantic prefixes the message of a ValueError raised by a validator
            "msg": str(error.get("msg", "invalid")).removeprefix("Value error, "),
            "type": str(error.get("type", "value_error")),
        }
        for error in exc.errors()
    ]
    detail = "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in errors
    )
    return problem(
        request,
        422,
        ProblemType.VALIDATION,
        "Invalid request",
        detail or "the request is invalid",
        errors=errors,
    )


async def _unauthorized(request: Request, exc: UnauthorizedError) -> JSONResponse:
    return problem(
        request,
        401,
        ProblemType.UNAUTHORIZED,
        "Unauthorized",
        exc.reason,
        headers={"WWW-Authenticate": 'Bearer realm="keo"'},
    )


async def _unknown_key(request: Request, exc: UnknownKeyError) -> JSONResponse:
    return problem(
        request,
        404,
        ProblemType.UNKNOWN_KEY,
        "Unknown key",
        f"no delivery state for this key in stream {exc.stream!r}: never claimed, "
        "or its dedupe TTL has passed",
        stream=exc.stream,
        key=exc.key,
    )


async def _unknown_run(request: Request, exc: UnknownRunError) -> JSONResponse:
    return problem(
        request,
        404,
        ProblemType.UNKNOWN_RUN,
        "Unknown run",
        f"no replay-mode run of this name in stream {exc.stream!r}: never registered, "
        "or its dedupe TTL has passed",
        stream=exc.stream,
        run=exc.run,
    )


async def _ledger_failed(request: Request, exc: LedgerError) -> JSONResponse:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.ledger_errors.labels(error=type(exc).__name__).inc()
    retry = {"Retry-After": str(RETRY_AFTER_S)}
    if isinstance(exc, LedgerUnavailableError):
        log.warning(
            "ledger unavailable route=%s error=%s code=%s",
            _route_of(request),
            exc,
            exc.cause_response_code,
            extra=_where(request, exc),
        )
        return problem(
            request,
            503,
            ProblemType.LEDGER_UNAVAILABLE,
            "Ledger unavailable",
            "the ledger (DynamoDB) did not answer; retry later",
            headers=retry,
        )
    if isinstance(exc, LedgerSchemaError):
        log.error(
            "ledger not ready route=%s error=%s",
            _route_of(request),
            exc,
            extra=_where(request, exc),
        )
        return problem(
            request,
            503,
            ProblemType.LEDGER_NOT_READY,
            "Ledger not ready",
            str(exc),  # missing, not stamped, or of another schema version: and what to do
            headers=retry,
        )
    log.error("ledger error route=%s", _route_of(request), exc_info=exc, extra=_where(request, exc))
    return problem(request, 500, ProblemType.INTERNAL, "Internal error", None)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    status = exc.status_code
    if status == 400:
        # FastAPI's answer to a body it cannot decode: the only 400 here, and a validation
        # failure like any other
        return problem(
            request,
            422,
            ProblemType.VALIDATION,
            "Invalid request",
            "body: the body is not valid JSON text",
            errors=[
                {"loc": ["body"], "msg": "the body is not valid JSON text", "type": "json_invalid"}
            ],
        )
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail != title else None
    headers = dict(exc.headers) if exc.headers else None
    return problem(request, status, ProblemType.HTTP, title, detail, headers=headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error route=%s", _route_of(request), exc_info=exc)
    return problem(request, 500, ProblemType.INTERNAL, "Internal error", None)


def _route_of(request: Request) -> str:
    """The route template (``/v1/streams/{stream}/messages/{key:path}``): logs name routes,
    never paths, which hold message keys."""
    route = request.scope.get("route")
    template = getattr(route, "path", None)
    return template if isinstance(template, str) else "unmatched"


def _where(request: Request, exc: LedgerError) -> dict[str, str]:
    """The stream and table of a ledger failure, as fields of a JSON log line."""
    fields = {"table": exc.table} if exc.table else {}
    stream = request.path_params.get("stream")
    return {**fields, "stream": stream} if isinstance(stream, str) else fields
