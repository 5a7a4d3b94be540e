"""Tokens, token providers and configuration errors (a gateway that requires a token)."""

from __future__ import annotations

import asyncio
import pickle
import threading

import pytest
from conftest import TokenGateway

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, Client


def test_a_token_is_required(token_gateway: TokenGateway) -> None:
    with Client(token_gateway.endpoint) as anonymous:
        with pytest.raises(osdk.UnauthenticatedError) as info:
            anonymous.sandboxes.list()
        assert info.value.code == "unauthenticated"
        assert info.value.grpc_status == osdk.GrpcStatus.UNAUTHENTICATED
    with Client(token_gateway.endpoint, token="wrong-token") as wrong:
        with pytest.raises(osdk.UnauthenticatedError) as info:
            wrong.sandboxes.list()
        assert "wrong-token" not in str(info.value)
    with Client(token_gateway.endpoint, token=token_gateway.token) as right:
        assert right.sandboxes.list() == []


def test_a_sync_token_provider_is_refreshed_after_a_rejection(
    token_gateway: TokenGateway,
) -> None:
    calls: list[bool] = []
    lock = threading.Lock()

    def provider(force_refresh: bool) -> str:
        with lock:
            calls.append(force_refresh)
            # The first token is stale; a forced refresh gets the real one.
            return token_gateway.token if force_refresh else "stale-token"

    with Client(token_gateway.endpoint, token_provider=provider) as client:
        assert client.sandboxes.list() == []
        assert client.sandboxes.list() == []
    assert calls == [False, True]


async def test_an_async_token_provider_runs_on_the_callers_loop(
    token_gateway: TokenGateway,
) -> None:
    loop = asyncio.get_running_loop()
    seen: list[bool] = []

    async def provider(force_refresh: bool) -> tuple[str, float]:
        seen.append(asyncio.get_running_loop() is loop)
        await asyncio.sleep(0.01)
        return token_gateway.token, 300.0

    async with AsyncClient(token_gateway.endpoint, token_provider=provider) as client:
        results = await asyncio.gather(*(client.sandboxes.list() for _ in range(10)))
    assert all(r == [] for r in results)
    # Single flight: one provider call served every concurrent caller.
    assert seen == [True]


def test_a_failing_provider_is_an_auth_error(token_gateway: TokenGateway) -> None:
    class Unavailable(Exception):
        retryable = True

    def provider(force_refresh: bool) -> str:
        raise Unavailable("vault is down")

    with (
        Client(token_gateway.endpoint, token_provider=provider) as client,
        pytest.raises(osdk.AuthError) as info,
    ):
        client.sandboxes.list()
    assert info.value.code == "auth" and info.value.retryable
    assert "vault is down" in str(info.value)


def test_configuration_errors_are_raised_before_any_io() -> None:
    for kwargs in (
        {"endpoint": "ftp://127.0.0.1:1"},
        {"endpoint": "127.0.0.1:1"},
        {"endpoint": "http://127.0.0.1:1", "ca_pem": b"not a pem"},
        {"endpoint": "http://127.0.0.1:1", "token": "t", "token_provider": lambda f: "t"},
        {"endpoint": "http://10.1.2.3:1", "token": "t"},
        {"endpoint": "http://127.0.0.1:1", "timeout": -1.0},
    ):
        with pytest.raises(osdk.InvalidConfigError) as info:
            Client(**kwargs)  # type: ignore[arg-type]
        assert info.value.code == "invalid_config", kwargs


def test_an_unreachable_endpoint_is_a_connect_error() -> None:
    with (
        Client("http://127.0.0.1:1", connect_timeout=1) as client,
        pytest.raises(osdk.ConnectError) as info,
    ):
        client.health()
    assert info.value.retryable and info.value.grpc_status == osdk.GrpcStatus.UNAVAILABLE
    with pytest.raises(osdk.ConnectError):
        Client.connect("http://127.0.0.1:1", connect_timeout=1)


def test_errors_pickle_and_have_one_base() -> None:
    err = osdk.errors._from_native(
        "not_found", "no sandbox x", 5, False, [("x-openshell-served-by", "gw-1")]
    )
    assert isinstance(err, osdk.NotFoundError) and isinstance(err, osdk.OpenShellError)
    assert str(err) == "not_found: no sandbox x"
    assert err.served_by == "gw-1"
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is osdk.NotFoundError
    assert (copy.code, copy.grpc_status, copy.metadata) == (err.code, err.grpc_status, err.metadata)
    unknown = osdk.errors._from_native("something_new", "m", 2, False, [])
    assert type(unknown) is osdk.OpenShellError and unknown.code == "something_new"


def test_exec_rejects_a_string_command(client: Client, ready_sandbox: str) -> None:
    with pytest.raises(TypeError):
        client.exec(ready_sandbox, "echo hi")  # type: ignore[arg-type]
