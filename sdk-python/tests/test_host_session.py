"""HostSession: a shared supervisor host's session.

Bad input is refused before any I/O; the token never shows. (The tests
against a real cluster in ``--driver hosts`` mode follow below.)
"""

from __future__ import annotations

import asyncio

import pytest

from openshell_sdk import (
    ConfigSnapshot,
    HostSession,
    InvalidConfigError,
    SyncHostSession,
)

SECRET = "host-token-that-must-never-show"


def noop(sandbox_id: str, snapshot: ConfigSnapshot) -> None:
    return None


@pytest.mark.parametrize("cls", [HostSession, SyncHostSession])
def test_bad_input_is_refused_before_any_io(cls: type[HostSession] | type[SyncHostSession]) -> None:
    endpoint = "http://127.0.0.1:1"
    with pytest.raises(InvalidConfigError) as empty:
        cls(endpoint, " ", SECRET, apply=noop, allow_cleartext_token=True)
    assert empty.value.code == "invalid_config"
    assert "member id" in str(empty.value)
    with pytest.raises(InvalidConfigError):
        cls(endpoint, "h-0", SECRET, apply=None, allow_cleartext_token=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError):
        cls("ftp://127.0.0.1:1", "h-0", SECRET, apply=noop)
    with pytest.raises(InvalidConfigError):
        cls(endpoint, "h-0", SECRET, apply=noop, capacity=-1, allow_cleartext_token=True)
    with pytest.raises(InvalidConfigError) as cleartext:
        # A token over plain http to a non-loopback host is refused unless allowed.
        cls("http://192.0.2.1:1", "h-0", SECRET, apply=noop)
    for err in (empty.value, cleartext.value):
        assert SECRET not in str(err) and SECRET not in repr(err)


async def test_the_token_never_shows_and_close_ends_an_unconnected_session() -> None:
    host = HostSession(
        "http://127.0.0.1:1",
        "h-7",
        SECRET,
        apply=noop,
        capacity=3,
        instance_id="inst-1",
        connect_timeout=0.2,
    )
    assert SECRET not in repr(host) and "h-7" in repr(host)
    assert host.member_id == "h-7" and host.instance_id == "inst-1"
    runner = asyncio.get_running_loop().create_task(host.run())
    await asyncio.sleep(0.3)
    stats = host.stats()
    assert stats.sessions_accepted == 0 and stats.session_id is None and stats.assigned == 0
    with pytest.raises(TimeoutError):
        await host.wait_accepted(timeout=0.2)
    runner.cancel()
    await asyncio.wait({runner}, timeout=10)
    assert runner.done() and host.closed
