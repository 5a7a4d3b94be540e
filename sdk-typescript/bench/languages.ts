// The TypeScript program of `make bench BENCH=languages` (and `make bench
// BENCH=typescript`): @openshell/sdk against what a grpc-js user would
// write (bench/grpcjs.ts: a client loaded from the same proto with
// @grpc/proto-loader, and a ForwardTcp pump), following the per-language
// contract of bench/src/contract.rs.
//
// Inputs (environment): OPENSHELL_ENDPOINT, OPENSHELL_TOKEN (optional),
// OPENSHELL_BENCH_SANDBOX (READY), OPENSHELL_BENCH_IPERF_PORT (an
// `iperf3 -s` on 127.0.0.1 inside the sandbox's network, its own loopback
// under isolation; without it the program starts its own inside the
// sandbox through an exec stream when iperf3 is on PATH, else reports no
// forward figure),
// OPENSHELL_BENCH_ROUNDS (default 5), OPENSHELL_BENCH_FORWARD_SECONDS
// (default 3), OPENSHELL_BENCH_EXEC_MIB (default 64), OPENSHELL_BENCH_PROTO
// (the proto/ directory, default the repository's), OPENSHELL_SDK_NATIVE
// (the addon; `make bench` passes the release build).
//
// Per round, each figure runs both clients in a fresh random order:
// GetSandbox latency (100 batches of 10 per client, interleaved), 100
// concurrent GetSandbox callers x 20 calls, one iperf3 run through each
// forward, one exec of `head -c` streaming its stdout. Prints a table, then
// as the last line `BENCH_JSON {...}` with the medians over the rounds.
import { execFile } from "node:child_process";
import { type AddressInfo, createServer } from "node:net";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Client } from "../src/index.js";
import { grpcJsClient, grpcJsForward, type OpenShellGrpcClient } from "./grpcjs.js";

const UNARY_WARMUP = 100;
const UNARY_BATCHES = 100;
const UNARY_BATCH = 10;
const CONCURRENT_CALLERS = 100;
const CONCURRENT_CALLS_EACH = 20;

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

