// Plain data the client returns.
import type { NativeExecOutput, NativeSandbox } from "./native.js";

/** Lifecycle phase of a sandbox. */
export type SandboxPhase =
  | "UNSPECIFIED"
  | "PROVISIONING"
  | "READY"
  | "ERROR"
  | "DELETING"
  | "UNKNOWN"
  | "STOPPING"
  | "STOPPED"
  | "STARTING"
  | (string & {});

export interface Sandbox {
  readonly id: string;
  readonly name: string;
  readonly phase: SandboxPhase;
  readonly labels: Readonly<Record<string, string>>;
  /** Exit code of the main process once it ended, else null. */
  readonly exitCode: number | null;
  /** Increases on every change (64-bit, hence bigint). */
  readonly resourceVersion: bigint;
  /** The full `openshell.v1.Sandbox` message, encoded. */
  readonly raw: Uint8Array;
}

export function sandboxOf(s: NativeSandbox): Sandbox {
  return Object.freeze({
    id: s.id,
    name: s.name,
    phase: s.phase,
    labels: Object.freeze({ ...s.labels }),
    exitCode: s.exitCode ?? null,
    resourceVersion: s.resourceVersion,
    raw: s.proto,
  });
}

/** Output of a command that has ended. */
export class ExecResult {
  readonly stdout: Buffer;
  readonly stderr: Buffer;
  readonly exitCode: number;

  constructor(stdout: Buffer, stderr: Buffer, exitCode: number) {
    this.stdout = stdout;
    this.stderr = stderr;
    this.exitCode = exitCode;
  }

  static of(out: NativeExecOutput): ExecResult {
    return new ExecResult(out.stdout, out.stderr, out.exitCode);
  }

  /** stdout decoded as UTF-8. */
  get stdoutText(): string {
    return this.stdout.toString("utf8");
  }

  /** stderr decoded as UTF-8. */
  get stderrText(): string {
    return this.stderr.toString("utf8");
  }

  /** Whether the command exited with status 0. */
  get ok(): boolean {
    return this.exitCode === 0;
  }
}

/** One event of a running command; a stream ends with exactly one `exit`. */
export type ExecEvent =
  | { readonly type: "stdout"; readonly data: Buffer }
  | { readonly type: "stderr"; readonly data: Buffer }
  | { readonly type: "exit"; readonly exitCode: number };

export interface ForwardStats {
  connectionsAccepted: bigint;
  connectionsActive: bigint;
  connectionsFailed: bigint;
  bytesIn: bigint;
  bytesOut: bigint;
}

export interface RoutingStats {
  /** Calls sent with an owner hint. */
  hinted: bigint;
  unhinted: bigint;
  unroutedRetries: bigint;
  ownerLookups: bigint;
  cacheHits: bigint;
}

export interface Health {
  status: string;
  version: string;
  servedBy: string | null;
}
