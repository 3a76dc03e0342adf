"""The signature fence against the real emulators, behind the fault proxy that emulates the
signature window: the emulators do not check signatures; AWS refuses a request that arrives
more than 5 minutes after its ``X-Amz-Date``, the proxy more than ``WINDOW_S`` after it.

A ``keo send`` process is stopped in each step of its send for longer than its lease (a
failpoint's SIGSTOP at after_claim, before_put, after_put and before_mark; a failpoint's pause
at before_put, its sending thread stalled and the process running on; its put held in the proxy
once signed while the process is SIGSTOPped), while a second producer and the reconciler take
its keys over; then it resumes (the test sends SIGCONT once the take-over is done). The stream
is read back: no key twice,
every key exactly once after ``keo reconcile --once``, and the stopped producer's outcomes say
what became of its keys (never SENT for a put that was refused). With ``KEO_PUT_FENCE=off``
a stall before the put is refused by the send-time lease deadline all the same (``LeaseFence``);
a put the network holds past the lease, within Kinesis' own 5-minute window, writes the
duplicate the fence exists for, and ``keo audit`` reports it.

Nothing here asserts a duration: the test waits on the stopped process' state (or its
failpoint's line), on the proxy's events and on the ledger (every key DELIVERED) before it
resumes it.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import stacks
import streamcheck

from dedupe_store.clock import SystemClock
from dedupe_store.settings import env_var
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from devstack.fault_proxy import FaultProxy, FaultRule
from kinesis_store.entries import put_entry
from kinesis_store.results import LEASE_FENCE, SIGNATURE_FENCE, PutResultKind
from producer.audit.stream import audit_stream
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message
from producer.retries import poll_until
from producer.settings import ProducerSettings, PutFence
from producer.wiring import build_stack, put_writer

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
WINDOW_S = 2.0
AWS_WINDOW_S = 300.0  # what Kinesis itself allows a signature
# The fence on, a 2 s window; the lease just above its minimum, 2 + 1 + 1 + 2 x 0.5 = 5 s.
# (X-Amz-Date is to the second: a request reaches the proxy up to 1 s older than it says.)
# Payloads are kept in the claims, so the reconciler can send the keys no one else does.
TIMING: dict[str, Any] = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 1.0,
    "clock_skew_s": 0.5,
    "signature_window_s": WINDOW_S,
    "lease_s": 6.0,
    "wait_initial_s": 0.05,
    "wait_max_s": 0.5,
    "store_payload": True,
}
# The fence off: the minimum lease is 1 + 1 + 2 x 0.5 = 3 s.
UNFENCED: dict[str, Any] = {**TIMING, "put_fence": PutFence.OFF, "lease_s": 4.0}
KEYS = 20
TAKEN_BY_B = 10  # the second producer sends these; the reconciler sends the rest
SETTLE_TIMEOUT_S = 90


@pytest.fixture
def proxy(emulators: local_stack.Endpoints) -> Iterator[FaultProxy]:
    """kinesalite behind the fault proxy, which refuses signatures older than the window."""
    with FaultProxy(emulators.kinesis, signature_window_s=WINDOW_S) as proxy:
        yield proxy


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


def settings_for(
    emulators: local_stack.Endpoints, names: Names, proxy: FaultProxy, timing: dict[str, Any]
) -> ProducerSettings:
    """Settings reaching Kinesis through ``proxy``; the stream and table created directly."""
    settings = stacks.settings_for(emulators, names, timing, kinesis_endpoint_url=proxy.endpoint)
    stacks.create_stream_and_table(
        settings.model_copy(update={"kinesis_endpoint_url": emulators.kinesis}), 2
    )
    return settings


@pytest.fixture
def settings(emulators: local_stack.Endpoints, names: Names, proxy: FaultProxy) -> ProducerSettings:
    return settings_for(emulators, names, proxy, TIMING)


def keo_env(
    env: dict[str, str], settings: ProducerSettings, timing: dict[str, Any]
) -> dict[str, str]:
    """The environment of a ``keo`` process with ``settings`` (endpoints, names, timing)."""
    values = {
        env_var(name): str(value).lower() if isinstance(value, bool) else str(value)
        for name, value in timing.items()
    }
    return {
        **env,
        **values,
        "KEO_KINESIS_ENDPOINT_URL": str(settings.kinesis_endpoint_url),
        "KEO_STREAM": settings.stream,
        "KEO_TABLE": settings.table,
    }


# --- the before-send handler on a real client ---------------------------------------------------


def test_a_fenced_client_sends_only_what_its_lease_covers(
    settings: ProducerSettings, proxy: FaultProxy, kinesis: Any
) -> None:
    # GIVEN the product's put writer (the fence installed) on a real botocore client
    writer = build_stack(settings).writer
    policy = settings.lease_policy()
    now_ms = SystemClock().now_ms()
    # WHEN it puts under a fresh lease, under a lease 1 s short of the window and the skew
    # (the request's signing time reads at most 1 s earlier than now), and under no lease
    fresh = writer.put_entries([put_entry("fresh", b"1")], lease_expires_at_ms=now_ms + 8_000)
    short_end = now_ms + round((WINDOW_S + policy.skew_ms / 1000) * 1000) - 1_001
    short = writer.put_entries([put_entry("short", b"2")], lease_expires_at_ms=short_end)
    unleased = writer.put_entries([put_entry("unleased", b"3")])
    # THEN the first is written; the others are NOT_WRITTEN (SignatureFence, retriable) and
    # never left the process: the proxy saw one PutRecords, the stream holds one record
    assert fresh[0].kind is PutResultKind.WRITTEN
    for (result,) in (short, unleased):
        assert (result.kind, result.error_code, result.retriable) == (
            PutResultKind.NOT_WRITTEN,
            SIGNATURE_FENCE,
            True,
        )
    assert proxy.received["PutRecords"] == 1
    assert streamcheck.read_stream(kinesis, settings.stream).counts == Counter({"fresh": 1})


@pytest.mark.parametrize(
    ("offset_s", "wording"),
    [(WINDOW_S + 60, "Signature expired"), (-(WINDOW_S + 60), "Signature not yet current")],
    ids=["arrives-after-the-window", "signed-ahead-of-the-window"],
)
def test_a_signature_the_proxy_refuses_is_not_written_and_retriable(
    emulators: local_stack.Endpoints,
    names: Names,
    kinesis: Any,
    offset_s: float,
    wording: str,
) -> None:
    # GIVEN a proxy whose clock stands a minute past (or before) the signing clock's: every
    # request arrives outside its window, as AWS sees a stalled (or a fast-clocked) client
    with FaultProxy(
        emulators.kinesis,
        signature_window_s=WINDOW_S,
        clock=lambda: time.time() + offset_s,
    ) as late:
        settings = settings_for(emulators, names, late, TIMING)
        writer = put_writer(settings)  # the fenced writer alone: every other call is refused
        # WHEN a put leaves, its lease long enough for the fence
        (result,) = writer.put_entries(
            [put_entry("refused", b"x")], lease_expires_at_ms=SystemClock().now_ms() + 8_000
        )
    # THEN Kinesis (the proxy) refused it as AWS words it: not written, worth another attempt
    assert (result.kind, result.error_code, result.retriable) == (
        PutResultKind.NOT_WRITTEN,
        "InvalidSignatureException",
        True,
    )
    assert str(result.error_message).startswith(wording)
    assert late.signatures_refused["PutRecords"] == 1
    assert streamcheck.read_stream(kinesis, settings.stream).records == []


# --- a stopped producer, its keys taken over, resumed --------------------------------------------


class Send:
    """``keo send`` in the background, its stderr read as it comes."""

    def __init__(self, source: Path, env: dict[str, str], failpoints: str = "") -> None:
        self.process = subprocess.Popen(
            [KEO, "send", "--input", str(source), "--no-progress"],
            env={**env, "KEO_FAILPOINTS": failpoints},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self._ended = False
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            with self._changed:
                self._lines.append(raw.decode("utf-8", "replace"))
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def wait_for_line(self, text: str, timeout_s: float = 60) -> None:
        with self._changed:
            self._changed.wait_for(
                lambda: self._ended or any(text in line for line in self._lines), timeout_s
            )
            found = any(text in line for line in self._lines)
        assert found, f"keo send never logged {text!r}: {self.stderr}"

    def stopped(self) -> bool:
        """Whether the process is stopped (SIGSTOP): its state in /proc is T."""
        stat = Path(f"/proc/{self.process.pid}/stat").read_text(encoding="ascii")
        return stat.rpartition(")")[2].split()[0] == "T"

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)
        self.wait_stopped()

    def wait_stopped(self) -> None:
        assert poll_until(self.stopped, timeout_s=60, interval_s=0.02), self.stderr

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def outcomes(self) -> list[dict[str, Any]]:
        """Its outcomes, once it has exited (0 or 1: every message answered, none lost)."""
        returncode = self.process.wait(timeout=180)
        assert self.process.stdout is not None
        stdout = self.process.stdout.read().decode("utf-8")
        assert returncode in (0, 1), self.stderr
        return [json.loads(line) for line in stdout.splitlines()]


@dataclass(frozen=True)
class Stall:
    """How the first producer is stopped: a failpoint spec, and whether the test stops it."""

    failpoints: str = ""
    sigstop: bool = False  # the test sends SIGSTOP (and SIGCONT) itself
    hold_put: bool = False  # its PutRecords is held in the proxy once signed
    put_refused: str | None = None  # what its stderr says of the put that was refused


# A failpoint that stops the process (SIGSTOP) stalls it until the take-over is done, however
# slow the machine; a pause stalls its sending thread alone (the process runs on), as long.
STALLS = {
    "sigstop-after-claim": Stall("after_claim=stop"),
    "pause-before-put": Stall("before_put=pause", put_refused=SIGNATURE_FENCE),
    "sigstop-before-put": Stall("before_put=stop", put_refused=SIGNATURE_FENCE),
    "sigstop-after-put": Stall("after_put=stop"),
    "sigstop-before-mark": Stall("before_mark=stop"),
    "put-held-after-signing-and-sigstop": Stall(sigstop=True, hold_put=True),
}
# its put landed before the stall: the reconciler settles its group, its own settle is refused
WRITTEN_BEFORE_THE_STALL = {"sigstop-after-put", "sigstop-before-mark"}


def batch_of(prefix: str) -> list[Message]:
    return [Message(f"{prefix}-{i:03d}", f'{{"n": {i}}}'.encode()) for i in range(KEYS)]


def write_jsonl(path: Path, batch: list[Message]) -> Path:
    lines = [json.dumps({"key": m.key, "data": m.data.decode()}) for m in batch]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def start_stalled(send: Send, stall: Stall, proxy: FaultProxy) -> FaultRule | None:
    """Wait until the first producer is in its stall; returns the proxy's hold, if any."""
    if stall.hold_put:
        hold = proxy.schedule.rules[-1]
        assert hold.held.wait(timeout=60), send.stderr
        send.stop()  # signed, and frozen before its request is answered
        return hold
    if stall.failpoints.endswith("=stop"):
        send.wait_stopped()
    else:
        send.wait_for_line("failpoint hit")
    return None


