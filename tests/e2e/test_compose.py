"""docker-compose.yml and the Dockerfile are for users with Docker (none runs here): check what
can be checked without it. The compose file is valid against the Compose Specification's schema
(``compose_spec/``, vendored), every command it runs exists in the image with the options it
passes, services wait on health and on ``init``, reach each other by name, and publish only on
the host's loopback address. The Dockerfile builds on a pinned Debian release that has Java 17,
installs a wheel in a runtime stage of its own, runs as a user that is not root, and bakes no
credentials in."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml
from typer.main import get_command

from api.settings import MIN_API_TOKEN_LENGTH
from cli import app
from spark_jobs.produce_stream import parse_args

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
SCHEMA = Path(__file__).parent / "compose_spec" / "compose-spec.json"
TOKEN = "0123456789abcdef0123456789abcdef"

# --- Compose's variable interpolation, as `docker compose` does it before validating ---------

_VARIABLE = re.compile(
    r"\$(?:\$|\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\})"
)


class InterpolationError(ValueError):
    """A required variable is unset or empty: compose refuses the file with this message."""


def interpolate(text: str, env: dict[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group("name"), match.group("op"), match.group("arg")
        value = env.get(name)
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if op is not None and op.endswith("?") and missing:
            raise InterpolationError(f"required variable {name} is missing a value: {arg}")
        if op is not None and op.endswith("-") and missing:
            return arg
        return value or ""

    return _VARIABLE.sub(replace, text)


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    given = {"KEO_API_TOKEN": TOKEN} if env is None else env
    text = interpolate(COMPOSE.read_text(encoding="utf-8"), given)
    document = yaml.safe_load(text)
    assert isinstance(document, dict)
    return document


def services() -> dict[str, dict[str, Any]]:
    found = compose()["services"]
    assert isinstance(found, dict)
    return found


# --- the file against the specification -------------------------------------------------------


def test_the_compose_file_is_valid_against_the_compose_specification() -> None:
    # GIVEN the Compose Specification's schema and the file as compose reads it
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text(encoding="utf-8")))
    document = compose()
    # THEN the file is valid
    assert [error.message for error in validator.iter_errors(document)] == []
    # AND the schema does bite: a condition compose does not know is refused
    broken = compose()
    broken["services"]["api"]["depends_on"]["init"]["condition"] = "service_ready"
    assert any("service_ready" in error.message for error in validator.iter_errors(broken))


def test_without_a_token_compose_refuses_the_file_saying_what_to_set() -> None:
    # GIVEN no KEO_API_TOKEN in the environment
    # WHEN compose reads the file
    # THEN it refuses it, naming the variable and how long a token must be (rather than
    # starting an API that exits 3 and restarts forever)
    with pytest.raises(InterpolationError) as refused:
        compose({})
    message = str(refused.value)
    assert "KEO_API_TOKEN" in message
    assert f"{MIN_API_TOKEN_LENGTH}+ characters" in message


# --- what the services run ---------------------------------------------------------------------


def _serve_js_flags() -> set[str]:
    source = (ROOT / "emulators" / "serve.js").read_text(encoding="utf-8")
    return set(re.findall(r"flag === '(--[a-z-]+)'", source))


def keo_parses(args: list[str]) -> None:
    """``keo args...`` as the entry point parses it: the root's options, a subcommand (of a
    group too), its options and their values; raises click's usage error otherwise."""
    command: Any = get_command(app)
    context = None
    name = "keo"
    while True:
        takes_value = {
            opt
            for param in command.params
            if not (getattr(param, "is_flag", False) or getattr(param, "count", False))
            for opt in param.opts
        }
        words = iter(range(len(args)))
        split = len(args)
        for index in words:
            if args[index] in takes_value:
                next(words, None)
            elif not args[index].startswith("-"):
                split = index
                break
        own, rest = args[:split], args[split:]
        if not hasattr(command, "commands") or not rest:
            command.make_context(name, [*own, *rest], parent=context)
            return
        if own:  # a group without its options would print its help (no_args_is_help)
            context = command.make_context(name, own, parent=context)
        sub = command.get_command(context, rest[0])  # keo loads its commands on first use
        assert sub is not None, f"{name} has no subcommand {rest[0]!r}"
        command, name, args = sub, rest[0], rest[1:]


@pytest.mark.parametrize("name", sorted(services()))
def test_each_service_runs_a_command_that_exists_with_options_it_takes(name: str) -> None:
    # GIVEN a compose service WHEN we read its command THEN the image's entry point has it
    command = services()[name]["command"]
    assert isinstance(command, list)
    program, *args = command
    if program == "keo":
        keo_parses(args)
    elif program == "node":
        assert (ROOT / args[0]).is_file()
        given = {arg for arg in args if arg.startswith("--")}
        assert given <= _serve_js_flags()
    elif program == "python":
        assert args[:2] == ["-m", "spark_jobs.produce_stream"]
        parse_args(args[2:])  # exits 2 on an option it does not take
    else:
        pytest.fail(f"unexpected program {program}")


