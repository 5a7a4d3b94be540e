// Sandbox logs and watches that resume. `client.sandboxes.logs` reads the
// lines a gateway recorded about a sandbox; `client.sandboxes.events`
// follows its status, its log lines or both. The core's watch reopens its
// stream after the last cursor it delivered when the stream breaks (a
// replica died, a connection dropped), on whichever replica answers: no
// event is lost or repeated. When the gateway no longer holds what followed
// the cursor, the watch ends with an OutOfRangeError rather than skip ahead.
import { call, invalidArgument, u32 } from "./errors.js";
import { KeepAlive } from "./keepalive.js";
import type {
  NativeClient,
  NativeEventWatch,
  NativeLogLine,
  NativeLogQuery,
  NativeWatchEvent,
} from "./native.js";
import { type CallOptions, onAbort, withSignal } from "./signal.js";
import { type Sandbox, sandboxOf } from "./types.js";

/** A log line's level, most verbose first. */
export type LogLevel = "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR" | (string & {});

/** Which lines to read; everything by default (the newest 2000). */
export interface LogFilter {
  /** Only the newest `tail` lines (of those that match). */
  tail?: number;
  /** Only lines written at or after this time. */
  since?: Date;
  /** Only lines of these sources (`"gateway"`, `"sandbox"`: its supervisor). */
  sources?: string[];
  /** Only lines at this level or above (case does not matter). */
  minLevel?: LogLevel;
}

export interface LogsOptions extends LogFilter, CallOptions {}

/** One recorded log line. `String(line)` prints it as every SDK does. */
export class LogLine {
  /** When it was written (the writer's clock), when known. */
  readonly time: Date | null;
  readonly level: LogLevel;
  /** `"gateway"` or `"sandbox"` (its supervisor). */
  readonly source: string;
  /** What wrote it (a module path). */
  readonly target: string;
  readonly message: string;
  /** Structured fields (for example `exit_code`), as strings. */
  readonly fields: Readonly<Record<string, string>>;
  readonly #text: string;

  /** @internal Builds one (the constructor is private: not public API). */
  static _of(line: NativeLogLine): LogLine {
    return new LogLine(line);
  }

  private constructor(line: NativeLogLine) {
    this.time = line.timeMs === undefined || line.timeMs === null ? null : new Date(line.timeMs);
    this.level = line.level;
    this.source = line.source;
    this.target = line.target;
    this.message = line.message;
    const fields: Record<string, string> = {};
    for (const [key, value] of line.fields) {
      if (key !== undefined) fields[key] = value ?? "";
    }
    this.fields = Object.freeze(fields);
    this.#text = line.text;
    Object.freeze(this);
  }

  /** `2026-12-04T05:01:02.345Z INFO  sandbox exec finished exit_code=0` */
  toString(): string {
    return this.#text;
  }
}

/** What `client.sandboxes.logs` returns. */
export interface Logs {
  /** Oldest first. */
  readonly lines: readonly LogLine[];
  /** Lines the gateway holds for the sandbox (before the filters). */
  readonly bufferTotal: number;
}

/**
 * One event of a watch; resume after its `cursor` to get what followed.
 * Without `resumeAfter` a watch starts with the sandbox as it is now (also
 * when `status` is false), then the replayed lines, whose cursors extend its
 * own (resuming after one delivers the rest of the replay).
 */
export type WatchEvent =
  | { readonly kind: "sandbox"; readonly sandbox: Sandbox; readonly cursor: string }
  | { readonly kind: "log"; readonly line: LogLine; readonly cursor: string };

export interface EventsOptions extends LogFilter, CallOptions {
  /** Follow status changes (default true): the current state first, then every change. */
  status?: boolean;
  /**
   * Follow log lines (default false); the filters apply, and without
   * `resumeAfter` the newest `tail` lines (200 when unset) come first.
   */
  logs?: boolean;
  /** Start after this cursor (of an earlier event): exactly the events that came later. */
  resumeAfter?: string;
  /** End once the sandbox is READY, COMPLETED, STOPPED or in ERROR. */
  stopOnTerminal?: boolean;
}

function logQuery(filter: LogFilter): NativeLogQuery | undefined {
  const { tail, since, sources, minLevel } = filter;
  if (
    tail === undefined &&
    since === undefined &&
    sources === undefined &&
    minLevel === undefined
  ) {
    return undefined;
  }
  if (since !== undefined && (!(since instanceof Date) || Number.isNaN(since.getTime()))) {
    throw invalidArgument("since must be a valid Date");
  }
  if (
    sources !== undefined &&
    (!Array.isArray(sources) || sources.some((s) => typeof s !== "string"))
  ) {
    throw invalidArgument("sources must be an array of strings");
  }
  if (minLevel !== undefined && typeof minLevel !== "string") {
    throw invalidArgument("minLevel must be a string");
  }
  return {
    tail: tail === undefined ? undefined : u32("tail", tail),
    sinceMs: since?.getTime(),
    sources,
    minLevel,
  };
}

