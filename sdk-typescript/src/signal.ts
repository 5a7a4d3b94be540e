// AbortSignal -> the addon's per-call cancel token. napi's own AbortSignal
// support does not reach the tokio futures the calls run on.
import { cancelled, fromNative } from "./errors.js";
import { type CancelToken, native } from "./native.js";

export interface CallOptions {
  /** Aborting it cancels the call (the RPC is reset; a command is killed). */
  signal?: AbortSignal;
  /**
   * Deadline of this call in milliseconds (overrides the client's); 0 for
   * none, as for the client's `timeoutMs`.
   */
  timeoutMs?: number;
}

/**
 * Runs `start(token)` with a cancel token tied to `signal`. A signal that is
 * already aborted fails at once, without a call. What the addon throws while
 * `start` builds the call (a bad option is rejected synchronously, before
 * any promise exists) becomes an OpenShellError like any rejection.
 */
export async function withSignal<T>(
  signal: AbortSignal | undefined,
  start: (token: CancelToken | undefined) => Promise<T>,
): Promise<T> {
  if (signal?.aborted) throw cancelled();
  const token = signal === undefined ? undefined : new native.CancelToken();
  const onAbort = () => token?.cancel();
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    return await start(token);
  } catch (err) {
    throw fromNative(err);
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
}

/** Calls `onAbort` when `signal` aborts; returns the function that stops listening. */
export function onAbort(signal: AbortSignal | undefined, action: () => void): () => void {
  if (signal === undefined) return () => {};
  if (signal.aborted) {
    action();
    return () => {};
  }
  signal.addEventListener("abort", action, { once: true });
  return () => signal.removeEventListener("abort", action);
}
