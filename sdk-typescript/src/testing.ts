// @openshell/sdk/testing: a real local OpenShell cluster for your own tests,
// with faults on demand. The cluster is the core's (sdk-core's
// `testing::LocalCluster`: `openshell-gateway up` on a free loopback port and
// a fresh data directory, every process supervised and stopped by `up`);
// this module is its TypeScript face. Plain Promises and no globals, so it
// serves node:test, vitest and jest alike.
import { existsSync } from "node:fs";
import { join } from "node:path";
import { Client, type ClientOptions } from "./client.js";
import { call, callSync, invalidArgument, u32 } from "./errors.js";
import { type NativeLocalCluster, native, platformPackageDir } from "./native.js";

/** The environment variable naming the `openshell-gateway` executable to run. */
export const GATEWAY_BIN_ENV = "OPENSHELL_GATEWAY_BIN";

export type ConfigDelivery = "push" | "poll";
export type Isolation = "auto" | "namespaces" | "none";

export interface LocalClusterOptions {
  /** Gateway replicas, `gw-0`.. (default 3, at least 1). */
  replicas?: number;
  /** Shared supervisor hosts, `h-0`..; 0 (the default) runs one supervisor process per sandbox. */
  hosts?: number;
  /** How replicas deliver configuration (default `"push"`). */
  configDelivery?: ConfigDelivery;
  /** Sandbox isolation, as the gateway's `--isolation` (default `"auto"`). */
  isolation?: Isolation;
  /** Start a process that died unasked again (default false: a test sees the crash). */
  restartCrashed?: boolean;
  /**
   * The `openshell-gateway` to run (its `openshell-supervisor` beside it).
   * Default: `$OPENSHELL_GATEWAY_BIN`, else the one in this platform's
   * package (`@openshell/sdk-<platform>`), else `openshell-gateway` on `PATH`.
   */
  gatewayBin?: string;
}

/** The `openshell-gateway` shipped in this platform's package, if installed. */
export function bundledGateway(): string | null {
  const dir = platformPackageDir();
  if (dir === null) return null;
  const path = join(dir, "bin", "openshell-gateway");
  return existsSync(path) ? path : null;
}

/** The explicit path, else none when the variable is set (the core reads it), else the bundled one. */
function gatewayBin(explicit: string | undefined): string | undefined {
  if (explicit !== undefined) {
    if (typeof explicit !== "string" || explicit === "") {
      throw invalidArgument("gatewayBin must be a non-empty string");
    }
    return explicit;
  }
  if (process.env[GATEWAY_BIN_ENV]) return undefined;
  return bundledGateway() ?? undefined;
}

function oneOf(what: string, value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== "string") throw invalidArgument(`${what} must be a string`);
  return value;
}

/**
 * Starts a local cluster and resolves once it serves. Bad options reject
 * with an `InvalidConfigError`; a cluster that cannot start rejects with a
 * `ClusterError` whose `logs` names the kept log directory.
 *
 * ```ts
 * await using cluster = await startLocalCluster({ replicas: 3 });
 * ```
 */
export async function startLocalCluster(options: LocalClusterOptions = {}): Promise<LocalCluster> {
  if (typeof options !== "object" || options === null) {
    throw invalidArgument("options must be an object");
  }
  if (options.restartCrashed !== undefined && typeof options.restartCrashed !== "boolean") {
    throw invalidArgument("restartCrashed must be a boolean");
  }
  const handle = await call(() =>
    native.NativeLocalCluster.start({
      replicas: options.replicas === undefined ? undefined : u32("replicas", options.replicas),
      hosts: options.hosts === undefined ? undefined : u32("hosts", options.hosts),
      configDelivery: oneOf("configDelivery", options.configDelivery),
      isolation: oneOf("isolation", options.isolation),
      restartCrashed: options.restartCrashed,
      gatewayBin: gatewayBin(options.gatewayBin),
    }),
  );
  return LocalCluster._create(handle);
}

// Every running cluster, held until stopped (never collected while its
// processes run). One still running when the process exits is stopped
// there, on the main thread: its processes by PID, its data directory
// removed. A process that dies without exiting (a signal, even SIGKILL)
// closes `up`'s input, and `up` stops every process it started.
const running = new Set<LocalCluster>();
let exitHook = false;

function onExit(): void {
  for (const cluster of running) {
    try {
      cluster._stopBlocking();
    } catch {
      process.stderr.write(`openshell local cluster logs kept in ${cluster.dataDir}\n`);
    }
  }
  running.clear();
}

/**
 * A running local cluster: `startLocalCluster()` makes one. Stop it with
 * `stop()` or `await using`; faults are orders to it, each resolved once
 * carried out. An id that is not the cluster's rejects with an
 * `InvalidConfigError`; a fault after `stop()` with a `ClusterError`.
 */
