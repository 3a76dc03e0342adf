"""The embedded local stack: started once, reused, loopback only, clear errors."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import httpx
import pytest
from typer.testing import CliRunner

from cli.emulators import app as emulators_cli
from cli.exit_codes import ExitCode
from devstack import emulators as local_stack
from kinesis_store.provisioning import wait_active
from producer.errors import StreamUnavailableError
from producer.retries import poll_until

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_kinesis import KinesisClient

LOOPBACK_HEX = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it
TCP_LISTEN = "0A"


def kinesis_client(endpoint: str) -> KinesisClient:
    return boto3.client(
        "kinesis",
        endpoint_url=endpoint,
        region_name=local_stack.REGION,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
    )


def dynamodb_client(endpoint: str) -> DynamoDBClient:
    return boto3.client(
        "dynamodb",
        endpoint_url=endpoint,
        region_name=local_stack.REGION,
        aws_access_key_id=local_stack.DUMMY_ACCESS_KEY_ID,
        aws_secret_access_key=local_stack.DUMMY_SECRET_ACCESS_KEY,
    )


def wait_stream_active(kinesis: KinesisClient, stream: str, timeout_s: float = 10) -> None:
    # boto3's waiter sleeps 10 s between polls; the emulators switch state in 50 ms
    try:
        wait_active(kinesis, stream, timeout_s=timeout_s)
    except StreamUnavailableError as exc:
        pytest.fail(str(exc))


def create_table(dynamodb: DynamoDBClient, table: str) -> None:
    dynamodb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def listeners(port: int) -> list[str]:
    """Local addresses (hex, as in /proc/net/tcp{,6}) of the TCP sockets listening on ``port``."""
    found = []
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            address, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) == port and fields[3] == TCP_LISTEN:
                found.append(address)
    return found


def non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(
                ("192.0.2.1", 9)
            )  # TEST-NET-1: picks the outgoing interface, sends nothing
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_endpoints_answer_real_api_calls(emulators: local_stack.Endpoints, names: Any) -> None:
    # GIVEN the session's stack
    kinesis = kinesis_client(emulators.kinesis)
    dynamodb = dynamodb_client(emulators.dynamodb)

    # WHEN a stream and a table are created
    kinesis.create_stream(StreamName=names.stream, ShardCount=2)
    create_table(dynamodb, names.table)

    # THEN kinesalite and dynalite serve them
    # (described, not listed: earlier tests of the session leave more than a page of them)
    wait_stream_active(kinesis, names.stream)
    assert dynamodb.describe_table(TableName=names.table)["Table"]["TableName"] == names.table


def test_second_up_reuses_running_emulators(
    emulators: local_stack.Endpoints, emulator_state_dir: Path
) -> None:
    # GIVEN a running stack
    pids_before = {s.name: s.pid for s in local_stack.status(emulator_state_dir)}

    # WHEN up runs again
    again = local_stack.up(emulator_state_dir)

    # THEN the same processes serve the same endpoints, and endpoints.env points at them
    # (kinesis-local too, when an earlier test of the session asked for it)
    assert (again.kinesis, again.dynamodb) == (emulators.kinesis, emulators.dynamodb)
    assert {s.name: s.pid for s in local_stack.status(emulator_state_dir)} == pids_before
    sourced = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1" && echo "$KEO_KINESIS_ENDPOINT_URL $KEO_DYNAMODB_ENDPOINT_URL"',
            "-",
            str(emulator_state_dir / local_stack.ENV_FILE),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert sourced.stdout.split() == [emulators.kinesis, emulators.dynamodb]


def test_status_reports_each_emulator_running(
    emulators: local_stack.Endpoints, emulator_state_dir: Path
) -> None:
    statuses = local_stack.status(emulator_state_dir)

    by_name = {s.name: s for s in statuses}
    assert {local_stack.KINESALITE, local_stack.DYNALITE} <= set(by_name)
    assert all(s.running for s in statuses)
    assert by_name[local_stack.KINESALITE].endpoint == emulators.kinesis
    assert by_name[local_stack.DYNALITE].endpoint == emulators.dynamodb


def test_status_command_prints_a_table_and_exits_0(
    emulators: local_stack.Endpoints, emulator_state_dir: Path
) -> None:
    result = CliRunner().invoke(emulators_cli, ["status", "--state-dir", str(emulator_state_dir)])

    assert result.exit_code == ExitCode.OK, result.output
    assert "kinesalite" in result.output
    assert "dynalite" in result.output


def test_status_command_exits_1_when_nothing_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(emulators_cli, ["status", "--state-dir", str(tmp_path)])

    assert result.exit_code == ExitCode.FAILED
    assert "keo emulators up" in result.output


def test_emulators_listen_on_loopback_only(emulators: local_stack.Endpoints) -> None:
    for endpoint in (emulators.kinesis, emulators.dynamodb):
        port = port_of(endpoint)
        # THEN the only listening socket on the port is bound to 127.0.0.1
        assert listeners(port) == [LOOPBACK_HEX], endpoint
        # and the machine's other address refuses the connection
        address = non_loopback_address()
        if address is not None:
            with pytest.raises(OSError):  # noqa: PT011 - refused, unreachable: any is fine
                socket.create_connection((address, port), timeout=2).close()


def test_kinesis_local_is_loopback_only_and_supports_update_shard_count(
    kinesis_local_endpoint: str, names: Any
) -> None:
    # GIVEN kinesis-local, started lazily for this test
    assert listeners(port_of(kinesis_local_endpoint)) == [LOOPBACK_HEX]
    kinesis = kinesis_client(kinesis_local_endpoint)
    kinesis.create_stream(StreamName=names.stream, ShardCount=1)
    wait_stream_active(kinesis, names.stream)

    # WHEN the stream is rescaled with UpdateShardCount (kinesalite lacks it)
    kinesis.update_shard_count(
        StreamName=names.stream, TargetShardCount=2, ScalingType="UNIFORM_SCALING"
    )
    wait_stream_active(kinesis, names.stream)

    # THEN the new shards name the old one as their parent
    shards = kinesis.list_shards(StreamName=names.stream)["Shards"]
    parents = {s.get("ParentShardId") for s in shards} - {None}
    assert len(parents) == 1
    assert len(shards) == 3


def test_kinesis_local_tls_port_is_loopback_only(
    kinesis_local_endpoint: str, emulator_state_dir: Path
) -> None:
    # the TLS port is in no Endpoints; it must not listen on the network either
    records = json.loads((emulator_state_dir / local_stack.STATE_FILE).read_text())
    tls_port = records["emulators"][local_stack.KINESIS_LOCAL]["tls_port"]

    assert listeners(tls_port) == [LOOPBACK_HEX]


def test_dynamodb_local_is_loopback_only_and_has_ttl_and_transactions(
    dynamodb_local_endpoint: str, names: Any
) -> None:
    # GIVEN DynamoDB Local, started lazily for this test: one socket, on 127.0.0.1
    assert listeners(port_of(dynamodb_local_endpoint)) == [LOOPBACK_HEX]
    dynamodb = dynamodb_client(dynamodb_local_endpoint)
    create_table(dynamodb, names.table)
    # WHEN TTL is turned on and a transaction writes (dynalite has neither)
    dynamodb.update_time_to_live(
        TableName=names.table,
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires_at"},
    )
    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": names.table, "Item": {"pk": {"S": f"k-{i}"}}}} for i in range(2)
        ]
    )
    # THEN both took effect
    ttl = dynamodb.describe_time_to_live(TableName=names.table)["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "ENABLED"
    assert dynamodb.scan(TableName=names.table)["Count"] == 2


def test_up_command_points_the_stack_at_the_dynamodb_emulator_chosen(
    dynamodb_local_endpoint: str, emulator_state_dir: Path
) -> None:
    # GIVEN the session's stack, DynamoDB Local running in it
    # WHEN `keo emulators up` is told (by its variable) to use DynamoDB Local
    result = CliRunner().invoke(
        emulators_cli,
        ["up", "--state-dir", str(emulator_state_dir)],
        env={"KEO_DYNAMODB_EMULATOR": local_stack.DYNAMODB_LOCAL},
    )
    # THEN it reuses the running one, and endpoints.env points at it and names it
    assert result.exit_code == 0, result.output
    assert f"dynamodb       {dynamodb_local_endpoint}  (dynamodb-local)" in result.output
    env_file = (emulator_state_dir / local_stack.ENV_FILE).read_text()
    assert f"export KEO_DYNAMODB_ENDPOINT_URL={dynamodb_local_endpoint}\n" in env_file
    assert "export KEO_DYNAMODB_EMULATOR=dynamodb-local\n" in env_file
    # AND a DynamoDB it does not know is a usage error
    unknown = CliRunner().invoke(
        emulators_cli,
        ["up", "--state-dir", str(emulator_state_dir), "--dynamodb-emulator", "localstack"],
    )
    assert unknown.exit_code == ExitCode.USAGE
    assert "one of dynalite, dynamodb-local" in unknown.output
    # AND so is a JVM profile it does not know, named with the variable that set it
    profile = CliRunner().invoke(
        emulators_cli,
        ["up", "--state-dir", str(emulator_state_dir)],
        env={"KEO_DYNAMODB_LOCAL_JVM": "fast"},
    )
    assert profile.exit_code == ExitCode.USAGE
    assert "one of startup, throughput" in profile.output
    assert "KEO_DYNAMODB_LOCAL_JVM" in profile.output


@pytest.mark.parametrize(
    ("profile", "present", "absent"),
    [
        (local_stack.JvmProfile.STARTUP, "-XX:TieredStopAtLevel=1", "-XX:+UseParallelGC"),
        (local_stack.JvmProfile.THROUGHPUT, "-XX:+UseParallelGC", "-XX:TieredStopAtLevel=1"),
    ],
)
def test_dynamodb_local_runs_on_the_jvm_profile_asked_for(
    tmp_path: Path, profile: local_stack.JvmProfile, present: str, absent: str
) -> None:
    # GIVEN a launcher for that profile
    launcher = local_stack._Launcher.of(
        local_stack._node_modules_dir(None),
        tmp_path,
        in_memory=True,
        dynamodb_local_jvm=profile,
    )
    # WHEN it builds DynamoDB Local's command line
    command = launcher.command(local_stack._SPECS[local_stack.DYNAMODB_LOCAL], 1234, None, tmp_path)
    # THEN the JVM gets that profile's options, on IPv4 loopback, and the store in memory
    assert present in command
    assert absent not in command
    assert "-Djava.net.preferIPv4Stack=true" in command
    assert "-inMemory" in command


def test_requested_port_in_use_gives_a_clear_error(tmp_path: Path) -> None:
    # GIVEN a port another process listens on
    with socket.socket() as squatter:
        squatter.bind((local_stack.HOST, 0))
        squatter.listen()
        port = squatter.getsockname()[1]

        # WHEN kinesalite is asked to use it
        with pytest.raises(local_stack.PortInUseError) as caught:
            local_stack.up(tmp_path, ports={local_stack.KINESALITE: port})

    # THEN the error names the emulator and the port, and nothing is left running
    assert (caught.value.name, caught.value.port) == (local_stack.KINESALITE, port)
    assert str(port) in str(caught.value)
    assert local_stack.status(tmp_path) == []


def test_missing_node_modules_tells_to_run_npm_ci(tmp_path: Path) -> None:
    with pytest.raises(local_stack.NodeModulesMissingError) as caught:
        local_stack.up(tmp_path / "state", node_modules=tmp_path / "node_modules")

    assert "npm ci" in str(caught.value)
    assert caught.value.path == tmp_path / "node_modules"


def test_missing_node_tells_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))

    with pytest.raises(local_stack.NodeNotFoundError) as caught:
        local_stack.up(tmp_path / "state")

    assert "Node.js" in str(caught.value)


def test_missing_java_tells_what_to_install_and_starts_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a PATH with node and without java
    node = shutil.which("node")
    assert node is not None
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "node").symlink_to(node)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    # WHEN DynamoDB Local is asked for
    with pytest.raises(local_stack.JavaNotFoundError) as caught:
        local_stack.up(tmp_path / "state", dynamodb=local_stack.DYNAMODB_LOCAL)
    # THEN the error says what to install, and nothing was started (kinesalite neither)
    assert "Java 17" in str(caught.value)
    assert local_stack.status(tmp_path / "state") == []


def test_up_command_exits_3_when_packages_are_missing(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        emulators_cli,
        ["up", "--state-dir", str(tmp_path / "state")],
        env={"KEO_NODE_MODULES": str(tmp_path / "node_modules")},
    )

    assert result.exit_code == ExitCode.CONFIG
    assert "npm ci" in result.output


def test_down_stops_everything_and_data_survives_a_restart(tmp_path: Path, names: Any) -> None:
    # GIVEN a stack of its own with a stream and a table in it
    first = local_stack.up(tmp_path)
    pids = [s.pid for s in local_stack.status(tmp_path)]
    try:
        kinesis = kinesis_client(first.kinesis)
        kinesis.create_stream(StreamName=names.stream, ShardCount=1)
        wait_stream_active(kinesis, names.stream)
        create_table(dynamodb_client(first.dynamodb), names.table)
    finally:
        # WHEN it is stopped
        stopped = local_stack.down(tmp_path)

    # THEN the processes are gone, and nothing is recorded
    # (not "the ports are free": a concurrent test run may take them at once)
    assert stopped == [local_stack.DYNALITE, local_stack.KINESALITE]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert local_stack.status(tmp_path) == []
    assert not (tmp_path / local_stack.ENV_FILE).exists()

    # WHEN it starts again from the same state directory
    second = local_stack.up(tmp_path)
    try:
        # THEN the stream and the table are still there
        assert names.stream in kinesis_client(second.kinesis).list_streams()["StreamNames"]
        assert names.table in dynamodb_client(second.dynamodb).list_tables()["TableNames"]
    finally:
        local_stack.down(tmp_path)


def test_up_restarts_only_what_died(tmp_path: Path) -> None:
    # GIVEN a stack of its own whose dynalite died
    first = local_stack.up(tmp_path)
    try:
        pids = {s.name: s.pid for s in local_stack.status(tmp_path)}
        os.killpg(pids[local_stack.DYNALITE], signal.SIGKILL)
        wait_until(lambda: not by_name(local_stack.status(tmp_path))["dynalite"].running)
        status_result = CliRunner().invoke(emulators_cli, ["status", "--state-dir", str(tmp_path)])

        # WHEN up runs again
        second = local_stack.up(tmp_path)

        # THEN status had said so, and only dynalite was started again
        assert status_result.exit_code == ExitCode.FAILED
        after = by_name(local_stack.status(tmp_path))
        assert after[local_stack.KINESALITE].pid == pids[local_stack.KINESALITE]
        assert after[local_stack.DYNALITE].pid != pids[local_stack.DYNALITE]
        assert all(s.running for s in after.values())
        assert second.kinesis == first.kinesis
    finally:
        local_stack.down(tmp_path)


def by_name(statuses: list[local_stack.EmulatorStatus]) -> dict[str, local_stack.EmulatorStatus]:
    return {s.name: s for s in statuses}


def wait_until(condition: Callable[[], bool], timeout_s: float = 5) -> None:
    if not poll_until(condition, timeout_s=timeout_s, interval_s=0.05):
        pytest.fail(f"condition not met after {timeout_s} s")


def test_serve_js_binds_the_address_given_with_host_and_refuses_a_name() -> None:
    # GIVEN the launcher docker-compose.yml runs (its containers pass --host 0.0.0.0 on a
    # private network; here another loopback address stands in for it)
    serve_js = Path(__file__).resolve().parents[2] / "emulators" / "serve.js"
    node_modules = os.environ.get("KEO_NODE_MODULES") or str(serve_js.parents[1] / "node_modules")
    env = {**os.environ, "KEO_NODE_MODULES": node_modules}
    with socket.socket() as probe:
        probe.bind(("127.0.0.2", 0))
        port = probe.getsockname()[1]
    # WHEN dynalite is started with --host 127.0.0.2
    process = subprocess.Popen(
        ["node", str(serve_js), "dynalite", "--port", str(port), "--host", "127.0.0.2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        announced = process.stdout.readline()
        # THEN it listens on that address alone, and says so
        assert announced.strip() == f"dynalite listening on http://127.0.0.2:{port}"
        assert listeners(port) == ["0200007F"]
    finally:
        process.terminate()
        process.communicate(timeout=30)
    # AND an address that is not an IP address is a usage error, before anything listens
    refused = subprocess.run(
        ["node", str(serve_js), "dynalite", "--port", str(port), "--host", "example.com"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "--host: not an IP address: example.com" in refused.stderr


def _hang_up_mid_body(endpoint: str, target: str) -> None:
    """A client that announces a body of 1,000 bytes, sends 20, and closes: as a process
    killed in the middle of a put leaves its request."""
    host, port = endpoint.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as client:
        client.sendall(
            (
                f"POST / HTTP/1.1\r\nHost: {host}:{port}\r\nX-Amz-Target: {target}\r\n"
                "Content-Type: application/x-amz-json-1.1\r\nContent-Length: 1000\r\n\r\n"
                '{"StreamName": "cut'
            ).encode()
        )


def test_a_client_that_hangs_up_mid_request_does_not_take_an_emulator_down(
    tmp_path: Path,
) -> None:
    # GIVEN a stack of its own (a crash here must not take the session's stack with it)
    stack = local_stack.up(tmp_path)
    try:
        # WHEN a client of kinesalite and one of dynalite each hang up in the middle of a body
        _hang_up_mid_body(stack.kinesis, "Kinesis_20131202.DescribeStreamSummary")
        _hang_up_mid_body(stack.dynamodb, "DynamoDB_20120810.DescribeTable")
        # THEN each emulator saw the client go, and serves on
        for name in (local_stack.KINESALITE, local_stack.DYNALITE):
            log = tmp_path / "logs" / f"{name}.log"
            wait_until(lambda log=log: "client gone mid-request" in log.read_text())
        assert kinesis_client(stack.kinesis).list_streams()["StreamNames"] == []
        assert dynamodb_client(stack.dynamodb).list_tables()["TableNames"] == []
        assert all(s.running for s in local_stack.status(tmp_path))
    finally:
        local_stack.down(tmp_path)


def test_up_with_aws_quotas_puts_each_emulator_behind_its_quota_proxy(
    tmp_path: Path, names: Any
) -> None:
    # GIVEN a stack of its own started with AWS's quotas, as `keo emulators up --quotas aws`,
    # on the stack's default DynamoDB (DynamoDB Local), as `make demo` runs
    result = CliRunner().invoke(
        emulators_cli, ["up", "--state-dir", str(tmp_path)], env={"KEO_QUOTAS": "aws"}
    )
    try:
        assert result.exit_code == 0, result.output
        statuses = by_name(local_stack.status(tmp_path))
        proxy = statuses[local_stack.KINESIS_QUOTAS]
        kinesalite = statuses[local_stack.KINESALITE]
        # THEN its Kinesis endpoint is the proxy's, on the loopback interface only, in front
        # of kinesalite, and endpoints.env points every command at it
        assert proxy.running
        assert set(listeners(proxy.port)) == {LOOPBACK_HEX}
        assert f"kinesis        {proxy.endpoint}  (AWS's quotas" in result.output
        assert kinesalite.endpoint in result.output
        env_file = (tmp_path / local_stack.ENV_FILE).read_text()
        assert f"export KEO_KINESIS_ENDPOINT_URL={proxy.endpoint}\n" in env_file

        # WHEN a shard is sent 12 records of 100 KiB in one request through it
        kinesis = kinesis_client(proxy.endpoint)
        kinesis.create_stream(StreamName=names.stream, ShardCount=1)
        wait_stream_active(kinesis, names.stream)
        records = [{"PartitionKey": f"big-{i:02d}", "Data": b"x" * 100 * 1024} for i in range(12)]
        answer = kinesis.put_records(StreamName=names.stream, Records=records)

        # THEN what 1 MiB a second holds is written and the rest refused as AWS refuses it,
        # and the proxy counts it for any process that asks
        assert answer["FailedRecordCount"] == 2
        report = httpx.get(f"{proxy.endpoint}/__keo/report", timeout=5).json()
        refused = report["quotas"]["records_refused"]
        assert refused == {f"{names.stream}/shardId-000000000000": 2}

        # AND DynamoDB Local answers behind its own proxy, which counts per partition key
        dynamodb_local = statuses[local_stack.DYNAMODB_LOCAL]
        in_front = f"(AWS's quotas, in front of dynamodb-local at {dynamodb_local.endpoint})"
        assert in_front in result.output
        dynamodb_proxy = statuses[local_stack.DYNAMODB_QUOTAS]
        assert set(listeners(dynamodb_proxy.port)) == {LOOPBACK_HEX}
        assert f"export KEO_DYNAMODB_ENDPOINT_URL={dynamodb_proxy.endpoint}\n" in env_file
        dynamodb = dynamodb_client(dynamodb_proxy.endpoint)
        dynamodb.list_tables()
        counted = httpx.get(f"{dynamodb_proxy.endpoint}/__keo/report", timeout=5).json()
        assert counted["quotas"]["calls"] == {"ListTables": 1}

        # AND `up` without quotas points the stack at the emulators again, the proxies left
        # running
        plain = local_stack.up(tmp_path, dynamodb=local_stack.DYNAMODB_LOCAL)
        assert (plain.kinesis, plain.quotas) == (kinesalite.endpoint, "none")
        assert plain.dynamodb == dynamodb_local.endpoint
    finally:
        stopped = local_stack.down(tmp_path)
    assert {local_stack.KINESIS_QUOTAS, local_stack.DYNAMODB_QUOTAS} <= set(stopped)
