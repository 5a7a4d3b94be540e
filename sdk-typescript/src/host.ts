// A shared supervisor host's session: HostSession.
//
// A host is one process serving many sandboxes. It holds ONE `ConnectHost`
// session with the gateway, on its host token, and the gateway assigns
// sandboxes to it; every assigned sandbox's session rides inside the
// host's. The protocol runs in the Rust core: the host hello (member id,
// capacity, `stay`), placement redirects followed at once with `stay`,
// sticky redials to the replica that accepted it, falls back to the shared
// address, the assignment, and each sandbox's configuration (pushed, or
// polled when not). TypeScript sees one `apply(sandboxId, snapshot)`
// callback, run one snapshot at a time per sandbox; its verdict answers.
import { type ApplyResult, ConfigSnapshot, verdict } from "./config.js";
import { call, callSync, cancelled, deadlineExceeded, invalidArgument } from "./errors.js";
import { KeepAlive } from "./keepalive.js";
import {
  type NativeHostSession,
  type NativeHostSessionStats,
  type NativeHostUpdate,
  native,
} from "./native.js";
import { onAbort } from "./signal.js";

/** `apply(sandboxId, snapshot)`: its verdict answers the snapshot (see `ApplyResult`). */
export type HostApplyCallback = (
  sandboxId: string,
  snapshot: ConfigSnapshot,
) => ApplyResult | Promise<ApplyResult>;

export interface HostSessionOptions {
  /** The gateway's shared address (the edge in front of a cluster). */
  endpoint: string;
  /** The host's member id: the id its host token was issued for. */
  memberId: string;
  /** The host token (`openshell-gateway host-token`). Never shown or logged. */
  hostToken: string;
  /** Applies each assigned sandbox's configuration (required). */
  apply: HostApplyCallback;
  /** Most sandboxes this host serves at once (default 0: no limit). */
  capacity?: number;
  /** Sandbox sessions announce push support (default true; false: they poll). */
  configPush?: boolean;
  /** The host instance id (default: a new UUID). */
  instanceId?: string;
  ca?: string | Uint8Array;
  tlsServerName?: string;
  connectTimeoutMs?: number;
  allowCleartextToken?: boolean;
}

/** Counters of a host session (64-bit counters as bigint). */
export interface HostSessionStats {
  /** Host sessions the gateway accepted. */
  readonly sessionsAccepted: bigint;
  /** Placement redirects followed (each at once, with `stay`). */
  readonly redirects: bigint;
  /** Redials of the replica that held a lost session (with `stay`). */
  readonly stickyRedials: bigint;
  /** Falls back to the shared address. */
  readonly fallbacks: bigint;
  /** Whether the last hello carried `stay`. */
  readonly stay: boolean;
  readonly sessionId: string | null;
  /** The replica holding the session. */
  readonly servedBy: string | null;
  /** Sandboxes in the last assignment. */
  readonly assigned: number;
}

function statsOf(s: NativeHostSessionStats): HostSessionStats {
  return Object.freeze({
    sessionsAccepted: s.sessionsAccepted,
    redirects: s.redirects,
    stickyRedials: s.stickyRedials,
    fallbacks: s.fallbacks,
    stay: s.stay,
    sessionId: s.sessionId ?? null,
    servedBy: s.servedBy ?? null,
    assigned: s.assigned,
  });
}

/**
 * A shared supervisor host's session:
 *
 *     const host = new HostSession({ endpoint, memberId, hostToken, apply });
 *     await host.run({ signal }); // until close() or the signal aborts
 *
 * `apply` runs on the main thread, one snapshot at a time per sandbox
 * (snapshots of different sandboxes may be applied concurrently). Once
 * started, the session keeps the process alive until `close()` (like a
 * `net.Server`), unless `unref()` was called.
 */
export class HostSession implements AsyncDisposable {
  readonly memberId: string;
  readonly #native: NativeHostSession;
  readonly #apply: HostApplyCallback;
  #keepAlive: KeepAlive | null = null;
  #unref = false;
  #closing: Promise<void> | null = null;

