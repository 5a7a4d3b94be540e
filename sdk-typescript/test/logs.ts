// Sandbox logs and watches against real clusters: the run's shared one for
// logs, filters and cursors, and a LocalCluster of its own for a log watch
// through the edge that must see every exec's line exactly once while the
// sandbox's owner replica is killed and started again.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  Client,
  InvalidArgumentError,
  InvalidConfigError,
  type LogLine,
  NotFoundError,
  OpenShellError,
  OutOfRangeError,
  type WatchEvent,
} from "../src/index.js";
import { startLocalCluster } from "../src/testing.js";
import { binDir, cluster, sleep, unique } from "./cluster.js";

async function rejection(promise: Promise<unknown>): Promise<OpenShellError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof OpenShellError, `not an OpenShellError: ${String(err)}`);
    return err;
  }
  assert.fail("the call succeeded");
}

async function readySandbox(client: Client, prefix: string): Promise<string> {
  const name = unique(prefix);
  await client.sandboxes.create({ name });
  await client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
  return name;
}

function finished(line: LogLine, code: number): boolean {
  return line.message === "exec finished" && line.fields.exit_code === String(code);
}

/** Exit codes of the "exec finished" lines among `events`, with how often each came. */
function finishedCodes(events: WatchEvent[]): Map<number, number> {
  const codes = new Map<number, number>();
  for (const e of events) {
    if (e.kind === "log" && e.line.message === "exec finished") {
      const code = Number(e.line.fields.exit_code);
      codes.set(code, (codes.get(code) ?? 0) + 1);
    }
  }
  return codes;
}

