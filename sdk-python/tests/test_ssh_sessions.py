"""SSH session tokens: issued and revoked by the curated calls, and a forward that
carries one, against a gateway that requires a user token (so a client holding
only the session token is the token-only caller the gateway scopes)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from conftest import TokenGateway, unique
from sandbox_server import sandbox_echo

import openshell_sdk as osdk
from openshell_sdk import AsyncClient, Client, SshSession


@pytest.fixture(scope="module")
def two_sandboxes(token_gateway: TokenGateway) -> Iterator[tuple[str, str]]:
    """Two READY sandboxes on the token gateway: the token's and another one."""
    names = (unique("py-ssh-a"), unique("py-ssh-b"))
    with Client(token_gateway.endpoint, token=token_gateway.token) as user:
        for name in names:
            user.sandboxes.create(name)
        for name in names:
            user.sandboxes.wait_ready(name, timeout=60)
        yield names
        for name in names:
            user.sandboxes.delete(name)


@pytest.fixture(scope="module")
def echo_port(token_gateway: TokenGateway, two_sandboxes: tuple[str, str]) -> Iterator[int]:
    """A port with a TCP echo server in both sandboxes (each has a network of
    its own): a refused forward is the token check's doing, not a closed port."""
    mine, other = two_sandboxes
    with (
        Client(token_gateway.endpoint, token=token_gateway.token) as user,
        sandbox_echo(user, mine) as port,
        sandbox_echo(user, other, port),
    ):
        yield port


def echoes(address: tuple[str, int]) -> bool:
    """Whether a connection to the forward gets its bytes back (a refused
    stream closes the connection instead)."""
    with socket.create_connection(address, timeout=20) as conn:
        conn.settimeout(20)
        try:
            conn.sendall(b"ping")
            return conn.recv(16) == b"ping"
        except OSError:
            return False


def refused(forward: osdk.SyncForward) -> bool:
    """The connection was closed without an echo and counted as failed."""
    if echoes(forward.local_address):
        return False
    deadline = time.monotonic() + 10
    while forward.stats().connections_failed < 1:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_session_token_alone_forwards_to_its_sandbox_until_revoked(
    token_gateway: TokenGateway, two_sandboxes: tuple[str, str], echo_port: int
) -> None:
    mine, other = two_sandboxes
    with (
        Client(token_gateway.endpoint, token=token_gateway.token) as user,
        Client(token_gateway.endpoint) as anonymous,
    ):
        before = datetime.now(UTC)
        session = user.create_ssh_session(mine)
        assert isinstance(session, SshSession)
        assert session.sandbox_id == user.sandboxes.get(mine).id
        assert session.token
        assert session.gateway_scheme == "http"
        assert session.gateway_host == "127.0.0.1"
        assert session.gateway_port == int(token_gateway.endpoint.rsplit(":", 1)[1])
        assert session.host_key_fingerprint.startswith("SHA256:")
        # The gateway's default TTL (a day).
        assert session.expires_at is not None
        assert before < session.expires_at < before + timedelta(days=2)

        # Without the session token a token-less client may not forward.
        with anonymous.forward(mine, echo_port) as plain:
            assert refused(plain)
        with anonymous.forward(mine, echo_port, ssh_session_token=session.token) as fwd:
            assert echoes(fwd.local_address)
            assert fwd.stats().connections_failed == 0
        # Another sandbox: refused for the token-only caller and for a user alike.
        with anonymous.forward(other, echo_port, ssh_session_token=session.token) as fwd:
            assert refused(fwd)
        with user.forward(other, echo_port, ssh_session_token=session.token) as fwd:
            assert refused(fwd)

        assert user.revoke_ssh_session(session) is True
        assert user.revoke_ssh_session(session.token) is False, "revoking is idempotent"
        with anonymous.forward(mine, echo_port, ssh_session_token=session.token) as fwd:
            assert refused(fwd)


async def test_the_async_client_issues_and_revokes(
    token_gateway: TokenGateway, two_sandboxes: tuple[str, str], echo_port: int
) -> None:
    mine, _ = two_sandboxes
    async with (
        AsyncClient(token_gateway.endpoint, token=token_gateway.token) as user,
        AsyncClient(token_gateway.endpoint) as anonymous,
    ):
        session = await user.create_ssh_session(mine)
        async with await anonymous.forward(mine, echo_port, ssh_session_token=session.token) as fwd:
            ok = await asyncio.to_thread(echoes, fwd.local_address)
            assert ok
        assert await user.revoke_ssh_session(session.token) is True
        assert await user.revoke_ssh_session(session) is False
        # A token-only client cannot issue or revoke tokens.
        with pytest.raises(osdk.UnauthenticatedError):
            await anonymous.create_ssh_session(mine)


def test_the_token_is_never_shown(
    token_gateway: TokenGateway,
    two_sandboxes: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    mine, _ = two_sandboxes
    with Client(token_gateway.endpoint, token=token_gateway.token) as user:
        session = user.create_ssh_session(mine)
        try:
            for text in (repr(session), str(session), f"{session}", f"{session!r}"):
                assert session.token not in text
                assert session.sandbox_id in text
            logging.getLogger("test").warning("session %s", session)
            assert session.token not in caplog.text
            # Frozen: the token cannot be swapped on a session.
            with pytest.raises(AttributeError):
                session.token = "x"  # type: ignore[misc]
        finally:
            user.revoke_ssh_session(session)


def test_bad_input_gets_the_right_error(
    token_gateway: TokenGateway, two_sandboxes: tuple[str, str]
) -> None:
    mine, _ = two_sandboxes
    with Client(token_gateway.endpoint, token=token_gateway.token) as user:
        with pytest.raises(osdk.InvalidArgumentError) as info:
            user.create_ssh_session("")
        assert info.value.code == "invalid_argument"
        assert info.value.grpc_status == osdk.GrpcStatus.INVALID_ARGUMENT
        with pytest.raises(osdk.NotFoundError):
            user.create_ssh_session(unique("py-no-such"))
        with pytest.raises(osdk.InvalidArgumentError):
            user.revoke_ssh_session("")
        assert user.revoke_ssh_session("not-a-token") is False
        # A negative or zero timeout is refused in the client, before any call.
        for timeout in (-1.0, 0.0):
            with pytest.raises(osdk.InvalidConfigError) as bad:
                user.create_ssh_session(mine, timeout=timeout)
            assert bad.value.code == "invalid_config"
