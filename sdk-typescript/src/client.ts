// The client: sandboxes, exec, forward, raw calls. Everything that talks to
// the gateway (owner routing, auth, deadlines, the exec and forward data
// planes) runs in the Rust core; this module is the TypeScript face of it.
import type { AddressInfo } from "node:net";
import type { Writable } from "node:stream";
import { call, callSync, invalidArgument, u32 } from "./errors.js";
import { ExecStream, InteractiveExec } from "./exec.js";
import {
  type DownloadStream,
  download,
  downloadStream,
  readFile,
  type TransferOptions,
  type TransferSummary,
  type UploadSource,
  upload,
  writeFile,
} from "./files.js";
import { GeneratedRaw } from "./gen/raw.js";
import { KeepAlive } from "./keepalive.js";
import { type EventsOptions, EventWatch, type Logs, type LogsOptions, logs } from "./logs.js";
import {
  type NativeClient,
  type NativeExecRequest,
  type NativeForward,
  type NativeTokenAnswer,
  type NativeWatch,
  native,
  type Pairs,
} from "./native.js";
import { type CallOptions, onAbort, withSignal } from "./signal.js";
import type { RawCallOptions } from "./typed-raw.js";
import {
  ExecResult,
  type ForwardStats,
  type Health,
  type RoutingStats,
  type Sandbox,
  SshSession,
  sandboxOf,
} from "./types.js";

/** What a token provider returns: a token, or a token with its lifetime. */
export type TokenAnswer = string | { token: string; expiresInMs?: number };

/**
 * Called by the core when it needs a token: on first use, when the cached
 * one expires, and with `forceRefresh` after the gateway answered
 * UNAUTHENTICATED. Concurrent calls share one invocation (single flight).
 * A thrown error fails the call with code `auth`; set `retryable: true` on
 * the error to mark it retryable.
 */
export type TokenProvider = (context: {
  forceRefresh: boolean;
}) => TokenAnswer | Promise<TokenAnswer>;

export interface ClientOptions {
  /** `http://host:port` or `https://host:port`. */
  endpoint: string;
  /** A static bearer token. */
  token?: string;
  /** A function that supplies tokens (instead of `token`). */
  tokenProvider?: TokenProvider;
  /** PEM of the CA that signed the gateway's certificate. */
  ca?: string | Uint8Array;
  /** TLS server name, when it differs from the endpoint's host. */
  tlsServerName?: string;
  /** Default deadline of every call, in ms; 0 for none. */
  timeoutMs?: number;
  connectTimeoutMs?: number;
  /** Most bytes of output a buffered exec collects (default: the core's). */
  execOutputLimit?: number;
  /** Allow sending a token over cleartext HTTP to a non-loopback host. */
  allowCleartextToken?: boolean;
}

export interface CreateSandboxOptions extends CallOptions {
  name?: string;
  image?: string;
  env?: Record<string, string>;
  command?: string[];
  labels?: Record<string, string>;
  tty?: boolean;
}

export interface ListSandboxesOptions extends CallOptions {
  /** `key=value[,key=value]`. */
  labelSelector?: string;
  pageSize?: number;
}

export interface ExecOptions extends CallOptions {
  workdir?: string;
  env?: Record<string, string>;
  stdin?: string | Uint8Array;
  /** Run the command on a terminal of this size. */
  tty?: { cols: number; rows: number };
  /** Run time limit of the command; the gateway kills it past this. */
  execTimeoutMs?: number;
  /** Most bytes of output collected (buffered exec, `collect`, `wait`). */
  outputLimit?: number;
}

export interface ForwardOptions extends CallOptions {
  /** Local `host:port` to listen on (default `127.0.0.1:0`, a free port). */
  localAddress?: string;
  /**
   * An SSH session token (`SshSession.token`) every connection's stream
   * carries: a client without a user token can then forward to that token's
   * sandbox, and to no other. The gateway checks it per connection; a refused
   * connection is closed and counted in `stats().connectionsFailed`.
   */
  sshSessionToken?: string;
}

/** A handle that keeps the process alive while open (like `net.Server`). */
interface Closeable {
  close(): unknown;
}

