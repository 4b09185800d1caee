"""Typed operator settings: one object built from CLI flags and ``FENCEDLEASE_*`` environment.

The Helm chart sets the environment variables; the CLI flags override them. Every field has
the environment variable ``FENCEDLEASE_<FIELD_NAME_UPPER>``.
"""

from __future__ import annotations

import os
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StartupError(RuntimeError):
    """The process cannot start as configured: a user-facing message, never a traceback."""


_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_KEY = rf"(?:{_DNS}/)?{_NAME}"
_VALUE = rf"(?:{_NAME})?"
_REQUIREMENT = re.compile(
    rf"^(?:!?\s*{_KEY}|{_KEY}\s*(?:==?|!=)\s*{_VALUE}"
    rf"|{_KEY}\s*[<>]\s*[0-9]+"
    rf"|{_KEY}\s+(?:in|notin)\s*\(\s*{_VALUE}(?:\s*,\s*{_VALUE})*\s*\))$"
)


def label_selector_problem(selector: str) -> str | None:
    """Why ``selector`` is not a Kubernetes label selector string (``a=b,c!=d,e in (f,g),h,!i``),
    or ``None``. Checked at start-up so a typo fails the process with a message instead of
    every Pod watch request."""
    requirements: list[str] = []
    depth, start = 0, 0
    for i, char in enumerate(selector):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            requirements.append(selector[start:i])
            start = i + 1
        if depth not in (0, 1):
            return "unbalanced parentheses"
    requirements.append(selector[start:])
    if depth:
        return "unbalanced parentheses"
    for requirement in (r.strip() for r in requirements):
        if not _REQUIREMENT.match(requirement):
            return (
                f"{requirement!r} is not a label requirement (key, !key, key=value, "
                "key!=value, key in (v1,v2), key notin (v1,v2))"
            )
    return None


class Role(StrEnum):
    ALL = "all"  # reconciler + admission webhook in one process (local mode, small installs)
    CONTROLLER = "controller"  # FencedLease reconciler only
    WEBHOOK = "webhook"  # admission webhook only (standalone, several replicas)


class EventLoop(StrEnum):
    UVLOOP = "uvloop"  # libuv's loop (uvloop); the asyncio one when uvloop is not installed
    ASYNCIO = "asyncio"  # the standard library's


class WebhookRegistration(StrEnum):
    NONE = "none"  # the chart owns the webhook configuration
    URL = "url"  # local mode: register by URL with our own CA (like Kopf's self-registration)


