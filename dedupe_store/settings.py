"""Settings shared by everything that talks to the ledger (producer, reconciler, API).

Read from the environment with the ``KEO_`` prefix and validated at start. Region and
credentials come the standard AWS way (environment, profile, instance role).

Every setting is declared with :func:`setting`, which makes it document itself: what it is,
its bounds, and why its default is what it is. ``docs/settings.md`` is generated from those
fields (``make settings-doc``). The building blocks the other packages' settings share live
here, in the lowest layer: :func:`setting`, :data:`EndpointUrl` and the emulator credentials.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field, JsonValue, ValidationInfo, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from dedupe_store.connection import ConnectionOptions
from dedupe_store.errors import ConfigurationError

ENV_PREFIX: Final = "KEO_"
# Emulators accept any credentials, but botocore refuses to sign without some. Letters and
# digits only: DynamoDB Local refuses any other access key id (UnrecognizedClientException).
EMULATOR_CREDENTIALS: Final = ("keolocal", "keolocal")

_WHY: Final = "why"
_RULE: Final = "rule"
_DEFAULT_TEXT: Final = "default_text"


def unknown_names(unknown: Iterable[str], known: Iterable[str], what: str = "setting") -> str:
    """What to say of names that are not among ``known`` (``what``: settings, Spark's
    options): each with the nearest known one, when one is near (``dedup`` -> ``dedupe``)."""
    known = list(known)
    said = []
    for name in unknown:
        nearest = difflib.get_close_matches(name.lower(), known, n=1)
        said.append(f"{name!r} (did you mean {nearest[0]!r}?)" if nearest else repr(name))
    plural = "s" if len(said) > 1 else ""
    return f"unknown {what}{plural} {', '.join(said)}"


def env_var(field_name: str) -> str:
    """The environment variable of a setting: ``lease_s`` -> ``KEO_LEASE_S``."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def setting(
    default: object,
    *,
    description: str,
    why: str,
    rule: str | None = None,
    default_text: str | None = None,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
) -> Any:  # a pydantic FieldInfo, typed Any as pydantic.Field is, so it types as the field
    """A settings field that documents itself.

    ``why`` says why the default is what it is; ``rule`` states, in words, a bound that a
    validator enforces (a cross-field rule, a URL) rather than the constraints given here.
    ``default_text`` says in words a default that depends on other settings (a validator of
    the settings class then replaces ``default`` where it does not apply).
    """
    extra: dict[str, JsonValue] = {_WHY: why}
    if rule is not None:
        extra[_RULE] = rule
    if default_text is not None:
        extra[_DEFAULT_TEXT] = default_text
    return Field(
        default,
        description=description,
        json_schema_extra=extra,
        gt=gt,
        ge=ge,
        lt=lt,
        le=le,
        min_length=min_length,
        max_length=max_length,
        pattern=pattern,
    )


@dataclass(frozen=True, slots=True)
class SettingNotes:
    """What :func:`setting` recorded on a field beyond pydantic's own attributes."""

    why: str
    rule: str | None
    default_text: str | None = None  # a default that depends on other settings, in words

    @classmethod
    def of(cls, name: str, field: FieldInfo) -> SettingNotes:
        extra = field.json_schema_extra
        why = extra.get(_WHY) if isinstance(extra, dict) else None
        if not isinstance(why, str) or not why or not field.description:
            raise ValueError(
                f"setting {name} has no description or no why: declare it with setting()"
            )
        rule = extra.get(_RULE) if isinstance(extra, dict) else None
        default_text = extra.get(_DEFAULT_TEXT) if isinstance(extra, dict) else None
        return cls(
            why=why,
            rule=rule if isinstance(rule, str) else None,
            default_text=default_text if isinstance(default_text, str) else None,
        )


def _endpoint_url(value: str | None, info: ValidationInfo) -> str | None:
    if value in (None, ""):
        return None
    if not value.startswith(("http://", "https://")):
        variable = env_var(info.field_name or "endpoint_url")
        raise ValueError(f"{variable} must be an http(s) URL, got {value!r}")
    return value.rstrip("/")


# An endpoint override: unset or empty means the AWS default (real AWS); otherwise an
# http(s) URL, kept without its trailing slash. A bad value is refused naming its variable.
EndpointUrl = Annotated[str | None, AfterValidator(_endpoint_url)]
ENDPOINT_URL_RULE: Final = "an http(s) URL; empty counts as unset"


def emulator_credentials_for(endpoint_url: str | None) -> tuple[str, str] | None:
    """Dummy credentials for an emulator endpoint when the environment has none."""
    if endpoint_url is None or os.environ.get("AWS_ACCESS_KEY_ID"):
        return None
    return EMULATOR_CREDENTIALS


