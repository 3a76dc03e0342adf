"""Issue 26's scenario, as a user met it: ``keo send`` with puts the network delays past the
client's read timeout (ambiguous, and landing after it gave up) while DynamoDB throttles a
quarter of the ``UpdateItem`` calls (claims, lease renewals and take-overs retried by the SDK,
late), two groups in flight, the signature fence off; then the same with the fence on.

Before the fix it wrote hundreds of keys twice while reporting them SENT: a put left after a
slow, retried renewal or take-over with less lease left than its timeouts (nothing checked the
lease when the request left), and an ambiguous put was read back against its group's lease at
claim time rather than the renewed one it was sent under, found missing, and sent again. The
stream is read back: no key twice, every key reported SENT or DUPLICATE exactly once; after the
reconciler, every key once.

Nothing here asserts a duration; the faults come from a seeded schedule (each seed replays).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stacks
import streamcheck

from devstack import emulators as local_stack
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from producer.retries import poll_until

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
MESSAGES = 150
CHUNK = 50  # three groups, two in flight
# the proxy forwards a delayed put after DELAY_S: past the 1 s read timeout, so the client has
# given up (ambiguous) when it lands
DELAY_S = 1.5
UNFENCED = {
    "KEO_PUT_FENCE": "off",
    "KEO_LEASE_S": "4",  # the shortest the timeouts allow is 1 + 1 + 2 x 0.5 = 3 s
    "KEO_PUT_CONNECT_TIMEOUT_S": "1",
    "KEO_PUT_READ_TIMEOUT_S": "1",
    "KEO_CLOCK_SKEW_S": "0.5",
    "KEO_GROUPS_IN_FLIGHT": "2",
    "KEO_WAIT_MAX_S": "0.5",
    "KEO_STORE_PAYLOAD": "true",  # the reconciler sends what the producer left unsent
    # few claims at once: a group's throttled claims (retried by the SDK after backoff) take
    # longer than its lease, so its puts wait on renewals and take-overs, themselves throttled
    "KEO_LEDGER_CONCURRENCY": "4",
}
WINDOW_S = 3.0
FENCED = {
    **UNFENCED,
    "KEO_PUT_FENCE": "signature",
    "KEO_SIGNATURE_WINDOW_S": str(WINDOW_S),
    "KEO_LEASE_S": "6",  # 3 + 1 + 1 + 2 x 0.5
}


def faults(seed: int) -> tuple[FaultSchedule, FaultSchedule]:
    """A third of the puts delayed past the read timeout; a quarter of the UpdateItems
    throttled (claims, renewals, take-overs, settles)."""
    delayed = FaultRule("PutRecords", "delay", probability=1 / 3, delay_s=DELAY_S)
    throttled = FaultRule("UpdateItem", "throttle", probability=0.25)
    return FaultSchedule([delayed], seed=seed), FaultSchedule([throttled], seed=seed)


# One seed with the fence off: the code before the fix (ce3234c) wrote a group twice with seed
# 1 in each of 4 runs (150 and 100 messages); seed 2, the same rules, in 2 runs of 3 (and at
# 100 messages no put of it was delayed)
@pytest.mark.parametrize(
    ("timing", "seed"),
    [(UNFENCED, 1), (FENCED, 3)],
    ids=["fence-off-seed-1", "fence-on-seed-3"],
)
def test_delayed_puts_and_throttled_ledger_writes_deliver_each_key_once(
    emulators: local_stack.Endpoints,
    names: Names,
    env: dict[str, str],
    tmp_path: Path,
    timing: dict[str, str],
    seed: int,
) -> None:
    settings = stacks.fresh(emulators, names)
    stack_args = ["--stream", settings.stream, "--table", settings.table, "--no-progress"]
    messages = [{"key": f"k{i:04d}", "data": f'{{"n": {i}}}'} for i in range(MESSAGES)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    put_faults, write_faults = faults(seed)
    window = WINDOW_S if timing is FENCED else None
    with (
        FaultProxy(emulators.kinesis, put_faults, signature_window_s=window) as kinesis_proxy,
        FaultProxy(emulators.dynamodb, write_faults) as dynamodb_proxy,
    ):
        process_env = {
            **env,
            **timing,
            "KEO_KINESIS_ENDPOINT_URL": kinesis_proxy.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": dynamodb_proxy.endpoint,
        }
        # GIVEN puts delayed past the client's timeout and a throttled ledger
        # WHEN `keo send` sends the batch through them
        sent = run_keo(
            ["send", *stack_args, "--input", str(source), "--chunk-size", str(CHUNK)],
            process_env,
        )
    assert sent.returncode in (0, 1), sent.stderr
    outcomes = [json.loads(line) for line in sent.stdout.splitlines()]
    statuses = Counter(outcome["status"] for outcome in outcomes)
    assert put_faults.injected["PutRecords:delay"] > 0, "no put was delayed: pick another seed"
    assert write_faults.injected["UpdateItem:throttle"] > 0

    # THEN no key is in the stream twice, and each key reported delivered is there once
    kinesis = streamcheck.kinesis_client(emulators.kinesis)
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.duplicates() == {}, (statuses, sent.stderr[-3000:])
    delivered = [o["key"] for o in outcomes if o["status"] in ("SENT", "DUPLICATE")]
    assert all(contents.counts[key] == 1 for key in delivered), statuses
    assert set(statuses) <= {"SENT", "DUPLICATE", "FAILED", "IN_FLIGHT"}, statuses

    # AND once the reconciler has settled what the throttled send left open (after its
    # leases), and the keys it failed are sent again, every key is in the stream exactly once
    direct = {**env, **timing}

    def every_key_once() -> bool:
        run_keo(["reconcile", *stack_args, "--once"], direct)
        resend = run_keo(["send", *stack_args, "--input", str(source)], direct)
        again = [json.loads(line)["status"] for line in resend.stdout.splitlines()]
        return resend.returncode == 0 and set(again) <= {"DUPLICATE", "SENT"}

    assert poll_until(every_key_once, timeout_s=120, interval_s=0.5)
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.duplicates() == {}
    assert set(contents.counts) == {m["key"] for m in messages}


def run_keo(args: list[str], env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KEO, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
