// Process lifetime: a closed client never keeps Node alive; an open forward
// does, like a listening net.Server, until closed or unref'd.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { cluster, stop, unique } from "./cluster.js";

const INDEX = join(dirname(fileURLToPath(import.meta.url)), "..", "src", "index.js");

interface Run {
  /** ms from the script's "done" line to the process's exit, or null if still running. */
  exitAfterDoneMs: number | null;
  output: string;
}

/** Runs an ESM script that prints "done" when finished; waits `graceMs` after that. */
function run(script: string, graceMs: number): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    let doneAt: number | null = null;
    let timer: NodeJS.Timeout | null = null;
    let killed = false;
    const startTimer = setTimeout(() => {
      void stop(child, "SIGKILL").then(() => reject(new Error(`script hung:\n${output}`)));
    }, 60_000);
    child.stdout.on("data", (d: Buffer) => {
      output += d.toString();
      if (doneAt === null && output.includes("done")) {
        doneAt = Date.now();
        clearTimeout(startTimer);
        timer = setTimeout(() => {
          killed = true;
          void stop(child, "SIGKILL");
        }, graceMs);
      }
    });
    child.stderr.on("data", (d: Buffer) => {
      output += d.toString();
    });
    child.once("exit", () => {
      clearTimeout(startTimer);
      if (timer !== null) clearTimeout(timer);
      if (doneAt === null) reject(new Error(`script failed:\n${output}`));
      else resolve({ exitAfterDoneMs: killed ? null : Date.now() - doneAt, output });
    });
  });
}

describe("process lifetime", () => {
  let endpoint: string;
  let sandbox: string;

  before(async () => {
    endpoint = (await cluster()).endpoint;
    sandbox = unique("ts-life");
    const { Client } = await import("../src/index.js");
    await using client = new Client({ endpoint });
    await client.sandboxes.create({ name: sandbox });
    await client.sandboxes.waitReady(sandbox, { timeoutMs: 60_000 });
  });

  const prelude = () => `
    import { Client } from ${JSON.stringify(INDEX)};
    const client = new Client({ endpoint: ${JSON.stringify(endpoint)} });
    await client.health();
    const out = await client.exec(${JSON.stringify(sandbox)}, ["echo", "hi"]);
    if (out.stdoutText !== "hi\\n") throw new Error("bad output");
  `;

  test("a process that closed its client exits by itself within a second", async () => {
    const result = await run(
      `${prelude()}
      const fwd = await client.forward(${JSON.stringify(sandbox)}, 9);
      await client.close();
      console.log("done", fwd.closed);`,
      3000,
    );
    assert.notEqual(result.exitAfterDoneMs, null, result.output);
    assert.ok((result.exitAfterDoneMs ?? 0) < 1000, `exited after ${result.exitAfterDoneMs} ms`);
    assert.match(result.output, /done true/);
  });

  test("an open forward keeps the process alive; unref() lets it exit", async () => {
    const held = await run(
      `${prelude()}
      await client.forward(${JSON.stringify(sandbox)}, 9);
      console.log("done");`,
      1500,
    );
    assert.equal(held.exitAfterDoneMs, null, "the process exited with a forward open");
    const unrefd = await run(
      `${prelude()}
      (await client.forward(${JSON.stringify(sandbox)}, 9)).unref();
      console.log("done");`,
      3000,
    );
    assert.notEqual(unrefd.exitAfterDoneMs, null, unrefd.output);
    assert.ok((unrefd.exitAfterDoneMs ?? 0) < 1000);
  });

  test("an open watch keeps the process alive; unref() lets it exit, ref() holds it again", async () => {
    const watch = (extra: string) => `${prelude()}
      const watch = await client.sandboxes.watch(${JSON.stringify(sandbox)});
      ${extra}
      console.log("done");`;
    const held = await run(watch(""), 1500);
    assert.equal(held.exitAfterDoneMs, null, "the process exited with a watch open");
    const reheld = await run(watch("watch.unref(); watch.ref();"), 1500);
    assert.equal(reheld.exitAfterDoneMs, null, "ref() did not hold the process again");
    const unrefd = await run(watch("watch.unref();"), 3000);
    assert.notEqual(unrefd.exitAfterDoneMs, null, unrefd.output);
    assert.ok((unrefd.exitAfterDoneMs ?? 0) < 1000, `exited after ${unrefd.exitAfterDoneMs} ms`);
  });

  test("an open ConfigSession keeps the process alive until closed or unref'd", async () => {
    // No such sandbox: the session keeps retrying, which is what an open one does.
    const session = (extra: string) => `
      import { ConfigSession } from ${JSON.stringify(INDEX)};
      const session = new ConfigSession({
        endpoint: ${JSON.stringify(endpoint)}, sandboxId: "no-such-sandbox", sandboxToken: "t",
      }).start();
      await new Promise((resolve) => setTimeout(resolve, 200));
      ${extra}
      console.log("done");`;
    const held = await run(session(""), 1500);
    assert.equal(held.exitAfterDoneMs, null, "the process exited with a session open");
    for (const extra of ["session.unref();", "await session.close();"]) {
      const result = await run(session(extra), 3000);
      assert.notEqual(result.exitAfterDoneMs, null, `${extra}\n${result.output}`);
      assert.ok((result.exitAfterDoneMs ?? 0) < 1000, `${extra}: ${result.exitAfterDoneMs} ms`);
    }
  });
});