class Settings(BaseModel):
    """Everything the operator process needs to know, validated once at start-up."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role = Role.ALL
    namespace: str | None = Field(
        default=None, description="Watch only this namespace (default: all namespaces)."
    )
    pod_selector: str | None = Field(
        default=None,
        description=(
            "Kubernetes label selector every candidate Pod carries (e.g. "
            "fencedlease.io/candidate=true): the controller lists and watches only the Pods "
            "it selects, server side. Other Pods are never candidates. Default: every Pod "
            '(docs/operations.md, "Scoping the Pod watch").'
        ),
    )
    etcd_endpoints: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:2379"])
    etcd_ca_file: Path | None = None
    etcd_cert_file: Path | None = None
    etcd_key_file: Path | None = None
    etcd_prefix: str = "/fencedlease"
    etcd_timeout_seconds: float = Field(default=5.0, gt=0)
    clock_skew_seconds: float = Field(
        default=1.0,
        ge=0,
        description="Bound on clock uncertainty subtracted from deadlines given to holders.",
    )
    token_retention_generations: int = Field(
        default=16,
        ge=1,
        description="Token records kept per lease: its last N generations (docs/tokens.md).",
    )
    deleted_lease_retention_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description="How long a deleted lease's token records and high-water mark stay "
        "(at least; at most twice this).",
    )
    metrics_port: int = Field(default=8080, ge=0, le=65535)
    health_port: int = Field(default=8081, ge=0, le=65535)
    kopf_liveness_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="Serve Kopf's liveness endpoint (/healthz, the same verdict as ours on "
        "health_port) on this port too; 0: not served.",
    )
    health_etcd_probe_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often the process reads etcd's revision when nothing else did "
        "(so /healthz and /readyz see etcd even when idle).",
    )
    health_etcd_liveness_seconds: float = Field(
        default=120.0,
        gt=0,
        description="/healthz fails once etcd round trips have failed, with none succeeding, "
        "for this long.",
    )
    health_etcd_readiness_seconds: float = Field(
        default=10.0,
        gt=0,
        description="The webhook's /readyz fails once etcd round trips have failed, with none "
        "succeeding, for this long (it cannot decide).",
    )
    health_scheduler_stall_seconds: float = Field(
        default=60.0,
        gt=0,
        description="/healthz fails once a controller scheduler has had work due this long "
        "without starting or finishing any run.",
    )
    health_watch_grace_seconds: float = Field(
        default=60.0,
        gt=0,
        description="/healthz fails once a controller watch showed no event, bookmark or "
        "reconnection for its client timeout plus this long.",
    )
    webhook_host: str = "0.0.0.0"
    webhook_port: int = Field(default=9443, ge=0, le=65535)
    webhook_cert_dir: Path | None = Field(
        default=None, description="Directory with tls.crt / tls.key (reloaded when renewed)."
    )
    webhook_timeout_seconds: int = Field(
        default=5,
        ge=1,
        le=30,
        description=(
            "The webhook configuration's timeoutSeconds: the API server's wait for an answer. "
            "The webhook answers unavailable before it (webhook.checker.check_budget)."
        ),
    )
    webhook_drain_seconds: float = Field(
        default=0.0,
        ge=0,
        le=60,
        description=(
            "A webhook-only process (role=webhook) told to stop (SIGTERM) answers /readyz 503 and "
            "keeps answering reviews this long, so the Service stops sending it reviews first; "
            "then reviews in flight get their bound and the process exits. The chart sets 5 s."
        ),
    )
    webhook_event_loop: EventLoop = Field(
        default=EventLoop.UVLOOP,
        description=(
            "The event loop of a webhook-only process (role=webhook): uvloop (6-9% less webhook "
            "CPU per review, 12% less per new TLS connection; docs/performance.md), or asyncio. "
            "Without uvloop installed: asyncio, with a warning. Other roles always run on "
            "asyncio."
        ),
    )
    webhook_registration: WebhookRegistration = WebhookRegistration.NONE
    webhook_url_host: str = "127.0.0.1"
    webhook_configuration_name: str = "fencedlease.io"
    webhook_guard: bool = Field(
        default=False,
        description=(
            "With webhook_registration=none (the chart owns the configuration): remember it "
            "at start-up and restore it, with a Warning Event, if it is deleted or altered."
        ),
    )
    allowed_writers: list[str] = Field(
        default_factory=list,
        description=(
            "Identities other than Pod-bound service-account tokens that may write artifacts "
            "with a valid token: usernames or group:NAME, comma-separated in the environment. "
            "Default: none (only the holder Pod itself may write)."
        ),
    )
    token_key_file: Path | None = Field(
        default=None,
        description=(
            "File with the key that signs lease statuses (the restore guard trusts only "
            "signed tokens). Unset: the Secret authority_secret in the operator's namespace, "
            "created on first start."
        ),
    )
    authority_secret: str = "fencedlease-authority"
    leader_election: bool = Field(
        default=True,
        description=(
            "Controller replicas elect one writer through a coordination.k8s.io Lease; the "
            "others keep their caches warm and write nothing (docs/operations.md)."
        ),
    )
    leader_election_name: str = "fencedlease-controller"
    leader_election_namespace: str | None = Field(
        default=None,
        description="Where the election Lease lives (default: the operator's own namespace).",
    )
    leader_election_identity: str | None = Field(
        default=None,
        description="This replica's holderIdentity (default: POD_NAME or the host name, pid "
        "and a random suffix, unique per process).",
    )
    leader_election_lease_duration_seconds: int = Field(
        default=5,
        ge=2,
        le=300,
        description="A standby takes over after the Lease went this long (plus the clock-skew "
        "bound) without renewal.",
    )
    leader_election_renew_deadline_seconds: float = Field(
        default=3.0,
        gt=0,
        description="The leader stops writing this long after its last successful renewal "
        "started (local monotonic clock); below the lease duration.",
    )
    leader_election_retry_period_seconds: float = Field(
        default=1.0, gt=0, description="Renewal and standby polling interval."
    )
    log_format: str = "plain"

    @model_validator(mode="after")
    def _election_timing(self) -> Settings:
        if not (
            self.leader_election_retry_period_seconds
            < self.leader_election_renew_deadline_seconds
            < self.leader_election_lease_duration_seconds
        ):
            raise ValueError(
                "leader election needs retry period < renew deadline < lease duration (got "
                f"{self.leader_election_retry_period_seconds}, "
                f"{self.leader_election_renew_deadline_seconds}, "
                f"{self.leader_election_lease_duration_seconds})"
            )
        return self

    @field_validator("pod_selector")
    @classmethod
    def _pod_selector(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        problem = label_selector_problem(value)
        if problem:
            raise ValueError(f"pod_selector {value!r}: {problem}")
        return value.strip()

    @field_validator("etcd_endpoints", "allowed_writers", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @classmethod
    def from_env(cls, overrides: dict[str, Any] | None = None) -> Settings:
        """Build settings from ``FENCEDLEASE_*`` environment variables, then ``overrides``."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            env = os.environ.get(f"FENCEDLEASE_{name.upper()}")
            if env is not None and env != "":
                values[name] = env
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.model_validate(values)
