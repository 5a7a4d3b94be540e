// Tokens and token providers against a replica that requires a token.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  AuthError,
  Client,
  ConnectError,
  GrpcStatus,
  InvalidConfigError,
  UnauthenticatedError,
} from "../src/index.js";
import { type TokenGateway, tokenGateway } from "./cluster.js";

describe("auth and configuration", () => {
  let gateway: TokenGateway;

  before(async () => {
    gateway = await tokenGateway();
  });

  after(async () => {
    await gateway.close();
  });

  test("a token is required; a wrong one is not echoed", async () => {
    await using anonymous = new Client({ endpoint: gateway.endpoint });
    await assert.rejects(anonymous.sandboxes.list(), (err: unknown) => {
      assert.ok(err instanceof UnauthenticatedError);
      assert.equal(err.code, "unauthenticated");
      assert.equal(err.grpcStatus, GrpcStatus.UNAUTHENTICATED);
      return true;
    });
    await using wrong = new Client({ endpoint: gateway.endpoint, token: "wrong-token" });
    await assert.rejects(wrong.sandboxes.list(), (err: unknown) => {
      assert.ok(err instanceof UnauthenticatedError);
      assert.ok(!String(err.message).includes("wrong-token"));
      return true;
    });
    await using right = new Client({ endpoint: gateway.endpoint, token: gateway.token });
    assert.deepEqual(await right.sandboxes.list(), []);
  });

  test("token provider: single flight across concurrent calls", async () => {
    let calls = 0;
    const provider = async () => {
      calls += 1;
      await new Promise((resolve) => setTimeout(resolve, 50));
      return { token: gateway.token, expiresInMs: 300_000 };
    };
    await using client = new Client({ endpoint: gateway.endpoint, tokenProvider: provider });
    const results = await Promise.all(Array.from({ length: 20 }, () => client.sandboxes.list()));
    assert.ok(results.every((r) => r.length === 0));
    assert.equal(calls, 1);
  });

  test("token provider: refreshed after a rejection", async () => {
    const calls: boolean[] = [];
    await using client = new Client({
      endpoint: gateway.endpoint,
      tokenProvider: ({ forceRefresh }) => {
        calls.push(forceRefresh);
        return forceRefresh ? gateway.token : "stale-token";
      },
    });
    assert.deepEqual(await client.sandboxes.list(), []);
    assert.deepEqual(await client.sandboxes.list(), []);
    assert.deepEqual(calls, [false, true]);
  });

  test("a failing provider is an auth error", async () => {
    await using client = new Client({
      endpoint: gateway.endpoint,
      tokenProvider: () => {
        throw Object.assign(new Error("vault is down"), { retryable: true });
      },
    });
    await assert.rejects(client.sandboxes.list(), (err: unknown) => {
      assert.ok(err instanceof AuthError);
      assert.equal(err.code, "auth");
      assert.equal(err.retryable, true);
      assert.match(err.message, /vault is down/);
      return true;
    });
  });

  test("configuration errors are thrown before any I/O", () => {
    const bad = [
      { endpoint: "ftp://127.0.0.1:1" },
      { endpoint: "127.0.0.1:1" },
      { endpoint: "http://127.0.0.1:1", ca: "not a pem" },
      { endpoint: "http://127.0.0.1:1", token: "t", tokenProvider: () => "t" },
      { endpoint: "http://10.1.2.3:1", token: "t" },
      { endpoint: "http://127.0.0.1:1", timeoutMs: -1 },
      { endpoint: "" },
    ];
    for (const options of bad) {
      assert.throws(
        () => new Client(options),
        (err: unknown) => err instanceof InvalidConfigError && err.code === "invalid_config",
        JSON.stringify(options),
      );
    }
  });

  test("an unreachable endpoint is a retryable connect error", async () => {
    await using client = new Client({ endpoint: "http://127.0.0.1:1", connectTimeoutMs: 1000 });
    await assert.rejects(client.health(), (err: unknown) => {
      assert.ok(err instanceof ConnectError);
      assert.equal(err.retryable, true);
      assert.equal(err.grpcStatus, GrpcStatus.UNAVAILABLE);
      return true;
    });
  });

  test("fromEnv reads OPENSHELL_ENDPOINT", async () => {
    const saved = process.env.OPENSHELL_ENDPOINT;
    process.env.OPENSHELL_ENDPOINT = gateway.endpoint;
    try {
      await using client = Client.fromEnv({ token: gateway.token });
      assert.equal(client.endpoint.replace(/\/$/, ""), gateway.endpoint);
      assert.deepEqual(await client.sandboxes.list(), []);
    } finally {
      if (saved === undefined) delete process.env.OPENSHELL_ENDPOINT;
      else process.env.OPENSHELL_ENDPOINT = saved;
    }
  });
});
