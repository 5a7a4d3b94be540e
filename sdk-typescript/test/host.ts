// HostSession: a shared supervisor host's session. Bad options fail at once
// with invalid_config, the token never shows, and a session that cannot
// connect ends when its signal aborts.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { inspect } from "node:util";
import { type ConfigSnapshot, HostSession, InvalidConfigError } from "../src/index.js";

const SECRET = "host-token-that-must-never-show";

describe("HostSession", () => {
  const noop = (_sandboxId: string, _snapshot: ConfigSnapshot) => undefined;
  const base = {
    endpoint: "http://127.0.0.1:1",
    memberId: "h-0",
    hostToken: SECRET,
    apply: noop,
    allowCleartextToken: true,
  };

  test("bad options fail at once with invalid_config, without the token", () => {
    for (const options of [
      { ...base, memberId: " " },
      { ...base, memberId: "" },
      { ...base, apply: undefined as unknown as typeof noop },
      { ...base, capacity: -1 },
      { ...base, endpoint: "not a url" },
      { ...base, endpoint: "http://192.0.2.1:1", allowCleartextToken: false },
    ]) {
      assert.throws(
        () => new HostSession(options),
        (err: unknown) =>
          err instanceof InvalidConfigError &&
          err.code === "invalid_config" &&
          !`${err} ${inspect(err)}`.includes(SECRET),
      );
    }
    assert.throws(
      () => new HostSession({ ...base, memberId: "" }),
      (err: unknown) => err instanceof InvalidConfigError && /member id/.test(err.message),
    );
  });

  test("the token never shows; run ends when the signal aborts", async () => {
    const host = new HostSession({
      ...base,
      memberId: "h-7",
      capacity: 3,
      instanceId: "inst-1",
      connectTimeoutMs: 200,
    });
    for (const text of [`${host}`, inspect(host), JSON.stringify(host)]) {
      assert.ok(!text.includes(SECRET), text);
    }
    assert.equal(host.memberId, "h-7");
    assert.equal(host.instanceId, "inst-1");
    const stop = new AbortController();
    const running = host.run({ signal: stop.signal });
    await new Promise((resolve) => setTimeout(resolve, 300));
    const stats = host.stats();
    assert.equal(stats.sessionsAccepted, 0n);
    assert.equal(stats.sessionId, null);
    assert.equal(stats.assigned, 0);
    stop.abort();
    await running;
    assert.ok(host.closed);
  });
});
