// The native addon (bindings/node) and the shape of what it exports. Not a
// public API: everything here is wrapped by the modules next to it. The
// addon comes from OPENSHELL_SDK_NATIVE, else the platform package, else
// the install script's build in native/ (a checkout).
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { platformBase, platformName, platformSuffixes } from "./platform.js";

export interface NativeTokenAnswer {
  token?: string;
  expiresInMs?: number;
  error?: string;
  retryable?: boolean;
}

export interface NativeClientOptions {
  endpoint: string;
  token?: string;
  caPem?: Buffer;
  tlsServerName?: string;
  connectTimeoutMs?: number;
  timeoutMs?: number;
  execOutputLimit?: number;
  allowCleartextToken?: boolean;
}

export interface NativeSandbox {
  id: string;
  name: string;
  phase: string;
  labels: Record<string, string>;
  exitCode?: number | null;
  resourceVersion: bigint;
  proto: Buffer;
}

export interface NativeSshSession {
  sandboxId: string;
  token: string;
  hostKeyFingerprint: string;
  expiresAtMs?: number | null;
  gatewayHost: string;
  gatewayPort: number;
  gatewayScheme: string;
}

export interface NativeCreate {
  name?: string;
  image?: string;
  environment?: Record<string, string>;
  command?: string[];
  labels?: Record<string, string>;
  tty?: boolean;
}

export interface NativeExecRequest {
  sandbox: string;
  command: string[];
  workdir?: string;
  environment?: Record<string, string>;
  stdin?: Buffer;
  tty?: boolean;
  cols?: number;
  rows?: number;
  execTimeoutMs?: number;
  outputLimit?: number;
}

export interface NativeExecOutput {
  stdout: Buffer;
  stderr: Buffer;
  exitCode: number;
}

export interface NativeEvent {
  kind: 1 | 2 | 3;
  data: Buffer;
  exitCode: number;
}

export interface NativeForwardStats {
  connectionsAccepted: bigint;
  connectionsActive: bigint;
  connectionsFailed: bigint;
  bytesIn: bigint;
  bytesOut: bigint;
}

export interface NativeRoutingStats {
  hinted: bigint;
  unhinted: bigint;
  unroutedRetries: bigint;
  ownerLookups: bigint;
  cacheHits: bigint;
}

export type Pairs = string[][];

export interface CancelToken {
  cancel(): void;
  readonly cancelled: boolean;
}

export interface NativeEvents {
  nextBatch(): Promise<NativeEvent[]>;
  collect(buffered: NativeEvent[]): Promise<NativeExecOutput>;
  cancel(): void;
}

export interface NativeInteractive extends NativeEvents {
  write(data: Buffer): Promise<void>;
  resize(cols: number, rows: number): Promise<void>;
  closeStdin(): void;
}

export interface NativeWatch {
  next(): Promise<NativeSandbox | null>;
  cancel(): void;
}

export interface NativeForward {
  readonly localAddress: { address: string; family: string; port: number };
  readonly sandbox: string;
  readonly remotePort: number;
  readonly closed: boolean;
  stats(): NativeForwardStats;
  close(): void;
  waitClosed(): Promise<void>;
}

export interface NativeRawStream {
  send(message: Buffer): Promise<void>;
  closeSend(): void;
  recv(): Promise<Buffer | null>;
  responseMetadata(): Promise<Pairs>;
  trailers(): Pairs | null;
  cancel(): void;
}

export interface NativeProgress {
  bytesDone: number;
  bytesTotal: number;
  filesDone: number;
  filesTotal: number;
  current: string;
}

export interface NativeTransferSummary {
  files: number;
  directories: number;
  symlinks: number;
  skippedSymlinks: number;
  ignored: number;
  skippedOther: number;
  bytes: number;
}

/** Called with each report; `null` is the binding's flush (ignore it). Must not throw. */
export type NativeProgressFn = (report: NativeProgress | null) => void;

export interface NativeUploadSink {
  readonly target: string;
  write(data: Buffer): Promise<void>;
  finish(): Promise<NativeTransferSummary>;
  abort(): Promise<void>;
  cancel(): void;
}

export interface NativeDownloadSource {
  readonly size: number;
  readonly source: string;
  next(): Promise<Buffer | null>;
  close(): Promise<void>;
  cancel(): void;
}

export interface NativeLogQuery {
  tail?: number;
  sinceMs?: number;
  sources?: string[];
  minLevel?: string;
}

export interface NativeLogLine {
  timeMs?: number | null;
  level: string;
  source: string;
  target: string;
  message: string;
  fields: Pairs;
  text: string;
}

export interface NativeWatchOptions {
  status?: boolean;
  logs?: boolean;
  query?: NativeLogQuery;
  resumeAfter?: string;
  stopOnTerminal?: boolean;
}

export interface NativeWatchEvent {
  kind: "sandbox" | "log";
  sandbox?: NativeSandbox | null;
  line?: NativeLogLine | null;
  cursor: string;
}

