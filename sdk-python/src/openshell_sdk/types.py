"""Result types of the curated API: frozen dataclasses over the wire messages."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ._proto import openshell_pb2 as pb

__all__ = [
    "DeletionOutcome",
    "ExecEvent",
    "ExecExit",
    "ExecResult",
    "ExecStderr",
    "ExecStdout",
    "ForwardStats",
    "Health",
    "LogEvent",
    "LogLine",
    "Logs",
    "RoutingStats",
    "Sandbox",
    "SandboxEvent",
    "SandboxPhase",
    "ServiceStatus",
    "SshSession",
    "TransferProgress",
    "TransferSummary",
    "WatchEvent",
]


class SandboxPhase(enum.Enum):
    """Lifecycle phase of a sandbox."""

    UNSPECIFIED = pb.SANDBOX_PHASE_UNSPECIFIED
    PROVISIONING = pb.SANDBOX_PHASE_PROVISIONING
    READY = pb.SANDBOX_PHASE_READY
    ERROR = pb.SANDBOX_PHASE_ERROR
    DELETING = pb.SANDBOX_PHASE_DELETING
    UNKNOWN = pb.SANDBOX_PHASE_UNKNOWN
    STOPPING = pb.SANDBOX_PHASE_STOPPING
    STOPPED = pb.SANDBOX_PHASE_STOPPED
    STARTING = pb.SANDBOX_PHASE_STARTING
    COMPLETED = pb.SANDBOX_PHASE_COMPLETED

    @classmethod
    def of(cls, value: int) -> SandboxPhase:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


class ServiceStatus(enum.Enum):
    """What ``Health`` reports."""

    UNSPECIFIED = pb.SERVICE_STATUS_UNSPECIFIED
    HEALTHY = pb.SERVICE_STATUS_HEALTHY
    DEGRADED = pb.SERVICE_STATUS_DEGRADED
    UNHEALTHY = pb.SERVICE_STATUS_UNHEALTHY


class DeletionOutcome(enum.Enum):
    """What ``DeleteSandbox`` answered."""

    UNSPECIFIED = pb.DELETION_OUTCOME_UNSPECIFIED
    COMPLETED = pb.DELETION_OUTCOME_COMPLETED
    ACCEPTED = pb.DELETION_OUTCOME_ACCEPTED
    ALREADY_ABSENT = pb.DELETION_OUTCOME_ALREADY_ABSENT


@dataclass(frozen=True)
class Health:
    """Liveness of the replica that answered."""

    status: ServiceStatus
    version: str
    served_by: str | None


@dataclass(frozen=True, repr=False)
class Sandbox:
    """A sandbox as the gateway reported it; the full message is ``proto``.

    ``repr`` leaves the spec out: its environment may hold secrets.
    """

    id: str
    name: str
    phase: SandboxPhase
    labels: Mapping[str, str]
    exit_code: int | None
    resource_version: int
    proto: pb.Sandbox = field(compare=False)

    @classmethod
    def from_proto(cls, message: pb.Sandbox) -> Sandbox:
        status = message.status
        return cls(
            id=message.metadata.id,
            name=message.metadata.name,
            phase=SandboxPhase.of(status.phase),
            labels=dict(message.metadata.labels),
            exit_code=status.exit_code if status.HasField("exit_code") else None,
            resource_version=message.metadata.resource_version,
            proto=message,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Sandbox:
        return cls.from_proto(pb.Sandbox.FromString(data))

    @property
    def is_ready(self) -> bool:
        return self.phase is SandboxPhase.READY

    def __repr__(self) -> str:
        return (
            f"Sandbox(name={self.name!r}, id={self.id!r}, phase={self.phase.name}, "
            f"labels={dict(self.labels)!r}, exit_code={self.exit_code!r})"
        )


@dataclass(frozen=True, repr=False)
class ExecResult:
    """What a buffered exec collected. ``repr`` shows sizes, not output."""

    stdout: bytes
    stderr: bytes
    exit_code: int

    @property
    def success(self) -> bool:
        return self.exit_code == 0

    @property
    def stdout_text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (
            f"ExecResult(exit_code={self.exit_code}, stdout=<{len(self.stdout)} bytes>, "
            f"stderr=<{len(self.stderr)} bytes>)"
        )


@dataclass(frozen=True)
class ExecStdout:
    """A chunk of stdout."""

    data: bytes


@dataclass(frozen=True)
class ExecStderr:
    """A chunk of stderr."""

    data: bytes


@dataclass(frozen=True)
class ExecExit:
    """The process ended: always the last event (signals are 128+n, a timeout 124)."""

    exit_code: int


ExecEvent = ExecStdout | ExecStderr | ExecExit


@dataclass(frozen=True)
class ForwardStats:
    """Counters of a forward."""

    connections_accepted: int
    connections_active: int
    connections_failed: int
    bytes_in: int
    bytes_out: int


@dataclass(frozen=True)
class RoutingStats:
    """Owner-routing counters of a client (shared by every call it made)."""

    hinted: int
    unhinted: int
    unrouted_retries: int
    owner_lookups: int
    cache_hits: int


@dataclass(frozen=True)
class SshSession:
    """An SSH session token for one sandbox, as ``CreateSshSession`` issued it.

    ``token`` is a secret: it lets whoever holds it forward to this sandbox
    (``forward(..., ssh_session_token=session.token)``) without a user token,
    until ``expires_at`` or a revoke. ``repr`` (and so ``str``, logging and
    tracebacks) leaves it out. Pin ``host_key_fingerprint`` (OpenSSH's
    ``SHA256:`` form; empty until the supervisor reports one) as the sandbox's
    host key.
    """

    sandbox_id: str
    token: str = field(repr=False)
    host_key_fingerprint: str
    expires_at: datetime | None
    """When the token stops working (UTC); ``None``: only a revoke ends it."""
    gateway_host: str
    gateway_port: int
    gateway_scheme: str
    """``http`` or ``https``."""


@dataclass(frozen=True)
class TransferSummary:
    """What a file transfer did."""

    files: int
    """Regular files written."""
    directories: int
    """Directories created (or found) in a tree."""
    symlinks: int
    """Symlinks recreated (their target stays inside the tree)."""
    skipped_symlinks: int
    """Symlinks left out: their target leaves the tree."""
    ignored: int
    """Entries left out by the ignore files (a directory counts once)."""
    skipped_other: int
    """Other entries left out (sockets, devices, fifos)."""
    bytes: int
    """File bytes moved."""


@dataclass(frozen=True)
class TransferProgress:
    """Where a transfer stands, as its ``progress`` callback receives it."""

    bytes_done: int
    """File bytes moved so far."""
    bytes_total: int
    """File bytes the transfer moves in all (for a file object: written so far)."""
    files_done: int
    """Files completed (renamed into place)."""
    files_total: int
    """Files the transfer moves in all."""
    current: str
    """The file being moved (its destination path), or the last one."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LogLine:
    """One log line the gateway recorded about a sandbox.

    ``str(line)`` is the core's one-line form, the same in every language:
    ``2026-12-04T05:01:02.345Z INFO  sandbox exec finished exit_code=0``.
    """

    time: datetime | None
    """When it was written (UTC, the writer's clock)."""
    level: str
    """``TRACE``, ``DEBUG``, ``INFO``, ``WARN`` or ``ERROR``."""
    source: str
    """``"gateway"`` or ``"sandbox"`` (its supervisor)."""
    target: str
    """What wrote it (a module path)."""
    message: str
    fields: Mapping[str, str]
    """Structured fields (for example ``exit_code``)."""

    @classmethod
    def _from_wire(cls, wire: tuple[int | None, str, str, str, str, dict[str, str]]) -> LogLine:
        time_us, level, source, target, message, fields = wire
        time = None if time_us is None else _EPOCH + timedelta(microseconds=time_us)
        return cls(time, level, source, target, message, fields)

    def __str__(self) -> str:
        if self.time is None:
            when = "-"
        else:
            when = (
                self.time.strftime("%Y-%m-%dT%H:%M:%S.") + f"{self.time.microsecond // 1000:03d}Z"
            )
        text = f"{when} {self.level:<5} {self.source:<7} {self.message}"
        return text + "".join(f" {key}={self.fields[key]}" for key in sorted(self.fields))


@dataclass(frozen=True)
class Logs:
    """What ``client.sandboxes.logs`` returns."""

    lines: list[LogLine]
    """Oldest first."""
    buffer_total: int
    """Lines the gateway holds for the sandbox (before the query's filters)."""


@dataclass(frozen=True)
class SandboxEvent:
    """A watch's status event: the sandbox as it is now (the first event of a
    watch without a cursor) or as a change made it."""

    sandbox: Sandbox
    cursor: str
    """Pass it as ``resume_after`` to get exactly the events that followed."""


@dataclass(frozen=True)
class LogEvent:
    """A watch's log event: one recorded line."""

    line: LogLine
    cursor: str
    """Pass it as ``resume_after`` to get exactly the events that followed."""


WatchEvent = SandboxEvent | LogEvent