class BatchClaims(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"

    @property
    def supported(self) -> bool | None:
        """What the ledger is told: True, False, or None to learn it."""
        return {BatchClaims.AUTO: None, BatchClaims.ON: True, BatchClaims.OFF: False}[self]


class LedgerSettings(BaseSettings):
    """The ledger: its DynamoDB table and how it is reached. The producer's settings and the
    API's both start from these."""

    # KEO_* variables that are no setting (KEO_STATE_DIR, KEO_FAILPOINTS) are not read; a
    # keyword that is no setting is refused (_known_settings_only)
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _known_settings_only(cls, values: Any) -> Any:
        """A keyword that is no setting is an error naming the nearest one: ignored, a typo
        would silently keep the default (``ProducerSettings(dedup="replay")``: key mode)."""
        if isinstance(values, Mapping):
            unknown = sorted(name for name in values if name not in cls.model_fields)
            if unknown:
                raise ValueError(unknown_names(unknown, cls.model_fields))
        return values

    table: str = setting(
        "keo-ledger",
        min_length=3,
        max_length=255,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="DynamoDB table of the ledger (`keo init` creates it)",
        why="a name that says what it holds; the bounds are DynamoDB's table-name rules",
    )
    dynamodb_endpoint_url: EndpointUrl = setting(
        None,
        rule=ENDPOINT_URL_RULE,
        description="DynamoDB endpoint override (`keo emulators up` writes it to .keo/endpoints.env)",
        why="unset reaches real AWS: an emulator is opted into, never the default",
    )
    region: str | None = setting(
        None,
        description="AWS region of the stream and the table",
        why=(
            "unset follows the standard AWS chain (AWS_REGION, AWS_DEFAULT_REGION, profile); "
            "us-east-1 against an emulator"
        ),
    )
    dedupe_ttl_s: int = setting(
        7 * 24 * 3600,
        gt=0,
        description="how long a DELIVERED key suppresses duplicates (the ledger item's TTL)",
        why=(
            "7 days: the exactly-once window is min(TTL, stream retention), so the TTL outlives "
            "the default 24 h retention and covers a week-long replay of a retained stream"
        ),
    )
    inflight_buckets: int = setting(
        16,
        ge=1,
        le=1024,
        description=(
            "partitions of the sparse in-flight index; every process using a table "
            "(producers, reconcilers, the API) must use the same number"
        ),
        why="16 spreads the claims in flight over index partitions (no hot partition)",
    )
    ledger_concurrency: int = setting(
        32,
        ge=1,
        le=512,
        description=(
            "ledger calls in flight per process; its connection pool holds them (a producer's "
            "also holds its groups in flight)"
        ),
        why="DynamoDB's latency is hidden by concurrency: 32 calls keep a process busy",
    )
    ledger_connect_timeout_s: int = setting(
        2,
        ge=1,
        le=60,
        description="connect timeout of a ledger call",
        why="as for puts: a dead connection is given up quickly and the call retried",
    )
    ledger_read_timeout_s: int = setting(
        5,
        ge=1,
        le=120,
        description="read timeout of a ledger call",
        why=(
            "as for puts: a slow answer is given up quickly; a retried write that was applied "
            "is recognised by its token, so giving up early is safe"
        ),
    )
    ledger_batch_claims: BatchClaims = setting(
        BatchClaims.AUTO,
        description=(
            "claim new keys 25 to a request (PartiQL INSERTs in BatchExecuteStatement): auto "
            "(learned from the backend's first answer), on, off (one UpdateItem a key)"
        ),
        why=(
            "auto: AWS and DynamoDB Local run PartiQL, dynalite does not, and a producer "
            "learns which at its first claim; the same items either way"
        ),
    )
    ledger_max_retry_attempts: int = setting(
        3,
        ge=0,
        le=10,
        description="SDK retries of a ledger call (throttling, 5xx, timeouts)",
        why=(
            "ledger writes are conditional and carry a token, so an SDK retry cannot apply "
            "twice; 3 rides out a brief throttle without hiding an outage"
        ),
    )

    def resolved_region(self) -> str:
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            return region
        if self.dynamodb_endpoint_url is not None:
            return "us-east-1"
        import botocore.session

        session_region: str | None = botocore.session.get_session().get_config_variable("region")
        if session_region is None:
            raise ConfigurationError(
                "no AWS region: set KEO_REGION or AWS_REGION (or a profile with a region)",
                setting="KEO_REGION",
            )
        return session_region

    def ledger_callers(self) -> int:
        """Ledger calls this process may have in flight at once: its connection pool's size
        (a call beyond it opens a connection and throws it away after)."""
        return self.ledger_concurrency

    def ledger_connection(self) -> ConnectionOptions:
        key_id, secret = emulator_credentials_for(self.dynamodb_endpoint_url) or (None, None)
        return ConnectionOptions(
            table_name=self.table,
            region=self.resolved_region(),
            host=self.dynamodb_endpoint_url,
            connect_timeout_s=self.ledger_connect_timeout_s,
            read_timeout_s=self.ledger_read_timeout_s,
            max_retry_attempts=self.ledger_max_retry_attempts,
            max_pool_connections=max(self.ledger_callers(), 10),
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )
