"""Which AWS operations the code performs, by role: a recorder on every botocore client.

Every client the code makes goes through ``botocore.session.Session.create_client``: boto3's
(producer.wiring, the API) and pynamodb's (the ledger's model). :class:`AwsCallRecorder`
wraps that method while installed and registers a ``before-parameter-build`` handler on each
new client, so every API call (once per call, whatever the SDK's retries) is recorded under the
role the test is acting as::

    recorder = AwsCallRecorder()
    with recorder.installed(), recorder.acting_as("producer"):
        ...  # run `keo send`
    recorder.calls["producer"]  # {AwsCall("dynamodb:UpdateItem", "table"), ...}

The IAM action of an operation is ``<signing name>:<operation>`` (kinesis:PutRecords,
dynamodb:UpdateItem): Kinesis and DynamoDB name their actions after their operations, but for
PartiQL, whose actions are per statement (a batch of INSERTs: dynamodb:PartiQLInsert). The
resource is what the call targets, as a placeholder ARN of ``docs/iam-policy.json``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import botocore.session

STREAM_ARN = "arn:aws:kinesis:${Region}:${Account}:stream/${Stream}"
TABLE_ARN = "arn:aws:dynamodb:${Region}:${Account}:table/${Table}"


def index_arn(index: str) -> str:
    return f"{TABLE_ARN}/index/{index}"


@dataclass(frozen=True, order=True)
class AwsCall:
    """An IAM action on a resource (a placeholder ARN)."""

    action: str
    resource: str


def resource_of(service: str, params: dict[str, Any]) -> str:
    """The placeholder ARN a call acts on: Kinesis calls act on the stream (GetRecords names
    only its iterator, and IAM still checks it against the stream); DynamoDB calls on the
    table, or on its index when they name one."""
    if service == "kinesis":
        return STREAM_ARN
    index = params.get("IndexName")
    return index_arn(index) if index else TABLE_ARN


_PARTIQL = frozenset({"ExecuteStatement", "BatchExecuteStatement"})


def partiql_actions(params: dict[str, Any]) -> set[str]:
    """A PartiQL call's IAM actions: one per statement, named after its verb
    (``INSERT ...`` -> dynamodb:PartiQLInsert), on the table it names."""
    statements = params.get("Statements") or [params]
    return {
        f"dynamodb:PartiQL{str(s['Statement']).split(maxsplit=1)[0].capitalize()}"
        for s in statements
    }


class AwsCallRecorder:
    """Records the AWS calls of every client created while installed, by role. Thread-safe:
    the producer and the reconciler call DynamoDB from worker threads."""

    def __init__(self) -> None:
        self.calls: dict[str, set[AwsCall]] = defaultdict(set)
        self._role: str | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def installed(self) -> Iterator[AwsCallRecorder]:
        original = botocore.session.Session.create_client
        recorder = self

        def create_client(session: botocore.session.Session, *args: Any, **kwargs: Any) -> Any:
            client = original(session, *args, **kwargs)
            client.meta.events.register("before-parameter-build", recorder._on_call)
            return client

        botocore.session.Session.create_client = create_client  # type: ignore[method-assign]
        try:
            yield self
        finally:
            botocore.session.Session.create_client = original  # type: ignore[method-assign]

    @contextlib.contextmanager
    def acting_as(self, role: str) -> Iterator[None]:
        """Calls made inside are ``role``'s; calls made outside any role are not recorded."""
        self._role = role
        try:
            yield
        finally:
            self._role = None

    def _on_call(self, model: Any, params: dict[str, Any], **_: Any) -> None:
        role = self._role
        if role is None:
            return
        service = model.service_model.signing_name
        if model.name in _PARTIQL:
            calls = {AwsCall(a, TABLE_ARN) for a in partiql_actions(params)}
        else:
            calls = {AwsCall(f"{service}:{model.name}", resource_of(service, params))}
        with self._lock:
            self.calls[role].update(calls)