function envNumber(name: string, fallback: number): number {
  const value = process.env[name];
  if (value === undefined || value === "") return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} is not a positive number`);
  return n;
}

/** `rounds` rounds of `0..arms`, each shuffled. */
function interleaved(arms: number, rounds: number): number[] {
  const order: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const round = Array.from({ length: arms }, (_, i) => i);
    for (let i = round.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [round[i], round[j]] = [round[j] as number, round[i] as number];
    }
    order.push(...round);
  }
  return order;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.round((sorted.length - 1) * p)] ?? Number.NaN;
}

function median(values: number[]): number | null {
  if (values.length === 0) return null;
  const s = [...values].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 === 1
    ? (s[mid] as number)
    : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
}

/** One client's calls, as the benchmark makes them. */
interface Arm {
  name: string;
  get(): Promise<void>;
  /** Stdout bytes of `head -c bytes /dev/zero`, streamed. */
  execStdout(bytes: number): Promise<number>;
}

function sdkArm(client: Client, sandbox: string): Arm {
  return {
    name: "sdk",
    async get() {
      const got = await client.sandboxes.get(sandbox);
      if (got.name !== sandbox) throw new Error("wrong sandbox");
    },
    async execStdout(bytes) {
      let total = 0;
      for await (const event of client.execStream(sandbox, [
        "head",
        "-c",
        String(bytes),
        "/dev/zero",
      ])) {
        if (event.type === "stdout") total += event.data.length;
        else if (event.type === "exit" && event.exitCode !== 0) {
          throw new Error(`head exited with ${event.exitCode}`);
        }
      }
      return total;
    },
  };
}

function grpcJsArm(client: OpenShellGrpcClient, sandbox: string): Arm {
  return {
    name: "grpc-js",
    get() {
      return new Promise((resolve, reject) =>
        client.GetSandbox({ name: sandbox }, (err, value) => {
          if (err !== null) reject(err);
          else if (value?.sandbox?.metadata?.name !== sandbox) reject(new Error("wrong sandbox"));
          else resolve();
        }),
      );
    },
    execStdout(bytes) {
      return new Promise((resolve, reject) => {
        let total = 0;
        let exit: number | null = null;
        const call = client.ExecSandbox({
          sandbox,
          command: ["head", "-c", String(bytes), "/dev/zero"],
        });
        call.on("data", (event) => {
          if (event.stdout !== undefined) total += event.stdout.data.length;
          if (event.exit !== undefined) exit = event.exit.exit_code ?? 0;
        });
        call.on("error", reject);
        call.on("end", () => {
          if (exit !== 0) reject(new Error(`exec ended with exit ${exit}`));
          else resolve(total);
        });
      });
    },
  };
}

/** `callers` loops of `each` calls on one client: calls per second. */
async function concurrent(arm: Arm, callers: number, each: number): Promise<number> {
  const started = performance.now();
  await Promise.all(
    Array.from({ length: callers }, async () => {
      for (let i = 0; i < each; i++) await arm.get();
    }),
  );
  return (callers * each) / ((performance.now() - started) / 1000);
}

// ---------------------------------------------------------------- iperf3

const run = promisify(execFile);

async function hasIperf3(): Promise<boolean> {
  try {
    await run("iperf3", ["--version"]);
    return true;
  } catch {
    return false;
  }
}

async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Rejects with `what` when `promise` has not settled within `ms`. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(what)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * `iperf3 -s` inside `sandbox`, on its own loopback (a forward's target is
 * the sandbox's port: every sandbox has a network namespace of its own),
 * through an exec stream, once it listens; `stop` cancels the stream, which
 * ends it. The port is one free on this host, so that it is free in the
 * sandbox without isolation too.
 */
async function iperf3Server(
  client: Client,
  sandbox: string,
): Promise<{ port: number; stop(): Promise<void> }> {
  const port = await freePort();
  const stream = client.execStream(sandbox, [
    "iperf3",
    "-s",
    "--forceflush",
    "-B",
    "127.0.0.1",
    "-p",
    String(port),
  ]);
  let seen = "";
  let listening = false;
  let ready: () => void = () => {};
  let failed: (err: unknown) => void = () => {};
  const started = new Promise<void>((resolve, reject) => {
    ready = resolve;
    failed = reject;
  });
  // One reader for the stream's whole life, so iperf3 never blocks on a
  // full pipe; what it prints once it listens is dropped.
  const ended = (async () => {
    for await (const event of stream) {
      if (event.type === "exit") {
        failed(new Error(`iperf3 -s exited with ${event.exitCode}: ${seen}`));
      } else if (!listening) {
        seen += event.data.toString();
        if (seen.includes("Server listening")) {
          listening = true;
          ready();
        }
      }
    }
    failed(new Error(`iperf3 -s's exec stream ended: ${seen}`));
  })().catch(failed);
  const stop = async (): Promise<void> => {
    stream.cancel();
    await within(ended, 10_000, "iperf3 -s's exec stream did not end in 10 s");
  };
  try {
    await within(started, 10_000, "iperf3 -s did not listen in the sandbox within 10 s");
  } catch (err) {
    await stop();
    throw err;
  }
  return { port, stop };
}

/** One `iperf3 -c` run (one stream) into `port`: the receiver's Gbit/s. */
async function iperf3GbitS(port: number, seconds: number): Promise<number> {
  const { stdout } = await run(
    "iperf3",
    ["-c", "127.0.0.1", "-p", String(port), "-t", String(seconds), "-J"],
    { maxBuffer: 16 * 1024 * 1024, timeout: (seconds + 60) * 1000 },
  );
  const report = JSON.parse(stdout) as {
    error?: string;
    end?: { sum_received?: { bits_per_second: number } };
  };
  const bps = report.end?.sum_received?.bits_per_second;
  if (report.error !== undefined || bps === undefined) {
    throw new Error(`iperf3 -c to port ${port}: ${report.error ?? "no sum_received"}`);
  }
  return bps / 1e9;
}

// ---------------------------------------------------------------- main

interface Samples {
  p50: number[];
  p99: number[];
  concurrent: number[];
  forward: number[];
  exec: number[];
}

