// HostSession: a shared supervisor host's session. Bad options fail at once
// with invalid_config, the token never shows, and a session that cannot
// connect ends when its signal aborts. Then against a real replica in
// `--driver hosts` mode with a host token from `openshell-gateway
// host-token`: accepted by that replica, assigned a new sandbox, whose
// configuration reaches the apply callback.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { inspect } from "node:util";
import {
  Client,
  type ConfigSnapshot,
  HostSession,
  InvalidConfigError,
  Rejected,
} from "../src/index.js";
import { type HostsGateway, hostsGateway, unique, until } from "./cluster.js";

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

  describe("against a --driver hosts replica", () => {
    let gw: HostsGateway;
    before(async () => {
      gw = await hostsGateway();
    });
    after(async () => {
      await gw?.close();
    });

    test("accepted, assigned a new sandbox, its configuration applied through the callback", async () => {
      const hostId = unique("h-ts");
      const token = gw.hostToken(hostId);
      const seen: [string, bigint, unknown][] = [];
      const host = new HostSession({
        endpoint: gw.endpoint,
        memberId: hostId,
        hostToken: token,
        capacity: 10,
        apply: async (sandboxId, snapshot) => {
          seen.push([sandboxId, snapshot.configRevision, snapshot.setting("color")]);
          return snapshot.setting("color") === "plaid" ? new Rejected("no plaid") : undefined;
        },
      });
      const stop = new AbortController();
      const running = host.run({ signal: stop.signal });
      const client = new Client({ endpoint: gw.endpoint });
      const name = unique("ts-host");
      try {
        assert.ok(!inspect(host).includes(token));
        const accepted = await host.waitAccepted({ timeoutMs: 30_000 });
        assert.equal(accepted.sessionsAccepted, 1n);
        assert.equal(accepted.servedBy, gw.replica);
        assert.equal(accepted.stay, false);
        await until("the replica counts the host", async () => (await gw.metric(HOSTS)) === 1);
        const sandbox = await client.sandboxes.create({ name });
        await until("the first snapshot", () =>
          seen.some(([id, rev]) => id === sandbox.id && rev === 0n),
        );
        assert.equal(host.stats().assigned, 1);
        for (const color of ["blue", "plaid"]) {
          await client.raw.updateConfig({
            sandbox: name,
            settingKey: "color",
            settingValue: { value: { case: "stringValue", value: color } },
          });
          await until(`color=${color} applied`, () => seen.some((s) => s[2] === color));
        }
        await until(
          "the gateway saw the rejection",
          async () =>
            (await gw.metric('openshell_server_config_results_total{outcome="rejected"}')) >= 1,
        );
        assert.deepEqual(
          seen.map((s) => [s[0], s[2]]),
          [
            [sandbox.id, null],
            [sandbox.id, "blue"],
            [sandbox.id, "plaid"],
          ],
        );
        await client.sandboxes.delete(name);
        await until("the sandbox leaves the assignment", () => host.stats().assigned === 0);
      } finally {
        await client.sandboxes.delete(name).catch(() => {});
        await client.close();
        stop.abort();
        await running;
      }
      assert.ok(host.closed);
      await until("the host session ends", async () => (await gw.metric(HOSTS)) === 0);
    });
  });
});

const HOSTS = "openshell_server_supervisor_hosts";
