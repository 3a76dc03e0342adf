"""``/healthz``, ``/readyz`` and ``/metrics``: for orchestrators and scrapers, without a token."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from api.deps import LedgerDep
from api.metrics import ApiMetrics
from api.problems import problem_responses
from api.schemas import Health, Readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", operation_id="healthz", summary="The process is up")
def healthz() -> Health:
    """Answers as long as the process serves HTTP; it does not ask the ledger."""
    return Health()


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="The ledger answers",
    responses=problem_responses(503),
)
def readyz(ledger: LedgerDep) -> Readiness:
    """Asks DynamoDB for the ledger table; 503 while it is unreachable or missing."""
    ledger.ensure_ready()
    return Readiness(table=ledger.table_name)


@router.get(
    "/metrics",
    operation_id="metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "description": "metrics in the Prometheus text exposition format",
            "content": {
                "text/plain": {
                    "schema": {"type": "string"},
                    "example": 'keo_api_requests_total{method="GET",route="/healthz",status="200"} 3.0\n',
                }
            },
        }
    },
)
def metrics(request: Request) -> Response:
    registry_owner: ApiMetrics = request.app.state.metrics
    return Response(generate_latest(registry_owner.registry), media_type=CONTENT_TYPE_LATEST)