export class LocalCluster implements AsyncDisposable {
  readonly #native: NativeLocalCluster;
  #stopping: Promise<void> | null = null;
  /** The edge's URL (`http://127.0.0.1:<free port>`): what clients and supervisors dial. */
  readonly endpoint: string;
  /** The cluster's data directory (store, sandboxes, logs under `up/`); removed by a clean stop. */
  readonly dataDir: string;
  /** The replica ids, `gw-0`.. in order. */
  readonly replicaIds: readonly string[];
  /** The shared host ids, `h-0`.. in order (empty without hosts). */
  readonly hostIds: readonly string[];

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(handle: NativeLocalCluster): LocalCluster {
    return new LocalCluster(handle);
  }

  private constructor(handle: NativeLocalCluster) {
    this.#native = handle;
    this.endpoint = handle.endpoint;
    this.dataDir = handle.dataDir;
    this.replicaIds = Object.freeze([...handle.replicaIds]);
    this.hostIds = Object.freeze([...handle.hostIds]);
    running.add(this);
    if (!exitHook) {
      exitHook = true;
      process.on("exit", onExit);
    }
  }

  /** A `Client` of the edge (owner routing on; `options` as for `new Client`). */
  client(options: Omit<ClientOptions, "endpoint"> = {}): Client {
    return new Client({ ...options, endpoint: this.endpoint });
  }

  /** The replica holding `sandbox`'s supervisor session, or null (none now, or one replica). */
  ownerOf(sandbox: string): Promise<string | null> {
    return call(() => this.#native.ownerOf(sandbox));
  }

  /** SIGTERM to a replica (its sessions move to the others); down until `startReplica`. */
  stopReplica(id: string): Promise<void> {
    return call(() => this.#native.stopReplica(id));
  }

  /** SIGKILL to a replica; down until `startReplica`. */
  killReplica(id: string): Promise<void> {
    return call(() => this.#native.killReplica(id));
  }

  /** Starts a stopped or killed replica again, on its old ports; resolves once it serves. */
  startReplica(id: string): Promise<void> {
    return call(() => this.#native.startReplica(id));
  }

  /**
   * The edge loses its route to a replica: a call hinted to it is answered
   * "not forwarded" and the SDK retries it once unhinted
   * (`routingStats().unroutedRetries`); unhinted calls go to the others.
   */
  cutRoute(id: string): Promise<void> {
    return call(() => this.#native.cutRoute(id));
  }

  /** Gives the edge its route to a replica back. */
  restoreRoute(id: string): Promise<void> {
    return call(() => this.#native.restoreRoute(id));
  }

  /** Stops and starts the edge: every connection through it breaks and is dialled anew. */
  restartEdge(): Promise<void> {
    return call(() => this.#native.restartEdge());
  }

  /** SIGKILL to a shared host (its sandboxes lose their supervisor); down until `startHost`. */
  killHost(id: string): Promise<void> {
    return call(() => this.#native.killHost(id));
  }

  /** Starts a killed host again. */
  startHost(id: string): Promise<void> {
    return call(() => this.#native.startHost(id));
  }

  /**
   * Every replica's store calls wait `delayMs` first (a slow database),
   * until `restoreStore()`; a delay past a call's deadline (5 s) makes it
   * fail `unavailable`. A delay outside 0 to 600000 ms rejects with an
   * `InvalidConfigError`.
   */
  slowStore(delayMs: number): Promise<void> {
    return call(() => {
      if (typeof delayMs !== "number") throw invalidArgument("delayMs must be a number");
      return this.#native.slowStore(delayMs);
    });
  }

  /**
   * The store stops answering (a frozen or unreachable database): every
   * call that needs it fails `unavailable` after its deadline (5 s), naming
   * the store, until `restoreStore()`.
   */
  cutStore(): Promise<void> {
    return call(() => this.#native.cutStore());
  }

  /** Ends `slowStore` and `cutStore`. */
  restoreStore(): Promise<void> {
    return call(() => this.#native.restoreStore());
  }

  /**
   * Stops every process of the cluster by PID and removes the data
   * directory; idempotent. Rejects with a `ClusterError` (the directory
   * kept, its path in `logs`) when the cluster did not stop cleanly.
   */
  stop(): Promise<void> {
    if (this.#stopping === null) {
      running.delete(this);
      this.#stopping = call(() => this.#native.close());
    }
    return this.#stopping;
  }

  /** @internal `stop()` on this thread, for the process's exit. */
  _stopBlocking(): void {
    running.delete(this);
    callSync(() => this.#native.closeBlocking());
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.stop();
  }
}
