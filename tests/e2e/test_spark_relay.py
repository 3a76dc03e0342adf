"""``python -m spark_jobs.relay``'s query on the session's local Spark against kinesalite: stream
A read with ``readStream.format("keo")``, written to stream B with ``writeStream.format("keo")``
in replay mode; a batch that dies after its puts is replayed from the checkpoint. The oracle is
``streamcheck``'s plain boto3 reading of both streams, compared as multisets of key and data.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from spark_support import streamcheck

import spark_jobs
from dedupe_store.states import RunState
from devstack.failpoints import Failpoints
from kinesis_store.entries import put_entry
from kinesis_store.provisioning import create_stream
from producer.clients import kinesis_client
from producer.hooks import Step
from producer.wiring import Stack
from spark_jobs.relay import parse_args, start_relay

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180
QUERY = "relay-a-to-b"


def contents(kinesis: Any, stream: str) -> Counter[tuple[str, bytes]]:
    return Counter(
        (r.partition_key, r.data) for r in streamcheck.read_stream(kinesis, stream).records
    )


def test_a_relay_whose_batch_dies_after_its_puts_delivers_every_record_of_a_to_b_once(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    """GIVEN stream A with 60 records (two of them identical) and an empty stream B WHEN the
    relay's first batch dies after its puts to B, before its commit, and the relay is restarted
    from its checkpoint THEN B holds exactly A's records (the identical ones twice), every
    batch's run is COMPLETE, and the replayed batch sent nothing again."""
    source = stack.settings.stream
    target = f"{source}-b"
    create_stream(kinesis_client(stack.settings, for_put=False), target, 2, timeout_s=30)
    rows = [(f"order-{i:03d}", f"payload {i}".encode()) for i in range(58)]
    rows += rows[:2]  # the same record twice in A: twice in B
    for start in range(0, len(rows), 20):
        kinesis.put_records(
            StreamName=source, Records=[put_entry(k, d) for k, d in rows[start : start + 20]]
        )
    assert contents(kinesis, source) == Counter(rows)

    def relay() -> Any:
        return start_relay(
            keo,
            settings=settings,
            source=source,
            target=target,
            checkpoint=str(tmp_path / "checkpoint"),
            query_name=QUERY,
            max_records_per_trigger=40,
        )

    spark_jobs.register(keo, hooks=Failpoints(f"{Step.BATCH_AFTER_PUTS}=raise"))
    with pytest.raises(Exception, match="batch_after_puts"):
        relay().awaitTermination(QUERY_TIMEOUT_S)
    first_batch = contents(kinesis, target)
    assert 0 < sum(first_batch.values()) <= 40

    spark_jobs.register(keo)
    restarted = relay()
    assert restarted.awaitTermination(QUERY_TIMEOUT_S)
    assert restarted.exception() is None

    assert contents(kinesis, target) == Counter(rows)
    replayed = stack.ledger.get_run(target, f"{QUERY}/0")
    assert replayed is not None
    assert replayed.state is RunState.COMPLETE
    assert replayed.counts["sent"] == 0
    assert replayed.counts["duplicates"] == sum(first_batch.values())


def test_the_relay_job_names_its_query_and_refuses_a_bad_trigger() -> None:
    """GIVEN the job's command line WHEN it lacks --query-name THEN argparse refuses it; the
    default guarantee is replay mode."""
    with pytest.raises(SystemExit):
        parse_args(["--source", "a", "--target", "b", "--checkpoint", "ckpt"])
    args = parse_args(
        ["--source", "a", "--target", "b", "--checkpoint", "ckpt", "--query-name", "q"]
    )
    assert args.dedupe == "replay"
