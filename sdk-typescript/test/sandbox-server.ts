// TCP servers that tests run inside a sandbox. Every sandbox has a network
// namespace of its own, so a forward to 127.0.0.1:PORT reaches the
// sandbox's port PORT, never a listener of the test process: a forward's
// target has to listen in there. The server is a python3 program run by an
// exec stream; it prints "listening PORT" once it accepts connections, and
// ending the stream ends it (the gateway kills the command's process group).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Client } from "../src/index.js";

const ECHO_SCRIPT = join(
  dirname(fileURLToPath(import.meta.url)),
  "..",
  "..",
  "..",
  "testkit",
  "scripts",
  "sandbox-echo.py",
);
const START_MS = 30_000;
const STOP_MS = 10_000;
const LISTENING = /^listening (\d+)$/m;

let echoSource: string | null = null;

/** The shared echo server (testkit/scripts/sandbox-echo.py): echoes every
 * connection back, passing a half-close on, until it is killed. */
export function echoProgram(): string {
  echoSource ??= readFileSync(ECHO_SCRIPT, "utf8");
  return echoSource;
}

export interface SandboxServerOptions {
  /** python3 source that prints "listening PORT" (default: the echo server). */
  program?: string;
  /** Its arguments (the echo server takes a port; 0, the default, picks one). */
  args?: string[];
  /** How long to wait for the "listening PORT" line. */
  startTimeoutMs?: number;
  /** Ends the server when aborted. */
  signal?: AbortSignal;
}

export interface SandboxServer extends AsyncDisposable {
  /** The port it listens on, on the sandbox's loopback. */
  readonly port: number;
  /** What it wrote to stderr so far (for failure messages). */
  readonly stderr: string;
  /** Ends the exec stream and waits (bounded) until it has ended; idempotent. */
  stop(): Promise<void>;
}

/** Rejects with `what` when `promise` has not settled within `ms`. */
async function within<T>(promise: Promise<T>, ms: number, what: () => string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(what())), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Starts `python3 -c PROGRAM ARGS...` in `sandbox` and waits for its port. */
export async function startSandboxServer(
  client: Client,
  sandbox: string,
  options: SandboxServerOptions = {},
): Promise<SandboxServer> {
  const command = ["python3", "-c", options.program ?? echoProgram(), ...(options.args ?? [])];
  const stream = client.execStream(sandbox, command, { signal: options.signal });
  let stdout = "";
  let stderr = "";
  let listening: (port: number) => void = () => {};
  let failed: (err: unknown) => void = () => {};
  const port = new Promise<number>((resolve, reject) => {
    listening = resolve;
    failed = reject;
  });
  // One reader for the stream's whole life, so the server's output never
  // backs up; settling `port` again after the first time does nothing.
  const ended = (async () => {
    for await (const event of stream) {
      if (event.type === "stderr") {
        stderr += event.data.toString();
      } else if (event.type === "stdout") {
        stdout += event.data.toString();
        const found = LISTENING.exec(stdout);
        if (found) listening(Number(found[1]));
      } else {
        failed(new Error(`the sandbox server exited with ${event.exitCode}:\n${stderr}`));
      }
    }
    failed(new Error(`the sandbox server's exec stream ended:\n${stderr}`));
  })().catch(failed);

  let stopped: Promise<void> | null = null;
  const stop = (): Promise<void> => {
    stopped ??= (async () => {
      stream.cancel();
      await within(ended, STOP_MS, () => `the sandbox server's exec did not end in ${STOP_MS} ms`);
    })();
    return stopped;
  };
  const startMs = options.startTimeoutMs ?? START_MS;
  try {
    const bound = await within(
      port,
      startMs,
      () => `no "listening PORT" from the sandbox server in ${startMs} ms; stderr:\n${stderr}`,
    );
    return {
      port: bound,
      get stderr() {
        return stderr;
      },
      stop,
      [Symbol.asyncDispose]: stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
