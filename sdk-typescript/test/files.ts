// File transfer against the run's real 3-replica cluster (through its
// edge): a 2 GiB file both ways with the process's peak RSS bounded, bytes
// streamed from a Readable and back as an async iterable, a directory tree,
// readFile / writeFile, and bad input that fails with the right code and
// leaves nothing behind.
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import {
  chmodSync,
  closeSync,
  createReadStream,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { after, before, describe, test } from "node:test";
import {
  CancelledError,
  Client,
  FailedPreconditionError,
  InvalidArgumentError,
  NotFoundError,
  OpenShellError,
  type TransferProgress,
} from "../src/index.js";
import { cluster, unique, until } from "./cluster.js";

const MiB = 1 << 20;
const BIG = 2 * 1024 * MiB;
const GENERATE_CHUNK = 16 * MiB;
const RSS_LIMIT = 400 * MiB;

function sha256(path: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const hash = createHash("sha256");
    createReadStream(path, { highWaterMark: 4 * MiB })
      .on("data", (chunk) => hash.update(chunk))
      .on("error", reject)
      .on("end", () => resolve(hash.digest("hex")));
  });
}

/** Writes `size` random bytes to `path`; resolves to their sha256. */
function randomFile(path: string, size: number): string {
  const hash = createHash("sha256");
  const fd = openSync(path, "w");
  try {
    for (let left = size; left > 0; left -= GENERATE_CHUNK) {
      const chunk = randomBytes(Math.min(GENERATE_CHUNK, left));
      hash.update(chunk);
      writeSync(fd, chunk);
    }
  } finally {
    closeSync(fd);
  }
  return hash.digest("hex");
}

function peakRssBytes(): number {
  return process.resourceUsage().maxRSS * 1024;
}

async function rejection(promise: Promise<unknown>): Promise<OpenShellError> {
  try {
    await promise;
  } catch (err) {
    assert.ok(err instanceof OpenShellError, `not an OpenShellError: ${String(err)}`);
    return err;
  }
  assert.fail("the call succeeded");
}

describe("files", () => {
  let client: Client;
  let sandbox: string;
  let tmp: string;

  /** Names in the sandbox's working directory (hidden ones too). */
  async function remoteNames(dir = "."): Promise<string[]> {
    const out = await client.exec(sandbox, ["ls", "-A", dir]);
    assert.equal(out.exitCode, 0, out.stderrText);
    return out.stdoutText.split("\n").filter((n) => n !== "");
  }

  /** A cancelled upload's temp file goes when its stream ends (bounded wait). */
  async function noTempFiles(): Promise<void> {
    await until("the temp files of cancelled uploads are removed", async () => {
      const out = await client.exec(sandbox, ["sh", "-c", "find . -name '*.openshell-part-*'"]);
      return out.stdoutText === "";
    });
  }

  before(async () => {
    client = new Client({ endpoint: (await cluster()).endpoint });
    sandbox = unique("ts-files");
    await client.sandboxes.create({ name: sandbox });
    await client.sandboxes.waitReady(sandbox, { timeoutMs: 60_000 });
    tmp = mkdtempSync(join(tmpdir(), "openshell-node-files-"));
  });

  after(async () => {
    rmSync(tmp, { recursive: true, force: true });
    await client.sandboxes.delete(sandbox).catch(() => {});
    await client.close();
  });

  test("a 2 GiB file goes up and comes back byte for byte, in bounded memory", async () => {
    const local = join(tmp, "big.bin");
    const back = join(tmp, "big.back");
    try {
      let started = performance.now();
      const digest = randomFile(local, BIG);
      const generated = performance.now() - started;
      const reports: TransferProgress[] = [];

      started = performance.now();
      const up = await client.upload(sandbox, local, "big.bin", {
        progress: (p) => reports.push(p),
      });
      const upMs = performance.now() - started;
      assert.equal(up.files, 1);
      assert.equal(up.bytes, BIG);
      const last = reports.at(-1);
      assert.ok(last !== undefined, "no progress report");
      assert.deepEqual([last.bytesDone, last.bytesTotal, last.filesDone], [BIG, BIG, 1]);
      assert.ok(last.current.endsWith("/big.bin"), last.current);
      // At most one report every 100 ms, plus the last ones.
      assert.ok(reports.length <= upMs / 100 + 3, `${reports.length} reports in ${upMs} ms`);
      const remote = await client.exec(sandbox, ["sha256sum", "big.bin"]);
      assert.equal(remote.stdoutText.split(" ")[0], digest, "the sandbox's copy differs");

      started = performance.now();
      const down = await client.download(sandbox, "big.bin", back);
      const downMs = performance.now() - started;
      assert.equal(down.bytes, BIG);
      assert.equal(statSync(back).size, BIG);
      assert.equal(await sha256(back), digest, "the downloaded copy differs");

      const peak = peakRssBytes();
      const mibPerS = (ms: number) => ((BIG / MiB / ms) * 1000).toFixed(0);
      console.log(
        `2 GiB: generated in ${(generated / 1000).toFixed(1)} s; upload ${(upMs / 1000).toFixed(1)} s ` +
          `(${mibPerS(upMs)} MiB/s, ${reports.length} progress reports); download ` +
          `${(downMs / 1000).toFixed(1)} s (${mibPerS(downMs)} MiB/s); ` +
          `peak RSS of the node process ${(peak / MiB).toFixed(0)} MiB`,
      );
      assert.ok(peak < RSS_LIMIT, `peak RSS ${(peak / MiB).toFixed(0)} MiB`);
    } finally {
      rmSync(local, { force: true });
      rmSync(back, { force: true });
      await client.exec(sandbox, ["rm", "-f", "big.bin"]);
    }
  });

  test("bytes from a Readable go up with backpressure; downloadStream brings them back", async () => {
    const size = 64 * MiB + 12_345;
    const hash = createHash("sha256");
    let produced = 0;
    let reads = 0;
    const source = new Readable({
      highWaterMark: MiB,
      read() {
        reads++;
        if (produced >= size) {
          this.push(null);
          return;
        }
        // Odd sizes, so the core re-chunks them.
        const chunk = randomBytes(Math.min(size - produced, 333_333));
        produced += chunk.length;
        hash.update(chunk);
        this.push(chunk);
      },
    });
    const digest = () => hash.copy().digest("hex");
    const up = await client.upload(sandbox, source, "streamed.bin");
    assert.equal(up.bytes, size);
    assert.ok(reads > 100, `${reads} reads`);
    const sent = digest();

    const stream = client.downloadStream(sandbox, "streamed.bin");
    await stream.open();
    assert.equal(stream.size, size);
    assert.ok(stream.source?.endsWith("/streamed.bin"), String(stream.source));
    const back = createHash("sha256");
    let chunks = 0;
    for await (const chunk of stream) {
      assert.ok(chunk.length <= 256 * 1024, `a chunk of ${chunk.length} bytes`);
      back.update(chunk);
      chunks++;
    }
    assert.equal(back.digest("hex"), sent);
    assert.equal(stream.bytesRead, size);
    assert.ok(chunks >= 256, `${chunks} chunks`);

    // Into a Writable that is slow to drain, and from an async generator.
    let received = 0;
    const slow = new Writable({
      highWaterMark: 64 * 1024,
      write(chunk: Buffer, _encoding, done) {
        received += chunk.length;
        setImmediate(done);
      },
    });
    const down = await client.download(sandbox, "streamed.bin", slow);
    assert.equal(down.bytes, size);
    assert.equal(received, size);
    assert.ok(slow.writableFinished);

    async function* generated(): AsyncGenerator<Uint8Array | string> {
      yield "hello, ";
      yield new Uint8Array(Buffer.from("world"));
    }
    await client.upload(sandbox, generated(), "generated.txt");
    assert.equal((await client.readFile(sandbox, "generated.txt")).toString(), "hello, world");

    // Breaking out of a downloadStream ends it.
    for await (const _ of client.downloadStream(sandbox, "streamed.bin")) break;
    await client.exec(sandbox, ["rm", "-f", "streamed.bin", "generated.txt"]);
  });

  test("a directory tree round trip keeps modes and links, honours the ignore file", async () => {
    const tree = join(tmp, "tree");
    mkdirSync(join(tree, "src", "deep"), { recursive: true });
    writeFileSync(join(tree, "README"), "top\n");
    writeFileSync(join(tree, "src", "main.sh"), "#!/bin/sh\necho hi\n");
    chmodSync(join(tree, "src", "main.sh"), 0o755);
    writeFileSync(join(tree, "src", "deep", "data.bin"), randomBytes(300_000));
    writeFileSync(join(tree, "debug.log"), "noise\n");
    writeFileSync(join(tree, ".gitignore"), "*.log\n");
    symlinkSync("src/main.sh", join(tree, "run"));
    symlinkSync("/etc/passwd", join(tree, "outside"));

    const up = await client.upload(sandbox, tree, "tree", { ignoreFile: ".gitignore" });
    assert.deepEqual(
      { files: up.files, symlinks: up.symlinks, skipped: up.skippedSymlinks, ignored: up.ignored },
      { files: 4, symlinks: 1, skipped: 1, ignored: 1 },
      JSON.stringify(up),
    );
    assert.ok(up.directories >= 3, JSON.stringify(up));
    assert.deepEqual((await remoteNames("tree")).sort(), [".gitignore", "README", "run", "src"]);
    const ran = await client.exec(sandbox, ["sh", "-c", "./tree/run"]);
    assert.equal(ran.stdoutText, "hi\n", "the script lost its mode or the link its target");

    const back = join(tmp, "back");
    const down = await client.download(sandbox, "tree", back);
    assert.equal(down.files, 4);
    for (const file of ["README", ".gitignore", "src/main.sh", "src/deep/data.bin"]) {
      assert.deepEqual(readFileSync(join(back, file)), readFileSync(join(tree, file)), file);
    }
    assert.equal(statSync(join(back, "src", "main.sh")).mode & 0o777, 0o755);
    assert.equal(readlinkSync(join(back, "run")), "src/main.sh");
    assert.ok(!existsSync(join(back, "debug.log")));
    assert.ok(!existsSync(join(back, "outside")));
    await client.exec(sandbox, ["rm", "-rf", "tree"]);
  });

  test("readFile and writeFile", async () => {
    const written = await client.writeFile(sandbox, "note.txt", "héllo\n");
    assert.equal(written.bytes, Buffer.byteLength("héllo\n"));
    const read = await client.readFile(sandbox, "note.txt");
    assert.ok(Buffer.isBuffer(read));
    assert.equal(read.toString("utf8"), "héllo\n");
    const bytes = randomBytes(1_000_000);
    await client.writeFile(sandbox, "note.txt", bytes); // replaces it
    assert.deepEqual(await client.readFile(sandbox, "note.txt"), bytes);
    const mode = await client.exec(sandbox, ["stat", "-c", "%a", "note.txt"]);
    assert.equal(mode.stdoutText.trim(), "644");
    await client.exec(sandbox, ["rm", "-f", "note.txt"]);
  });

  test("bad input fails with its code, names the path and leaves nothing behind", async () => {
    const missing = await rejection(client.readFile(sandbox, "no/such/file.txt"));
    assert.ok(missing instanceof NotFoundError, missing.code);
    assert.match(missing.message, /no\/such\/file\.txt/);

    const local = join(tmp, "never");
    const down = await rejection(client.download(sandbox, "missing.bin", local));
    assert.ok(down instanceof NotFoundError, down.code);
    assert.match(down.message, /missing\.bin/);
    assert.ok(!existsSync(local), "a failed download left a local file");

    writeFileSync(join(tmp, "small.txt"), "x");
    for (const outside of ["/etc/openshell-test", "../escape.txt", "a/../../escape.txt"]) {
      const refused = await rejection(client.upload(sandbox, join(tmp, "small.txt"), outside));
      assert.ok(refused instanceof InvalidArgumentError, `${outside}: ${refused.code}`);
      assert.equal(refused.code, "invalid_argument");
    }
    const outsideWrite = await rejection(client.writeFile(sandbox, "/etc/x", "x"));
    assert.equal(outsideWrite.code, "invalid_argument");
    // Each path on its own: `test -e` exits 1 when it does not exist.
    for (const path of ["/etc/openshell-test", "../escape.txt"]) {
      const exists = await client.exec(sandbox, ["sh", "-c", 'test -e "$1"', "sh", path]);
      assert.equal(exists.exitCode, 1, `a refused upload wrote ${path}`);
    }

    const noLocal = await rejection(client.upload(sandbox, join(tmp, "absent"), "absent"));
    assert.equal(noLocal.code, "not_found");

    const dir = await rejection(client.readFile(sandbox, "."));
    assert.ok(dir instanceof FailedPreconditionError, dir.code);

    // An upload aborted half way: a CancelledError, no target, no temp file.
    const abort = new AbortController();
    let sent = 0;
    const endless = new Readable({
      read() {
        sent += MiB;
        if (sent > 8 * MiB) abort.abort();
        this.push(Buffer.alloc(MiB, 7));
      },
    });
    const aborted = await rejection(
      client.upload(sandbox, endless, "aborted.bin", { signal: abort.signal }),
    );
    assert.ok(aborted instanceof CancelledError, aborted.code);
    endless.destroy();

    // A progress callback that throws cancels the transfer with its error.
    writeFileSync(join(tmp, "four.bin"), randomBytes(4 * MiB));
    await assert.rejects(
      client.upload(sandbox, join(tmp, "four.bin"), "thrown.bin", {
        progress: () => {
          throw new Error("enough");
        },
      }),
      /enough/,
    );

    const names = await remoteNames();
    assert.ok(!names.includes("aborted.bin"), names.join(" "));
    assert.ok(!names.includes("thrown.bin"), names.join(" "));
    await noTempFiles();
  });
});
