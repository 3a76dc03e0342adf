"""In-process fault injection: the failures Kinesis and DynamoDB have and the emulators never do.

A :class:`FaultInjector` hooks one botocore client (the writer's Kinesis client, the ledger's
DynamoDB client: ``DynamoDBLedger.client``) through its event system, and fires faults on a
schedule: "the next N calls", or each call with a probability drawn from a seeded
``random.Random``. Tests use it to prove the protocol; the demo can use it to show the protocol
surviving a bad day. Where each fault acts on one API call's way through botocore::

    before-parameter-build   partial_throttle, partial_internal_failure: the chosen records are
                             dropped from the request, so they are truly never written
    before-call              ... and when every record was chosen, answer locally (no request)
    before-send              timeout_before_send, server_error_before_write, throttle,
      (every HTTP attempt)   rejected, unavailable: the request never reaches the server;
                             SDK retries, where the client has them, meet the schedule again;
                             response_lost_in_transit: the request is sent and applied, then
                             the read times out inside the HTTP layer, where the SDK's retry
                             policy sees it (and resends the same request, where it retries)
    after-call               lost_response, server_error_after_write: the server applied the
      (once, after retries)  request (2xx), the caller sees a timeout or a 500 instead;
                             partial_*: per-record errors go back at their original positions

Only the JSON protocol is supported (Kinesis and DynamoDB both use it). State that one call
carries from hook to hook lives in botocore's request context, a dict per call, so calls made
from many threads at once (the producer's ledger pool) never see each other's faults. The
schedule itself (counts left, the random draws) is shared and guarded by a lock.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import botocore.exceptions
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders

__all__ = ["Fault", "FaultInjector", "FaultKind", "UpdateTarget"]

_CONTEXT_KEY: Final = "keo_faults"
_THROUGHPUT_EXCEEDED: Final = "ProvisionedThroughputExceededException"
_ACCESS_DENIED: Final = "AccessDeniedException"
_INTERNAL_FAILURE: Final = "InternalFailure"
_PUT_RECORDS: Final = "PutRecords"
_UPDATE_ITEM: Final = "UpdateItem"
_injector_ids = itertools.count(1)


class FaultKind(StrEnum):
    LOST_RESPONSE = "lost_response"  # applied, then a read timeout (after SDK retries)
    RESPONSE_LOST_IN_TRANSIT = "response_lost_in_transit"  # applied, a timeout the SDK retries
    TIMEOUT_BEFORE_SEND = "timeout_before_send"  # not applied, a read timeout
    SERVER_ERROR_AFTER_WRITE = "server_error_after_write"  # applied, then a 500
    SERVER_ERROR_BEFORE_WRITE = "server_error_before_write"  # not applied, a 500
    PARTIAL_THROTTLE = "partial_throttle"  # PutRecords: some records throttled, not written
    PARTIAL_INTERNAL_FAILURE = "partial_internal_failure"  # ... InternalFailure, not written
    THROTTLE = "throttle"  # not applied, a 400 ProvisionedThroughputExceededException
    REJECTED = "rejected"  # not applied, a 400 AccessDeniedException (or the code given)
    UNAVAILABLE = "unavailable"  # not applied, the endpoint cannot be reached


class UpdateTarget(StrEnum):
    """Which ledger writes an UpdateItem fault hits, told apart by the request itself."""

    ANY = "any"
    CLAIM = "claim"  # the attempt counter is set with if_not_exists
    MARK = "mark"  # the write that records positions: a claim group's record or settle


_PARTIAL_KINDS: Final = {
    FaultKind.PARTIAL_THROTTLE: _THROUGHPUT_EXCEEDED,
    FaultKind.PARTIAL_INTERNAL_FAILURE: _INTERNAL_FAILURE,
}
_BEFORE_SEND_KINDS: Final = frozenset(
    {
        FaultKind.TIMEOUT_BEFORE_SEND,
        FaultKind.SERVER_ERROR_BEFORE_WRITE,
        FaultKind.THROTTLE,
        FaultKind.REJECTED,
        FaultKind.UNAVAILABLE,
        FaultKind.RESPONSE_LOST_IN_TRANSIT,
    }
)
_AFTER_CALL_KINDS: Final = frozenset({FaultKind.LOST_RESPONSE, FaultKind.SERVER_ERROR_AFTER_WRITE})


@dataclass(slots=True)
class Fault:
    """One scheduled fault. ``remaining`` counts down when set; else ``probability`` decides."""

    kind: FaultKind
    operations: frozenset[str]
    probability: float
    remaining: int | None
    target: UpdateTarget = UpdateTarget.ANY
    records: frozenset[int] | None = None  # partial faults: these positions of the request
    record_probability: float = 0.0  # partial faults: else each record with this chance
    error_code: str | None = None
    injected: int = 0  # how often it fired (calls; HTTP attempts for before-send faults)

    def matches(self, call: _Call) -> bool:
        if call.operation not in self.operations:
            return False
        if self.target is UpdateTarget.ANY:
            return True
        return call.operation == _UPDATE_ITEM and call.target is self.target


@dataclass(slots=True)
class _Call:
    """What one API call carries from hook to hook, in its request context."""

    operation: str
    target: UpdateTarget | None = None  # UpdateItem only: claim, mark, or neither (None)
    # partial faults: original position -> (error code, fault kind); the rest were sent
    failed: dict[int, tuple[str, FaultKind]] = field(default_factory=dict)
    sent_positions: list[int] = field(default_factory=list)
    answered_locally: bool = False


class _Body:
    """The ``raw`` of a fake AWSResponse: botocore reads ``content`` through ``stream()``."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._data


