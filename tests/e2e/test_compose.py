"""docker-compose.yml is for users with Docker (none runs here): check what can be checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from cli import app

ROOT = Path(__file__).resolve().parents[2]


def _services() -> dict[str, dict[str, object]]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    services = document["services"]
    assert isinstance(services, dict)
    return services


@pytest.mark.parametrize("name", sorted(_services()))
def test_each_service_runs_a_command_that_exists(name: str) -> None:
    # GIVEN a compose service WHEN we read its command THEN the entry point it names exists
    command = _services()[name]["command"]
    assert isinstance(command, list)
    program = command[0]
    if program == "keo":
        cli = get_command(app)
        words = [w for w in command[1:] if not w.startswith("-")]
        group = cli
        for word in words[:2]:
            sub = getattr(group, "commands", {}).get(word)
            if sub is None:
                break
            group = sub
        assert group is not cli, f"keo has no subcommand {words[0]!r}"
    elif program == "node":
        assert (ROOT / command[1]).is_file()
    elif program == "python":
        module = command[2]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file()
    else:
        pytest.fail(f"unexpected program {program}")


def test_every_service_stays_on_loopback() -> None:
    # GIVEN the compose file THEN no service publishes a port: all share the host's loopback
    for name, service in _services().items():
        assert service.get("network_mode") == "host", name
        assert "ports" not in service, name
