// Aborting and breaking out of calls reaches the sandbox: the gateway
// kills the process group of a cancelled command.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { CancelledError, Client, DeadlineExceededError, OpenShellError } from "../src/index.js";
import { cluster, markedPids, unique, until } from "./cluster.js";

describe("cancellation", () => {
  let client: Client;
  let name: string;

  before(async () => {
    client = new Client({ endpoint: (await cluster()).endpoint });
    name = unique("ts-cancel");
    await client.sandboxes.create({ name });
    await client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
  });

  after(async () => {
    await client.sandboxes.delete(name).catch(() => {});
    await client.close();
  });

  test("abort mid-exec kills the sandbox process", async () => {
    const marker = unique("abort");
    const controller = new AbortController();
    const running = client.exec(name, ["sleep", "300"], {
      env: { TEST_MARKER: marker },
      signal: controller.signal,
    });
    await until("the command runs", () => markedPids(marker).length > 0);
    controller.abort();
    await assert.rejects(running, (err: unknown) => {
      assert.ok(err instanceof CancelledError);
      assert.equal(err.code, "cancelled");
      return true;
    });
    await until("the command is killed", () => markedPids(marker).length === 0);
  });

  test("an already aborted signal fails without a call", async () => {
    const controller = new AbortController();
    controller.abort();
    await assert.rejects(client.sandboxes.get(name, { signal: controller.signal }), CancelledError);
  });

  test("break out of execStream ends the stream and the process", async () => {
    const marker = unique("break");
    const stream = client.execStream(name, ["sh", "-c", "echo started; exec sleep 300"], {
      env: { TEST_MARKER: marker },
    });
    let seen = 0;
    for await (const event of stream) {
      assert.equal(event.type, "stdout");
      seen += 1;
      break;
    }
    assert.equal(seen, 1);
    await until("the command is killed", () => markedPids(marker).length === 0);
  });

  test("abort during execStream iteration ends it with cancelled", async () => {
    const marker = unique("abort-stream");
    const controller = new AbortController();
    const stream = client.execStream(name, ["sh", "-c", "echo started; exec sleep 300"], {
      env: { TEST_MARKER: marker },
      signal: controller.signal,
    });
    await assert.rejects(
      (async () => {
        for await (const _event of stream) controller.abort();
      })(),
      CancelledError,
    );
    await until("the command is killed", () => markedPids(marker).length === 0);
  });

  test("abort after a forward opened closes it", async () => {
    const controller = new AbortController();
    const fwd = await client.forward(name, 9, { signal: controller.signal });
    assert.equal(fwd.closed, false);
    controller.abort();
    assert.equal(fwd.closed, true);
    // The listener is gone: a connection to it is refused.
    const { port } = fwd.localAddress;
    await until("the local port refuses connections", async () => {
      const { connect } = await import("node:net");
      return new Promise<boolean>((resolve) => {
        const socket = connect(port, "127.0.0.1");
        socket.once("connect", () => {
          socket.destroy();
          resolve(false);
        });
        socket.once("error", () => resolve(true));
      });
    });
  });

  test("abort after an interactive exec started ends it, between and during calls", async () => {
    const marker = unique("abort-interactive");
    const controller = new AbortController();
    const shell = await client.execInteractive(name, ["cat"], {
      env: { TEST_MARKER: marker },
      signal: controller.signal,
    });
    await shell.write("hello\n");
    await until("the command runs", () => markedPids(marker).length > 0);
    // Nobody iterates or waits: only the signal can end it.
    controller.abort();
    await until("the command is killed", () => markedPids(marker).length === 0);
    await assert.rejects(
      (async () => {
        for (let i = 0; i < 50; i++) {
          await shell.write("more\n");
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
      })(),
      OpenShellError,
    );
  });

  test("abort after a watch opened ends it", async () => {
    const controller = new AbortController();
    const watch = await client.sandboxes.watch(name, { signal: controller.signal });
    controller.abort();
    let seen = 0;
    for await (const _ of watch) seen += 1;
    assert.equal(seen, 0, "an aborted watch still yielded");
  });

  test("abort while a raw stream's recv() is pending cancels it", async () => {
    const controller = new AbortController();
    const stream = await client.raw.stream("/openshell.v1.OpenShell/ExecSandbox", {
      signal: controller.signal,
    });
    // ExecSandboxRequest{sandbox, command: ["sleep", "300"]}.
    const field = (tag: number, value: string) => {
      const bytes = Buffer.from(value);
      return Buffer.concat([Buffer.from([tag, bytes.length]), bytes]);
    };
    await stream.send(Buffer.concat([field(0x0a, name), field(0x12, "sleep"), field(0x12, "300")]));
    stream.closeSend();
    const pending = (async () => {
      for (let i = 0; i < 100; i++) {
        if ((await stream.recv()) === null) return;
      }
    })();
    setTimeout(() => controller.abort(), 300);
    await assert.rejects(pending, CancelledError);
  });

  test("timeoutMs is the call's deadline", async () => {
    await assert.rejects(
      client.exec(name, ["sleep", "30"], { timeoutMs: 300 }),
      (err: unknown) => err instanceof DeadlineExceededError && err.grpcStatus === 4,
    );
  });

  test("close() cancels calls in flight and every later call", async () => {
    const own = new Client({ endpoint: client.endpoint });
    const marker = unique("close");
    const running = own.exec(name, ["sleep", "300"], { env: { TEST_MARKER: marker } });
    await until("the command runs", () => markedPids(marker).length > 0);
    await own.close();
    await assert.rejects(running, CancelledError);
    await assert.rejects(own.sandboxes.get(name), CancelledError);
    await until("the command is killed", () => markedPids(marker).length === 0);
  });
});
