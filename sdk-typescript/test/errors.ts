// Every bad-input row of the conformance list (conformance/scenarios.json,
// group "errors") through the TypeScript client, with its `code`.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client, OpenShellError } from "../src/index.js";
import { native } from "../src/native.js";
import { cluster, unique } from "./cluster.js";

async function code(promise: Promise<unknown>): Promise<OpenShellError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof OpenShellError, `not an OpenShellError: ${String(err)}`);
    return err;
  }
  assert.fail("the call succeeded");
}

describe("bad input", () => {
  let client: Client;
  let main: string;

  before(async () => {
    client = new Client({ endpoint: (await cluster()).endpoint });
    main = unique("ts-errors");
    await client.sandboxes.create({ name: main });
    await client.sandboxes.waitReady(main, { timeoutMs: 60_000 });
  });

  after(async () => {
    await client.sandboxes.delete(main).catch(() => {});
    await client.close();
  });

  test("create: bad name, bad env key (value not echoed), duplicate", async () => {
    assert.equal(
      (await code(client.sandboxes.create({ name: "Upper_Case" }))).code,
      "invalid_argument",
    );
    const env = await code(
      client.sandboxes.create({ name: "cf-bad-env", env: { "NOT-AN-ID": "s3cr3t-value" } }),
    );
    assert.equal(env.code, "invalid_argument");
    assert.ok(!env.message.includes("s3cr3t-value"));
    assert.equal((await code(client.sandboxes.create({ name: main }))).code, "already_exists");
  });

  test("get, delete, list", async () => {
    const missing = await code(client.sandboxes.get("cf-no-such-sandbox"));
    assert.equal(missing.code, "not_found");
    assert.equal(missing.grpcStatus, 5);
    assert.equal((await code(client.sandboxes.get(""))).code, "invalid_argument");
    assert.equal((await code(client.sandboxes.delete("cf-no-such-sandbox"))).code, "not_found");
    assert.equal(
      (await code(client.sandboxes.list({ labelSelector: "novalue" }))).code,
      "invalid_argument",
    );
  });

  test("raw ListSandboxes with a negative page size", async () => {
    // ListSandboxesRequest{page_size: -1}: field 1, varint, ten bytes.
    const request = Buffer.from([0x08, ...Array(9).fill(0xff), 0x01]);
    const err = await code(client.raw.unary("/openshell.v1.OpenShell/ListSandboxes", request));
    assert.equal(err.code, "invalid_argument");
  });

  test("raw ExecSandbox with an empty command", async () => {
    // ExecSandboxRequest{sandbox: main}: no command.
    const name = Buffer.from(main);
    const stream = await client.raw.stream("/openshell.v1.OpenShell/ExecSandbox");
    await stream.send(Buffer.concat([Buffer.from([0x0a, name.length]), name]));
    stream.closeSend();
    const err = await code(
      (async () => {
        for await (const _ of stream) {
          // no reply expected
        }
      })(),
    );
    assert.equal(err.code, "invalid_argument");
  });

  test("exec: missing sandbox, empty command, bad env key, oversized request", async () => {
    assert.equal((await code(client.exec("cf-no-such-sandbox", ["true"]))).code, "not_found");
    assert.equal((await code(client.exec(main, []))).code, "invalid_config");
    const env = await code(client.exec(main, ["true"], { env: { "1X": "hidden-value" } }));
    assert.equal(env.code, "invalid_argument");
    assert.ok(!env.message.includes("hidden-value"));
    const big = await code(client.exec(main, ["cat"], { stdin: Buffer.alloc(9 * 1024 * 1024) }));
    assert.ok(["resource_exhausted", "out_of_range"].includes(big.code), big.code);
  });

  test("raw ExecSandboxInteractive whose first message is not start", async () => {
    const stream = await client.raw.execSandboxInteractive();
    await stream.send({ payload: { case: "stdin", value: Buffer.from("hi") } });
    stream.closeSend();
    const err = await code(
      (async () => {
        for await (const _ of stream) {
          // no reply expected
        }
      })(),
    );
    assert.equal(err.code, "invalid_argument");
  });

  test("raw ForwardTcp: a port outside 1..65535, a missing sandbox", async () => {
    const cases: Array<[string, number, string]> = [
      [main, 70000, "invalid_argument"],
      ["cf-no-such-sandbox", 80, "not_found"],
    ];
    for (const [sandbox, port, expected] of cases) {
      const stream = await client.raw.forwardTcp();
      await stream.send({
        payload: {
          case: "init",
          value: { sandbox, target: { case: "tcp", value: { host: "127.0.0.1", port } } },
        },
      });
      const err = await code(
        (async () => {
          for await (const _ of stream) {
            // no reply expected
          }
        })(),
      );
      assert.equal(err.code, expected, `${sandbox}:${port}`);
    }
  });

  test("bad per-call options are OpenShellErrors with a code, not raw addon errors", async () => {
    const invalid = (err: OpenShellError) => {
      assert.equal(err.code, "invalid_config", err.message);
      assert.equal(err.grpcStatus, 3);
      assert.ok(!err.message.includes("openshell-error"), err.message);
    };
    invalid(await code(client.health({ timeoutMs: -1 })));
    invalid(await code(client.sandboxes.get(main, { timeoutMs: Number.NaN })));
    invalid(await code(client.sandboxes.delete(main, { timeoutMs: -5 })));
    invalid(await code(client.exec(main, ["true"], { execTimeoutMs: -1 })));
    invalid(await code(client.exec(main, ["true"], { outputLimit: 0.5 })));
    invalid(await code(client.execInteractive(main, ["true"], { execTimeoutMs: Infinity })));
    invalid(await code(client.forward(main, 80, { timeoutMs: -1 })));
    invalid(await code(client.sandboxes.watch(main, { timeoutMs: -1 })));
    const badMetadata = [["only-a-key"]] as unknown as Array<[string, string]>;
    invalid(
      await code(
        client.raw.unary("/openshell.v1.OpenShell/Health", new Uint8Array(), {
          metadata: badMetadata,
        }),
      ),
    );
    invalid(
      await code(
        client.raw.stream("/openshell.v1.OpenShell/WatchSandbox", { metadata: badMetadata }),
      ),
    );
    const stream = client.execStream(main, ["true"], { timeoutMs: -1 });
    invalid(await code(stream.collect()));
  });

  test("negative or fractional sizes are rejected, never wrapped", async () => {
    const invalid = (err: OpenShellError, what: string) => {
      assert.equal(err.code, "invalid_config", err.message);
      assert.ok(err.message.includes(what), err.message);
    };
    invalid(await code(client.sandboxes.list({ pageSize: -1 })), "pageSize");
    invalid(await code(client.sandboxes.list({ pageSize: 1.5 })), "pageSize");
    invalid(await code(client.exec(main, ["true"], { tty: { cols: -80, rows: 24 } })), "tty.cols");
    invalid(
      await code(client.execInteractive(main, ["true"], { tty: { cols: 80, rows: -1 } })),
      "tty.rows",
    );
    const shell = await client.execInteractive(main, ["cat"], { tty: { cols: 80, rows: 24 } });
    try {
      invalid(await code(shell.resize(-1, 24)), "cols");
      invalid(await code(shell.resize(80, 2 ** 32)), "rows");
      await shell.resize(100, 30);
    } finally {
      shell.cancel();
    }
  });

  test("per-call timeoutMs 0 means no deadline (as for the client)", async () => {
    await using strict = new Client({ endpoint: (await cluster()).endpoint, timeoutMs: 300 });
    // main is never deleted: waitDeleted ends only by a deadline or an abort.
    const expired = await code(strict.sandboxes.waitDeleted(main));
    assert.equal(expired.code, "deadline_exceeded");
    const controller = new AbortController();
    const started = performance.now();
    const timer = setTimeout(() => controller.abort(), 1500);
    const lifted = await code(
      strict.sandboxes.waitDeleted(main, { timeoutMs: 0, signal: controller.signal }),
    );
    clearTimeout(timer);
    // Past the client's 300 ms only because 0 lifted the deadline of this call.
    assert.equal(lifted.code, "cancelled");
    assert.ok(performance.now() - started >= 1400);
  });

  test("forward: no port", async () => {
    assert.equal((await code(client.forward(main, 0))).code, "invalid_config");
  });

  test("client: bad endpoint, unreachable endpoint", async () => {
    assert.throws(() => new Client({ endpoint: "ftp://127.0.0.1:1" }), { code: "invalid_config" });
    await using unreachable = new Client({ endpoint: "http://127.0.0.1:1" });
    const err = await code(unreachable.health());
    assert.equal(err.code, "connect");
    assert.equal(err.retryable, true);
  });

  test("a panic in the addon is a rejection, not a crash", async () => {
    await assert.rejects(
      (async () => {
        try {
          await native.panicForTest();
        } catch (err) {
          const { fromNative } = await import("../src/errors.js");
          throw fromNative(err);
        }
      })(),
      (err: unknown) => err instanceof OpenShellError && err.code === "panic",
    );
    assert.equal((await client.health()).status, "HEALTHY");
  });
});
