// A user's node:test file in a fresh project that installed the packed
// @openshell/sdk and @openshell/sdk-<platform> tarballs (no cargo, no
// install script, no OPENSHELL_GATEWAY_BIN): the cluster runs the gateway
// shipped in the platform package. scripts/check-npm-packages.sh runs it.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { bundledGateway, startLocalCluster } from "@openshell/sdk/testing";

async function countRun(client, sandbox) {
  const out = await client.exec(sandbox, ["sh", "-c", "echo run >> runs; wc -l < runs"]);
  assert.equal(out.exitCode, 0, out.stderrText);
  return out.stdoutText.trim();
}

test("the installed packages bring the addon and the gateway", () => {
  assert.equal(process.env.OPENSHELL_GATEWAY_BIN, undefined);
  const gateway = bundledGateway();
  assert.match(gateway ?? "", /node_modules\/@openshell\/sdk-[^/]+\/bin\/openshell-gateway$/);
  const maps = readFileSync("/proc/self/maps", "utf8");
  assert.match(maps, /node_modules\/@openshell\/sdk-[^/]+\/openshell-sdk\.[^/]+\.node/);
});

test("an exec on each of 3 replicas; a killed owner costs no exec", async () => {
  const cluster = await startLocalCluster({ replicas: 3 });
  const client = cluster.client();
  try {
    const on = new Map();
    for (let i = 0; i < 15 && on.size < 3; i++) {
      const sandbox = await client.sandboxes.create();
      await client.sandboxes.waitReady(sandbox.name, { timeoutMs: 60_000 });
      const owner = await cluster.ownerOf(sandbox.name);
      assert.ok(owner !== null);
      if (!on.has(owner)) on.set(owner, sandbox.name);
    }
    assert.deepEqual([...on.keys()].sort(), cluster.replicaIds);
    for (const sandbox of on.values()) assert.equal(await countRun(client, sandbox), "1");

    const [owner, sandbox] = [...on].sort()[0];
    await cluster.killReplica(owner);
    assert.equal(await countRun(client, sandbox), "2", "the exec after the kill ran once");
    assert.notEqual(await cluster.ownerOf(sandbox), owner);
  } finally {
    await client.close();
    await cluster.stop();
  }
});