@pytest.mark.parametrize("name", sorted(n for n, s in services().items() if "healthcheck" in s))
def test_each_healthcheck_is_python_the_image_can_run(name: str) -> None:
    test = services()[name]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], test
    compile(test[3], f"<{name} healthcheck>", "exec")


# --- how the services find and wait for each other ----------------------------------------------


def test_no_host_networking_and_published_ports_bind_the_hosts_loopback_only() -> None:
    for name, service in services().items():
        assert "network_mode" not in service, name
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    for emulator in ("kinesalite", "dynalite"):
        assert "ports" not in services()[emulator]


def test_services_reach_the_emulators_by_service_name_on_the_port_they_listen_on() -> None:
    listening = {
        name: int(service["command"][service["command"].index("--port") + 1])
        for name, service in services().items()
        if service["command"][0] == "node"
    }
    for name, service in services().items():
        for variable in ("KEO_KINESIS_ENDPOINT_URL", "KEO_DYNAMODB_ENDPOINT_URL"):
            url = urlsplit(service["environment"][variable])
            assert url.hostname in listening, (name, variable)
            assert url.port == listening[url.hostname], (name, variable)


def test_every_service_waits_for_what_it_needs_to_be_healthy_or_done() -> None:
    every = services()
    for name, service in every.items():
        for needed, condition in service.get("depends_on", {}).items():
            # THEN a server it needs is healthy (it has a healthcheck), and init has finished
            if needed == "init":
                assert condition == {"condition": "service_completed_successfully"}, name
            else:
                assert condition == {"condition": "service_healthy"}, name
                assert "healthcheck" in every[needed], needed
    keo_users = [n for n, s in every.items() if s["command"][0] != "node" and n != "init"]
    assert all("init" in every[name]["depends_on"] for name in keo_users)
    assert {"kinesalite", "dynalite"} <= set(every["init"]["depends_on"])


def test_the_api_token_compose_passes_is_the_one_the_user_sets() -> None:
    assert services()["api"]["environment"]["KEO_API_TOKEN"] == TOKEN
    assert len(TOKEN) >= MIN_API_TOKEN_LENGTH


# --- the Dockerfile ---------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """``[(INSTRUCTION, arguments)]``, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
        for line in lines
        if line and not line.startswith("#")
    ]


def test_the_image_builds_on_a_pinned_debian_release_with_java_17() -> None:
    instructions = dockerfile()
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    stages = [a for i, a in instructions if i == "FROM"]
    # THEN every stage is on Debian 12 (bookworm), named, never a floating tag
    assert len(stages) >= 3
    for stage in stages:
        image = stage.split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert image.endswith("-bookworm") or "-bookworm-" in image, image
        assert " AS " in stage.upper()
    # AND the runtime stage, the last, installs Java 17 (Spark) and the wheel built before
    last_from = max(n for n, (i, _) in enumerate(instructions) if i == "FROM")
    runtime = instructions[last_from:]
    run = " ".join(a for i, a in runtime if i == "RUN")
    assert "openjdk-17-jre-headless" in run
    assert "--no-index --find-links=/wheels" in run


def test_the_image_runs_as_a_user_that_is_not_root_and_bakes_no_credentials() -> None:
    instructions = dockerfile()
    users = [a for i, a in instructions if i == "USER"]
    assert users, "no USER: the image would run as root"
    assert users[-1] not in {"root", "0"}
    baked = " ".join(a for i, a in instructions if i in {"ENV", "ARG"})
    assert "AWS_" not in baked


def test_the_wheel_stage_copies_every_package_and_the_image_makes_the_data_folders() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    copied = {
        source
        for i, a in dockerfile()
        if i == "COPY" and "--from" not in a
        for source in a.split()[:-1]
    }
    assert packages <= copied
    assert [source for source in copied if not (ROOT / source).exists()] == []
    run = " ".join(a for i, a in dockerfile() if i == "RUN")
    used = {
        word
        for service in services().values()
        for word in service["command"]
        if word.startswith("/data/")
    }
    assert used, "no /data folder used: the scan is broken"
    for folder in used:
        assert folder in run, f"{folder} is not created in the image"


# --- the Kubernetes CronJob of the reconciler ------------------------------------------------


def test_the_reconciler_cronjob_runs_keo_reconcile_once_as_the_images_user() -> None:
    # GIVEN the manifest the README points to
    documents = list(
        yaml.safe_load_all((ROOT / "docs" / "reconciler-cronjob.yaml").read_text(encoding="utf-8"))
    )
    cronjob = next(d for d in documents if d["kind"] == "CronJob")
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # THEN it runs one pass of keo reconcile that the entry point parses, never two at once,
    # as the image's user, with credentials from its service account's role (no keys)
    program, *args = container["command"]
    assert program == "keo"
    keo_parses(args)
    assert "reconcile" in args
    assert "--once" in args
    assert cronjob["spec"]["concurrencyPolicy"] == "Forbid"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] in {d["metadata"]["name"] for d in documents}
    assert not any(env["name"].startswith("AWS_ACCESS") for env in container["env"])
