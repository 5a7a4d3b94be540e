// Errors: every failure of a call is an OpenShellError carrying the core's
// stable string `code`, the gRPC status number and the replica that served
// the call (when known). Subclasses let callers use `instanceof`.
import { native } from "./native.js";

/** gRPC status numbers, as `grpcStatus` reports them. */
export const GrpcStatus = {
  OK: 0,
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  ABORTED: 10,
  OUT_OF_RANGE: 11,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  DATA_LOSS: 15,
  UNAUTHENTICATED: 16,
} as const;

export interface ErrorDetails {
  code: string;
  message: string;
  grpcStatus: number;
  retryable: boolean;
  servedBy: string | null;
  metadata: ReadonlyArray<readonly [string, string]>;
  /** A `cluster` error's kept log directory (the addon sends `null` otherwise). */
  logs?: string | null;
}

/** A failed call. `code` is the core's stable code (`not_found`, `cancelled`, ...). */
export class OpenShellError extends Error {
  readonly code: string;
  readonly grpcStatus: number;
  readonly retryable: boolean;
  /** The replica that answered (`x-openshell-served-by`), when known. */
  readonly servedBy: string | null;
  /** Response metadata of the failed call. */
  readonly metadata: ReadonlyArray<readonly [string, string]>;

  constructor(details: ErrorDetails, options?: { cause?: unknown }) {
    super(details.message, options);
    this.code = details.code;
    this.grpcStatus = details.grpcStatus;
    this.retryable = details.retryable;
    this.servedBy = details.servedBy;
    this.metadata = details.metadata;
  }

  override get name(): string {
    return this.constructor.name;
  }
}

export class NotFoundError extends OpenShellError {}
export class AlreadyExistsError extends OpenShellError {}
export class InvalidArgumentError extends OpenShellError {}
export class CancelledError extends OpenShellError {}
export class DeadlineExceededError extends OpenShellError {}
/** The token provider failed (code `auth`). */
export class AuthError extends OpenShellError {}
/** The gateway rejected the credentials. */
export class UnauthenticatedError extends OpenShellError {}
/** The endpoint could not be reached (retryable). */
export class ConnectError extends OpenShellError {}
export class PermissionDeniedError extends OpenShellError {}
export class UnavailableError extends OpenShellError {}
export class InvalidConfigError extends OpenShellError {}
export class OutputLimitError extends OpenShellError {}
/**
 * Something is in the way (`failed_precondition`): for a transfer, a
 * directory where a file is expected or the reverse, or a file too large
 * for `readFile`.
 */
export class FailedPreconditionError extends OpenShellError {}
/** Out of a resource (`resource_exhausted`): for a transfer, no space left. */
export class ResourceExhaustedError extends OpenShellError {}
/**
 * `out_of_range`: for a watch (`client.sandboxes.events`), the gateway no
 * longer holds the events that followed its cursor (it keeps a bounded
 * number of log lines), or the cursor is not one of its own. The watch ends
 * with it instead of skipping ahead quietly; watch again without
 * `resumeAfter` to start from the current state.
 */
export class OutOfRangeError extends OpenShellError {}

/**
 * A local test cluster (`@openshell/sdk/testing`) failed to start, to carry
 * out a fault, or to stop cleanly (code `cluster`).
 */
export class ClusterError extends OpenShellError {
  /** The directory the cluster's logs were kept in, when they were. */
  readonly logs?: string;

  constructor(details: ErrorDetails, options?: { cause?: unknown }) {
    super(details, options);
    if (typeof details.logs === "string") this.logs = details.logs;
  }
}

const classes: Record<string, new (d: ErrorDetails, o?: { cause?: unknown }) => OpenShellError> = {
  not_found: NotFoundError,
  already_exists: AlreadyExistsError,
  invalid_argument: InvalidArgumentError,
  cancelled: CancelledError,
  deadline_exceeded: DeadlineExceededError,
  unauthenticated: UnauthenticatedError,
  auth: AuthError,
  permission_denied: PermissionDeniedError,
  unavailable: UnavailableError,
  connect: ConnectError,
  invalid_config: InvalidConfigError,
  output_limit: OutputLimitError,
  failed_precondition: FailedPreconditionError,
  resource_exhausted: ResourceExhaustedError,
  out_of_range: OutOfRangeError,
  cluster: ClusterError,
};

const marker = native.errorMarker();

/** The OpenShellError for a rejection of the addon; other values pass through. */
export function fromNative(err: unknown): unknown {
  if (!(err instanceof Error) || !err.message.startsWith(marker)) return err;
  let details: ErrorDetails;
  try {
    details = JSON.parse(err.message.slice(marker.length)) as ErrorDetails;
  } catch {
    return err;
  }
  const Class = classes[details.code] ?? OpenShellError;
  return new Class(details);
}

/**
 * Awaits a call of the addon, turning its rejection into an OpenShellError.
 * Given a function, also converts what the addon throws synchronously while
 * the call is built (an argument it rejects).
 */
export async function call<T>(promise: Promise<T> | (() => Promise<T>)): Promise<T> {
  try {
    return await (typeof promise === "function" ? promise() : promise);
  } catch (err) {
    throw fromNative(err);
  }
}

/** `value` as a whole number in [0, 2^32): what crosses to the addon as u32. */
export function u32(what: string, value: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > 0xffff_ffff) {
    throw invalidArgument(`${what} must be a whole number between 0 and 4294967295`);
  }
  return value;
}

/** Runs a synchronous call of the addon, converting what it throws. */
export function callSync<T>(f: () => T): T {
  try {
    return f();
  } catch (err) {
    throw fromNative(err);
  }
}

export function cancelled(message = "the call was aborted"): CancelledError {
  return new CancelledError({
    code: "cancelled",
    message,
    grpcStatus: GrpcStatus.CANCELLED,
    retryable: false,
    servedBy: null,
    metadata: [],
  });
}

export function deadlineExceeded(message: string): DeadlineExceededError {
  return new DeadlineExceededError({
    code: "deadline_exceeded",
    message,
    grpcStatus: GrpcStatus.DEADLINE_EXCEEDED,
    retryable: false,
    servedBy: null,
    metadata: [],
  });
}

export function invalidArgument(message: string): InvalidConfigError {
  return new InvalidConfigError({
    code: "invalid_config",
    message,
    grpcStatus: GrpcStatus.INVALID_ARGUMENT,
    retryable: false,
    servedBy: null,
    metadata: [],
  });
}

/** The error class a code is thrown as (OpenShellError for codes without their own). */
export function errorClass(
  code: string,
): new (
  d: ErrorDetails,
  o?: { cause?: unknown },
) => OpenShellError {
  return classes[code] ?? OpenShellError;
}
