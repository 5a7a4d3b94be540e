"""Observation values (README: "Observations"): errors and byte outputs."""

from __future__ import annotations

from typing import Any

from openshell_sdk import OpenShellError, errors

# Longest text a field reports; ``<field>_bytes`` always has the full length.
TEXT_LIMIT = 4096


def error_observation(err: OpenShellError) -> dict[str, Any]:
    """The SDK error as reported; ``class`` and ``class_for_code`` let the
    harness check that each code raises its own exception class."""
    return {
        "code": err.code,
        "grpc_status": int(err.grpc_status),
        "message": str(err),
        "retryable": err.retryable,
        "served_by": err.served_by,
        "class": type(err).__name__,
        "class_for_code": errors.error_class(err.code).__name__,
    }


def text(field: str, data: bytes | str) -> dict[str, Any]:
    """``<field>`` (lossy UTF-8, cut at TEXT_LIMIT bytes) and ``<field>_bytes``."""
    raw = data.encode() if isinstance(data, str) else bytes(data)
    return {
        field: raw[:TEXT_LIMIT].decode(errors="replace"),
        f"{field}_bytes": len(raw),
    }
