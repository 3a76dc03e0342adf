"""Settings shared by everything that talks to the ledger (producer, reconciler, API).

Read from the environment with the ``KEO_`` prefix and validated at start. Region and
credentials come the standard AWS way (environment, profile, instance role).
"""

from __future__ import annotations

import os

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from dedupe_store.model import ConnectionOptions

# Emulators accept any credentials, but botocore refuses to sign without some.
_EMULATOR_CREDENTIALS = ("keo-local", "keo-local")


class LedgerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KEO_", extra="ignore", validate_default=True)

    table: str = Field(
        default="keo-ledger",
        min_length=3,
        max_length=255,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="DynamoDB table of the ledger",
    )
    dynamodb_endpoint_url: str | None = Field(
        default=None, description="DynamoDB endpoint; unset means the AWS default (real AWS)"
    )
    region: str | None = Field(
        default=None,
        description="AWS region; unset means AWS_REGION / AWS_DEFAULT_REGION / profile",
    )
    dedupe_ttl_s: int = Field(
        default=7 * 24 * 3600, gt=0, description="how long a DELIVERED key suppresses duplicates"
    )
    inflight_buckets: int = Field(
        default=16, ge=1, le=1024, description="partitions of the sparse in-flight index"
    )
    ledger_concurrency: int = Field(
        default=32, ge=1, le=512, description="ledger calls in flight per process"
    )
    ledger_connect_timeout_s: int = Field(default=2, ge=1)
    ledger_read_timeout_s: int = Field(default=5, ge=1)
    ledger_max_retry_attempts: int = Field(
        default=3, ge=0, le=10, description="SDK retries of ledger calls (throttling, 5xx)"
    )

    @field_validator("dynamodb_endpoint_url")
    @classmethod
    def _dynamodb_endpoint_is_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"KEO_DYNAMODB_ENDPOINT_URL must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    def resolved_region(self) -> str:
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            return region
        if self.dynamodb_endpoint_url is not None:
            return "us-east-1"
        import boto3

        session_region = boto3.session.Session().region_name
        if session_region is None:
            raise ValueError(
                "no AWS region: set KEO_REGION or AWS_REGION (or a profile with a region)"
            )
        return session_region

    def ledger_connection(self) -> ConnectionOptions:
        key_id = secret = None
        if self.dynamodb_endpoint_url is not None and not os.environ.get("AWS_ACCESS_KEY_ID"):
            key_id, secret = _EMULATOR_CREDENTIALS
        return ConnectionOptions(
            table_name=self.table,
            region=self.resolved_region(),
            host=self.dynamodb_endpoint_url,
            connect_timeout_s=self.ledger_connect_timeout_s,
            read_timeout_s=self.ledger_read_timeout_s,
            max_retry_attempts=self.ledger_max_retry_attempts,
            max_pool_connections=max(self.ledger_concurrency, 10),
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )
