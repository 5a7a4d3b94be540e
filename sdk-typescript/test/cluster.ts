// Real gateway processes on loopback for the tests, stopped by their own
// PIDs: `openshell-gateway up --replicas 3` (replicas, edge, supervisors)
// shared by every suite of the run, and single replicas that require a
// token. Binaries come from $OPENSHELL_BIN_DIR, else the cargo target dir.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
const START_MS = 90_000;
const STOP_MS = 30_000;

export function binDir(): string {
  if (process.env.OPENSHELL_BIN_DIR) return process.env.OPENSHELL_BIN_DIR;
  const target = process.env.CARGO_TARGET_DIR ?? join(ROOT, "target");
  return join(target, "debug");
}

function gatewayBinary(): string {
  const path = join(binDir(), "openshell-gateway");
  if (!existsSync(path)) {
    throw new Error(`${path} is missing: run \`make build\` (cargo build --workspace --bins)`);
  }
  return path;
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

/** Signals the process by its PID and waits; SIGKILL when it does not stop in time. */
export async function stop(child: ChildProcess, signal: NodeJS.Signals = "SIGINT"): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  process.kill(child.pid, signal);
  const timer = setTimeout(() => {
    if (child.pid !== undefined && child.exitCode === null) process.kill(child.pid, "SIGKILL");
  }, STOP_MS);
  await exited;
  clearTimeout(timer);
}

export interface Cluster {
  endpoint: string;
  dataDir: string;
}

async function startCluster(): Promise<{ cluster: Cluster; child: ChildProcess; tmp: string }> {
  const tmp = mkdtempSync(join(tmpdir(), "openshell-node-test-"));
  const listen = `127.0.0.1:${await freePort()}`;
  const dataDir = join(tmp, "data");
  const child = spawn(
    gatewayBinary(),
    // Push mode, and sandbox tokens in the data dir: the ConfigSession
    // tests act as a sandbox's supervisor.
    [
      "up",
      "--replicas",
      "3",
      "--listen",
      listen,
      "--data-dir",
      dataDir,
      "--config-delivery-mode",
      "push",
      "--expose-sandbox-tokens",
    ],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  let output = "";
  const ready = new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`openshell-gateway up did not start:\n${output.slice(-4000)}`)),
      START_MS,
    );
    const onData = (chunk: Buffer) => {
      output += chunk.toString();
      if (output.includes("serving http://")) {
        clearTimeout(timer);
        resolve();
      }
    };
    child.stdout?.on("data", onData);
    child.stderr?.on("data", (chunk: Buffer) => {
      output += chunk.toString();
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`openshell-gateway up exited (${code}):\n${output.slice(-4000)}`));
    });
  });
  try {
    await ready;
  } catch (err) {
    await stop(child);
    throw err;
  }
  // Keep draining so the pipes never fill.
  child.stdout?.resume();
  child.stderr?.resume();
  return { cluster: { endpoint: `http://${listen}`, dataDir }, child, tmp };
}

let shared: Promise<{ cluster: Cluster; child: ChildProcess; tmp: string }> | null = null;

/** The run's cluster, started on first use (see `stopCluster`). */
export async function cluster(): Promise<Cluster> {
  shared ??= startCluster();
  return (await shared).cluster;
}

/** Stops the run's cluster, if one was started (main.test.ts runs it last). */
export async function stopCluster(): Promise<void> {
  if (shared === null) return;
  const started = await shared.catch(() => null);
  shared = null;
  if (started !== null) {
    await stop(started.child);
    rmSync(started.tmp, { recursive: true, force: true });
  }
}

export interface TokenGateway {
  endpoint: string;
  token: string;
  close(): Promise<void>;
}

/** One replica that requires the bearer token it returns. */
export async function tokenGateway(): Promise<TokenGateway> {
  const token = `tok-${randomUUID()}`;
  const tmp = mkdtempSync(join(tmpdir(), "openshell-node-token-"));
  const readyFile = join(tmp, "ready.json");
  const child = spawn(
    gatewayBinary(),
    [
      "serve",
      "--listen",
      "127.0.0.1:0",
      "--metrics-listen",
      "127.0.0.1:0",
      "--data-dir",
      join(tmp, "data"),
      "--ready-file",
      readyFile,
      "--token",
      token,
      "--stop-sandboxes-on-exit",
    ],
    { stdio: ["ignore", "ignore", "ignore"] },
  );
  const deadline = Date.now() + START_MS;
  for (;;) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop(child);
      throw new Error("gateway serve did not start");
    }
    try {
      const info = JSON.parse(readFileSync(readyFile, "utf8")) as { url: string };
      return {
        endpoint: info.url.replace(/\/$/, ""),
        token,
        close: async () => {
          await stop(child);
          rmSync(tmp, { recursive: true, force: true });
        },
      };
    } catch {
      await sleep(50);
    }
  }
}

export interface HostsGateway {
  endpoint: string;
  /** The replica id (its ready file's `replica_id`). */
  replica: string;
  /** Issues host `hostId`'s token with the real `openshell-gateway host-token`. */
  hostToken(hostId: string): string;
  /** One sample of the replica's /metrics (0 when absent). */
  metric(sample: string): Promise<number>;
  close(): Promise<void>;
}

/** One dev-mode replica in `--driver hosts` mode: sandboxes go to shared supervisor hosts. */
export async function hostsGateway(): Promise<HostsGateway> {
  const tmp = mkdtempSync(join(tmpdir(), "openshell-node-hosts-"));
  const readyFile = join(tmp, "ready.json");
  const dataDir = join(tmp, "data");
  const child = spawn(
    gatewayBinary(),
    [
      "serve",
      "--dev",
      "--driver",
      "hosts",
      "--config-delivery-mode",
      "push",
      "--listen",
      "127.0.0.1:0",
      "--metrics-listen",
      "127.0.0.1:0",
      "--data-dir",
      dataDir,
      "--ready-file",
      readyFile,
    ],
    { stdio: ["ignore", "ignore", "ignore"] },
  );
  const deadline = Date.now() + START_MS;
  for (;;) {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop(child);
      throw new Error("gateway serve --driver hosts did not start");
    }
    try {
      const info = JSON.parse(readFileSync(readyFile, "utf8")) as {
        url: string;
        metrics: string;
        replica_id: string;
      };
      return {
        endpoint: info.url.replace(/\/$/, ""),
        replica: info.replica_id,
        hostToken(hostId: string): string {
          const out = join(tmp, `${hostId}.token`);
          const printed = execFileSync(
            gatewayBinary(),
            ["host-token", "--data-dir", dataDir, "--host-id", hostId, "--out", out],
            { encoding: "utf8" },
          );
          const token = readFileSync(out, "utf8").trim();
          if (token === "" || printed.includes(token)) throw new Error("host-token misbehaved");
          return token;
        },
        async metric(sample: string): Promise<number> {
          const text = await (await fetch(`http://${info.metrics}/metrics`)).text();
          const line = text.split("\n").find((l) => l.startsWith(`${sample} `));
          return line === undefined ? 0 : Number(line.split(" ").at(-1));
        },
        close: async () => {
          await stop(child);
          rmSync(tmp, { recursive: true, force: true });
        },
      };
    } catch {
      await sleep(50);
    }
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `check` every 50 ms until it is true; fails after `timeoutMs`. */
export async function until(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 20_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting: ${what}`);
    await sleep(50);
  }
}

/** Whether `pid` runs (a zombie has exited: only its reaping is pending). */
export function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return !(stat.split(") ").pop() ?? "").startsWith("Z");
  } catch {
    return false;
  }
}

/**
 * Host PIDs of the processes whose environment holds TEST_MARKER=marker (a
 * PID a sandbox reports about itself is one of its own namespace).
 */
export function markedPids(marker: string): number[] {
  const wanted = `TEST_MARKER=${marker}`;
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    let environ: string;
    try {
      environ = readFileSync(`/proc/${entry}/environ`, "latin1");
    } catch {
      continue;
    }
    if (environ.split("\0").includes(wanted) && running(Number(entry))) pids.push(Number(entry));
  }
  return pids;
}

export function unique(prefix: string): string {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}