function pairs(metadata: ReadonlyArray<readonly [string, string]> | undefined): Pairs | undefined {
  if (metadata === undefined) return undefined;
  if (!Array.isArray(metadata)) throw invalidArgument("metadata must be an array of [key, value]");
  return metadata.map((pair) => {
    if (
      !Array.isArray(pair) ||
      pair.length !== 2 ||
      typeof pair[0] !== "string" ||
      typeof pair[1] !== "string"
    ) {
      throw invalidArgument("metadata entries must be [key, value] pairs of strings");
    }
    return [pair[0], pair[1]];
  });
}

function bytes(data: string | Uint8Array): Buffer {
  return typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
}

/** A listening port forwarded to a port of a sandbox. */
export class Forward implements AsyncDisposable {
  readonly #native: NativeForward;
  readonly #keepAlive = new KeepAlive();
  readonly #onClose: () => void;
  #stopAbort: () => void = () => {};
  #closing: Promise<void> | null = null;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(
    handle: NativeForward,
    signal: AbortSignal | undefined,
    onClose: () => void,
  ): Forward {
    return new Forward(handle, signal, onClose);
  }

  private constructor(handle: NativeForward, signal: AbortSignal | undefined, onClose: () => void) {
    this.#native = handle;
    this.#onClose = onClose;
    // Aborting the forward's signal closes it, for as long as it is open.
    this.#stopAbort = onAbort(signal, () => void this.close().catch(() => {}));
  }

  /** Where the local listener is bound (like `server.address()`). */
  get localAddress(): AddressInfo {
    const a = this.#native.localAddress;
    return { address: a.address, family: a.family, port: a.port };
  }

  get sandbox(): string {
    return this.#native.sandbox;
  }

  get remotePort(): number {
    return this.#native.remotePort;
  }

  get closed(): boolean {
    return this.#closing !== null || this.#native.closed;
  }

  /** Counters (64-bit, as bigint). */
  stats(): ForwardStats {
    return this.#native.stats();
  }

  /** Stops listening and ends every connection; resolves once done. Idempotent. */
  close(): Promise<void> {
    if (this.#closing === null) {
      this.#stopAbort();
      this.#keepAlive.release();
      this.#onClose();
      this.#native.close();
      this.#closing = call(this.#native.waitClosed());
    }
    return this.#closing;
  }

  /** Lets the process exit while this forward is open. */
  unref(): this {
    this.#keepAlive.unref();
    return this;
  }

  ref(): this {
    this.#keepAlive.ref();
    return this;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Snapshots of one sandbox as it changes; iterate it, `cancel()` to end. */
export class SandboxWatch implements AsyncIterable<Sandbox>, AsyncDisposable {
  readonly #native: NativeWatch;
  readonly #keepAlive = new KeepAlive();
  readonly #onClose: () => void;
  #stopAbort: () => void = () => {};
  #done = false;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(
    handle: NativeWatch,
    signal: AbortSignal | undefined,
    onClose: () => void,
  ): SandboxWatch {
    return new SandboxWatch(handle, signal, onClose);
  }

  private constructor(handle: NativeWatch, signal: AbortSignal | undefined, onClose: () => void) {
    this.#native = handle;
    this.#onClose = onClose;
    // Aborting the signal ends the watch for as long as it is open.
    this.#stopAbort = onAbort(signal, () => this.cancel());
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Sandbox, void, undefined> {
    try {
      while (!this.#done) {
        const next = await call(this.#native.next());
        if (next === null) return;
        yield sandboxOf(next);
      }
    } finally {
      this.cancel();
    }
  }

  /** Ends the watch (idempotent). */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.#stopAbort();
    this.#keepAlive.release();
    this.#onClose();
    this.#native.cancel();
  }

  close(): void {
    this.cancel();
  }

  unref(): this {
    this.#keepAlive.unref();
    return this;
  }

  /** Undoes `unref()`: the open watch keeps the process alive again. */
  ref(): this {
    this.#keepAlive.ref();
    return this;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.cancel();
  }
}

/** Sandbox lifecycle: `client.sandboxes`. */
export class Sandboxes {
  readonly #client: Client;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(client: Client): Sandboxes {
    return new Sandboxes(client);
  }

  private constructor(client: Client) {
    this.#client = client;
  }

  create(options: CreateSandboxOptions = {}): Promise<Sandbox> {
    const n = this.#client._native();
    const request = {
      name: options.name,
      image: options.image,
      environment: options.env,
      command: options.command,
      labels: options.labels,
      tty: options.tty,
    };
    return withSignal(options.signal, async (t) =>
      sandboxOf(await call(n.createSandbox(request, options.timeoutMs, t))),
    );
  }

  get(name: string, options: CallOptions = {}): Promise<Sandbox> {
    const n = this.#client._native();
    return withSignal(options.signal, async (t) =>
      sandboxOf(await call(n.getSandbox(name, options.timeoutMs, t))),
    );
  }

  /** Every sandbox (all pages), optionally filtered by labels. */
  list(options: ListSandboxesOptions = {}): Promise<Sandbox[]> {
    const n = this.#client._native();
    return withSignal(options.signal, async (t) => {
      const pageSize =
        options.pageSize === undefined ? undefined : u32("pageSize", options.pageSize);
      const page = await call(
        n.listSandboxes(options.labelSelector, pageSize, options.timeoutMs, t),
      );
      return page.map(sandboxOf);
    });
  }

  /** Deletes a sandbox; resolves to the outcome (`DELETED`, `ALREADY_DELETING`, ...). */
  delete(name: string, options: CallOptions = {}): Promise<string> {
    const n = this.#client._native();
    return withSignal(options.signal, (t) => call(n.deleteSandbox(name, options.timeoutMs, t)));
  }

  /** Waits until the sandbox is READY (fails if it ends in ERROR). */
  waitReady(name: string, options: CallOptions = {}): Promise<Sandbox> {
    const n = this.#client._native();
    return withSignal(options.signal, async (t) =>
      sandboxOf(await call(n.waitReady(name, options.timeoutMs, t))),
    );
  }

  /** Waits until the sandbox no longer exists. */
  waitDeleted(name: string, options: CallOptions = {}): Promise<void> {
    const n = this.#client._native();
    return withSignal(options.signal, (t) => call(n.waitDeleted(name, options.timeoutMs, t)));
  }

  /**
   * The sandbox's recorded log lines, oldest first (the gateway's own and
   * its supervisor's): `{ tail, since, sources, minLevel }` filter them.
   */
  logs(name: string, options: LogsOptions = {}): Promise<Logs> {
    return logs(this.#client._native(), name, options);
  }

  /**
   * Follows a sandbox: status snapshots (`status`, on by default), log lines
   * (`logs: true`, with the filters of `logs()`), or both, each event with
   * its cursor. The watch resumes by itself after a broken stream, from its
   * last cursor; it ends with an `OutOfRangeError` when the gateway trimmed
   * what followed. Starts on the first iteration; `break`, `cancel()` or the
   * signal end it.
   */
  events(name: string, options: EventsOptions = {}): EventWatch {
    const n = this.#client._native();
    return this.#client._track((onClose) => EventWatch._create(n, name, options, onClose));
  }

  /** Watches a sandbox; keeps the process alive until cancelled or ended. */
  async watch(name: string, options: CallOptions = {}): Promise<SandboxWatch> {
    const n = this.#client._native();
    const handle = await withSignal(options.signal, (t) =>
      call(n.watch(name, options.timeoutMs, t)),
    );
    return this.#client._track((onClose) => SandboxWatch._create(handle, options.signal, onClose));
  }
}

/** SSH session tokens: `client.sshSessions`. */
export class SshSessions {
  readonly #client: Client;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(client: Client): SshSessions {
    return new SshSessions(client);
  }

  private constructor(client: Client) {
    this.#client = client;
  }

  /**
   * Issues a token for `sandbox` (needs a user token). How long it lives is
   * the gateway's setting (`expiresAt`). The token is a secret: the session
   * keeps it out of `util.inspect`, `console.log` and `JSON.stringify`.
   */
  create(sandbox: string, options: CallOptions = {}): Promise<SshSession> {
    const n = this.#client._native();
    return withSignal(options.signal, async (t) =>
      SshSession._of(await call(n.createSshSession(sandbox, options.timeoutMs, t))),
    );
  }

  /**
   * Revokes a session (or its token): forwards can no longer open with it.
   * Resolves to whether it was live; an unknown, expired or already revoked
   * token is `false`, not an error.
   */
  revoke(session: SshSession | string, options: CallOptions = {}): Promise<boolean> {
    const n = this.#client._native();
    const token = session instanceof SshSession ? session.token : session;
    return withSignal(options.signal, (t) => call(n.revokeSshSession(token, options.timeoutMs, t)));
  }
}