/** @internal `client.sandboxes.logs`. */
export function logs(n: NativeClient, name: string, options: LogsOptions): Promise<Logs> {
  return withSignal(options.signal, async (t) => {
    const query = logQuery(options);
    const got = await call(n.sandboxLogs(name, query, options.timeoutMs, t));
    return Object.freeze({
      lines: Object.freeze(got.lines.map(LogLine._of)),
      bufferTotal: got.bufferTotal,
    });
  });
}

function eventOf(e: NativeWatchEvent): WatchEvent {
  if (e.kind === "log" && e.line) {
    return Object.freeze({ kind: "log", line: LogLine._of(e.line), cursor: e.cursor });
  }
  if (e.kind === "sandbox" && e.sandbox) {
    return Object.freeze({ kind: "sandbox", sandbox: sandboxOf(e.sandbox), cursor: e.cursor });
  }
  throw new TypeError(`the addon sent a watch event of kind ${String(e.kind)} without its payload`);
}

/**
 * The events of one sandbox: `for await (const event of watch)`. The watch
 * starts on the first iteration and ends when the loop does (`break`, a
 * throw), on `cancel()`, when the signal aborts, or when the gateway ends it
 * (`stopOnTerminal`). While it runs it keeps the process alive, like a
 * `net.Server`, unless `unref()` is called. Iterate it once.
 */
export class EventWatch implements AsyncIterable<WatchEvent>, AsyncDisposable {
  readonly #start: () => Promise<NativeEventWatch>;
  readonly #signal: AbortSignal | undefined;
  readonly #onClose: () => void;
  #handle: NativeEventWatch | null = null;
  #keepAlive: KeepAlive | null = null;
  #unref = false;
  #used = false;
  #done = false;
  #cursor: string | null;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create(
    n: NativeClient,
    name: string,
    options: EventsOptions,
    onClose: () => void,
  ): EventWatch {
    return new EventWatch(n, name, options, onClose);
  }

  private constructor(n: NativeClient, name: string, options: EventsOptions, onClose: () => void) {
    const logsOn = options.logs === true;
    const query = logQuery(options);
    if (!logsOn && query !== undefined) {
      throw invalidArgument("tail, since, sources and minLevel filter log lines: set logs: true");
    }
    if (options.resumeAfter !== undefined && typeof options.resumeAfter !== "string") {
      throw invalidArgument("resumeAfter must be a cursor string");
    }
    const watch = {
      status: options.status,
      logs: logsOn,
      query,
      resumeAfter: options.resumeAfter,
      stopOnTerminal: options.stopOnTerminal,
    };
    this.#start = () =>
      withSignal(options.signal, (t) => call(n.sandboxEvents(name, watch, options.timeoutMs, t)));
    this.#signal = options.signal;
    this.#onClose = onClose;
    this.#cursor = options.resumeAfter ?? null;
  }

  /** The cursor of the last event handed out (or `resumeAfter`), else null. */
  get cursor(): string | null {
    return this.#cursor;
  }

  /** How many times the watch opened a new stream after a broken one. */
  get resumes(): number {
    return this.#handle?.resumes ?? 0;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<WatchEvent, void, undefined> {
    if (this.#used) throw new TypeError("an EventWatch can be consumed only once");
    this.#used = true;
    if (this.#done) return;
    const handle = await this.#start();
    this.#handle = handle;
    if (this.#done) {
      handle.cancel();
      return;
    }
    this.#keepAlive = new KeepAlive();
    if (this.#unref) this.#keepAlive.unref();
    const stop = onAbort(this.#signal, () => this.cancel());
    try {
      for (;;) {
        let batch: NativeWatchEvent[];
        try {
          batch = await call(handle.nextBatch());
        } catch (err) {
          // cancel() ends the loop quietly; an aborted signal is an error.
          if (this.#done && this.#signal?.aborted !== true) return;
          throw err;
        }
        if (batch.length === 0) return;
        for (const native of batch) {
          const event = eventOf(native);
          this.#cursor = event.cursor;
          yield event;
        }
      }
    } finally {
      stop();
      this.cancel();
    }
  }

  /** Ends the watch (idempotent). */
  cancel(): void {
    if (this.#done) return;
    this.#done = true;
    this.#keepAlive?.release();
    this.#onClose();
    this.#handle?.cancel();
  }

  close(): void {
    this.cancel();
  }

  /** Lets the process exit while the watch runs. */
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

  async [Symbol.asyncDispose](): Promise<void> {
    this.cancel();
  }
}