  constructor(options: HostSessionOptions) {
    if (typeof options.apply !== "function") {
      throw invalidArgument("a host session needs an apply function");
    }
    const capacity = options.capacity ?? 0;
    if (!Number.isInteger(capacity) || capacity < 0 || capacity > 0xffff_ffff) {
      throw invalidArgument("capacity must be a whole number from 0 to 4294967295");
    }
    const ca = options.ca;
    this.#apply = options.apply;
    // The token goes to the addon and is not kept on this object.
    this.#native = callSync(
      () =>
        new native.NativeHostSession(
          {
            endpoint: options.endpoint,
            memberId: options.memberId,
            hostToken: options.hostToken,
            capacity,
            configPush: options.configPush,
            instanceId: options.instanceId,
            caPem: ca === undefined ? undefined : Buffer.from(ca),
            tlsServerName: options.tlsServerName,
            connectTimeoutMs: options.connectTimeoutMs,
            allowCleartextToken: options.allowCleartextToken,
          },
          (u: NativeHostUpdate) => this.#deliver(u),
        ),
    );
    this.memberId = this.#native.memberId;
  }

  /** Runs the callback for one snapshot and answers it. */
  #deliver(update: NativeHostUpdate): void {
    void (async () => {
      let snapshot: ConfigSnapshot;
      try {
        snapshot = ConfigSnapshot._decode(update.sandboxConfig, update.providerEnvironment);
      } catch {
        this.#native.ack(update.id, false, "the update could not be decoded");
        return;
      }
      let applied: boolean;
      let reason: string | undefined;
      try {
        [applied, reason] = verdict(await this.#apply(update.sandboxId, snapshot));
      } catch (err) {
        const name = err instanceof Error ? err.name : typeof err;
        [applied, reason] = [false, `the apply callback threw ${name}`];
      }
      // False when the session closed meanwhile: nothing is waiting any more.
      this.#native.ack(update.id, applied, reason ?? null);
    })();
  }

  /** The instance id every hello carries. */
  get instanceId(): string {
    return this.#native.instanceId;
  }

  get closed(): boolean {
    return this.#native.closed;
  }

  stats(): HostSessionStats {
    return statsOf(this.#native.stats());
  }

  /** Starts the session (`run` does). Idempotent; returns `this`. */
  start(): this {
    if (this.#keepAlive === null && this.#closing === null && !this.#native.closed) {
      this.#keepAlive = new KeepAlive();
      if (this.#unref) this.#keepAlive.unref();
      this.#native.start(() => this.#keepAlive?.release());
    }
    return this;
  }

  /**
   * Starts the session and serves the host's sandboxes until `close()` or
   * until `signal` aborts (which closes it; the promise then resolves).
   * Rejects with the session's error if it could not run.
   */
  async run(options: { signal?: AbortSignal } = {}): Promise<void> {
    const stop = onAbort(options.signal, () => void this.close());
    try {
      this.start();
      await this.waitClosed();
    } finally {
      stop();
    }
  }

  /** Lets the process exit while this session is open. */
  unref(): this {
    this.#unref = true;
    this.#keepAlive?.unref();
    return this;
  }

  /** Undoes `unref()`. */
  ref(): this {
    this.#unref = false;
    this.#keepAlive?.ref();
    return this;
  }

  /**
   * Waits until the gateway accepted a host session. Rejects with a
   * CancelledError when the session closes or the signal aborts, a
   * DeadlineExceededError when `timeoutMs` (default 30 000) passes.
   */
  async waitAccepted(
    options: { timeoutMs?: number; signal?: AbortSignal } = {},
  ): Promise<HostSessionStats> {
    const deadline = performance.now() + (options.timeoutMs ?? 30_000);
    let aborted = false;
    const stop = onAbort(options.signal, () => {
      aborted = true;
    });
    try {
      for (;;) {
        const s = this.#native.stats();
        if (s.sessionsAccepted > 0n && s.sessionId != null) return statsOf(s);
        if (aborted) throw cancelled("waitAccepted was aborted");
        if (this.closed) throw cancelled("the host session is closed");
        if (performance.now() >= deadline) {
          throw deadlineExceeded("no host session accepted in time");
        }
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    } finally {
      stop();
    }
  }

  /** Resolves when the session ended; rejects with its error if it could not run. */
  waitClosed(): Promise<void> {
    return call(this.#native.waitClosed());
  }

  /** Ends the session; unanswered snapshots are rejected. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#native.close();
      await this.#native.waitClosed().catch(() => {});
      this.#keepAlive?.release();
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  /** Names the host, never its token. */
  toString(): string {
    return `HostSession(memberId=${this.memberId}, instanceId=${this.instanceId}, closed=${this.closed})`;
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toString();
  }
}