/**
 * Raw calls on any method, through the core (owner routing applies): typed,
 * one method per RPC (`client.raw.getSandbox({ name })`, generated by sdkgen
 * with protobuf-es message types), or on encoded bytes (`unary`, `stream`).
 */
export class RawCalls extends GeneratedRaw {
  readonly #client: Client;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(client: Client): RawCalls {
    return new RawCalls(client);
  }

  private constructor(client: Client) {
    super();
    this.#client = client;
  }

  /** A unary call: encoded request in, encoded response and metadata out. */
  override async unary(
    path: string,
    request: Uint8Array,
    options: RawCallOptions = {},
  ): Promise<{ bytes: Buffer; metadata: Array<[string, string]> }> {
    const n = this.#client._native();
    const answer = await withSignal(options.signal, (t) =>
      call(n.rawUnary(path, Buffer.from(request), pairs(options.metadata), options.timeoutMs, t)),
    );
    return {
      bytes: answer.bytes,
      metadata: answer.metadata.map(([k, v]) => [k ?? "", v ?? ""] as [string, string]),
    };
  }

  /** A streaming call: send encoded messages, iterate encoded replies. */
  override async stream(path: string, options: RawCallOptions = {}): Promise<RawStream> {
    const n = this.#client._native();
    const handle = await withSignal(options.signal, (t) =>
      call(n.rawStream(path, pairs(options.metadata), options.timeoutMs, t)),
    );
    return RawStream._create(handle, options.signal);
  }
}

