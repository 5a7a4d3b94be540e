// TypeScript runner of the conformance scenarios (conformance/scenarios.json).
//
// Performs every scenario's steps with @openshell/sdk against the cluster at
// $OPENSHELL_ENDPOINT and reports what it observed, one JSON line per step
// (format: conformance/README.md, "Observations"). It never reads a step's
// `expect`: the harness judges every runner in one place.
//
// Usage: node dist/conformance/runner.js [SCENARIOS_JSON] [--only ID ...]
import { randomBytes, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { fromBinary, fromJson, type JsonValue, toBinary, toJson } from "@bufbuild/protobuf";
import {
  AlreadyExistsError,
  Client,
  type ExecEvent,
  type ExecResult,
  errorClass,
  method,
  OpenShellError,
  path,
} from "../src/index.js";
import { startSandboxServer } from "../test/sandbox-server.js";
import { configSession } from "./config.js";
import { FILES_LOGS_OPS } from "./files-logs.js";

type Step = Record<string, unknown> & { op: string };
type Result = Record<string, unknown>;
interface Scenario {
  id: string;
  requires?: string[];
  uses?: string[];
  steps: Step[];
}

const DEFAULT_SCENARIOS = join(
  dirname(fileURLToPath(import.meta.url)),
  "..",
  "..",
  "..",
  "conformance",
  "scenarios.json",
);
const STEP_LIMIT_MS = 120_000;
const TEXT_LIMIT = 4096;
const PLACEHOLDER = /\$\{([a-z][a-z0-9]*)\}/g;

class StepFailed extends Error {}

function emit(line: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(line)}\n`);
}

function text(field: string, data: Buffer): Result {
  return {
    [field]: data.subarray(0, TEXT_LIMIT).toString("utf8"),
    [`${field}_bytes`]: data.length,
  };
}

function errorObservation(err: OpenShellError): Result {
  return {
    code: err.code,
    grpc_status: err.grpcStatus,
    message: err.message,
    retryable: err.retryable,
    served_by: err.servedBy,
    class: err.constructor.name,
    class_for_code: errorClass(err.code).name,
  };
}

class Runner {
  readonly runId: string;
  readonly prefix: string;
  readonly client: Client;
  readonly named = new Set<string>();
  readonly ready = new Set<string>();
  readonly control: string | null;
  readonly dataDir: string | null;
  readonly caps: string[];

  constructor(endpoint: string, runId: string) {
    this.runId = runId
      .toLowerCase()
      .replace(/[^a-z0-9]/g, "")
      .slice(0, 12);
    this.prefix = `cf-ts-${this.runId}-`;
    this.client = new Client({ endpoint });
    this.control = process.env.OPENSHELL_CONFORMANCE_CONTROL || null;
    // A config session needs a sandbox token, read from the supervisor in
    // the cluster's data directory.
    this.dataDir = process.env.OPENSHELL_CONFORMANCE_DATA_DIR || null;
    this.caps = [
      "routing_stats",
      ...(this.dataDir ? ["push_config"] : []),
      ...(this.control ? ["replica_control"] : []),
    ];
  }

  name(alias: string): string {
    this.named.add(this.prefix + alias);
    return this.prefix + alias;
  }

  subst(value: unknown): unknown {
    if (typeof value === "string") {
      return value.replace(PLACEHOLDER, (_, alias: string) =>
        alias === "run" ? this.runId : this.name(alias),
      );
    }
    if (Array.isArray(value)) return value.map((v) => this.subst(v));
    if (value !== null && typeof value === "object") {
      return Object.fromEntries(
        Object.entries(value).map(([k, v]) => [this.subst(k) as string, this.subst(v)]),
      );
    }
    return value;
  }

  target(step: Step): string {
    if ("name" in step) return String(this.subst(step.name));
    return this.name(typeof step.sandbox === "string" ? step.sandbox : "main");
  }

  async ensure(alias: string): Promise<void> {
    if (this.ready.has(alias)) return;
    const name = this.name(alias);
    try {
      await this.client.sandboxes.create({ name });
    } catch (err) {
      if (!(err instanceof AlreadyExistsError)) throw err;
    }
    await this.client.sandboxes.waitReady(name, { timeoutMs: 60_000 });
    this.ready.add(alias);
  }

  async cleanup(): Promise<void> {
    for (const name of [...this.named].sort()) {
      try {
        await this.client.sandboxes.delete(name);
        await this.client.sandboxes.waitDeleted(name, { timeoutMs: 60_000 });
      } catch (err) {
        if (!(err instanceof OpenShellError)) throw err;
      }
    }
    await this.client.close();
  }

  async run(scenario: Scenario): Promise<void> {
    const missing = (scenario.requires ?? []).filter((c) => !this.caps.includes(c));
    if (missing.length > 0) {
      emit({ type: "skip", scenario: scenario.id, missing });
      return;
    }
    for (const alias of scenario.uses ?? []) {
      try {
        await this.ensure(alias);
      } catch (err) {
        emit({ type: "setup", scenario: scenario.id, alias, failure: String(err) });
        return;
      }
    }
    for (const [index, step] of scenario.steps.entries()) {
      const started = performance.now();
      const outcome = await this.perform(step);
      const ms = Math.trunc(performance.now() - started);
      emit({ type: "step", scenario: scenario.id, step: index, op: step.op, ms, ...outcome });
    }
  }

  async perform(step: Step): Promise<Result> {
    const op = OPS[step.op];
    if (op === undefined) return { failure: `this runner does not know op '${step.op}'` };
    const signal = AbortSignal.timeout(STEP_LIMIT_MS);
    try {
      return { result: await op(this, step, signal) };
    } catch (err) {
      if (err instanceof OpenShellError && !(signal.aborted && err.code === "cancelled")) {
        return { error: errorObservation(err) };
      }
      if (signal.aborted) return { failure: `timed out after ${STEP_LIMIT_MS / 1000} s` };
      return { failure: `${(err as Error).name}: ${(err as Error).message}` };
    }
  }
}

type Op = (r: Runner, step: Step, signal: AbortSignal) => Promise<Result>;

const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const record = (v: unknown): Record<string, string> | undefined =>
  v !== null && typeof v === "object" ? (v as Record<string, string>) : undefined;
const seconds = (v: unknown): number | undefined => (typeof v === "number" ? v * 1000 : undefined);

function runExec(r: Runner, step: Step, signal: AbortSignal): Promise<ExecResult> {
  let stdin: Buffer | undefined =
    typeof step.stdin === "string" ? Buffer.from(step.stdin) : undefined;
  if (typeof step.stdin_size === "number") stdin = Buffer.alloc(step.stdin_size);
  return r.client.exec(r.target(step), step.command as string[], {
    env: record(step.env),
    stdin,
    execTimeoutMs: seconds(step.exec_timeout),
    signal,
  });
}

async function execOp(r: Runner, step: Step, signal: AbortSignal): Promise<Result> {
  const out = await runExec(r, step, signal);
  return { ...text("stdout", out.stdout), ...text("stderr", out.stderr), exit_code: out.exitCode };
}

function counters(r: Runner): Result {
  const s = r.client.routingStats();
  return { hinted: Number(s.hinted), unrouted_retry: Number(s.unroutedRetries) };
}

async function askHarness(control: string, request: string): Promise<void> {
  const at = control.lastIndexOf(":");
  const answer = await new Promise<string>((resolve, reject) => {
    const socket = connect(Number(control.slice(at + 1)), control.slice(0, at), () =>
      socket.write(`${request}\n`),
    );
    let data = "";
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new StepFailed(`the harness did not answer '${request}' in 30 s`));
    }, 30_000);
    socket.on("data", (d: Buffer) => {
      data += d.toString();
      if (data.includes("\n")) {
        clearTimeout(timer);
        socket.end();
        resolve(data.trim());
      }
    });
    socket.on("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
  if (answer !== "ok") throw new StepFailed(`the harness refused '${request}': ${answer}`);
}

function encode(r: Runner, name: string, body: unknown): Buffer {
  const schema = method(name).input;
  const message = fromJson(schema, r.subst(body ?? {}) as JsonValue);
  return Buffer.from(toBinary(schema, message));
}

const OPS: Record<string, Op> = {
  ...FILES_LOGS_OPS,
  config_session: (r, step) => configSession(r, step),
  async create_sandbox(r, step, signal) {
    const s = await r.client.sandboxes.create({
      name: r.target(step),
      env: record(step.env),
      labels: record(step.labels),
      signal,
    });
    if (typeof step.sandbox === "string") r.ready.delete(step.sandbox);
    return { name: s.name, phase: s.phase, labels: { ...s.labels } };
  },
  async wait_ready(r, step, signal) {
    const s = await r.client.sandboxes.waitReady(r.target(step), {
      timeoutMs: seconds(step.timeout),
      signal,
    });
    return { name: s.name, phase: s.phase };
  },
  async get_sandbox(r, step, signal) {
    const s = await r.client.sandboxes.get(r.target(step), { signal });
    return { name: s.name, phase: s.phase };
  },
  async list_sandboxes(r, step, signal) {
    const found = await r.client.sandboxes.list({
      labelSelector: str(step.label_selector),
      signal,
    });
    return { names: found.map((s) => s.name) };
  },
  async delete_sandbox(r, step, signal) {
    await r.client.sandboxes.delete(r.target(step), { signal });
    return {};
  },
  async wait_deleted(r, step, signal) {
    await r.client.sandboxes.waitDeleted(r.target(step), {
      timeoutMs: seconds(step.timeout),
      signal,
    });
    return {};
  },
  async client_health(_r, step, signal) {
    await using other = new Client({ endpoint: String(step.endpoint), connectTimeoutMs: 2000 });
    await other.health({ signal });
    return {};
  },
  exec: execOp,
  async exec_stream(r, step, signal) {
    const events: ExecEvent[] = [];
    for await (const e of r.client.execStream(r.target(step), step.command as string[], {
      signal,
    })) {
      events.push(e);
    }
    const data = (type: "stdout" | "stderr") =>
      Buffer.concat(events.flatMap((e) => (e.type === type ? [e.data] : [])));
    const exit = events.find((e) => e.type === "exit");
    return {
      ...text("stdout", data("stdout")),
      ...text("stderr", data("stderr")),
      exit_code: exit?.type === "exit" ? exit.exitCode : null,
      events: events.length,
      exit_events: events.filter((e) => e.type === "exit").length,
      last_event: events.at(-1)?.type ?? null,
    };
  },
  async exec_repeat(r, step, signal) {
    const runs = [];
    for (let i = 0; i < Number(step.count); i++) {
      const out = await runExec(r, step, signal);
      runs.push({ ...text("stdout", out.stdout), exit_code: out.exitCode });
    }
    return { runs };
  },
  async routing_stats_delta(r, step, signal) {
    const before = counters(r);
    for (let i = 0; i < Number(step.count); i++) {
      await r.client.exec(r.target(step), step.command as string[], { signal });
    }
    return { routing_before: before, routing_after: counters(r) };
  },
  async unroute_owner_then_exec(r, step, signal) {
    if (r.control === null) throw new StepFailed("no OPENSHELL_CONFORMANCE_CONTROL");
    const name = r.target(step);
    const answer = await r.client.raw.unary(
      "/openshell.v1.OpenShell/GetSandbox",
      encode(r, "GetSandbox", { name }),
      { metadata: [["x-openshell-want-owner", "1"]], signal },
    );
    const owner = answer.metadata.find(([k]) => k === "x-openshell-owner")?.[1];
    if (owner === undefined) throw new StepFailed(`GetSandbox ${name} named no owner replica`);
    await askHarness(r.control, `unroute ${owner}`);
    const before = counters(r);
    let result: Result;
    let after: Result;
    try {
      result = await execOp(r, step, signal);
    } finally {
      after = counters(r);
      await askHarness(r.control, "restore");
    }
    return {
      ...result,
      unrouted_replica: owner,
      routing_before: before,
      routing_after: after,
    };
  },
  async interactive(r, step, signal) {
    const tty = step.tty === true;
    const session = await r.client.execInteractive(r.target(step), step.command as string[], {
      tty: tty ? { cols: Number(step.cols ?? 80), rows: Number(step.rows ?? 24) } : undefined,
      signal,
    });
    const output: Buffer[] = [];
    const stdout: Buffer[] = [];
    await using _session = session;
    const events = session.events()[Symbol.asyncIterator]();
    let exitCode: number | null = null;
    for (const action of (step.actions as Record<string, unknown>[] | undefined) ?? []) {
      if (typeof action.wait_output === "string") {
        const wanted = action.wait_output;
        while (!Buffer.concat(output).includes(wanted)) {
          const next = await events.next();
          if (next.done || next.value.type === "exit") {
            throw new StepFailed(`the process ended before '${wanted}'`);
          }
          output.push(next.value.data);
          if (next.value.type === "stdout") stdout.push(next.value.data);
        }
      } else if (Array.isArray(action.resize)) {
        await session.resize(Number(action.resize[0]), Number(action.resize[1]));
      } else if (typeof action.write === "string") {
        await session.write(action.write);
      } else if (action.close_stdin === true) {
        session.closeStdin();
      }
    }
    for (;;) {
      const next = await events.next();
      if (next.done) break;
      if (next.value.type === "exit") {
        exitCode = next.value.exitCode;
        continue;
      }
      output.push(next.value.data);
      if (next.value.type === "stdout") stdout.push(next.value.data);
    }
    return {
      ...text("stdout", Buffer.concat(stdout)),
      ...text("output", Buffer.concat(output)),
      exit_code: exitCode,
    };
  },
  async forward(r, step, signal) {
    if ("remote_port" in step) {
      await (await r.client.forward(r.target(step), Number(step.remote_port), { signal })).close();
      return {};
    }
    // The echo server runs inside the sandbox (testkit/scripts/sandbox-echo.py
    // through an exec stream): a forward reaches the sandbox's own loopback.
    const server = await startSandboxServer(r.client, r.target(step), { signal });
    try {
      const size = Number(step.bytes_per_connection);
      const fwd = await r.client.forward(r.target(step), server.port, { signal });
      const { address, port } = fwd.localAddress;
      const roundtrip = (i: number) =>
        new Promise<boolean>((resolve) => {
          const payload = Buffer.concat([randomBytes(size - 1), Buffer.from([i % 256])]);
          const chunks: Buffer[] = [];
          const socket = connect(port, address, () => socket.end(payload));
          socket.on("data", (d: Buffer) => chunks.push(d));
          socket.on("end", () => resolve(Buffer.concat(chunks).equals(payload)));
          socket.on("error", () => resolve(false));
        });
      const echoed = await Promise.all(
        Array.from({ length: Number(step.connections) }, (_, i) => roundtrip(i)),
      );
      const accepted = Number(fwd.stats().connectionsAccepted);
      await fwd.close();
      const refuses = await new Promise<boolean>((resolve) => {
        const socket = connect(port, address, () => {
          socket.destroy();
          resolve(false);
        });
        socket.on("error", () => resolve(true));
      });
      return { echoed, accepted, closed_refuses: refuses };
    } finally {
      await server.stop();
    }
  },
  async raw_unary(r, step, signal) {
    const m = method(String(step.method));
    const metadata = ((step.metadata as [string, string][] | undefined) ?? []).map(
      ([k, v]) => [k, v] as const,
    );
    const answer = await r.client.raw.unary(path(m), encode(r, m.name, step.request), {
      metadata,
      signal,
    });
    const response = toJson(m.output, fromBinary(m.output, answer.bytes), {
      useProtoFieldName: true,
    });
    return { metadata: answer.metadata, response };
  },
  async raw_stream(r, step, signal) {
    const m = method(String(step.method));
    const stream = await r.client.raw.stream(path(m), { signal });
    for (const body of (step.messages as unknown[]) ?? []) {
      await stream.send(encode(r, m.name, body));
    }
    stream.closeSend();
    let received = 0;
    for await (const _ of stream) received++;
    return { received };
  },
};

async function main(argv: string[]): Promise<number> {
  const only = new Set<string>();
  let args = argv;
  const at = args.indexOf("--only");
  if (at >= 0) {
    for (const id of args.slice(at + 1)) only.add(id);
    args = args.slice(0, at);
  }
  const file = args[0] ?? DEFAULT_SCENARIOS;
  const endpoint = process.env.OPENSHELL_ENDPOINT || "http://127.0.0.1:17670";
  const runId = process.env.OPENSHELL_CONFORMANCE_RUN || randomUUID().slice(0, 8);
  const runner = new Runner(endpoint, runId);
  emit({
    type: "hello",
    runner: "typescript",
    run: runner.runId,
    sandbox_prefix: runner.prefix,
    capabilities: runner.caps,
  });
  try {
    const scenarios = (JSON.parse(readFileSync(file, "utf8")) as { scenarios: Scenario[] })
      .scenarios;
    for (const scenario of scenarios) {
      if (only.size === 0 || only.has(scenario.id)) await runner.run(scenario);
    }
  } finally {
    await runner.cleanup();
  }
  return 0;
}

process.exitCode = await main(process.argv.slice(2));
