// Plain data the client returns.
import { inspect } from "node:util";
import type { NativeExecOutput, NativeSandbox, NativeSshSession } from "./native.js";

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

/**
 * An SSH session token for one sandbox, as `CreateSshSession` issued it.
 *
 * `token` is a secret, so it is a getter over a private field rather than a
 * property: `util.inspect` (and so `console.log`) and `JSON.stringify` show
 * every other field and never the token, and neither do `Object.keys`,
 * `Object.entries` or `{ ...session }`. Read `session.token` where it is
 * needed (a forward's `sshSessionToken`).
 */
export class SshSession {
  /** The sandbox's id. */
  readonly sandboxId: string;
  /** `SHA256:<base64>` of the sandbox's SSH host key (pin it); empty until known. */
  readonly hostKeyFingerprint: string;
  /** When the token stops working; null when it does not expire. */
  readonly expiresAt: Date | null;
  /** The gateway address the session was issued through. */
  readonly gatewayHost: string;
  readonly gatewayPort: number;
  /** `http` or `https`. */
  readonly gatewayScheme: string;
  readonly #token: string;

  /** @internal Builds one (the constructor is private: not public API). */
  static _of(s: NativeSshSession): SshSession {
    return new SshSession(s);
  }

  private constructor(s: NativeSshSession) {
    this.sandboxId = s.sandboxId;
    this.#token = s.token;
    this.hostKeyFingerprint = s.hostKeyFingerprint;
    this.expiresAt =
      s.expiresAtMs === undefined || s.expiresAtMs === null ? null : new Date(s.expiresAtMs);
    this.gatewayHost = s.gatewayHost;
    this.gatewayPort = s.gatewayPort;
    this.gatewayScheme = s.gatewayScheme;
    Object.freeze(this);
  }

  /** The secret: a forward's `sshSessionToken`. */
  get token(): string {
    return this.#token;
  }

  /** What `JSON.stringify` writes: every field but the token. */
  toJSON(): Record<string, unknown> {
    return {
      sandboxId: this.sandboxId,
      hostKeyFingerprint: this.hostKeyFingerprint,
      expiresAt: this.expiresAt,
      gatewayHost: this.gatewayHost,
      gatewayPort: this.gatewayPort,
      gatewayScheme: this.gatewayScheme,
    };
  }

  /** What `util.inspect` shows: the fields, with the token redacted. */
  [inspect.custom](_depth: number, options: object): string {
    const shown = { ...this.toJSON(), token: "<redacted>" };
    return `SshSession ${inspect(shown, options)}`;
  }

  toString(): string {
    return `SshSession(${this.sandboxId}, token <redacted>)`;
  }
}