async function main(): Promise<void> {
  const endpoint = env("OPENSHELL_ENDPOINT");
  const sandbox = env("OPENSHELL_BENCH_SANDBOX");
  const token = process.env.OPENSHELL_TOKEN || undefined;
  const rounds = envNumber("OPENSHELL_BENCH_ROUNDS", 5);
  const seconds = envNumber("OPENSHELL_BENCH_FORWARD_SECONDS", 3);
  const execMib = envNumber("OPENSHELL_BENCH_EXEC_MIB", 64);
  const protoDir =
    process.env.OPENSHELL_BENCH_PROTO ?? fileURLToPath(new URL("../../../proto", import.meta.url));
  const client = new Client({ endpoint, timeoutMs: 120_000, ...(token ? { token } : {}) });
  const grpcClient = grpcJsClient(protoDir, new URL(endpoint).host, token);
  const arms = [sdkArm(client, sandbox), grpcJsArm(grpcClient, sandbox)];

  // The forward target: the given iperf3 server, else our own in the sandbox.
  let iperfPort = envNumber("OPENSHELL_BENCH_IPERF_PORT", 0);
  let ownServer: { stop(): Promise<void> } | null = null;
  if (iperfPort === 0 && (await hasIperf3())) {
    const server = await iperf3Server(client, sandbox);
    iperfPort = server.port;
    ownServer = server;
  }
  const forward = iperfPort > 0 ? await client.forward(sandbox, iperfPort) : null;
  const pump = iperfPort > 0 ? await grpcJsForward(grpcClient, sandbox, iperfPort) : null;
  const forwardPorts = [forward?.localAddress.port ?? 0, pump?.port ?? 0];

  const samples: Samples[] = arms.map(() => ({
    p50: [],
    p99: [],
    concurrent: [],
    forward: [],
    exec: [],
  }));
  const execBytes = execMib * 1024 * 1024;
  try {
    for (const arm of arms) {
      for (let i = 0; i < UNARY_WARMUP; i++) await arm.get();
      await concurrent(arm, CONCURRENT_CALLERS, 1);
    }
    for (let round = 0; round < rounds; round++) {
      const unary: number[][] = arms.map(() => []);
      for (const a of interleaved(arms.length, UNARY_BATCHES)) {
        for (let i = 0; i < UNARY_BATCH; i++) {
          const started = performance.now();
          await (arms[a] as Arm).get();
          (unary[a] as number[]).push((performance.now() - started) * 1000);
        }
      }
      unary.forEach((latencies, a) => {
        latencies.sort((x, y) => x - y);
        samples[a]?.p50.push(percentile(latencies, 0.5));
        samples[a]?.p99.push(percentile(latencies, 0.99));
      });
      for (const a of interleaved(arms.length, 1)) {
        const rate = await concurrent(arms[a] as Arm, CONCURRENT_CALLERS, CONCURRENT_CALLS_EACH);
        samples[a]?.concurrent.push(rate);
      }
      if (iperfPort > 0) {
        for (const a of interleaved(arms.length, 1)) {
          samples[a]?.forward.push(await iperf3GbitS(forwardPorts[a] as number, seconds));
        }
      }
      for (const a of interleaved(arms.length, 1)) {
        const started = performance.now();
        const got = await (arms[a] as Arm).execStdout(execBytes);
        const took = (performance.now() - started) / 1000;
        if (got !== execBytes)
          throw new Error(`${arms[a]?.name} exec: ${got} of ${execBytes} bytes`);
        samples[a]?.exec.push(execMib / took);
      }
      console.error(`typescript: round ${round + 1} of ${rounds} done`);
    }
  } finally {
    await forward?.close();
    await pump?.close();
    await ownServer?.stop();
  }
  const failed = forward?.stats().connectionsFailed ?? 0;
  if (failed > 0) throw new Error(`${failed} SDK forward connections failed`);

  const rows = arms.map((arm, a) => {
    const s = samples[a] as Samples;
    return {
      client: arm.name,
      unary_p50_us: median(s.p50),
      unary_p99_us: median(s.p99),
      concurrent_per_s: median(s.concurrent),
      forward_gbit_s: median(s.forward),
      exec_stdout_mib_s: median(s.exec),
    };
  });
  console.log(
    `typescript (Node ${process.version}): @openshell/sdk vs @grpc/grpc-js, ${rounds} rounds (medians); per round ` +
      `${UNARY_BATCHES * UNARY_BATCH} GetSandbox calls per client, ${CONCURRENT_CALLERS} concurrent callers x ` +
      `${CONCURRENT_CALLS_EACH}, one iperf3 -t ${seconds} per forward, one exec of ${execMib} MiB stdout`,
  );
  const cell = (v: number | null, digits: number) => (v === null ? "-" : v.toFixed(digits));
  console.log(
    `  ${"client".padEnd(8)} ${"p50 us".padStart(10)} ${"p99 us".padStart(10)} ${"conc/s".padStart(12)} ` +
      `${"fwd Gbit/s".padStart(12)} ${"exec MiB/s".padStart(12)}`,
  );
  for (const row of rows) {
    console.log(
      `  ${row.client.padEnd(8)} ${cell(row.unary_p50_us, 1).padStart(10)} ${cell(row.unary_p99_us, 1).padStart(10)} ` +
        `${cell(row.concurrent_per_s, 0).padStart(12)} ${cell(row.forward_gbit_s, 2).padStart(12)} ` +
        `${cell(row.exec_stdout_mib_s, 0).padStart(12)}`,
    );
  }
  grpcClient.close();
  await client.close();
  console.log(`BENCH_JSON ${JSON.stringify({ language: "typescript", rows })}`);
}

await main();
