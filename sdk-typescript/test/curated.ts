// Every curated call against a real 3-replica cluster.
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect } from "node:net";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { Client, type ExecEvent, NotFoundError, OpenShellError } from "../src/index.js";
import { cluster, unique } from "./cluster.js";
import { startSandboxServer } from "./sandbox-server.js";

describe("curated calls", () => {
  let client: Client;
  let name: string;

  before(async () => {
    client = new Client({ endpoint: (await cluster()).endpoint });
    name = unique("ts-main");
    const created = await client.sandboxes.create({ name, labels: { suite: "node-test" } });
    assert.equal(created.name, name);
    assert.ok(["PROVISIONING", "READY"].includes(created.phase), created.phase);
    assert.equal(created.labels.suite, "node-test");
    const ready = await client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
    assert.equal(ready.phase, "READY");
    assert.equal(typeof ready.resourceVersion, "bigint");
  });

  after(async () => {
    await client.sandboxes.delete(name).catch(() => {});
    await client.close();
  });

  test("health names the replica that answered", async () => {
    const h = await client.health();
    assert.equal(h.status, "HEALTHY");
    assert.ok(h.version.length > 0);
  });

  test("get and list", async () => {
    const got = await client.sandboxes.get(name);
    assert.equal(got.name, name);
    assert.ok(got.raw.length > 0);
    const listed = await client.sandboxes.list({ labelSelector: "suite=node-test" });
    assert.ok(listed.some((s) => s.name === name));
  });

  test("exec returns Buffers and text helpers", async () => {
    const out = await client.exec(name, ["sh", "-c", "printf out; printf err >&2; exit 3"]);
    assert.ok(Buffer.isBuffer(out.stdout));
    assert.equal(out.stdoutText, "out");
    assert.equal(out.stderrText, "err");
    assert.equal(out.exitCode, 3);
    assert.equal(out.ok, false);
  });

  test("exec passes stdin, env and workdir", async () => {
    const out = await client.exec(name, ["sh", "-c", 'cat; printf " $GREETING "; pwd'], {
      stdin: "hello",
      env: { GREETING: "hi" },
      workdir: "/tmp",
    });
    assert.equal(out.stdoutText, "hello hi /tmp\n");
  });

  test("execStream yields events ending in exactly one exit", async () => {
    const events: ExecEvent[] = [];
    for await (const event of client.execStream(name, ["sh", "-c", "echo a; echo b >&2; exit 7"])) {
      events.push(event);
    }
    const exits = events.filter((e) => e.type === "exit");
    assert.equal(exits.length, 1);
    assert.deepEqual(events.at(-1), { type: "exit", exitCode: 7 });
    const stdout = Buffer.concat(events.flatMap((e) => (e.type === "stdout" ? [e.data] : [])));
    const stderr = Buffer.concat(events.flatMap((e) => (e.type === "stderr" ? [e.data] : [])));
    assert.equal(stdout.toString(), "a\n");
    assert.equal(stderr.toString(), "b\n");
  });

  test("execStream collect()", async () => {
    const out = await client.execStream(name, ["echo", "collected"]).collect();
    assert.equal(out.stdoutText, "collected\n");
    assert.equal(out.exitCode, 0);
  });

  test("execInteractive: write, closeStdin, wait", async () => {
    const run = await client.execInteractive(name, ["cat"]);
    await run.write("line one\n");
    await run.write(Buffer.from("line two\n"));
    run.closeStdin();
    const out = await run.wait();
    assert.equal(out.stdoutText, "line one\nline two\n");
    assert.equal(out.exitCode, 0);
  });

  test("execInteractive with a terminal: resize and events", async () => {
    const run = await client.execInteractive(name, ["sh", "-c", "read x; stty size"], {
      tty: { cols: 80, rows: 24 },
    });
    await run.resize(100, 40);
    await run.write("go\n");
    let text = "";
    let exit: number | null = null;
    for await (const event of run.events()) {
      if (event.type === "exit") exit = event.exitCode;
      else text += event.data.toString();
    }
    assert.equal(exit, 0);
    assert.match(text, /40 100/);
  });

  test("100 concurrent execs on one client", async () => {
    const runs = Array.from({ length: 100 }, (_, i) => client.exec(name, ["echo", `n${i}`]));
    const outs = await Promise.all(runs);
    outs.forEach((out, i) => {
      assert.equal(out.stdoutText, `n${i}\n`);
      assert.equal(out.exitCode, 0);
    });
  });

  test("forward: localAddress, bytes both ways, stats, idempotent close", async () => {
    // The forward's target: an echo server on the sandbox's own loopback.
    const echo = await startSandboxServer(client, name);
    try {
      const fwd = await client.forward(name, echo.port);
      const { address, port } = fwd.localAddress;
      assert.equal(address, "127.0.0.1");
      assert.ok(port > 0);
      const payload = randomBytes(200_000);
      const roundtrip = () =>
        new Promise<Buffer>((resolve, reject) => {
          const chunks: Buffer[] = [];
          const socket = connect(port, address, () => socket.end(payload));
          socket.on("data", (d: Buffer) => chunks.push(d));
          socket.on("end", () => resolve(Buffer.concat(chunks)));
          socket.on("error", reject);
        });
      const echoed = await Promise.all(Array.from({ length: 4 }, roundtrip));
      for (const e of echoed) assert.ok(e.equals(payload));
      const stats = fwd.stats();
      assert.equal(typeof stats.bytesIn, "bigint");
      assert.ok(stats.connectionsAccepted >= 4n);
      assert.ok(stats.bytesOut >= 800_000n && stats.bytesIn >= 800_000n);
      await fwd.close();
      await fwd.close();
      assert.equal(fwd.closed, true);
      await assert.rejects(
        new Promise((resolve, reject) => {
          const s = connect(port, address, () => {
            s.destroy();
            resolve(undefined);
          });
          s.on("error", reject);
        }),
      );
    } finally {
      await echo.stop();
    }
  });

  test("watch yields snapshots until cancelled", async () => {
    const watch = await client.sandboxes.watch(name);
    let seen = 0;
    for await (const snapshot of watch) {
      assert.equal(snapshot.name, name);
      seen += 1;
      break;
    }
    assert.equal(seen, 1, "the watch ended without a snapshot");
    watch.cancel();
  });

  test("the published .d.ts gives handles no public constructor", () => {
    const here = dirname(fileURLToPath(import.meta.url));
    const classes: Record<string, string[]> = {
      "client.d.ts": ["Forward", "SandboxWatch", "Sandboxes", "RawCalls", "RawStream"],
      "exec.d.ts": ["ExecStream", "InteractiveExec"],
      "typed-raw.d.ts": ["TypedStream"],
      "config.d.ts": ["ConfigUpdate"],
    };
    for (const [file, names] of Object.entries(classes)) {
      const text = readFileSync(join(here, "..", "src", file), "utf8");
      for (const name of names) {
        const start = text.search(new RegExp(`declare class ${name}\\b`));
        assert.ok(start >= 0, `${name} in ${file}`);
        const body = text.slice(start, text.indexOf("\n}", start));
        assert.match(body, /private constructor\(\);/, `${name} has a public constructor`);
        assert.ok(!body.includes("_create"), `${name} shows its internal factory`);
      }
    }
  });

  test("routingStats counts owner-routed calls as bigint", async () => {
    const before = client.routingStats();
    await client.sandboxes.get(name);
    await client.exec(name, ["true"]);
    const after = client.routingStats();
    assert.equal(typeof after.hinted, "bigint");
    assert.ok(after.hinted + after.unhinted > before.hinted + before.unhinted);
  });

  test("typed raw stubs: unary, server streaming owner-routed, bidi", async () => {
    const health = await client.raw.health();
    assert.equal(health.$typeName, "openshell.v1.HealthResponse");
    assert.ok(health.version.length > 0);
    const got = await client.raw.getSandbox({ name });
    assert.equal(got.sandbox?.metadata?.name, name);

    const before = client.routingStats();
    const stream = await client.raw.execSandbox({ sandbox: name, command: ["echo", "typed"] });
    let stdout = "";
    let exit: number | null = null;
    for await (const event of stream) {
      if (event.payload.case === "stdout") stdout += Buffer.from(event.payload.value.data);
      if (event.payload.case === "exit") exit = event.payload.value.exitCode;
    }
    assert.equal(stdout, "typed\n");
    assert.equal(exit, 0);
    assert.ok(client.routingStats().hinted > before.hinted, "ExecSandbox went to the owner");

    // Bidi: the first message opens the interactive exec.
    const bidi = await client.raw.execSandboxInteractive();
    await bidi.send({
      payload: { case: "start", value: { sandbox: name, command: ["cat"] } },
    });
    await bidi.send({ payload: { case: "stdin", value: Buffer.from("ping") } });
    bidi.closeSend();
    let echoed = "";
    for await (const event of bidi) {
      if (event.payload.case === "stdout") echoed += Buffer.from(event.payload.value.data);
      if (event.payload.case === "exit") break;
    }
    assert.equal(echoed, "ping");

    await assert.rejects(client.raw.getSandbox({ name: "Not_A_Name" }), (err: unknown) => {
      assert.ok(err instanceof OpenShellError);
      return true;
    });
  });

  test("delete, then waitDeleted; get fails with not_found", async () => {
    const doomed = unique("ts-doomed");
    await client.sandboxes.create({ name: doomed });
    const outcome = await client.sandboxes.delete(doomed);
    assert.ok(outcome.length > 0);
    await client.sandboxes.waitDeleted(doomed, { timeoutMs: 60_000 });
    await assert.rejects(client.sandboxes.get(doomed), (err: unknown) => {
      assert.ok(err instanceof NotFoundError);
      assert.equal(err.code, "not_found");
      assert.equal(err.grpcStatus, 5);
      return true;
    });
  });
});
