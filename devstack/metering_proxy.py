"""``MeteringProxy``: DynamoDB on 127.0.0.1 behind a proxy that bills every call through it.

:class:`devstack.cost_meter.BillingMeter` watches one botocore client's events, in one
process; Spark's executors and the driver's commit are other processes. Pointed at this proxy
(their ``dynamodb_endpoint_url``), they reach the emulator through it, and the proxy hands
the meter each exchange as the events botocore emits around a call::

    any process ──POST──> MeteringProxy ──forward──> dynalite
                             │ the request's JSON: the call's parameters (binary values stay
                             │   base64 text, which the billing model reads as their bytes)
                             │ the answer, parsed by botocore's own JSON parser (modeled
                             │   error fields too: a failed condition's ``Item``)
                             └─> before-parameter-build / after-call(-error).dynamodb.<Op>
                                 on a client that never sends: the meter's hooks

Each attempt a client makes is a call here (SDK retries are billed one by one, as AWS bills
them). The meter's ``read_item`` (the new image after an UpdateItem that did not return it:
the producer's claims ask only for the old values) runs before the answer leaves, as it does
in-process, so no write of the caller's comes in between. It is a consistent GetItem sent on
the proxy's own connection with the headers of the call being priced: the emulators check no
signature, and a botocore client's GetItem would cost the proxy more CPU than the claim it
prices. It does not pass through the meter: never billed.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from typing import Any

import botocore.session
from botocore.model import OperationModel, OperationNotFoundError
from botocore.parsers import create_parser

from dedupe_store.billing import Item
from dedupe_store.errors import aws_error_code
from devstack.cost_meter import BillingMeter, ledger_table_spec
from devstack.fault_proxy import FaultProxy

__all__ = ["MeteringProxy"]

log = logging.getLogger(__name__)

_SERVICE = "dynamodb"
_TARGET = "x-amz-target"
_GET_ITEM = "DynamoDB_20120810.GetItem"
_IDLE_S = 2.0  # a connection idle longer is not used again


class MeteringProxy(FaultProxy):
    """``with MeteringProxy(dynamodb_url, table) as proxy: use proxy.endpoint``; every call
    that reaches the emulator through it is billed in ``proxy.meter``, ``table`` by the
    ledger's schema."""

    def __init__(self, upstream: str, table: str, *, region: str = "us-east-1") -> None:
        super().__init__(upstream)
        # a client that never sends: its model names the operations, its events feed the meter
        self._client = botocore.session.get_session().create_client(
            _SERVICE,
            region_name=region,
            endpoint_url=upstream,
            aws_access_key_id="metering-proxy",
            aws_secret_access_key="metering-proxy",  # noqa: S106 - never sent anywhere
        )
        self._parser = create_parser(self._client.meta.service_model.resolved_protocol)
        # each handler thread's connection to the emulator, and the call it is forwarding
        self._local = threading.local()
        self.meter = BillingMeter({table: ledger_table_spec()}, read_item=self._read_item)
        self.meter.attach(self._client)

    def __enter__(self) -> MeteringProxy:
        self.start()
        return self

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        operation = self._operation_of(headers)
        events = self._client.meta.events
        context: dict[str, Any] = {}
        self._local.call = path, headers
        if operation is not None:
            events.emit(
                f"before-parameter-build.{_SERVICE}.{operation.name}",
                params=json.loads(body or b"{}"),
                model=operation,
                context=context,
            )
        try:
            status, answer_headers, answer = self._exchange(method, path, headers, body)
        except OSError:
            if operation is not None:
                events.emit(f"after-call-error.{_SERVICE}.{operation.name}", context=context)
            raise
        if operation is not None:
            events.emit(
                f"after-call.{_SERVICE}.{operation.name}",
                http_response=None,
                parsed=self._parse(operation, status, answer_headers, answer),
                model=operation,
                context=context,
            )
        return status, answer_headers, answer

    def _read_item(self, table: str, key: Any) -> Item | None:
        """The item's image now (the meter asks after an UpdateItem that did not return it),
        read on this thread's connection with the headers of the call it follows."""
        path, headers = self._local.call
        get = {name: value for name, value in headers.items() if name.lower() != _TARGET}
        get["X-Amz-Target"] = _GET_ITEM
        body = json.dumps({"TableName": table, "Key": key, "ConsistentRead": True}).encode()
        status, _, answer = self._exchange("POST", path, get, body)
        if status != http.client.OK:
            return None  # the meter prices a lower bound, and says so (inexact)
        item: Item | None = json.loads(answer).get("Item")
        return item

    def _exchange(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """One exchange on this thread's connection to the emulator, kept open between calls
        (a connection per call doubles what a claim costs); a fresh one once it has been idle
        long enough that the emulator may be closing it (Node's keep-alive timeout: 5 s)."""
        held: tuple[http.client.HTTPConnection, float] | None = getattr(
            self._local, "connection", None
        )
        now = time.monotonic()
        if held is not None and now - held[1] > _IDLE_S:
            held[0].close()
            held = None
        connection = (
            held[0]
            if held is not None
            else http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        )
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.status, dict(response.getheaders()), response.read()
        except OSError:
            connection.close()
            self._local.connection = None
            raise
        self._local.connection = (connection, time.monotonic())
        return answer

    def _parse(
        self, operation: OperationModel, status: int, headers: dict[str, str], body: bytes
    ) -> Any:
        """The answer as botocore's client sees it (``botocore.endpoint`` does the same)."""
        response = {
            "status_code": status,
            "headers": {name.lower(): value for name, value in headers.items()},
            "body": body,
        }
        output = operation.output_shape  # every DynamoDB operation has one
        parsed: dict[str, Any] = self._parser.parse(response, output) if output else {}
        code = aws_error_code(parsed)
        # botocore-stubs types the code an int; botocore looks its shapes up by the code's name
        shape = operation.service_model.shape_for_error_code(code) if code else None  # type: ignore[arg-type]
        if shape is not None:
            parsed.update(self._parser.parse(response, shape))
        return parsed

    def _operation_of(self, headers: dict[str, str]) -> OperationModel | None:
        """The operation ``X-Amz-Target`` names (``DynamoDB_20120810.UpdateItem``)."""
        target = next((v for k, v in headers.items() if k.lower() == _TARGET), "")
        name = target.rpartition(".")[2]
        try:
            return self._client.meta.service_model.operation_model(name) if name else None
        except OperationNotFoundError:
            log.debug("metering proxy: not a DynamoDB operation target=%s", target)
            return None
