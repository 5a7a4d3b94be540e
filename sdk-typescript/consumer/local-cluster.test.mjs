// A user's node:test file in a fresh project that installed the packed
// @openshell/sdk and @openshell/sdk-<platform> tarballs (no cargo, no
// install script, no OPENSHELL_GATEWAY_BIN): the cluster runs the gateway
// shipped in the platform package. scripts/check-npm-packages.sh runs it.
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
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

test("files and logs with the packages' executables", async () => {
  const cluster = await startLocalCluster({ replicas: 1 });
  const client = cluster.client();
  const dir = mkdtempSync(join(tmpdir(), "openshell-consumer-"));
  try {
    const { name } = await client.sandboxes.create();
    await client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
    // Every byte value, 1 MiB: binary-safe both ways.
    const data = Buffer.alloc(1 << 20, 0).map((_, i) => i % 256);
    assert.equal((await client.writeFile(name, "blob.bin", data)).bytes, data.length);
    assert.ok((await client.readFile(name, "blob.bin")).equals(data));
    mkdirSync(join(dir, "tree", "sub"), { recursive: true });
    writeFileSync(join(dir, "tree", "sub", "a.txt"), "a\n");
    assert.equal((await client.upload(name, join(dir, "tree"), "tree")).files, 1);
    await client.download(name, "tree", join(dir, "back"));
    assert.equal(readFileSync(join(dir, "back", "sub", "a.txt"), "utf8"), "a\n");

    assert.equal((await client.exec(name, ["sh", "-c", "exit 3"])).exitCode, 3);
    const deadline = Date.now() + 30_000;
    for (;;) {
      const { lines } = await client.sandboxes.logs(name, { sources: ["sandbox"] });
      if (lines.some((l) => l.message === "exec finished" && l.fields.exit_code === "3")) break;
      assert.ok(Date.now() < deadline, lines.map(String).join("\n"));
      await sleep(200);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await client.close();
    await cluster.stop();
  }
});
