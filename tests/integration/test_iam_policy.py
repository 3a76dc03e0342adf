"""``docs/iam-policy.json`` grants each role exactly the AWS calls its commands make.

One statement per role (``Sid``): the producer (``keo send``, the Spark sink), the reconciler,
the audit, the API (``keo serve``) and ``keo init``. The test drives each role's work once
against the emulators, records every AWS operation the code performs (``aws_calls``: a
handler on every botocore client the code creates) and checks both ways:

- every call a role made is allowed by its statement: action *and* resource;
- every action and resource a statement grants was used by its role (least privilege).

What the code calls but a role is not given stays out on purpose, and is said so in the README
(for example, a writer stamps an unstamped table, which needs a Scan: ``keo init`` does it).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import planting
import pytest
import stacks
import streamcheck
import typer
from aws_calls import STREAM_ARN, TABLE_ARN, AwsCall, AwsCallRecorder, index_arn

from api import ApiSettings, create_app
from cli.audit import audit
from cli.init import init
from cli.reconcile import reconcile
from cli.send import send
from dedupe_store.clock import SkewedClock, SystemClock
from dedupe_store.table import INFLIGHT_INDEX_NAME
from devstack import emulators as local_stack
from devstack.faults import FaultInjector
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack

if TYPE_CHECKING:
    from conftest import Names

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "docs" / "iam-policy.json"
ROLES = {
    "KeoProducer": "producer",
    "KeoReconciler": "reconciler",
    "KeoAudit": "audit",
    "KeoApi": "api",
    "KeoInit": "init",
}
TOKEN = "iam-test-token-0123456789"
PLANTED_LEASE_MS = 15_000
LATER_MS = 30_000  # the in-process reconciler's clock: every planted lease has expired


def load_policy() -> dict[str, list[dict[str, Any]]]:
    """``{role: [statement, ...]}`` from the policy document."""
    document = json.loads(POLICY.read_text(encoding="utf-8"))
    assert document["Version"] == "2012-10-17"
    by_role: dict[str, list[dict[str, Any]]] = {}
    for statement in document["Statement"]:
        by_role.setdefault(ROLES[statement["Sid"]], []).append(statement)
    return by_role


def granted(statement: dict[str, Any]) -> tuple[set[str], set[str]]:
    actions, resources = statement["Action"], statement["Resource"]
    return (
        {actions} if isinstance(actions, str) else set(actions),
        {resources} if isinstance(resources, str) else set(resources),
    )


def allows(statements: list[dict[str, Any]], call: AwsCall) -> bool:
    for statement in statements:
        actions, resources = granted(statement)
        if statement["Effect"] == "Allow" and call.action in actions and call.resource in resources:
            return True
    return False


def test_the_policy_is_one_scoped_statement_per_role() -> None:
    # GIVEN the policy document
    document = json.loads(POLICY.read_text(encoding="utf-8"))
    statements = document["Statement"]
    # THEN it has one statement per role, no wildcard, and only the stream, table and index
    assert sorted(s["Sid"] for s in statements) == sorted(ROLES)
    placeholders = {STREAM_ARN, TABLE_ARN, index_arn(INFLIGHT_INDEX_NAME)}
    for statement in statements:
        actions, resources = granted(statement)
        assert statement["Effect"] == "Allow"
        assert not any("*" in action for action in actions), statement["Sid"]
        assert resources <= placeholders, statement["Sid"]
        assert all(action.split(":")[0] in {"kinesis", "dynamodb"} for action in actions)


def test_every_role_is_granted_exactly_the_calls_its_commands_make(
    emulators: local_stack.Endpoints,
    kinesis_local_endpoint: str,
    names: Names,
    keo_env: dict[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN every botocore client the code creates is watched
    recorder = AwsCallRecorder()
    with recorder.installed():
        # WHEN each role does its work once: keo init (on kinesis-local too), keo send (with a duplicate, a conflict
        # and an ambiguous put read back), the reconciler over stale groups (found, resent,
        # released), keo audit, and every route of the API
        run_every_role(recorder, emulators, kinesis_local_endpoint, names, tmp_path)
    capsys.readouterr()
    # THEN every call is allowed to its role, and every grant was used by its role
    policy = load_policy()
    assert set(recorder.calls) == set(ROLES.values())
    for role, calls in sorted(recorder.calls.items()):
        denied = sorted(call for call in calls if not allows(policy[role], call))
        assert denied == [], f"{role} made calls docs/iam-policy.json does not allow it"
        for statement in policy[role]:
            actions, resources = granted(statement)
            assert actions - {c.action for c in calls} == set(), f"{role}: actions never used"
            assert resources - {c.resource for c in calls} == set(), f"{role}: unused resources"


# --- each role's work ------------------------------------------------------------------------


def run_every_role(
    recorder: AwsCallRecorder,
    emulators: local_stack.Endpoints,
    kinesis_local: str,
    names: Names,
    tmp_path: Path,
) -> None:
    where = {"stream": names.stream, "table": names.table}
    settings = stacks.settings_for(emulators, names, stacks.FAST)
    made_elsewhere = stacks.settings_for(emulators, names, stacks.FAST, table=f"{names.prefix}-iac")
    stacks.create_table(made_elsewhere)  # as infrastructure as code leaves it: no schema stamp
    with recorder.acting_as("init"):
        init(**where, shards=2, timeout_s=60.0)  # creates both
        init(stream=names.stream, table=made_elsewhere.table, timeout_s=60.0)  # stamps it
        init(  # kinesis-local: on demand, retention, KMS (kinesalite has none of them)
            stream=f"{names.prefix}-on-demand",
            table=names.table,
            on_demand=True,
            retention_hours=48,
            kms_key="alias/aws/kinesis",
            kinesis_endpoint_url=kinesis_local,
            timeout_s=60.0,
        )

    source = tmp_path / "input.jsonl"
    source.write_text(
        "".join(json.dumps({"key": f"k{i}", "data": f"d{i}"}) + "\n" for i in range(5))
    )
    clash = tmp_path / "clash.jsonl"
    clash.write_text(json.dumps({"key": "k0", "data": "other data"}) + "\n")
    with recorder.acting_as("producer"):
        send(input_path=str(source), **where, progress=False)  # SENT
        send(input_path=str(source), **where, progress=False)  # DUPLICATE
        exits_with(1, lambda: send(input_path=str(clash), **where, progress=False))  # CONFLICT
        stack = build_stack(settings)
        with FaultInjector(stack.writer.client, seed=1) as faults, stack.producer() as producer:
            faults.lost_response(count=1)
            producer.send([Message("ambiguous", b"read back")])  # found by read-back

    plant_stale_groups(emulators, settings, stack)
    with recorder.acting_as("reconciler"):
        later = build_stack(settings, clock=SkewedClock(SystemClock(), LATER_MS))
        report = later.reconciler(owner="iam-test-reconciler").run_once()
        assert (report.delivered, report.resent, report.released) == (1, 1, 1), report
        reconcile(**where, once=True, progress=False)

    with recorder.acting_as("audit"):
        audit(**where, progress=False)  # clean: the released key was never delivered

    with recorder.acting_as("api"):
        drive_the_api(emulators, names)


def plant_stale_groups(
    emulators: local_stack.Endpoints, settings: ProducerSettings, stack: Stack
) -> None:
    """Three groups a crashed producer left OPEN: one whose put landed, one that stored its
    payload (the reconciler resends it), one that did not (the reconciler releases it)."""
    now_ms = SystemClock().now_ms()
    lease = {"owner": "crashed", "now_ms": now_ms, "lease_ms": PLANTED_LEASE_MS}
    landed = Message("landed", b"put, never settled")
    _, claims = planting.plant_claims(stack.ledger, settings.stream, [landed], **lease)
    kinesis = streamcheck.kinesis_client(emulators.kinesis)
    kinesis.put_record(
        StreamName=settings.stream,
        PartitionKey=landed.key,
        Data=landed.data,
        ExplicitHashKey=claims[landed.key].routing_hash_key,
    )
    planting.plant_claims(
        stack.ledger,
        settings.stream,
        [Message("stored", b"resend me")],
        store_payload=True,
        **lease,
    )
    planting.plant_claims(stack.ledger, settings.stream, [Message("lost", b"gone")], **lease)


def drive_the_api(emulators: local_stack.Endpoints, names: Names) -> None:
    app = create_app(
        ApiSettings(table=names.table, dynamodb_endpoint_url=emulators.dynamodb, api_token=TOKEN)
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    base = f"/v1/streams/{names.stream}"
    responses = asgi_requests(
        app,
        [
            ("GET", "/readyz", None),
            ("GET", f"{base}/messages/k0", None),
            ("POST", f"{base}/messages:lookup", {"keys": ["k0", "k1", "nope"]}),
            ("GET", f"{base}/in-flight?stale=true", None),
            ("GET", f"{base}/in-flight", None),
            ("GET", f"{base}/summary", None),
        ],
        auth,
    )
    assert [r.status_code for r in responses] == [200] * 6, [r.text for r in responses]
    window = responses[-1].json()["exactly_once_window"]  # read from the stream
    assert window["stream_retention_seconds"] == 24 * 3600


def asgi_requests(
    app: Any, requests: list[tuple[str, str, Any]], headers: dict[str, str]
) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return [
                await client.request(method, url, json=body, headers=headers)
                for method, url, body in requests
            ]

    return asyncio.run(run())


def exits_with(code: int, command: Any) -> None:
    with pytest.raises(typer.Exit) as exited:
        command()
    assert exited.value.exit_code == code
