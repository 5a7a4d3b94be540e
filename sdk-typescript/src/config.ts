// The supervisor side of a sandbox's session: ConfigSession.
//
// A supervisor (or anything that runs a sandbox's workload) holds one
// `ConnectSupervisor` session with the gateway, on the sandbox's own token,
// and applies the sandbox's configuration. The protocol runs in the Rust
// core: the startup poll, the hello announcing push support, the bootstrap,
// pushed updates answered in order, heartbeats, redirects, reconnects with
// backoff, and polling whenever the gateway does not push. TypeScript sees
// full configuration snapshots (ConfigUpdate), one at a time, each answered
// applied (`ack()`) or rejected (`reject(reason)`). A snapshot equal to the
// last applied one is answered by the core and never reaches JavaScript.
import { fromBinary } from "@bufbuild/protobuf";
import { call, callSync, cancelled, deadlineExceeded, invalidArgument } from "./errors.js";
import {
  type GetSandboxProviderEnvironmentResponse,
  GetSandboxProviderEnvironmentResponseSchema,
} from "./gen/openshell/openshell_pb.js";
import {
  type GetSandboxConfigResponse,
  GetSandboxConfigResponseSchema,
  type SettingValue as SettingValueMessage,
} from "./gen/openshell/sandbox_pb.js";
import { KeepAlive } from "./keepalive.js";
import {
  type NativeConfigSession,
  type NativeConfigSessionStats,
  type NativeConfigUpdate,
  native,
} from "./native.js";
import { onAbort } from "./signal.js";

/** How configuration reaches the session. */
export type DeliveryMode = "push" | "poll";

/** A setting's value: string, boolean, 64-bit integer, bytes, or null when unset. */
export type SettingValue = string | boolean | bigint | Uint8Array | null;

/** What an apply callback returns to refuse an update. */
export class Rejected {
  constructor(readonly reason: string) {}
}

/**
 * An apply callback's verdict: `undefined` or `true` applies, `false` or a
 * `Rejected` refuses. A thrown error refuses too (its message is not sent).
 */
export type ApplyResult = undefined | boolean | Rejected;

export type ApplyCallback = (update: ConfigUpdate) => ApplyResult | Promise<ApplyResult>;

export interface ConfigSessionOptions {
  /** The gateway (or the edge in front of a cluster). */
  endpoint: string;
  sandboxId: string;
  /** The sandbox's own token (a supervisor gets it in OPENSHELL_SANDBOX_TOKEN). */
  sandboxToken: string;
  /**
   * Answers every update through this function instead of the async
   * iterator. It runs on the main thread, one update at a time.
   */
  apply?: ApplyCallback;
  /** Interval of `GetSandboxConfig` polls when nothing is pushed (default 10 000). */
  pollIntervalMs?: number;
  /** Announce push support in the hello (default true). */
  announcePush?: boolean;
  /** The supervisor instance id (default: a new UUID). */
  instanceId?: string;
  ca?: string | Uint8Array;
  tlsServerName?: string;
  connectTimeoutMs?: number;
  allowCleartextToken?: boolean;
}

/** Counters of a session (64-bit counters as bigint). */
export interface ConfigSessionStats {
  readonly mode: DeliveryMode | null;
  readonly applied: bigint;
  readonly rejected: bigint;
  /** Updates answered IGNORED_DUPLICATE by the core. */
  readonly duplicates: bigint;
  /** Pushed updates received (the bootstrap included). */
  readonly updatesReceived: bigint;
  readonly lastUpdateId: bigint;
  readonly configRevision: bigint;
  readonly polls: bigint;
  readonly sessionsAccepted: bigint;
  readonly redirects: bigint;
  readonly sessionId: string | null;
  /** The replica holding the session. */
  readonly servedBy: string | null;
}

function statsOf(s: NativeConfigSessionStats): ConfigSessionStats {
  return Object.freeze({
    mode: s.mode ?? null,
    applied: s.applied,
    rejected: s.rejected,
    duplicates: s.duplicates,
    updatesReceived: s.updatesReceived,
    lastUpdateId: s.lastUpdateId,
    configRevision: s.configRevision,
    polls: s.polls,
    sessionsAccepted: s.sessionsAccepted,
    redirects: s.redirects,
    sessionId: s.sessionId ?? null,
    servedBy: s.servedBy ?? null,
  });
}

function settingValue(v: SettingValueMessage | undefined): SettingValue {
  if (v === undefined || v.value.case === undefined) return null;
  return v.value.value;
}

/**
 * One full configuration of a sandbox. Its `environment` values are
 * secrets: `toString()` and `util.inspect` show only their keys. A
 * `HostSession` hands these to its apply callback; `ConfigUpdate` is one
 * with an answer attached.
 */
export class ConfigSnapshot {
  /** `openshell.sandbox.v1.GetSandboxConfigResponse`: policy, settings, revisions. */
  readonly sandboxConfig: GetSandboxConfigResponse;
  /** `openshell.v1.GetSandboxProviderEnvironmentResponse` (secret values). */
  readonly providerEnvironment: GetSandboxProviderEnvironmentResponse;