describe("logs and watch", () => {
  let client: Client;
  let sandbox: string;

  before(async () => {
    client = new Client({ endpoint: (await cluster()).endpoint });
    sandbox = await readySandbox(client, "ts-logs");
  });

  after(async () => {
    await client.sandboxes.delete(sandbox).catch(() => {});
    await client.close();
  });

  test("an exec's line appears in the logs, and the filters apply", async () => {
    const out = await client.exec(sandbox, ["sh", "-c", "exit 7"]);
    assert.equal(out.exitCode, 7);
    const deadline = Date.now() + 15_000;
    let lines: readonly LogLine[] = [];
    while (!lines.some((l) => finished(l, 7))) {
      assert.ok(Date.now() < deadline, `no exec line after 15 s: ${lines.join("\n")}`);
      await sleep(100);
      lines = (await client.sandboxes.logs(sandbox)).lines;
    }
    const line = lines.find((l) => finished(l, 7)) as LogLine;
    assert.equal(line.source, "sandbox");
    assert.equal(line.level, "INFO");
    assert.ok(line.time instanceof Date && Math.abs(line.time.getTime() - Date.now()) < 60_000);
    assert.ok(Object.isFrozen(line) && Object.isFrozen(line.fields));
    assert.match(String(line), /^\d{4}-\d\d-\d\dT[\d:.]+Z INFO {2}sandbox exec finished/);
    assert.match(String(line), / exit_code=7/);
    assert.ok(
      lines.some((l) => l.source === "gateway"),
      "no line of the gateway's own",
    );

    const only = await client.sandboxes.logs(sandbox, {
      sources: ["sandbox"],
      minLevel: "info",
      tail: 1,
    });
    assert.equal(only.lines.length, 1);
    assert.equal(only.lines[0]?.source, "sandbox");
    assert.ok(only.bufferTotal >= lines.length, `${only.bufferTotal} < ${lines.length}`);
    const gatewayOnly = await client.sandboxes.logs(sandbox, { sources: ["gateway"] });
    assert.ok(gatewayOnly.lines.length > 0);
    assert.ok(gatewayOnly.lines.every((l) => l.source === "gateway"));
    const errorsOnly = await client.sandboxes.logs(sandbox, { minLevel: "ERROR" });
    assert.ok(errorsOnly.lines.every((l) => l.level === "ERROR"));
    const future = await client.sandboxes.logs(sandbox, {
      since: new Date(Date.now() + 3_600_000),
    });
    assert.deepEqual(future.lines, []);
    const recent = await client.sandboxes.logs(sandbox, { since: line.time as Date });
    assert.ok(recent.lines.some((l) => finished(l, 7)));
  });

  test("bad levels, missing sandboxes and bad options are refused", async () => {
    const loud = await rejection(client.sandboxes.logs(sandbox, { minLevel: "LOUD" }));
    assert.ok(loud instanceof InvalidArgumentError, loud.code);
    assert.equal(loud.code, "invalid_argument");
    const missing = await rejection(client.sandboxes.logs("no-such-sandbox"));
    assert.ok(missing instanceof NotFoundError, missing.code);
    const badSince = await rejection(
      client.sandboxes.logs(sandbox, { since: new Date(Number.NaN) }),
    );
    assert.ok(badSince instanceof InvalidConfigError);
    assert.throws(() => client.sandboxes.events(sandbox, { tail: 3 }), InvalidConfigError);
    const gone = client.sandboxes.events("no-such-sandbox");
    await assert.rejects(async () => {
      for await (const _ of gone) assert.fail("an event of a missing sandbox");
    }, NotFoundError);
  });

  test("a status watch starts with the sandbox and ends on a terminal phase", async () => {
    const events: WatchEvent[] = [];
    // Bounded: 60 s for the whole watch, and a few events at most.
    const watch = client.sandboxes.events(sandbox, { stopOnTerminal: true, timeoutMs: 60_000 });
    for await (const event of watch) {
      events.push(event);
      if (events.length > 10) break;
    }
    assert.equal(events.length, 1, JSON.stringify(events.map((e) => e.kind)));
    const first = events[0];
    assert.ok(first?.kind === "sandbox");
    assert.equal(first.sandbox.name, sandbox);
    assert.equal(first.sandbox.phase, "READY");
    assert.ok(first.cursor.length > 0);
  });

  test("a log watch resumes after a cursor with exactly what came later", async () => {
    const watch = client.sandboxes.events(sandbox, {
      status: false,
      logs: true,
      tail: 1,
      timeoutMs: 60_000,
    });
    let cursor: string | null = null;
    const kinds: string[] = [];
    for await (const event of watch) {
      // Without a cursor the sandbox comes first, even with status: false.
      kinds.push(event.kind);
      cursor = event.cursor;
      if (event.kind === "log" || kinds.length > 10) break; // ends the watch
    }
    assert.deepEqual(kinds, ["sandbox", "log"]);
    assert.ok(cursor !== null);
    assert.equal(watch.cursor, cursor);
    assert.equal((await client.exec(sandbox, ["sh", "-c", "exit 41"])).exitCode, 41);
    assert.equal((await client.exec(sandbox, ["sh", "-c", "exit 42"])).exitCode, 42);

    const abort = new AbortController();
    const seen: WatchEvent[] = [];
    const resumed = client.sandboxes.events(sandbox, {
      logs: true,
      sources: ["sandbox"],
      resumeAfter: cursor,
      signal: abort.signal,
    });
    const timer = setTimeout(() => abort.abort(), 20_000);
    try {
      for await (const event of resumed) {
        seen.push(event);
        const codes = finishedCodes(seen);
        if (codes.has(41) && codes.has(42)) break;
      }
    } finally {
      clearTimeout(timer);
    }
    assert.ok(!seen.some((e) => e.kind === "sandbox"), "a snapshot after a cursor");
    assert.deepEqual([...finishedCodes(seen)].sort(), [
      [41, 1],
      [42, 1],
    ]);
    const cursors = seen.map((e) => e.cursor);
    assert.ok(
      cursors.every((c) => c > (cursor as string)),
      "a cursor at or before the resume point",
    );

    // A cursor the gateway cannot resume after (ahead of its event log).
    const [space] = (cursor as string).split(".");
    const ahead = `${space}.${"99999999999".padStart(20, "0")}`;
    await assert.rejects(async () => {
      for await (const _ of client.sandboxes.events(sandbox, { logs: true, resumeAfter: ahead })) {
        assert.fail("an event after an impossible cursor");
      }
    }, OutOfRangeError);

    // An abort ends a watch that waits for events.
    const stop = new AbortController();
    const waiting = client.sandboxes.events(sandbox, { signal: stop.signal });
    setTimeout(() => stop.abort(), 300);
    const ended = await rejection(
      (async () => {
        for await (const _ of waiting) {
          /* the snapshot, then nothing until the abort */
        }
      })(),
    );
    assert.equal(ended.code, "cancelled");
  });

  test("a log watch through the edge sees every exec once while the owner is killed", async () => {
    await using local = await startLocalCluster({
      replicas: 3,
      gatewayBin: join(binDir(), "openshell-gateway"),
    });
    await using client = local.client();
    const sandbox = await readySandbox(client, "ts-watch");
    const watch = client.sandboxes.events(sandbox, {
      status: false,
      logs: true,
      sources: ["sandbox"],
    });
    const events: WatchEvent[] = [];
    let ended: unknown = null;
    let stopping = false;
    const reading = (async () => {
      try {
        for await (const event of watch) events.push(event);
        if (!stopping) ended = new Error("the watch ended quietly");
      } catch (err) {
        ended = err;
      }
    })();

    // Each exec exits with its own number, so each line names one exec.
    const completed: number[] = [];
    const run = async (codes: number[]) => {
      for (const code of codes) {
        try {
          const out = await client.exec(sandbox, ["sh", "-c", `exit ${code}`], {
            timeoutMs: 20_000,
          });
          assert.equal(out.exitCode, code);
          completed.push(code);
        } catch (err) {
          // An exec caught by the kill may fail; it must then not run twice.
          assert.ok(err instanceof OpenShellError, String(err));
        }
      }
    };
    const range = (from: number, to: number) =>
      Array.from({ length: to - from + 1 }, (_, i) => from + i);
    await run(range(1, 12));
    const owner = await local.ownerOf(sandbox);
    assert.ok(owner !== null, "no owner");
    await local.killReplica(owner);
    await run(range(13, 24));
    await local.startReplica(owner);
    await run(range(25, 36));
    assert.ok(completed.length >= 30, `too few execs completed: ${completed}`);

    const deadline = Date.now() + 30_000;
    while (!completed.every((code) => finishedCodes(events).has(code))) {
      if (ended !== null) throw ended;
      if (Date.now() > deadline) {
        assert.fail(
          `lines missing after 30 s: completed ${completed}, seen ${[...finishedCodes(events).keys()]}`,
        );
      }
      await sleep(50);
    }
    await sleep(700); // a line delivered twice would show by now
    const repeated = [...finishedCodes(events)].filter(([, n]) => n > 1);
    assert.deepEqual(repeated, [], "lines delivered twice");
    const cursors = events.map((e) => e.cursor);
    assert.ok(
      cursors.every((c, i) => i === 0 || (cursors[i - 1] as string) <= c),
      "cursors went back",
    );
    assert.ok(watch.resumes >= 1, "the watch never had to resume: the kill did not reach it");
    console.log(
      `log watch across an owner kill: ${completed.length} execs completed, each line seen once, ` +
        `${watch.resumes} resumes`,
    );
    stopping = true;
    watch.cancel();
    await reading;
    assert.equal(ended, null, `the watch failed: ${String(ended)}`);
  });
});