def take_over(settings: ProducerSettings, batch: list[Message]) -> list[Outcome]:
    """A second producer sends the first keys; the reconciler settles or sends the rest.
    Returns once the ledger says every key DELIVERED: the second producer's outcomes."""
    stack = build_stack(settings)
    with stack.producer(owner="producer-b") as producer:
        outcomes = producer.send(batch[:TAKEN_BY_B])
    reconciler = stack.reconciler(owner="reconciler-during-the-stall")
    keys = [m.key for m in batch]

    def every_key_delivered() -> bool:
        reconciler.run_once()
        records = stack.ledger.batch_get(settings.stream, keys)
        return len(records) == len(keys) and all(
            record.state is LedgerState.DELIVERED for record in records.values()
        )

    assert poll_until(every_key_delivered, timeout_s=SETTLE_TIMEOUT_S, interval_s=0.2)
    return outcomes


def reconcile_once(env: dict[str, str]) -> None:
    result = subprocess.run(
        [KEO, "reconcile", "--once"], env=env, capture_output=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.parametrize("name", list(STALLS))
def test_a_producer_stopped_longer_than_its_lease_writes_no_duplicate(
    settings: ProducerSettings,
    proxy: FaultProxy,
    kinesis: Any,
    env: dict[str, str],
    tmp_path: Path,
    name: str,
) -> None:
    stopped_then_taken_over(settings, TIMING, STALLS[name], name, proxy, kinesis, env, tmp_path)


def test_without_the_fence_a_producer_stalled_before_its_put_is_refused_at_send_time(
    emulators: local_stack.Endpoints,
    names: Names,
    proxy: FaultProxy,
    kinesis: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    # KEO_PUT_FENCE=off: the lease deadline checks the clock as the request leaves, so a
    # process stopped past its lease before the put (not after the check) sends nothing
    settings = settings_for(emulators, names, proxy, UNFENCED)
    stall = Stall("before_put=stop", put_refused=LEASE_FENCE)
    stopped_then_taken_over(settings, UNFENCED, stall, "unfenced", proxy, kinesis, env, tmp_path)


def stopped_then_taken_over(
    settings: ProducerSettings,
    timing: dict[str, Any],
    stall: Stall,
    name: str,
    proxy: FaultProxy,
    kinesis: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    batch = batch_of(name)
    process_env = keo_env(env, settings, timing)
    if stall.hold_put:
        proxy.schedule.rules.append(FaultRule("PutRecords", "hold", limit=1))
    # GIVEN `keo send` stopped in the middle of its send for longer than its lease
    send = Send(write_jsonl(tmp_path / "batch.jsonl", batch), process_env, stall.failpoints)
    hold = start_stalled(send, stall, proxy)
    try:
        # WHEN a second producer and the reconciler take its keys over and deliver them
        outcomes_b = take_over(settings, batch)
        assert send.process.poll() is None, f"it woke up before the take-over: {send.stderr}"
    finally:
        if hold is not None:
            hold.release.set()  # its request reaches "Kinesis" only now, long after signing
        if stall.sigstop or stall.failpoints.endswith(("=stop", "=pause")):
            send.resume()
    # AND it resumes, and then `keo reconcile --once` runs
    outcomes_a = send.outcomes()
    reconcile_once(process_env)

    # THEN the stream holds every key exactly once, where the ledger says
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.duplicates() == {}
    streamcheck.assert_exactly_once(
        contents,
        [m.key for m in batch],
        build_stack(settings).ledger,
        payloads={m.key: m.data for m in batch},
    )
    stack = build_stack(settings)
    assert audit_stream(stack.reader, stack.ledger, expected=[m.key for m in batch]).clean
    # AND the stopped producer says what became of its keys: its put landed before the stall
    # and its group was settled by the reconciler (TAKEN_OVER), or it was refused and the
    # keys were delivered by the others (DUPLICATE); never SENT
    statuses = Counter(outcome["status"] for outcome in outcomes_a)
    if name in WRITTEN_BEFORE_THE_STALL:
        assert statuses == {"TAKEN_OVER": KEYS}, outcomes_a
        assert Counter(o.status for o in outcomes_b) == {OutcomeStatus.DUPLICATE: TAKEN_BY_B}
    else:
        assert statuses == {"DUPLICATE": KEYS}, outcomes_a
        assert Counter(o.status for o in outcomes_b) == {OutcomeStatus.SENT: TAKEN_BY_B}
    if stall.put_refused is not None:
        assert stall.put_refused in send.stderr, send.stderr
    if stall.hold_put:
        assert proxy.signatures_refused["PutRecords"] == 1


def test_without_the_fence_a_put_the_network_holds_past_its_lease_lands_twice_and_is_reported(
    emulators: local_stack.Endpoints,
    names: Names,
    kinesis: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    # GIVEN KEO_PUT_FENCE=off, and `keo send` whose put the network holds once it has left
    # (its process stopped meanwhile) for longer than its lease, but within the window Kinesis
    # accepts a signature in (AWS's 5 minutes): the one thing fence-off mode cannot bound
    with FaultProxy(emulators.kinesis, signature_window_s=AWS_WINDOW_S) as network:
        network.schedule.rules.append(FaultRule("PutRecords", "hold", limit=1))
        settings = settings_for(emulators, names, network, UNFENCED)
        batch = batch_of("unfenced")
        source = write_jsonl(tmp_path / "batch.jsonl", batch)
        process_env = keo_env(env, settings, UNFENCED)
        send = Send(source, process_env)
        hold = start_stalled(send, Stall(sigstop=True, hold_put=True), network)
        try:
            # WHEN a second producer and the reconciler take its keys over and deliver them
            take_over(settings, batch)
            assert send.process.poll() is None, f"it woke up before the take-over: {send.stderr}"
        finally:
            # AND the network lets its request go, and it resumes
            assert hold is not None
            hold.release.set()
            send.resume()
        outcomes_a = send.outcomes()
        reconcile_once(process_env)

    # THEN every key it sent is in the stream twice: the documented fence-off bound; it
    # never says SENT: its settle was refused (TAKEN_OVER), or its put timed out and it found
    # the keys delivered by the others (DUPLICATE); the ledger names the other copy
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.duplicates() == {m.key: 2 for m in batch}
    statuses = {outcome["status"] for outcome in outcomes_a}
    assert statuses <= {"TAKEN_OVER", "DUPLICATE"}, outcomes_a
    # AND `keo audit` reports every duplicate, with both positions
    audit = subprocess.run(
        [KEO, "audit", "--expected", str(source), "--json"],
        env={**process_env, "KEO_KINESIS_ENDPOINT_URL": emulators.kinesis},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert audit.returncode == 1, audit.stderr.decode()
    report = json.loads(audit.stdout)
    assert report["duplicate_count"] == KEYS
    assert all(len(positions) == 2 for positions in report["duplicates"].values())
    assert report["missing_count"] == 0


def test_a_take_over_lost_to_the_reconciler_is_waited_on_then_delivered_once(
    emulators: local_stack.Endpoints,
    names: Names,
    proxy: FaultProxy,
    kinesis: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    # Issue 22's second defect through `keo send`: a take-over into a fresh group that loses a
    # key to the reconciler used to put that key as if it were ours (KeyError, outcomes lost)
    # GIVEN `keo send` stopped right after its claims (SIGSTOP), until its lease has run out
    settings = settings_for(emulators, names, proxy, UNFENCED)
    batch = batch_of("lost-take-over")
    send = Send(
        write_jsonl(tmp_path / "batch.jsonl", batch),
        keo_env(env, settings, UNFENCED),
        "after_claim=stop",
    )
    send.wait_stopped()
    # AND the reconciler takes its group over and moves its keys into a group of its own
    # whose put Kinesis refuses (throttled): that group stays OPEN, holding the keys
    proxy.schedule.rules.append(FaultRule("PutRecords", "throttle"))
    reconciler = build_stack(settings).reconciler(owner="reconciler")
    try:
        assert poll_until(lambda: reconciler.run_once().groups > 0, timeout_s=60, interval_s=0.2)
    finally:
        proxy.schedule.rules.clear()
        # WHEN `keo send` resumes: its lease is over, so it moves its keys to a fresh group,
        # and loses every take-over to the reconciler's group
        send.resume()
    outcomes = send.outcomes()

    # THEN it waits that group's lease out, reads back (not there), fences it, takes the keys
    # over and sends them: every key SENT, once
    assert Counter(o["status"] for o in outcomes) == {"SENT": KEYS}, outcomes
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.counts == Counter({m.key: 1 for m in batch})


# --- keo emulators proxy ------------------------------------------------------------------------


def test_keo_emulators_proxy_refuses_a_signature_older_than_its_window(
    emulators: local_stack.Endpoints, env: dict[str, str]
) -> None:
    # GIVEN `keo emulators proxy` in front of kinesalite with a 4 s window
    process = subprocess.Popen(
        [KEO, "emulators", "proxy", "--upstream", emulators.kinesis, "--signature-window-s", "4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("export KEO_KINESIS_ENDPOINT_URL=http://127.0.0.1:"), line
        endpoint = line.strip().partition("=")[2]
        # WHEN a request signed now goes through it, and one signed a minute ago
        streamcheck.kinesis_client(endpoint).list_streams()
        host, _, port = endpoint.removeprefix("http://").partition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
        minute_ago = datetime.fromtimestamp(time.time() - 60, tz=UTC)
        connection.request(
            "POST",
            "/",
            body=b"{}",
            headers={
                "X-Amz-Target": "Kinesis_20131202.ListStreams",
                "X-Amz-Date": minute_ago.strftime("%Y%m%dT%H%M%SZ"),
                "Content-Type": "application/x-amz-json-1.1",
            },
        )
        answer = connection.getresponse()
        body = json.loads(answer.read())
        connection.close()
    finally:
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(timeout=30)
    # THEN the first is answered by kinesalite, the second refused as AWS refuses it; the
    # proxy stops cleanly on SIGTERM
    assert answer.status == 400
    assert body["__type"] == "InvalidSignatureException"
    assert body["message"].startswith("Signature expired: ")
    assert body["message"].endswith("- 4 sec.)")
    assert returncode == 0