export interface NativeEventWatch {
  readonly resumes: number;
  nextBatch(): Promise<NativeWatchEvent[]>;
  cancel(): void;
}

export interface NativeConfigSessionOptions {
  endpoint: string;
  sandboxId: string;
  sandboxToken: string;
  pollIntervalMs?: number;
  announcePush?: boolean;
  instanceId?: string;
  caPem?: Buffer;
  tlsServerName?: string;
  connectTimeoutMs?: number;
  allowCleartextToken?: boolean;
}

export interface NativeConfigUpdate {
  id: number;
  sandboxConfig: Buffer;
  providerEnvironment: Buffer;
  mode: "push" | "poll";
}

export interface NativeConfigSessionStats {
  mode?: "push" | "poll" | null;
  applied: bigint;
  rejected: bigint;
  duplicates: bigint;
  updatesReceived: bigint;
  lastUpdateId: bigint;
  configRevision: bigint;
  polls: bigint;
  sessionsAccepted: bigint;
  redirects: bigint;
  sessionId?: string | null;
  servedBy?: string | null;
}

export interface NativeConfigSession {
  readonly instanceId: string;
  readonly closed: boolean;
  start(onEnded?: () => void): void;
  nextUpdate(): Promise<NativeConfigUpdate | null>;
  waitClosed(): Promise<void>;
  ack(id: number, applied: boolean, reason?: string | null): boolean;
  stats(): NativeConfigSessionStats;
  close(): void;
  /** Tests only: the next start() runs a session that panics at once. */
  panicInRunForTest(): void;
}

export interface NativeHostSessionOptions {
  endpoint: string;
  memberId: string;
  hostToken: string;
  capacity?: number;
  configPush?: boolean;
  instanceId?: string;
  caPem?: Buffer;
  tlsServerName?: string;
  connectTimeoutMs?: number;
  allowCleartextToken?: boolean;
}

export interface NativeHostUpdate {
  id: number;
  sandboxId: string;
  sandboxConfig: Buffer;
  providerEnvironment: Buffer;
}

export interface NativeHostSessionStats {
  sessionsAccepted: bigint;
  redirects: bigint;
  stickyRedials: bigint;
  fallbacks: bigint;
  stay: boolean;
  sessionId?: string | null;
  servedBy?: string | null;
  assigned: number;
}

export interface NativeHostSession {
  readonly memberId: string;
  readonly instanceId: string;
  readonly closed: boolean;
  start(onEnded?: () => void): void;
  waitClosed(): Promise<void>;
  ack(id: number, applied: boolean, reason?: string | null): boolean;
  stats(): NativeHostSessionStats;
  close(): void;
}

export interface NativeLocalClusterOptions {
  replicas?: number;
  hosts?: number;
  configDelivery?: string;
  isolation?: string;
  restartCrashed?: boolean;
  gatewayBin?: string;
}

export interface NativeLocalCluster {
  readonly endpoint: string;
  readonly dataDir: string;
  readonly replicaIds: string[];
  readonly hostIds: string[];
  ownerOf(sandbox: string): Promise<string | null>;
  stopReplica(id: string): Promise<void>;
  killReplica(id: string): Promise<void>;
  startReplica(id: string): Promise<void>;
  cutRoute(id: string): Promise<void>;
  restoreRoute(id: string): Promise<void>;
  restartEdge(): Promise<void>;
  killHost(id: string): Promise<void>;
  startHost(id: string): Promise<void>;
  slowStore(delayMs: number): Promise<void>;
  cutStore(): Promise<void>;
  restoreStore(): Promise<void>;
  close(): Promise<void>;
  closeBlocking(): void;
}

type Ms = number | undefined | null;
type Cancel = CancelToken | undefined | null;