  /** @internal Decodes one (not public API). */
  static _decode(sandboxConfig: Uint8Array, providerEnvironment: Uint8Array): ConfigSnapshot {
    return new ConfigSnapshot(sandboxConfig, providerEnvironment);
  }

  protected constructor(sandboxConfig: Uint8Array, providerEnvironment: Uint8Array) {
    this.sandboxConfig = fromBinary(GetSandboxConfigResponseSchema, sandboxConfig);
    this.providerEnvironment = fromBinary(
      GetSandboxProviderEnvironmentResponseSchema,
      providerEnvironment,
    );
  }

  get configRevision(): bigint {
    return this.sandboxConfig.configRevision;
  }

  get providerEnvRevision(): bigint {
    return this.providerEnvironment.providerEnvRevision;
  }

  /** The effective settings (a global value overrides the sandbox's). */
  get settings(): Record<string, SettingValue> {
    return Object.fromEntries(
      Object.entries(this.sandboxConfig.settings).map(([k, e]) => [k, settingValue(e.value)]),
    );
  }

  /** One effective setting, or null. */
  setting(key: string): SettingValue {
    const effective = Object.hasOwn(this.sandboxConfig.settings, key)
      ? this.sandboxConfig.settings[key]
      : undefined;
    return settingValue(effective?.value);
  }

  /** The provider environment (secret values). */
  get environment(): Record<string, string> {
    return { ...this.providerEnvironment.environment };
  }

  /** @internal The fields every description shows (never a value of the environment). */
  protected describe(): string {
    const keys = Object.keys(this.providerEnvironment.environment).sort();
    return (
      `configRevision=${this.configRevision}, ` +
      `providerEnvRevision=${this.providerEnvRevision}, ` +
      `settings=[${Object.keys(this.sandboxConfig.settings).sort().join(",")}], ` +
      `environmentKeys=[${keys.join(",")}]`
    );
  }

  toString(): string {
    return `ConfigSnapshot(${this.describe()})`;
  }

  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return this.toString();
  }
}

/**
 * One full configuration of the sandbox, to apply and answer. Its
 * `environment` values are secrets: `toString()` and `util.inspect` show
 * only their keys.
 */
export class ConfigUpdate extends ConfigSnapshot {
  /** How it arrived. */
  readonly mode: DeliveryMode;
  readonly #session: NativeConfigSession;
  readonly #id: number;
  #answered = false;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(session: NativeConfigSession, update: NativeConfigUpdate): ConfigUpdate {
    return new ConfigUpdate(session, update);
  }

  private constructor(session: NativeConfigSession, update: NativeConfigUpdate) {
    super(update.sandboxConfig, update.providerEnvironment);
    this.#session = session;
    this.#id = update.id;
    this.mode = update.mode;
  }

  get answered(): boolean {
    return this.#answered;
  }

  #answer(applied: boolean, reason: string | undefined): void {
    if (this.#answered) throw new Error("this configuration update was already answered");
    this.#answered = true;
    // False when the session closed meanwhile: nothing is waiting any more.
    this.#session.ack(this.#id, applied, reason ?? null);
  }

  /** @internal Answers unless the application already did. */
  settle(applied: boolean, reason?: string): void {
    if (!this.#answered) this.#answer(applied, reason);
  }

  /** Answers applied: the configuration is in force. */
  ack(): void {
    this.#answer(true, undefined);
  }

  /**
   * Answers rejected; the previous configuration stays in force. `reason`
   * goes to the gateway, bounded and scrubbed of provider values.
   */
  reject(reason: string): void {
    this.#answer(false, reason);
  }

  override toString(): string {
    return `ConfigUpdate(mode=${this.mode}, ${this.describe()})`;
  }
}

/** @internal An apply callback's verdict as (applied, reason). */
export function verdict(result: ApplyResult): [boolean, string | undefined] {
  if (result === undefined || result === true) return [true, undefined];
  if (result === false) return [false, "rejected by the apply callback"];
  if (result instanceof Rejected) return [false, result.reason];
  return [false, "the apply callback returned neither a boolean nor Rejected"];
}

/**
 * The supervisor side of a sandbox's session. Answer updates either by
 * iterating:
 *
 *     const session = new ConfigSession({ endpoint, sandboxId, sandboxToken });
 *     for await (const update of session) { apply(update); update.ack(); }
 *
 * or with `apply`, a callback run one update at a time. An update waits for
 * its answer before the next one comes (the gateway keeps one in flight).
 * Once started, the session keeps the process alive until `close()` (like a
 * `net.Server`), unless `unref()` was called. Dropping a started session
 * without `close()` does not end it (it is never garbage-collected while
 * running, unref'd or not): close it.
 */
export class ConfigSession implements AsyncIterable<ConfigUpdate>, AsyncDisposable {
  readonly sandboxId: string;
  readonly #native: NativeConfigSession;
  readonly #apply: ApplyCallback | undefined;
  #keepAlive: KeepAlive | null = null;
  #unref = false;
  #iterating = false;
  #closing: Promise<void> | null = null;

