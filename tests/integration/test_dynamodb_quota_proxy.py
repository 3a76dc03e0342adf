"""The quota mode's DynamoDB layer (devstack.dynamodb_quota_proxy) against dynalite and DynamoDB
Local: each quota throttles at its figure, as AWS answers past it, and a throttled write writes
nothing.

The proxy's buckets read a clock the test moves, so every figure is exact. Items are large (a
put of 10 KB is 10 write units) so that a quota is reached in a few calls. The client's
retries are off: each call is one attempt.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from streamcheck import StepClock, aws_client

from devstack import emulators as local_stack
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.dynamodb_quotas import DynamoDbQuotas
from devstack.fault_proxy import REPORT_PATH

pytestmark = pytest.mark.integration

ONE_ATTEMPT = Config(retries={"total_max_attempts": 1, "mode": "standard"})
TEN_KB = "x" * (10 * 1024 - 20)  # with its key and names: 10 write units


def _client(endpoint: str, config: Config | None = None) -> Any:
    return aws_client("dynamodb", endpoint, config)


@pytest.fixture(params=[local_stack.DYNALITE, local_stack.DYNAMODB_LOCAL])
def dynamodb(request: pytest.FixtureRequest, emulators: Any) -> str:
    """Each DynamoDB emulator of the stack."""
    if request.param == local_stack.DYNAMODB_LOCAL:
        return str(request.getfixturevalue("dynamodb_local_endpoint"))
    return str(emulators.dynamodb)


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
def table(dynamodb: str, names: Any) -> str:
    return _create_table(dynamodb, names.table)


def _create_table(dynamodb: str, name: str) -> str:
    direct = _client(dynamodb)
    direct.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    direct.get_waiter("table_exists").wait(
        TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100}
    )
    return name


def _proxy(dynamodb: str, clock: StepClock, **figures: float) -> DynamoDbQuotaProxy:
    return DynamoDbQuotaProxy(dynamodb, DynamoDbQuotas(**figures), monotonic=clock)


@pytest.fixture
def proxy(dynamodb: str, clock: StepClock) -> Iterator[DynamoDbQuotaProxy]:
    with _proxy(dynamodb, clock) as running:
        yield running


def _put(client: Any, table: str, pk: str, n: int) -> None:
    client.put_item(TableName=table, Item={"pk": {"S": pk}, "n": {"N": str(n)}, "v": {"S": TEN_KB}})


def _refusal(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as refused:
        call()
    response: dict[str, Any] = refused.value.response
    return response


def test_a_partition_key_takes_1000_write_units_a_second_and_a_refused_put_writes_nothing(
    proxy: DynamoDbQuotaProxy, dynamodb: str, table: str, clock: StepClock
) -> None:
    client, direct = _client(proxy.endpoint, ONE_ATTEMPT), _client(dynamodb)
    # GIVEN 100 puts of 10 KB on one key within one second: 1,000 write units
    for n in range(100):
        _put(client, table, "hot", n)
    # WHEN one more comes in the same second
    refused = _refusal(lambda: _put(client, table, "hot", 100))
    # THEN it is refused as AWS refuses a hot key, and not written
    assert refused["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert refused["ThrottlingReasons"][0]["reason"] == "TableWriteKeyRangeThroughputExceeded"
    assert refused["ThrottlingReasons"][0]["resource"].endswith(f":table/{table}")
    item = direct.get_item(TableName=table, Key={"pk": {"S": "hot"}}, ConsistentRead=True)
    assert item["Item"]["n"] == {"N": "99"}
    # AND another key writes in the same second; a tenth of a second later the hot key writes
    # a tenth of its quota
    _put(client, table, "cold", 0)
    clock.advance(0.1)
    for n in range(10):
        _put(client, table, "hot", 200 + n)
    assert _refusal(lambda: _put(client, table, "hot", 300))["Error"]["Code"] == (
        "ProvisionedThroughputExceededException"
    )


def test_a_table_past_its_on_demand_quota_answers_throttling_exception(
    dynamodb: str, table: str, clock: StepClock
) -> None:
    with _proxy(dynamodb, clock, table_write_units_per_s=30) as proxy:
        client = _client(proxy.endpoint, ONE_ATTEMPT)
        for key in ("a", "b", "c"):
            _put(client, table, key, 0)
        refused = _refusal(lambda: _put(client, table, "d", 0))
    assert refused["Error"]["Code"] == "ThrottlingException"
    assert refused["throttlingReasons"][0]["reason"] == "TableWriteAccountLimitExceeded"
    assert "Item" not in _client(dynamodb).get_item(TableName=table, Key={"pk": {"S": "d"}})


def test_a_batch_execute_statement_answers_each_throttled_insert_in_its_place(
    dynamodb_local_endpoint: str, names: Any, clock: StepClock
) -> None:
    # dynalite has no PartiQL (the ledger claims one key a call there)
    dynamodb = dynamodb_local_endpoint
    table = _create_table(dynamodb, names.table)
    # GIVEN a key quota of 5 write units a second, and the ledger's form of INSERT
    with _proxy(dynamodb, clock, key_write_units_per_s=5) as proxy:
        client = _client(proxy.endpoint, ONE_ATTEMPT)

        def insert(pk: str, size: int) -> dict[str, Any]:
            return {
                "Statement": f"INSERT INTO \"{table}\" VALUE {{'pk': ?, 'v': ?}}",
                "Parameters": [{"S": pk}, {"S": "x" * size}],
            }

        # WHEN three INSERTs come in one batch, the middle one of 6 KB (6 units)
        answer = client.batch_execute_statement(
            Statements=[insert("small-1", 10), insert("big", 6 * 1024), insert("small-2", 10)]
        )
    # THEN the middle one is answered ProvisionedThroughputExceeded, the others applied
    codes = [r.get("Error", {}).get("Code") for r in answer["Responses"]]
    assert codes == [None, "ProvisionedThroughputExceeded", None]
    written = _client(dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]
    assert sorted(i["pk"]["S"] for i in written) == ["small-1", "small-2"]


def test_a_batch_execute_statement_on_dynalite_is_refused_as_dynalite_refuses_it(
    emulators: Any, names: Any, clock: StepClock
) -> None:
    # GIVEN dynalite behind the proxy, its key quota spent (a batch would be throttled whole)
    table = _create_table(emulators.dynamodb, names.table)
    with _proxy(emulators.dynamodb, clock, key_write_units_per_s=1) as proxy:
        client = _client(proxy.endpoint, ONE_ATTEMPT)
        client.put_item(TableName=table, Item={"pk": {"S": "hot"}})
        statement = {
            "Statement": f"INSERT INTO \"{table}\" VALUE {{'pk': ?}}",
            "Parameters": [{"S": "hot"}],
        }
        # WHEN a BatchExecuteStatement comes
        refused = _refusal(lambda: client.batch_execute_statement(Statements=[statement]))
    # THEN the answer is dynalite's own (no PartiQL there), not a throttle: the ledger learns
    # to claim a key a call, as it does on dynalite alone
    assert refused["Error"]["Code"] == "UnknownOperationException"


def test_a_batch_write_answers_throttled_puts_as_unprocessed_and_all_throttled_as_an_error(
    dynamodb: str, table: str, clock: StepClock
) -> None:
    with _proxy(dynamodb, clock, table_write_units_per_s=25) as proxy:
        client = _client(proxy.endpoint, ONE_ATTEMPT)
        puts = [
            {"PutRequest": {"Item": {"pk": {"S": f"k{i}"}, "v": {"S": TEN_KB}}}} for i in range(3)
        ]
        answer = client.batch_write_item(RequestItems={table: puts})
        assert answer["UnprocessedItems"] == {table: [puts[2]]}
        refused = _refusal(lambda: client.batch_write_item(RequestItems={table: puts[2:]}))
    assert refused["Error"]["Code"] == "ThrottlingException"
    written = _client(dynamodb).scan(TableName=table, ConsistentRead=True)["Items"]
    assert sorted(i["pk"]["S"] for i in written) == ["k0", "k1"]


def test_a_partition_key_takes_3000_read_units_a_second_billed_on_what_was_read(
    proxy: DynamoDbQuotaProxy, dynamodb: str, table: str, clock: StepClock
) -> None:
    # GIVEN an item of 40 KB: a strongly consistent read is 10 units, an eventual one 5
    big = {"pk": {"S": "hot"}, "v": {"S": "x" * (40 * 1024 - 20)}}
    _client(dynamodb).put_item(TableName=table, Item=big)
    client = _client(proxy.endpoint, ONE_ATTEMPT)
    key = {"pk": {"S": "hot"}}
    for _ in range(300):
        client.get_item(TableName=table, Key=key, ConsistentRead=True)
    refused = _refusal(lambda: client.get_item(TableName=table, Key=key))
    assert refused["ThrottlingReasons"][0]["reason"] == "TableReadKeyRangeThroughputExceeded"
    # a BatchGetItem answers the hot key unprocessed, the others read
    answer = client.batch_get_item(
        RequestItems={table: {"Keys": [key, {"pk": {"S": "absent"}}], "ConsistentRead": True}}
    )
    assert answer["UnprocessedKeys"][table]["Keys"] == [key]
    assert answer["UnprocessedKeys"][table]["ConsistentRead"] is True
    clock.advance(0.5)  # half a second: 1,500 units, 300 eventual reads
    for _ in range(300):
        client.get_item(TableName=table, Key=key)
    assert _refusal(lambda: client.get_item(TableName=table, Key=key))["Error"]["Code"] == (
        "ProvisionedThroughputExceededException"
    )
    report = httpx.get(proxy.endpoint + REPORT_PATH).json()["quotas"]
    assert report["throttles"] == {"GetItem": 2, "BatchGetItem": 1}
    assert report["units"][f"{table}/Read"] == 300 * 10 + 1 + 300 * 5
    assert report["most_throttled_keys"][0] == {
        "table": table,
        "key": '{"S": "hot"}',
        "throttled": 3,
    }


def test_a_client_that_asks_to_close_its_connection_is_told_so_and_served_on_a_new_one(
    emulators: Any,
) -> None:
    # GIVEN a kept-alive connection to the proxy (the metering proxy keeps one per thread)
    with DynamoDbQuotaProxy(emulators.dynamodb) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", int(proxy.endpoint.rsplit(":", 1)[1]))
        headers = {
            "X-Amz-Target": "DynamoDB_20120810.ListTables",
            "Content-Type": "application/x-amz-json-1.0",
            # the emulators look for a signature, not at it
            "X-Amz-Date": "20260101T000000Z",
            "Authorization": "AWS4-HMAC-SHA256 Credential=x/20260101/us-east-1/dynamodb/"
            "aws4_request, SignedHeaders=host, Signature=0",
        }
        answers = []
        # WHEN a request asks to close it, and the next one is sent
        for extra in ({}, {"Connection": "close"}, {}):
            connection.request("POST", "/", body=b"{}", headers={**headers, **extra})
            answer = connection.getresponse()
            answer.read()
            answers.append((answer.status, answer.getheader("Connection")))
    # THEN the proxy said it closes (so the client opens a new one), and each was answered
    assert answers == [(200, None), (200, "close"), (200, None)]
