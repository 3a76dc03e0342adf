"""Prometheus metrics of the API, in a registry of its own per app (tests build many apps).

Requests are labelled by route template (``/v1/streams/{stream}/messages/{key:path}``), never
by the concrete path: keys would make the label set unbounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_UNMATCHED = "unmatched"


@dataclass(frozen=True, slots=True)
class ApiMetrics:
    registry: CollectorRegistry
    requests: Counter
    duration_s: Histogram
    ledger_errors: Counter

    @classmethod
    def create(cls) -> ApiMetrics:
        registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        return cls(
            registry=registry,
            requests=Counter(
                "keo_api_requests",
                "HTTP requests answered, by route template and status",
                ["method", "route", "status"],
                registry=registry,
            ),
            duration_s=Histogram(
                "keo_api_request_duration_seconds",
                "time to answer a request, by route template",
                ["method", "route"],
                registry=registry,
            ),
            ledger_errors=Counter(
                "keo_api_ledger_errors",
                "ledger calls that failed, by error",
                ["error"],
                registry=registry,
            ),
        )


class MetricsMiddleware:
    """Counts and times every HTTP request (pure ASGI: no buffering of the body)."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees if the app raises before answering

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            # the router stores the matched route in the scope it was handed
            route = scope.get("route")
            template = (
                route.path if isinstance(route, BaseRoute) and hasattr(route, "path") else None
            )
            label = template if isinstance(template, str) else _UNMATCHED
            method = str(scope.get("method", ""))
            self.metrics.requests.labels(method=method, route=label, status=str(status)).inc()
            self.metrics.duration_s.labels(method=method, route=label).observe(
                time.perf_counter() - started
            )