class FaultInjector:
    """Faults on one botocore client, on a seeded schedule; ``detach()`` removes every hook.

    ::

        with FaultInjector(stack.writer._client, seed=7) as faults:
            faults.lost_response(count=1)              # the next PutRecords: written, timed out
            faults.partial_throttle(probability=0.2, record_probability=0.1)
            outcomes = producer.send(messages)
        faults.injected                                # Counter: kind -> calls hit
    """

    def __init__(self, client: Any, *, seed: int | None = 0) -> None:
        service_model = client.meta.service_model
        if service_model.protocol != "json":
            raise ValueError(
                f"fault injection supports JSON-protocol services, not "
                f"{service_model.service_name} ({service_model.protocol})"
            )
        self._client = client
        self._service_id: str = service_model.service_id.hyphenize()
        self._operation_names = frozenset(service_model.operation_names)
        self._endpoint_url: str = client.meta.endpoint_url
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._injected: Counter[str] = Counter()
        self._failed_records: Counter[str] = Counter()
        self._unique = f"keo-faults-{next(_injector_ids)}"
        self._hooks = (
            (f"before-parameter-build.{self._service_id}", self._before_parameter_build),
            (f"before-call.{self._service_id}", self._before_call),
            (f"before-send.{self._service_id}", self._before_send),
            (f"after-call.{self._service_id}", self._after_call),
        )
        for event, handler in self._hooks:
            client.meta.events.register(event, handler, unique_id=f"{self._unique}-{event}")
        self._attached = True

    def __enter__(self) -> FaultInjector:
        return self

    def __exit__(self, *_: object) -> None:
        self.detach()

    def detach(self) -> None:
        """Remove every hook; calls already past a hook finish as scheduled."""
        if not self._attached:
            return
        for event, handler in self._hooks:
            self._client.meta.events.unregister(event, handler, unique_id=f"{self._unique}-{event}")
        self._attached = False

    # --- counters ---------------------------------------------------------------------------

    @property
    def injected(self) -> Counter[str]:
        """Faults fired per kind: calls (HTTP attempts for the before-send kinds)."""
        with self._lock:
            return Counter(self._injected)

    @property
    def failed_records(self) -> Counter[str]:
        """Records failed per partial kind (a partial fault fires once per call, on many records)."""
        with self._lock:
            return Counter(self._failed_records)

    def clear(self) -> None:
        """Cancel every scheduled fault (counters are kept)."""
        with self._lock:
            self._faults.clear()

    # --- scheduling -------------------------------------------------------------------------

    def lost_response(self, *, operations: Iterable[str] = (_PUT_RECORDS,), **when: Any) -> Fault:
        """The server applies the request; the caller gets a ReadTimeoutError instead of the answer."""
        return self.add(FaultKind.LOST_RESPONSE, operations=operations, **when)

    def timeout_before_send(
        self, *, operations: Iterable[str] = (_PUT_RECORDS,), **when: Any
    ) -> Fault:
        """A ReadTimeoutError before the request leaves: nothing applied, ambiguous to the caller."""
        return self.add(FaultKind.TIMEOUT_BEFORE_SEND, operations=operations, **when)

    def response_lost_in_transit(
        self, *, operations: Iterable[str] = (_PUT_RECORDS,), **when: Any
    ) -> Fault:
        """The request is applied; the response is lost on the wire (a read timeout inside the
        HTTP layer), so a client with SDK retries sends the same request again."""
        return self.add(FaultKind.RESPONSE_LOST_IN_TRANSIT, operations=operations, **when)

    def server_error_after_write(
        self, *, operations: Iterable[str] = (_PUT_RECORDS,), **when: Any
    ) -> Fault:
        """The server applies the request; the caller gets HTTP 500 (InternalFailure by default)."""
        return self.add(FaultKind.SERVER_ERROR_AFTER_WRITE, operations=operations, **when)

    def server_error_before_write(
        self, *, operations: Iterable[str] = (_PUT_RECORDS,), **when: Any
    ) -> Fault:
        """HTTP 500 answered before the request reaches the server: nothing applied."""
        return self.add(FaultKind.SERVER_ERROR_BEFORE_WRITE, operations=operations, **when)

    def partial_throttle(self, **when: Any) -> Fault:
        """PutRecords: chosen records get ProvisionedThroughputExceededException, not written."""
        return self.add(FaultKind.PARTIAL_THROTTLE, operations=(_PUT_RECORDS,), **when)

    def partial_internal_failure(self, **when: Any) -> Fault:
        """PutRecords: chosen records get InternalFailure, not written."""
        return self.add(FaultKind.PARTIAL_INTERNAL_FAILURE, operations=(_PUT_RECORDS,), **when)

    def throttle(self, *, operations: Iterable[str] = (_UPDATE_ITEM,), **when: Any) -> Fault:
        """HTTP 400 ProvisionedThroughputExceededException before the request is applied."""
        return self.add(FaultKind.THROTTLE, operations=operations, **when)

    def rejected(self, *, operations: Iterable[str], **when: Any) -> Fault:
        """HTTP 400 AccessDeniedException (or ``error_code``): nothing applied, not retriable."""
        return self.add(FaultKind.REJECTED, operations=operations, **when)

    def unavailable(self, *, operations: Iterable[str] = (_UPDATE_ITEM,), **when: Any) -> Fault:
        """EndpointConnectionError: the request never leaves."""
        return self.add(FaultKind.UNAVAILABLE, operations=operations, **when)

    def add(
        self,
        kind: FaultKind,
        *,
        operations: Iterable[str],
        count: int | None = None,
        probability: float | None = None,
        target: UpdateTarget = UpdateTarget.ANY,
        records: Iterable[int] | None = None,
        record_probability: float | None = None,
        error_code: str | None = None,
    ) -> Fault:
        """Schedule ``kind`` on ``operations`` for the next ``count`` calls, or each call with
        ``probability``. Partial faults fail the request positions ``records``, or each record
        with ``record_probability`` (all of them when neither is given)."""
        ops = frozenset(operations)
        unknown = ops - self._operation_names
        if not ops or unknown:
            raise ValueError(f"unknown operations for {self._service_id}: {sorted(unknown)}")
        if (count is None) == (probability is None):
            raise ValueError("give exactly one of count (the next N calls) and probability")
        if count is not None and count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        if probability is not None and not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be in [0, 1], got {probability}")
        if kind in _PARTIAL_KINDS:
            if ops != {_PUT_RECORDS}:
                raise ValueError(f"{kind} applies to PutRecords only")
            if records is not None and record_probability is not None:
                raise ValueError("give at most one of records and record_probability")
        elif records is not None or record_probability is not None:
            raise ValueError(f"records and record_probability apply to partial faults, not {kind}")
        if record_probability is not None and not 0.0 <= record_probability <= 1.0:
            raise ValueError(f"record_probability must be in [0, 1], got {record_probability}")
        if target is not UpdateTarget.ANY and ops != {_UPDATE_ITEM}:
            raise ValueError("target (claim or mark) applies to UpdateItem only")
        fault = Fault(
            kind=kind,
            operations=ops,
            probability=probability if probability is not None else 0.0,
            remaining=count,
            target=target,
            records=frozenset(records) if records is not None else None,
            record_probability=record_probability if record_probability is not None else 1.0,
            error_code=error_code,
        )
        with self._lock:
            self._faults.append(fault)
        return fault

    def _fire(self, call: _Call, kinds: frozenset[FaultKind]) -> Fault | None:
        """The first scheduled fault of ``kinds`` that fires on ``call`` (consuming its turn)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind not in kinds or not fault.matches(call):
                    continue
                if fault.remaining is not None:
                    if fault.remaining <= 0:
                        continue
                    fault.remaining -= 1
                elif self._rng.random() >= fault.probability:
                    continue
                fault.injected += 1
                self._injected[fault.kind.value] += 1
                return fault
        return None

    # --- hooks ------------------------------------------------------------------------------

    def _before_parameter_build(
        self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        call = _Call(model.name)
        if call.operation == _UPDATE_ITEM:
            call.target = _update_target(params)
        context[_CONTEXT_KEY] = call
        if call.operation != _PUT_RECORDS:
            return
        records = params.get("Records")
        if not isinstance(records, list) or not records:
            return
        for kind, code in _PARTIAL_KINDS.items():
            fault = self._fire(call, frozenset({kind}))
            if fault is None:
                continue
            for position in self._choose_records(fault, len(records)):
                call.failed.setdefault(position, (fault.error_code or code, kind))
        if not call.failed:
            return
        with self._lock:
            self._failed_records.update(kind.value for _, kind in call.failed.values())
        call.sent_positions = [i for i in range(len(records)) if i not in call.failed]
        if call.sent_positions:
            # a new list: the caller's own list of records is left as it was
            params["Records"] = [records[i] for i in call.sent_positions]
        else:
            call.answered_locally = True  # PutRecords needs one record at least: see before-call

    def _choose_records(self, fault: Fault, count: int) -> list[int]:
        if fault.records is not None:
            return sorted(i for i in fault.records if 0 <= i < count)
        with self._lock:
            return [i for i in range(count) if self._rng.random() < fault.record_probability]

    def _before_call(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, Any] | None:
        call = context.get(_CONTEXT_KEY)
        if not isinstance(call, _Call) or not call.answered_locally:
            return None
        # every record failed: nothing is sent, after-call writes the per-record errors
        http = AWSResponse(self._endpoint_url, 200, HTTPHeaders(), _Body(b"{}"))
        parsed = {
            "FailedRecordCount": 0,
            "Records": [],
            "ResponseMetadata": {"HTTPStatusCode": 200, "HTTPHeaders": {}, "RetryAttempts": 0},
        }
        return http, parsed

    def _before_send(self, request: Any, **_: Any) -> AWSResponse | None:
        call = getattr(request, "context", {}).get(_CONTEXT_KEY)
        if not isinstance(call, _Call):
            return None
        fault = self._fire(call, _BEFORE_SEND_KINDS)
        if fault is None:
            return None
        url = str(request.url)
        if fault.kind is FaultKind.TIMEOUT_BEFORE_SEND:
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=url)
        if fault.kind is FaultKind.UNAVAILABLE:
            raise botocore.exceptions.EndpointConnectionError(endpoint_url=url)
        if fault.kind is FaultKind.RESPONSE_LOST_IN_TRANSIT:
            # the same HTTP session botocore would use: the server applies the request
            self._client._endpoint.http_session.send(request)
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=url)
        if fault.kind is FaultKind.THROTTLE:
            code = fault.error_code or _THROUGHPUT_EXCEEDED
            return _error_response(url, 400, code, "Rate exceeded (injected)")
        if fault.kind is FaultKind.REJECTED:
            code = fault.error_code or _ACCESS_DENIED
            return _error_response(url, 400, code, "Request rejected (injected)")
        code = fault.error_code or _INTERNAL_FAILURE
        return _error_response(url, 500, code, "Internal failure (injected, not applied)")

    def _after_call(
        self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> None:
        call = context.get(_CONTEXT_KEY)
        if not isinstance(call, _Call) or http_response.status_code >= 300:
            return
        if call.failed:
            _reinsert_failures(call, parsed)
        fault = self._fire(call, _AFTER_CALL_KINDS)
        if fault is None:
            return
        if fault.kind is FaultKind.LOST_RESPONSE:
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=self._endpoint_url)
        code = fault.error_code or _INTERNAL_FAILURE
        response: dict[str, Any] = {
            "Error": {"Code": code, "Message": "Internal failure (injected after the write)"},
            "ResponseMetadata": {"HTTPStatusCode": 500, "HTTPHeaders": {}, "RetryAttempts": 0},
        }
        raise self._client.exceptions.from_code(code)(response, call.operation)


def _update_target(params: dict[str, Any]) -> UpdateTarget | None:
    update = str(params.get("UpdateExpression") or "")
    if "#positions" in update:
        return UpdateTarget.MARK
    if "if_not_exists" in update:
        return UpdateTarget.CLAIM
    return None


def _reinsert_failures(call: _Call, parsed: dict[str, Any]) -> None:
    """Put the dropped records' errors back where they were, so results align with the request."""
    results = parsed.get("Records")
    if not isinstance(results, list) or len(results) != len(call.sent_positions):
        return  # not a response to the request we sent: leave it for the caller to distrust
    by_position = dict(zip(call.sent_positions, results, strict=True))
    total = len(call.sent_positions) + len(call.failed)
    merged: list[dict[str, Any]] = []
    for position in range(total):
        if position in call.failed:
            code, _ = call.failed[position]
            merged.append({"ErrorCode": code, "ErrorMessage": f"{code} (injected, not written)"})
        else:
            merged.append(by_position[position])
    parsed["Records"] = merged
    parsed["FailedRecordCount"] = sum(1 for entry in merged if entry.get("ErrorCode"))


def _error_response(url: str, status: int, code: str, message: str) -> AWSResponse:
    body = json.dumps({"__type": code, "message": message}).encode()
    headers = HTTPHeaders.from_dict(
        {
            "Content-Type": "application/x-amz-json-1.1",
            "Content-Length": str(len(body)),
            "x-amzn-RequestId": "keo-injected-fault",
        }
    )
    return AWSResponse(url, status, headers, _Body(body))
