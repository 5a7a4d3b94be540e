// Running commands: the streaming and interactive handles.
import { call, fromNative, GrpcStatus, OpenShellError, u32 } from "./errors.js";
import type { NativeEvent, NativeEvents, NativeInteractive } from "./native.js";
import { onAbort } from "./signal.js";
import { type ExecEvent, ExecResult } from "./types.js";

function eventOf(e: NativeEvent): ExecEvent {
  if (e.kind === 1) return { type: "stdout", data: e.data };
  if (e.kind === 2) return { type: "stderr", data: e.data };
  return { type: "exit", exitCode: e.exitCode };
}

function endedWithoutExit(): OpenShellError {
  return new OpenShellError({
    code: "stream_closed",
    message: "the exec stream ended without an exit event",
    // As the core reports stream_closed.
    grpcStatus: GrpcStatus.ABORTED,
    retryable: false,
    servedBy: null,
    metadata: [],
  });
}

/**
 * Iterates the events of a native exec handle. Ending the loop early
 * (`break`, `return`, a throw) cancels the command's RPC, and the gateway
 * kills the process group.
 */
async function* iterate(
  handle: NativeEvents,
  signal: AbortSignal | undefined,
  state: { exited: boolean },
): AsyncGenerator<ExecEvent, void, undefined> {
  const stop = onAbort(signal, () => handle.cancel());
  try {
    for (;;) {
      const batch = await call(handle.nextBatch());
      if (batch.length === 0) break;
      for (const event of batch) {
        if (event.kind === 3) state.exited = true;
        yield eventOf(event);
      }
      if (state.exited) return;
    }
    if (!state.exited) throw endedWithoutExit();
  } finally {
    stop();
    if (!state.exited) handle.cancel();
  }
}

/**
 * A running command's output as an async iterable of events, ending in
 * exactly one `exit`. Iterate it once, or call `collect()`.
 */
export class ExecStream implements AsyncIterable<ExecEvent>, AsyncDisposable {
  readonly #start: () => Promise<NativeEvents>;
  readonly #signal: AbortSignal | undefined;
  #handle: Promise<NativeEvents> | null = null;
  #used = false;
  #state = { exited: false };

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(start: () => Promise<NativeEvents>, signal: AbortSignal | undefined): ExecStream {
    return new ExecStream(start, signal);
  }

  private constructor(start: () => Promise<NativeEvents>, signal: AbortSignal | undefined) {
    this.#start = start;
    this.#signal = signal;
  }

  #native(): Promise<NativeEvents> {
    this.#handle ??= this.#start();
    return this.#handle;
  }

  #claim(): void {
    if (this.#used) {
      throw new TypeError("an ExecStream can be consumed only once");
    }
    this.#used = true;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<ExecEvent, void, undefined> {
    this.#claim();
    yield* iterate(await this.#native(), this.#signal, this.#state);
  }

  /** Waits for the command and returns all its output (under the output cap). */
  async collect(): Promise<ExecResult> {
    this.#claim();
    const handle = await this.#native();
    const stop = onAbort(this.#signal, () => handle.cancel());
    try {
      const out = ExecResult.of(await call(handle.collect([])));
      this.#state.exited = true;
      return out;
    } finally {
      stop();
    }
  }

  /** Cancels the command (idempotent). */
  cancel(): void {
    if (this.#handle === null) {
      this.#used = true;
      return;
    }
    this.#handle.then(
      (h) => h.cancel(),
      () => {},
    );
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.#state.exited) this.cancel();
  }
}

/** A command with stdin, a terminal size and a stream of events. */
export class InteractiveExec implements AsyncDisposable {
  readonly #native: NativeInteractive;
  readonly #signal: AbortSignal | undefined;
  readonly #state = { exited: false };
  /** Stops cancelling on abort; the signal is watched while the command runs. */
  #stopAbort: () => void = () => {};
  #used = false;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(handle: NativeInteractive, signal: AbortSignal | undefined): InteractiveExec {
    return new InteractiveExec(handle, signal);
  }

  private constructor(handle: NativeInteractive, signal: AbortSignal | undefined) {
    this.#native = handle;
    this.#signal = signal;
    // Aborting the signal cancels the command at any point of its life
    // (during write(), resize(), between calls), not only while iterating.
    this.#stopAbort = onAbort(signal, () => this.cancel());
  }

  /** Writes to the command's stdin. */
  async write(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
    await call(() => this.#native.write(bytes));
  }

  /** Resizes the terminal (whole numbers of columns and rows). */
  async resize(cols: number, rows: number): Promise<void> {
    const c = u32("cols", cols);
    const r = u32("rows", rows);
    await call(() => this.#native.resize(c, r));
  }

  /** Closes stdin (end of file). Idempotent. */
  closeStdin(): void {
    try {
      this.#native.closeStdin();
    } catch (err) {
      throw fromNative(err);
    }
  }

  /** The command's events; breaking out of the loop cancels the command. */
  events(): AsyncIterable<ExecEvent> {
    if (this.#used) throw new TypeError("the events of an InteractiveExec can be consumed once");
    this.#used = true;
    const events = iterate(this.#native, this.#signal, this.#state);
    const stopAbort = this.#stopAbort;
    return (async function* () {
      try {
        yield* events;
      } finally {
        stopAbort();
      }
    })();
  }

  /** Waits for the command to end and returns the output not yet consumed. */
  async wait(): Promise<ExecResult> {
    if (this.#used) throw new TypeError("the events of an InteractiveExec can be consumed once");
    this.#used = true;
    const stop = onAbort(this.#signal, () => this.#native.cancel());
    try {
      const out = ExecResult.of(await call(this.#native.collect([])));
      this.#state.exited = true;
      return out;
    } finally {
      stop();
      this.#stopAbort();
    }
  }

  /** Cancels the command (idempotent). */
  cancel(): void {
    this.#stopAbort();
    this.#native.cancel();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.#state.exited) this.cancel();
  }
}
