// SSH session tokens (client.sshSessions) and a forward that carries one,
// against a replica that requires a user token: a client with no token and
// only the session token is the token-only caller the gateway scopes.
import assert from "node:assert/strict";
import { connect } from "node:net";
import { after, before, describe, test } from "node:test";
import { inspect } from "node:util";
import {
  Client,
  type Forward,
  InvalidArgumentError,
  InvalidConfigError,
  NotFoundError,
  SshSession,
  UnauthenticatedError,
} from "../src/index.js";
import { type TokenGateway, tokenGateway, unique, until } from "./cluster.js";
import { type SandboxServer, startSandboxServer } from "./sandbox-server.js";

/** Whether a connection to the forward gets its bytes back (a refused
 * stream closes the connection instead). */
function echoes(fwd: Forward): Promise<boolean> {
  const { address, port } = fwd.localAddress;
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const socket = connect(port, address, () => socket.end("ping"));
    socket.setTimeout(20_000, () => socket.destroy());
    socket.on("data", (d: Buffer) => chunks.push(d));
    socket.on("close", () => resolve(Buffer.concat(chunks).toString() === "ping"));
    socket.on("error", () => {});
  });
}

/** The connection was closed without an echo and counted as failed. */
async function refused(fwd: Forward): Promise<boolean> {
  if (await echoes(fwd)) return false;
  await until("a failed connection", () => fwd.stats().connectionsFailed >= 1n, 10_000);
  return true;
}

describe("ssh sessions", () => {
  let gateway: TokenGateway;
  let user: Client;
  let anonymous: Client;
  // An echo server in each sandbox, so a refused forward is the token's
  // doing, not a port where nothing listens.
  const echo = new Map<string, SandboxServer>();
  const echoPort = (name: string) => (echo.get(name) as SandboxServer).port;
  const mine = unique("node-ssh-a");
  const other = unique("node-ssh-b");

  before(async () => {
    gateway = await tokenGateway();
    user = new Client({ endpoint: gateway.endpoint, token: gateway.token });
    anonymous = new Client({ endpoint: gateway.endpoint });
    for (const name of [mine, other]) await user.sandboxes.create({ name });
    for (const name of [mine, other]) await user.sandboxes.waitReady(name, { timeoutMs: 60_000 });
    for (const name of [mine, other]) echo.set(name, await startSandboxServer(user, name));
  });

  after(async () => {
    for (const server of echo.values()) await server.stop().catch(() => {});
    for (const name of [mine, other]) await user.sandboxes.delete(name).catch(() => {});
    await user.close();
    await anonymous.close();
    await gateway.close();
  });

  test("a session token alone forwards to its sandbox until revoked", async () => {
    const before = Date.now();
    const session = await user.sshSessions.create(mine);
    assert.ok(session instanceof SshSession);
    assert.equal(session.sandboxId, (await user.sandboxes.get(mine)).id);
    assert.ok(session.token.length > 0);
    assert.equal(session.gatewayScheme, "http");
    assert.equal(session.gatewayHost, "127.0.0.1");
    assert.equal(session.gatewayPort, Number(new URL(gateway.endpoint).port));
    assert.match(session.hostKeyFingerprint, /^SHA256:/);
    // The gateway's default TTL: a day.
    assert.ok(session.expiresAt instanceof Date);
    const ttl = session.expiresAt.getTime() - before;
    assert.ok(ttl > 0 && ttl < 2 * 24 * 3600_000, `expires in ${ttl} ms`);

    // Without a session token a token-less client may not forward.
    const plain = await anonymous.forward(mine, echoPort(mine));
    assert.ok(await refused(plain));
    await plain.close();
    const fwd = await anonymous.forward(mine, echoPort(mine), { sshSessionToken: session.token });
    assert.ok(await echoes(fwd));
    assert.equal(fwd.stats().connectionsFailed, 0n);
    await fwd.close();
    // Another sandbox: refused for the token-only caller and for a user alike.
    for (const client of [anonymous, user]) {
      const wrong = await client.forward(other, echoPort(other), {
        sshSessionToken: session.token,
      });
      assert.ok(await refused(wrong));
      await wrong.close();
    }

    assert.equal(await user.sshSessions.revoke(session), true);
    assert.equal(await user.sshSessions.revoke(session.token), false, "idempotent");
    const revoked = await anonymous.forward(mine, echoPort(mine), {
      sshSessionToken: session.token,
    });
    assert.ok(await refused(revoked));
    await revoked.close();
    // A token-only client cannot issue tokens.
    await assert.rejects(anonymous.sshSessions.create(mine), UnauthenticatedError);
  });

  test("inspect, console and JSON never show the token", async () => {
    const session = await user.sshSessions.create(mine);
    try {
      const texts = [
        inspect(session),
        inspect(session, { showHidden: true, depth: null }),
        inspect({ nested: [session] }, { depth: null }),
        JSON.stringify(session),
        JSON.stringify({ session }),
        String(session),
        `${session}`,
        JSON.stringify({ ...session }),
        JSON.stringify(Object.entries(session)),
      ];
      for (const text of texts) {
        assert.ok(!text.includes(session.token), text);
      }
      assert.ok(inspect(session).includes(session.sandboxId));
      assert.ok(inspect(session).includes("<redacted>"));
      assert.equal(JSON.parse(JSON.stringify(session)).sandboxId, session.sandboxId);
      assert.ok(Object.isFrozen(session));
    } finally {
      await user.sshSessions.revoke(session);
    }
  });

  test("bad input gets the right error", async () => {
    await assert.rejects(user.sshSessions.create(""), (err: unknown) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.equal(err.code, "invalid_argument");
      return true;
    });
    await assert.rejects(user.sshSessions.create(unique("node-no-such")), NotFoundError);
    await assert.rejects(user.sshSessions.revoke(""), InvalidArgumentError);
    assert.equal(await user.sshSessions.revoke("not-a-token"), false);
    // A negative timeout is refused in the client, before any call.
    await assert.rejects(user.sshSessions.create(mine, { timeoutMs: -1 }), (err: unknown) => {
      assert.ok(err instanceof InvalidConfigError);
      assert.equal(err.code, "invalid_config");
      return true;
    });
  });
});
