// ConfigSession against the real cluster (push mode, sandbox tokens in its
// data dir): each test takes over a sandbox's session from its supervisor
// (stopped by PID) with the sandbox's own token.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { takeOver, updateSetting } from "../conformance/config.js";
import { fromNative } from "../src/errors.js";
import {
  CancelledError,
  Client,
  ConfigSession,
  type ConfigUpdate,
  DeadlineExceededError,
  InvalidConfigError,
  OpenShellError,
  Rejected,
} from "../src/index.js";
import { native } from "../src/native.js";
import { cluster, unique, until } from "./cluster.js";

describe("ConfigSession", () => {
  let client: Client;
  let endpoint: string;
  let dataDir: string;
  const names: string[] = [];

  /** A ready sandbox whose supervisor is stopped: its id and token. */
  async function takenOver(): Promise<{ name: string; id: string; token: string }> {
    const name = unique("ts-cfg");
    names.push(name);
    await client.sandboxes.create({ name });
    const sandbox = await client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
    return { name, id: sandbox.id, token: await takeOver(dataDir, sandbox.id) };
  }

  before(async () => {
    ({ endpoint, dataDir } = await cluster());
    client = new Client({ endpoint });
  });

  after(async () => {
    for (const name of names) await client.sandboxes.delete(name).catch(() => {});
    await client.close();
  });

  test("push: the bootstrap, then each write acknowledged in order; a rejection stays rejected", async () => {
    const { name, id, token } = await takenOver();
    await using session = new ConfigSession({ endpoint, sandboxId: id, sandboxToken: token });
    const seen: ConfigUpdate[] = [];
    const answering = (async () => {
      for await (const update of session) {
        seen.push(update);
        if (update.setting("color") === "red") update.reject("red is not allowed");
        else update.ack();
        assert.throws(() => update.ack(), /already answered/);
      }
    })();
    assert.equal(await session.waitMode(undefined, { timeoutMs: 30_000 }), "push");
    await until("the bootstrap answered", () => session.stats().lastUpdateId >= 1n);
    assert.equal(session.stats().sessionsAccepted, 1n);
    assert.ok(session.stats().servedBy, "a session names its replica");

    for (const [color, rejected] of [
      ["blue", 0n],
      ["red", 1n],
      ["green", 1n],
    ] as const) {
      const started = performance.now();
      await updateSetting(client, name, "color", color, false);
      await until(`color=${color} delivered`, () => seen.some((u) => u.setting("color") === color));
      // Pushed, so well under the 10 s poll interval.
      assert.ok(performance.now() - started < 5000);
      await until("the answer counted", () => session.stats().rejected === rejected);
    }
    const last = seen.at(-1);
    assert.equal(last?.mode, "push");
    assert.equal(last?.settings.color, "green");
    assert.ok((last?.configRevision ?? 0n) > (seen[0]?.configRevision ?? 0n));
    assert.match(String(last), /^ConfigUpdate\(mode=push, configRevision=\d+/);
    const stats = session.stats();
    assert.equal(stats.applied, BigInt(seen.length - 1));
    assert.equal(stats.polls, 1n, "only the startup poll once pushing");
    await session.close();
    await answering;
    assert.equal(session.closed, true);
    await session.close(); // idempotent
  });

  test("poll: an apply callback, with announcePush false, answers every update", async () => {
    const { name, id, token } = await takenOver();
    const applied: string[] = [];
    const session = new ConfigSession({
      endpoint,
      sandboxId: id,
      sandboxToken: token,
      announcePush: false,
      pollIntervalMs: 300,
      apply: async (update) => {
        await new Promise((resolve) => setImmediate(resolve));
        const size = update.setting("size");
        if (size === "huge") return new Rejected("too big");
        if (size === "boom") throw new Error("the callback failed");
        applied.push(String(size));
        return undefined;
      },
    });
    try {
      session.start();
      assert.throws(() => session.updates().next(), TypeError);
      assert.equal(await session.waitMode("poll", { timeoutMs: 30_000 }), "poll");
      for (const [size, rejected] of [
        ["large", 0n],
        ["huge", 1n],
        ["boom", 2n],
        ["small", 2n],
      ] as const) {
        await updateSetting(client, name, "size", size, false);
        await until(`size=${size} answered`, () => {
          const s = session.stats();
          return s.rejected === rejected && (rejected > 0n || applied.includes(size));
        });
      }
      await until("small applied", () => applied.at(-1) === "small");
      const stats = session.stats();
      assert.equal(stats.mode, "poll");
      assert.equal(stats.updatesReceived, 0n, "nothing is pushed to a session without push");
      assert.ok(stats.polls >= 2n);
    } finally {
      await session.close();
    }
  });

  test("a panic in the session's run ends it: waiters get a panic error, never hang", async () => {
    const session = new native.NativeConfigSession({
      endpoint,
      sandboxId: "sb",
      sandboxToken: "t",
    });
    session.panicInRunForTest();
    let ended = false;
    session.start(() => {
      ended = true;
    });
    // Bounded: without the fix these two promises never settle.
    const bounded = <T>(what: string, p: Promise<T>) =>
      Promise.race([
        p,
        new Promise<never>((_, reject) =>
          setTimeout(() => reject(new Error(`${what} did not settle in 10 s`)), 10_000).unref(),
        ),
      ]);
    const isPanic = (err: unknown) => {
      const e = fromNative(err);
      assert.ok(e instanceof OpenShellError, String(err));
      assert.equal(e.code, "panic");
      assert.match(e.message, /deliberate panic in run/);
      return true;
    };
    await assert.rejects(bounded("nextUpdate", session.nextUpdate()), isPanic);
    await assert.rejects(bounded("waitClosed", session.waitClosed()), isPanic);
    assert.equal(session.closed, true);
    await until("the ended callback ran", () => ended);
    session.close();
  });

  test("waitMode rejects with CancelledError or DeadlineExceededError", async () => {
    // No such sandbox: the session never reaches a mode.
    await using session = new ConfigSession({
      endpoint,
      sandboxId: "no-such-sandbox",
      sandboxToken: "t",
    }).start();
    await assert.rejects(
      session.waitMode(undefined, { timeoutMs: 200 }),
      (err: unknown) => err instanceof DeadlineExceededError && err.code === "deadline_exceeded",
    );
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    await assert.rejects(
      session.waitMode(undefined, { timeoutMs: 30_000, signal: controller.signal }),
      (err: unknown) => err instanceof CancelledError && err.code === "cancelled",
    );
    await session.close();
    await assert.rejects(session.waitMode(), CancelledError);
  });

  test("bad options fail at once with invalid_config", () => {
    const base = { endpoint, sandboxId: "sb", sandboxToken: "t" };
    for (const options of [
      { ...base, sandboxId: " " },
      { ...base, pollIntervalMs: 10 },
      { ...base, endpoint: "not a url" },
    ]) {
      assert.throws(
        () => new ConfigSession(options),
        (err: unknown) => err instanceof InvalidConfigError && err.code === "invalid_config",
      );
    }
    assert.throws(
      () => new ConfigSession({ ...base, endpoint: "https://127.0.0.1:1", ca: "not a pem" }),
      (err: unknown) => err instanceof OpenShellError && err.code === "tls",
    );
  });
});
