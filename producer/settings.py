"""Settings of the producer, reconciler and audit, validated at start.

Every invalid combination fails with a message that names the setting by its environment
variable, e.g. a lease too short to outlive a put.
"""

from __future__ import annotations

import os
from typing import Self

from pydantic import Field, field_validator, model_validator

from dedupe_store.settings import LedgerSettings
from producer.protocol import LeasePolicy


class ProducerSettings(LedgerSettings):
    stream: str = Field(
        default="keo-stream",
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Kinesis data stream",
    )
    kinesis_endpoint_url: str | None = Field(
        default=None, description="Kinesis endpoint; unset means the AWS default (real AWS)"
    )
    put_connect_timeout_s: float = Field(default=2.0, gt=0, le=60)
    put_read_timeout_s: float = Field(default=5.0, gt=0, le=120)
    clock_skew_s: float = Field(default=5.0, ge=0, le=300)
    lease_s: float = Field(default=60.0, gt=0, le=3600)
    put_max_attempts: int = Field(
        default=8, ge=1, le=50, description="our retries of records definitely not written"
    )
    wait_initial_s: float = Field(default=0.1, gt=0)
    wait_max_s: float = Field(default=5.0, gt=0)
    max_record_bytes: int | None = Field(
        default=None, gt=0, description="override the stream's max record size (1 MiB default)"
    )
    store_payload: bool = Field(
        default=False, description="keep small payloads in the claim so the reconciler can resend"
    )
    store_payload_max_bytes: int = Field(default=4096, ge=0, le=350_000)
    owner: str | None = Field(default=None, description="producer identity in claims")
    aggregate: bool = Field(
        default=False, description="pack user records per shard into KPL aggregates"
    )

    @field_validator("kinesis_endpoint_url")
    @classmethod
    def _kinesis_endpoint_is_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"KEO_KINESIS_ENDPOINT_URL must be an http(s) URL, got {value!r}")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _lease_outlives_a_put(self) -> Self:
        minimum_s = self.put_connect_timeout_s + self.put_read_timeout_s + 2 * self.clock_skew_s
        if self.lease_s < minimum_s:
            raise ValueError(
                f"KEO_LEASE_S={self.lease_s:g} is too short: a put may still land up to "
                f"KEO_PUT_CONNECT_TIMEOUT_S + KEO_PUT_READ_TIMEOUT_S + 2 x KEO_CLOCK_SKEW_S "
                f"= {minimum_s:g} s after it was sent; raise the lease or lower the timeouts"
            )
        if self.wait_max_s < self.wait_initial_s:
            raise ValueError("KEO_WAIT_MAX_S must be >= KEO_WAIT_INITIAL_S")
        return self

    def lease_policy(self) -> LeasePolicy:
        return LeasePolicy(
            lease_ms=round(self.lease_s * 1000),
            put_timeout_ms=round((self.put_connect_timeout_s + self.put_read_timeout_s) * 1000),
            skew_ms=round(self.clock_skew_s * 1000),
        )

    def kinesis_region(self) -> str:
        return self.resolved_region()

    def emulator_credentials(self) -> tuple[str, str] | None:
        """Dummy credentials for an emulator when the environment has none."""
        if self.kinesis_endpoint_url is None or os.environ.get("AWS_ACCESS_KEY_ID"):
            return None
        return ("keo-local", "keo-local")