/** A raw stream: `send`, `closeSend`, then iterate the replies. */
export class RawStream implements AsyncIterable<Buffer>, AsyncDisposable {
  readonly #native: Awaited<ReturnType<NativeClient["rawStream"]>>;
  #stopAbort: () => void = () => {};

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(
    handle: Awaited<ReturnType<NativeClient["rawStream"]>>,
    signal?: AbortSignal,
  ): RawStream {
    return new RawStream(handle, signal);
  }

  private constructor(
    handle: Awaited<ReturnType<NativeClient["rawStream"]>>,
    signal?: AbortSignal,
  ) {
    this.#native = handle;
    // Aborting the signal cancels the stream at any point of its life
    // (a pending recv() or send(), between calls), until it ends.
    this.#stopAbort = onAbort(signal, () => this.cancel());
  }

  async send(message: Uint8Array): Promise<void> {
    await call(() => this.#native.send(Buffer.from(message)));
  }

  closeSend(): void {
    this.#native.closeSend();
  }

  /** The next reply, or null when the server ended the stream OK. */
  async recv(): Promise<Buffer | null> {
    try {
      const message = await call(this.#native.recv());
      if (message === null) this.#stopAbort();
      return message;
    } catch (err) {
      this.#stopAbort();
      throw err;
    }
  }

  async responseMetadata(): Promise<Array<[string, string]>> {
    const m = await call(this.#native.responseMetadata());
    return m.map(([k, v]) => [k ?? "", v ?? ""]);
  }

  trailers(): Array<[string, string]> | null {
    return this.#native.trailers()?.map(([k, v]) => [k ?? "", v ?? ""]) ?? null;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer, void, undefined> {
    let ended = false;
    try {
      for (;;) {
        const message = await this.recv();
        if (message === null) {
          ended = true;
          return;
        }
        yield message;
      }
    } finally {
      if (!ended) this.cancel();
    }
  }

  cancel(): void {
    this.#stopAbort();
    this.#native.cancel();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.cancel();
  }
}

function providerOf(provider: TokenProvider): (force: boolean) => Promise<NativeTokenAnswer> {
  return async (forceRefresh) => {
    try {
      const answer = await provider({ forceRefresh });
      if (typeof answer === "string") return { token: answer };
      return { token: answer.token, expiresInMs: answer.expiresInMs };
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      const retryable =
        typeof err === "object" &&
        err !== null &&
        (err as { retryable?: unknown }).retryable === true;
      return { error: message, retryable };
    }
  };
}

/**
 * A client of an OpenShell gateway (or its edge). Cheap to share: calls run
 * concurrently on one connection. `close()` cancels everything in flight;
 * a closed client never keeps the process alive.
 */
export class Client implements AsyncDisposable {
  readonly #native: NativeClient;
  readonly #open = new Set<Closeable>();
  /** Sandbox lifecycle. */
  readonly sandboxes: Sandboxes;
  /** Raw calls on any method (see also `@openshell/sdk/raw`). */
  readonly raw: RawCalls;
  /** SSH session tokens (forwarding without a user token). */
  readonly sshSessions: SshSessions;

  constructor(options: ClientOptions) {
    if (typeof options?.endpoint !== "string" || options.endpoint === "") {
      throw invalidArgument("endpoint must be a non-empty string");
    }
    if (options.token !== undefined && options.tokenProvider !== undefined) {
      throw invalidArgument("give either token or tokenProvider, not both");
    }
    const provider = options.tokenProvider ? providerOf(options.tokenProvider) : undefined;
    this.#native = callSync(
      () =>
        new native.NativeClient(
          {
            endpoint: options.endpoint,
            token: options.token,
            caPem: options.ca === undefined ? undefined : bytes(options.ca),
            tlsServerName: options.tlsServerName,
            connectTimeoutMs: options.connectTimeoutMs,
            timeoutMs: options.timeoutMs,
            execOutputLimit: options.execOutputLimit,
            allowCleartextToken: options.allowCleartextToken,
          },
          provider,
        ),
    );
    this.sandboxes = Sandboxes._create(this);
    this.raw = RawCalls._create(this);
    this.sshSessions = SshSessions._create(this);
  }

  /**
   * A client for `$OPENSHELL_ENDPOINT` (default `http://127.0.0.1:17670`)
   * with `$OPENSHELL_TOKEN` when set; `overrides` win.
   */
  static fromEnv(overrides: Partial<ClientOptions> = {}): Client {
    const endpoint = process.env.OPENSHELL_ENDPOINT || "http://127.0.0.1:17670";
    const token = process.env.OPENSHELL_TOKEN || undefined;
    const base: ClientOptions = { endpoint };
    if (token !== undefined && overrides.tokenProvider === undefined) base.token = token;
    return new Client({ ...base, ...overrides });
  }

  /** @internal */
  _native(): NativeClient {
    return this.#native;
  }

  /** @internal Registers an open handle; the client closes it on close(). */
  _track<T extends Closeable>(make: (onClose: () => void) => T): T {
    let handle: T | undefined;
    const onClose = () => {
      if (handle !== undefined) this.#open.delete(handle);
    };
    handle = make(onClose);
    if (this.closed) {
      handle.close();
    } else {
      this.#open.add(handle);
    }
    return handle;
  }

  get endpoint(): string {
    return this.#native.endpoint;
  }

  get closed(): boolean {
    return this.#native.closed;
  }

  /** Liveness of the gateway and the replica that answered. */
  async health(options: CallOptions = {}): Promise<Health> {
    const h = await withSignal(options.signal, (t) =>
      call(this.#native.health(options.timeoutMs, t)),
    );
    return { status: h.status, version: h.version, servedBy: h.servedBy ?? null };
  }

  /** Runs a command to the end; output is collected in the core under a cap. */
  exec(sandbox: string, command: string[], options: ExecOptions = {}): Promise<ExecResult> {
    return withSignal(options.signal, async (t) => {
      const request = execRequest(sandbox, command, options);
      return ExecResult.of(await call(this.#native.exec(request, options.timeoutMs, t)));
    });
  }

  /**
   * Runs a command and streams its events: `for await (const e of
   * client.execStream(...))`. The call starts on first iteration; `break`
   * cancels it (the gateway kills the process group).
   */
  execStream(sandbox: string, command: string[], options: ExecOptions = {}): ExecStream {
    const request = execRequest(sandbox, command, options);
    const n = this.#native;
    return ExecStream._create(
      () => withSignal(options.signal, (t) => call(n.execStream(request, options.timeoutMs, t))),
      options.signal,
    );
  }

  /** Runs a command with stdin (and a terminal when `tty` is given). */
  async execInteractive(
    sandbox: string,
    command: string[],
    options: ExecOptions = {},
  ): Promise<InteractiveExec> {
    const request = execRequest(sandbox, command, options);
    const handle = await withSignal(options.signal, (t) =>
      call(this.#native.execInteractive(request, options.timeoutMs, t)),
    );
    return InteractiveExec._create(handle, options.signal);
  }

  /**
   * Listens locally and forwards each connection to `remotePort` in the
   * sandbox. The forward keeps the process alive until `close()` (or
   * `unref()`), like a listening `net.Server`.
   */
  async forward(
    sandbox: string,
    remotePort: number,
    options: ForwardOptions = {},
  ): Promise<Forward> {
    if (!Number.isInteger(remotePort) || remotePort < 1 || remotePort > 65535) {
      throw invalidArgument("remotePort must be an integer between 1 and 65535");
    }
    const handle = await withSignal(options.signal, (t) =>
      call(
        this.#native.forward(
          sandbox,
          remotePort,
          options.localAddress,
          options.sshSessionToken,
          options.timeoutMs,
          t,
        ),
      ),
    );
    return this._track((onClose) => Forward._create(handle, options.signal, onClose));
  }

  /**
   * Uploads to `remote` in the sandbox (relative to its working directory;
   * an absolute path must lie inside it). `local` is a path on this machine
   * (a file, or a directory with everything in it: modes and mtimes kept,
   * symlinks leaving the tree skipped, `ignoreFile` honoured), which the
   * core reads itself; or bytes (a `Readable`, an `AsyncIterable` of
   * chunks, a `Uint8Array`) streamed with backpressure. When `remote` is an
   * existing directory, a path goes inside it under its own name. The file
   * appears only once complete; a failure leaves nothing behind.
   */
  upload(
    sandbox: string,
    local: UploadSource,
    remote: string,
    options: TransferOptions = {},
  ): Promise<TransferSummary> {
    return upload(this.#native, sandbox, local, remote, options);
  }

  /**
   * Downloads the file or directory `remote` to a local path (written by
   * the core: temp names, renamed into place) or into a `Writable` (a file
   * only; ended when done).
   */
  download(
    sandbox: string,
    remote: string,
    local: string | Writable,
    options: TransferOptions = {},
  ): Promise<TransferSummary> {
    return download(this.#native, sandbox, remote, local, options);
  }

  /** The file `remote` as an async iterable of Buffers (`toReadable()` for a Readable). */
  downloadStream(sandbox: string, remote: string, options: TransferOptions = {}): DownloadStream {
    return downloadStream(this.#native, sandbox, remote, options);
  }

  /** The whole file `remote` (at most 64 MiB; larger is a FailedPreconditionError). */
  readFile(sandbox: string, remote: string, options: CallOptions = {}): Promise<Buffer> {
    return readFile(this.#native, sandbox, remote, options);
  }

  /** Writes `data` as the file `remote` (mode 0644), replacing any file there atomically. */
  writeFile(
    sandbox: string,
    remote: string,
    data: string | Uint8Array,
    options: CallOptions = {},
  ): Promise<TransferSummary> {
    return writeFile(this.#native, sandbox, remote, data, options);
  }

  /** Owner-routing counters of this client (64-bit, as bigint). */
  routingStats(): RoutingStats {
    return this.#native.routingStats();
  }

  /**
   * Cancels every call, stream, watch and forward of this client, now and
   * later. Idempotent.
   */
  async close(): Promise<void> {
    this.#native.close();
    const open = [...this.#open];
    this.#open.clear();
    await Promise.all(open.map((h) => h.close()));
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function execRequest(sandbox: string, command: string[], options: ExecOptions): NativeExecRequest {
  if (!Array.isArray(command) || command.some((a) => typeof a !== "string")) {
    throw invalidArgument("command must be an array of strings");
  }
  return {
    sandbox,
    command,
    workdir: options.workdir,
    environment: options.env,
    stdin: options.stdin === undefined ? undefined : bytes(options.stdin),
    tty: options.tty !== undefined,
    cols: options.tty === undefined ? undefined : u32("tty.cols", options.tty.cols),
    rows: options.tty === undefined ? undefined : u32("tty.rows", options.tty.rows),
    execTimeoutMs: options.execTimeoutMs,
    outputLimit: options.outputLimit,
  };
}
