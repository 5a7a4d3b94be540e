// @openshell/sdk: the OpenShell client for Node.
export {
  Client,
  type ClientOptions,
  type CreateSandboxOptions,
  type ExecOptions,
  Forward,
  type ForwardOptions,
  type ListSandboxesOptions,
  RawCalls,
  RawStream,
  Sandboxes,
  SandboxWatch,
  SshSessions,
  type TokenAnswer,
  type TokenProvider,
} from "./client.js";
export {
  type ApplyCallback,
  type ApplyResult,
  ConfigSession,
  type ConfigSessionOptions,
  type ConfigSessionStats,
  ConfigSnapshot,
  ConfigUpdate,
  type DeliveryMode,
  Rejected,
  type SettingValue,
} from "./config.js";
export {
  AlreadyExistsError,
  AuthError,
  CancelledError,
  ClusterError,
  ConnectError,
  DeadlineExceededError,
  type ErrorDetails,
  errorClass,
  FailedPreconditionError,
  GrpcStatus,
  InvalidArgumentError,
  InvalidConfigError,
  NotFoundError,
  OpenShellError,
  OutOfRangeError,
  OutputLimitError,
  PermissionDeniedError,
  ResourceExhaustedError,
  UnauthenticatedError,
  UnavailableError,
} from "./errors.js";
export { ExecStream, InteractiveExec } from "./exec.js";
export {
  DownloadStream,
  type TransferOptions,
  type TransferProgress,
  type TransferSummary,
  type UploadSource,
} from "./files.js";
export {
  type HostApplyCallback,
  HostSession,
  type HostSessionOptions,
  type HostSessionStats,
} from "./host.js";
export {
  type EventsOptions,
  EventWatch,
  type LogFilter,
  type LogLevel,
  LogLine,
  type Logs,
  type LogsOptions,
  type WatchEvent,
} from "./logs.js";
export { method, path, registry } from "./registry.js";
export type { CallOptions } from "./signal.js";
export { type RawCallOptions, TypedStream } from "./typed-raw.js";
export {
  type ExecEvent,
  ExecResult,
  type ForwardStats,
  type Health,
  type RoutingStats,
  type Sandbox,
  type SandboxPhase,
  SshSession,
} from "./types.js";