export interface NativeClient {
  readonly endpoint: string;
  readonly closed: boolean;
  close(): void;
  health(
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<{ status: string; version: string; servedBy?: string | null }>;
  createSandbox(request: NativeCreate, timeoutMs: Ms, cancel: Cancel): Promise<NativeSandbox>;
  getSandbox(name: string, timeoutMs: Ms, cancel: Cancel): Promise<NativeSandbox>;
  listSandboxes(
    labelSelector: string | undefined,
    pageSize: number | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeSandbox[]>;
  deleteSandbox(name: string, timeoutMs: Ms, cancel: Cancel): Promise<string>;
  waitReady(name: string, timeoutMs: Ms, cancel: Cancel): Promise<NativeSandbox>;
  waitDeleted(name: string, timeoutMs: Ms, cancel: Cancel): Promise<void>;
  watch(name: string, timeoutMs: Ms, cancel: Cancel): Promise<NativeWatch>;
  exec(request: NativeExecRequest, timeoutMs: Ms, cancel: Cancel): Promise<NativeExecOutput>;
  execStream(request: NativeExecRequest, timeoutMs: Ms, cancel: Cancel): Promise<NativeEvents>;
  execInteractive(
    request: NativeExecRequest,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeInteractive>;
  forward(
    sandbox: string,
    remotePort: number,
    localAddress: string | undefined,
    sshSessionToken: string | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeForward>;
  createSshSession(sandbox: string, timeoutMs: Ms, cancel: Cancel): Promise<NativeSshSession>;
  revokeSshSession(token: string, timeoutMs: Ms, cancel: Cancel): Promise<boolean>;
  rawUnary(
    path: string,
    request: Buffer,
    metadata: Pairs | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<{ bytes: Buffer; metadata: Pairs }>;
  rawStream(
    path: string,
    metadata: Pairs | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeRawStream>;
  routingStats(): NativeRoutingStats;
  upload(
    sandbox: string,
    local: string,
    remote: string,
    ignoreFile: string | undefined,
    progress: NativeProgressFn | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeTransferSummary>;
  download(
    sandbox: string,
    remote: string,
    local: string,
    ignoreFile: string | undefined,
    progress: NativeProgressFn | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeTransferSummary>;
  uploadStream(
    sandbox: string,
    remote: string,
    progress: NativeProgressFn | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeUploadSink>;
  downloadStream(
    sandbox: string,
    remote: string,
    progress: NativeProgressFn | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeDownloadSource>;
  readFile(sandbox: string, remote: string, timeoutMs: Ms, cancel: Cancel): Promise<Buffer>;
  writeFile(
    sandbox: string,
    remote: string,
    data: Buffer,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeTransferSummary>;
  sandboxLogs(
    name: string,
    query: NativeLogQuery | undefined,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<{ lines: NativeLogLine[]; bufferTotal: number }>;
  sandboxEvents(
    name: string,
    options: NativeWatchOptions,
    timeoutMs: Ms,
    cancel: Cancel,
  ): Promise<NativeEventWatch>;
}

export interface NativeModule {
  NativeClient: new (
    options: NativeClientOptions,
    tokenProvider?: (forceRefresh: boolean) => Promise<NativeTokenAnswer>,
  ) => NativeClient;
  CancelToken: new () => CancelToken;
  NativeConfigSession: new (
    options: NativeConfigSessionOptions,
    apply?: (update: NativeConfigUpdate) => void,
  ) => NativeConfigSession;
  NativeHostSession: new (
    options: NativeHostSessionOptions,
    apply: (update: NativeHostUpdate) => void,
  ) => NativeHostSession;
  NativeLocalCluster: {
    start(options: NativeLocalClusterOptions): Promise<NativeLocalCluster>;
  };
  nativeVersion(): string;
  errorMarker(): string;
  descriptorSet(): Buffer;
  panicForTest(): Promise<void>;
}

const require = createRequire(import.meta.url);

/** The folder of an installed `@openshell/sdk-<name>`, or null. */
function installed(name: string): string | null {
  try {
    return dirname(require.resolve(`@openshell/sdk-${name}/package.json`));
  } catch {
    return null;
  }
}

let platformPackage: { dir: string | null } | null = null;

/**
 * The folder of this platform's package (`@openshell/sdk-<platform>`, an
 * optional dependency of a published release: the addon, and the gateway
 * and supervisor executables under `bin/`), or null when it is not
 * installed (a checkout). When only one C library variant is installed it
 * is this machine's (npm installs by `libc`), so no detection is needed.
 */
export function platformPackageDir(): string | null {
  if (platformPackage === null) {
    const found = platformSuffixes()
      .map((suffix) => installed(`${platformBase()}${suffix}`))
      .filter((dir) => dir !== null);
    const dir = found.length === 1 ? (found[0] ?? null) : installed(platformName());
    platformPackage = { dir };
  }
  return platformPackage.dir;
}

function load(): NativeModule {
  const explicit = process.env.OPENSHELL_SDK_NATIVE;
  if (explicit) return require(explicit) as NativeModule;
  // A release: the platform package's addon (its `main`).
  const packaged = platformPackageDir();
  if (packaged !== null) return require(packaged) as NativeModule;
  // A checkout: the addon the install script built (native/). When only
  // one C library variant was built, it is this machine's.
  const packageDir = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
  const addon = (name: string) => join(packageDir, "native", `openshell-sdk.${name}.node`);
  const built = platformSuffixes()
    .map((suffix) => addon(`${platformBase()}${suffix}`))
    .filter((file) => existsSync(file));
  if (built.length === 1 && built[0] !== undefined) return require(built[0]) as NativeModule;
  const platform = platformName();
  const local = addon(platform);
  if (existsSync(local)) return require(local) as NativeModule;
  throw new Error(
    `@openshell/sdk: no native addon for ${platform} (looked for the package ` +
      `@openshell/sdk-${platform} and ${local}); install the release's platform package, or ` +
      "reinstall from a checkout so the install script can build the addon",
  );
}

export const native: NativeModule = load();