  constructor(options: ConfigSessionOptions) {
    if (options.apply !== undefined && typeof options.apply !== "function") {
      throw invalidArgument("apply must be a function");
    }
    const ca = options.ca;
    this.sandboxId = options.sandboxId;
    this.#apply = options.apply;
    const deliver =
      options.apply === undefined ? undefined : (u: NativeConfigUpdate) => this.#deliver(u);
    this.#native = callSync(
      () =>
        new native.NativeConfigSession(
          {
            endpoint: options.endpoint,
            sandboxId: options.sandboxId,
            sandboxToken: options.sandboxToken,
            pollIntervalMs: options.pollIntervalMs,
            announcePush: options.announcePush,
            instanceId: options.instanceId,
            caPem: ca === undefined ? undefined : Buffer.from(ca),
            tlsServerName: options.tlsServerName,
            connectTimeoutMs: options.connectTimeoutMs,
            allowCleartextToken: options.allowCleartextToken,
          },
          deliver,
        ),
    );
  }

  /** Callback mode: runs the callback for one update and answers it. */
  #deliver(update: NativeConfigUpdate): void {
    const apply = this.#apply;
    if (apply === undefined) return;
    void (async () => {
      let parsed: ConfigUpdate;
      try {
        parsed = ConfigUpdate._create(this.#native, update);
      } catch {
        this.#native.ack(update.id, false, "the update could not be decoded");
        return;
      }
      try {
        const [applied, reason] = verdict(await apply(parsed));
        parsed.settle(applied, reason);
      } catch (err) {
        const name = err instanceof Error ? err.name : typeof err;
        parsed.settle(false, `the apply callback threw ${name}`);
      }
    })();
  }

  /** The instance id every hello carries. */
  get instanceId(): string {
    return this.#native.instanceId;
  }

  get closed(): boolean {
    return this.#native.closed;
  }

  /** `push` or `poll` once known, else null. */
  get mode(): DeliveryMode | null {
    return this.#native.stats().mode ?? null;
  }

  stats(): ConfigSessionStats {
    return statsOf(this.#native.stats());
  }

  /** Starts the session (iterating does). Idempotent; returns `this`. */
  start(): this {
    if (this.#keepAlive === null && this.#closing === null && !this.#native.closed) {
      this.#keepAlive = new KeepAlive();
      if (this.#unref) this.#keepAlive.unref();
      // A session that ended by itself (an unusable endpoint) lets go of
      // the event loop. (A pending native promise would hold it: a callback.)
      this.#native.start(() => this.#release());
    }
    return this;
  }

  #release(): void {
    this.#keepAlive?.release();
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
   * The snapshots to apply, in order, until the session closes. Answer each
   * one before the next arrives. One consumer at a time; not available with
   * `apply`. Breaking out of the loop does not close the session. While a
   * loop waits for the next update, it holds the process even after
   * `unref()` (a callback session does not).
   */
  updates(): AsyncGenerator<ConfigUpdate, void, undefined> {
    if (this.#apply !== undefined) {
      throw new TypeError("this session answers through its apply callback");
    }
    if (this.#iterating) throw new TypeError("the session already has a consumer");
    this.#iterating = true;
    return this.#updates();
  }

  async *#updates(): AsyncGenerator<ConfigUpdate, void, undefined> {
    try {
      this.start();
      for (;;) {
        const next = await call(this.#native.nextUpdate());
        if (next === null) return;
        yield ConfigUpdate._create(this.#native, next);
      }
    } finally {
      this.#iterating = false;
    }
  }

  [Symbol.asyncIterator](): AsyncGenerator<ConfigUpdate, void, undefined> {
    return this.updates();
  }

  /**
   * Waits until a session is accepted and delivery is `mode` (any when
   * omitted). Rejects with a CancelledError when the session closes or the
   * signal aborts, a DeadlineExceededError when `timeoutMs` (default
   * 30 000) passes.
   */
  async waitMode(
    mode?: DeliveryMode,
    options: { timeoutMs?: number; signal?: AbortSignal } = {},
  ): Promise<DeliveryMode> {
    const deadline = performance.now() + (options.timeoutMs ?? 30_000);
    let aborted = false;
    const stop = onAbort(options.signal, () => {
      aborted = true;
    });
    try {
      for (;;) {
        const s = this.#native.stats();
        if (s.mode != null && s.sessionsAccepted > 0n && (mode === undefined || s.mode === mode)) {
          return s.mode;
        }
        if (aborted) throw cancelled("waitMode was aborted");
        if (this.closed) throw cancelled("the session is closed");
        if (performance.now() >= deadline) {
          throw deadlineExceeded(`delivery mode ${mode ?? "(any)"} not reached in time`);
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

  /**
   * Ends the session (the gateway sees the supervisor leave); unanswered
   * updates are rejected. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#native.close();
      await this.#native.waitClosed().catch(() => {});
      this.#release();
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
