// File transfer: files and directory trees in and out of a sandbox, over
// the sandbox's SFTP server (the core speaks SFTP over an owner-routed
// ForwardTcp stream). A local path is read or written by the core itself,
// never whole in memory; bytes that live in JavaScript (a Readable, an
// async iterable, a Uint8Array) stream through the core's upload sink one
// chunk at a time, each write awaited before the next chunk is taken from
// the source, so a fast source waits for the sandbox (backpressure).
import { Readable, type Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { call, cancelled, invalidArgument } from "./errors.js";
import type {
  NativeClient,
  NativeDownloadSource,
  NativeProgress,
  NativeProgressFn,
  NativeTransferSummary,
  NativeUploadSink,
} from "./native.js";
import { type CallOptions, onAbort, withSignal } from "./signal.js";

/** Where a transfer stands, as handed to `progress`. */
export interface TransferProgress {
  /** File bytes moved so far. */
  readonly bytesDone: number;
  /** File bytes the transfer moves in all (for a stream: those written so far). */
  readonly bytesTotal: number;
  /** Files completed (renamed into place). */
  readonly filesDone: number;
  readonly filesTotal: number;
  /** The file being moved (its destination path), or the last one. */
  readonly current: string;
}

/** What a transfer did. */
export interface TransferSummary {
  /** Regular files written. */
  readonly files: number;
  /** Directories created (or found) in a tree. */
  readonly directories: number;
  /** Symlinks recreated (their target stays inside the tree). */
  readonly symlinks: number;
  /** Symlinks skipped: their target leaves the tree. */
  readonly skippedSymlinks: number;
  /** Entries left out by the ignore files (a directory counts once). */
  readonly ignored: number;
  /** Other entries skipped (sockets, devices, fifos). */
  readonly skippedOther: number;
  /** File bytes moved. */
  readonly bytes: number;
}

/**
 * How a transfer runs. Transfers have no deadline unless `timeoutMs` is
 * given (they are streams); `signal` cancels one at any point, and nothing
 * half-written is left behind.
 */
export interface TransferOptions extends CallOptions {
  /**
   * The name of ignore files (".gitignore" syntax, for example
   * `".gitignore"`) honoured in every directory of a tree, uploads and
   * downloads alike.
   */
  ignoreFile?: string;
  /**
   * Called at most every 100 ms and once at the end, on the main thread;
   * every call has happened when the transfer's Promise settles. A throw
   * cancels the transfer, which then rejects with what was thrown.
   */
  progress?: (progress: TransferProgress) => void;
}

/** What `upload` sends: a local path, or bytes. */
export type UploadSource = string | Uint8Array | Readable | AsyncIterable<Uint8Array | string>;

/** Largest piece handed to the addon at once (each is copied into Rust). */
const PIECE = 4 << 20;

function summaryOf(s: NativeTransferSummary): TransferSummary {
  return Object.freeze({
    files: s.files,
    directories: s.directories,
    symlinks: s.symlinks,
    skippedSymlinks: s.skippedSymlinks,
    ignored: s.ignored,
    skippedOther: s.skippedOther,
    bytes: s.bytes,
  });
}

function progressOf(p: NativeProgress): TransferProgress {
  return Object.freeze({
    bytesDone: p.bytesDone,
    bytesTotal: p.bytesTotal,
    filesDone: p.filesDone,
    filesTotal: p.filesTotal,
    current: p.current,
  });
}

function text(what: string, value: unknown): string {
  if (typeof value !== "string" || value === "") {
    throw invalidArgument(`${what} must be a non-empty string`);
  }
  return value;
}

/**
 * One transfer's cancellation and progress: the caller's signal, plus a
 * progress callback that may throw (the throw cancels the transfer and is
 * what the transfer rejects with).
 */
class Transfer {
  readonly #controller = new AbortController();
  readonly #stopAbort: () => void;
  #thrown: { error: unknown } | null = null;
  readonly report: NativeProgressFn | undefined;

  constructor(options: TransferOptions) {
    if (options.ignoreFile !== undefined) text("ignoreFile", options.ignoreFile);
    const callback = options.progress;
    if (callback !== undefined && typeof callback !== "function") {
      throw invalidArgument("progress must be a function");
    }
    this.#stopAbort = onAbort(options.signal, () => this.#controller.abort());
    // The addon calls this on the main thread; it must never throw there.
    this.report =
      callback === undefined
        ? undefined
        : (report) => {
            if (report === null || this.#thrown !== null) return;
            try {
              callback(progressOf(report));
            } catch (error) {
              this.#thrown = { error };
              this.#controller.abort();
            }
          };
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Stops following the caller's signal (idempotent). */
  release(): void {
    this.#stopAbort();
  }

  /** `err`, unless a progress callback threw: then what it threw. */
  failure(err: unknown): unknown {
    return this.#thrown !== null ? this.#thrown.error : err;
  }

  /**
   * Runs the transfer; a progress callback's throw wins over `cancelled`,
   * and over success too: the last reports reach JavaScript after the core
   * has finished, so a throw from them rejects a transfer that completed.
   */
  async run<T>(body: (signal: AbortSignal) => Promise<T>): Promise<T> {
    try {
      const done = await body(this.#controller.signal);
      if (this.#thrown !== null) throw this.#thrown.error;
      return done;
    } catch (err) {
      throw this.failure(err);
    } finally {
      this.release();
    }
  }
}

/** `source` as pieces of at most PIECE bytes, Buffers over the same memory. */
async function* pieces(source: Exclude<UploadSource, string>): AsyncGenerator<Buffer> {
  const split = function* (chunk: Uint8Array): Generator<Buffer> {
    const whole = Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    for (let at = 0; at < whole.length; at += PIECE) yield whole.subarray(at, at + PIECE);
  };
  if (source instanceof Uint8Array) {
    yield* split(source);
    return;
  }
  for await (const chunk of source as AsyncIterable<unknown>) {
    if (typeof chunk === "string") yield* split(Buffer.from(chunk, "utf8"));
    else if (chunk instanceof Uint8Array) yield* split(chunk);
    else throw invalidArgument("upload's source yielded something that is not bytes or a string");
  }
}

/** Refuses a source that is neither bytes nor an async iterable, before any I/O. */
function checkSource(source: unknown): void {
  if (source instanceof Uint8Array) return;
  const iterable = source as Partial<AsyncIterable<unknown>> | null | undefined;
  if (typeof iterable?.[Symbol.asyncIterator] !== "function") {
    throw invalidArgument(
      "upload's source must be a path, a Uint8Array, a Readable or an AsyncIterable of bytes",
    );
  }
}

/** Streams `source` into a new upload sink; the file appears at `finish`. */
async function uploadBytes(
  n: NativeClient,
  sandbox: string,
  source: Exclude<UploadSource, string>,
  remote: string,
  options: TransferOptions,
  transfer: Transfer,
  signal: AbortSignal,
): Promise<TransferSummary> {
  checkSource(source);
  const sink: NativeUploadSink = await withSignal(signal, (t) =>
    call(n.uploadStream(sandbox, remote, transfer.report, options.timeoutMs, t)),
  );
  const stop = onAbort(signal, () => sink.cancel());
  try {
    for await (const piece of pieces(source)) {
      if (signal.aborted) throw cancelled();
      await call(sink.write(piece));
    }
    return summaryOf(await call(sink.finish()));
  } catch (err) {
    // Nothing is left behind: the temp file goes with the sink.
    await sink.abort().catch(() => {});
    throw err;
  } finally {
    stop();
  }
}

/** @internal `client.upload`. */
export function upload(
  n: NativeClient,
  sandbox: string,
  local: UploadSource,
  remote: string,
  options: TransferOptions,
): Promise<TransferSummary> {
  const transfer = new Transfer(options);
  return transfer.run(async (signal) => {
    if (typeof local === "string") {
      const path = text("local", local);
      const done = await withSignal(signal, (t) =>
        call(
          n.upload(
            sandbox,
            path,
            remote,
            options.ignoreFile,
            transfer.report,
            options.timeoutMs,
            t,
          ),
        ),
      );
      return summaryOf(done);
    }
    if (options.ignoreFile !== undefined) {
      throw invalidArgument("ignoreFile applies to a local path, not to bytes");
    }
    return uploadBytes(n, sandbox, local, remote, options, transfer, signal);
  });
}

/** @internal `client.download`. */
export function download(
  n: NativeClient,
  sandbox: string,
  remote: string,
  local: string | Writable,
  options: TransferOptions,
): Promise<TransferSummary> {
  const transfer = new Transfer(options);
  return transfer.run(async (signal) => {
    if (typeof local === "string") {
      const path = text("local", local);
      const done = await withSignal(signal, (t) =>
        call(
          n.download(
            sandbox,
            remote,
            path,
            options.ignoreFile,
            transfer.report,
            options.timeoutMs,
            t,
          ),
        ),
      );
      return summaryOf(done);
    }
    if (options.ignoreFile !== undefined) {
      throw invalidArgument("ignoreFile applies to a local path, not to a Writable");
    }
    if (typeof (local as Partial<Writable>)?.write !== "function") {
      throw invalidArgument("download's destination must be a path or a Writable");
    }
    const stream = new DownloadStream(n, sandbox, remote, options, transfer);
    await stream.open();
    // pipeline waits for 'drain' between chunks and ends the Writable.
    await pipeline(stream.toReadable(), local, { signal });
    return Object.freeze({
      files: 1,
      directories: 0,
      symlinks: 0,
      skippedSymlinks: 0,
      ignored: 0,
      skippedOther: 0,
      bytes: stream.bytesRead,
    });
  });
}

/** @internal `client.downloadStream`. */
export function downloadStream(
  n: NativeClient,
  sandbox: string,
  remote: string,
  options: TransferOptions,
): DownloadStream {
  return new DownloadStream(n, sandbox, remote, options, new Transfer(options));
}

/** @internal `client.readFile`. */
export function readFile(
  n: NativeClient,
  sandbox: string,
  remote: string,
  options: CallOptions,
): Promise<Buffer> {
  return withSignal(options.signal, (t) => call(n.readFile(sandbox, remote, options.timeoutMs, t)));
}

/** @internal `client.writeFile`. */
export function writeFile(
  n: NativeClient,
  sandbox: string,
  remote: string,
  data: string | Uint8Array,
  options: CallOptions,
): Promise<TransferSummary> {
  const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data);
  return withSignal(options.signal, async (t) =>
    summaryOf(await call(n.writeFile(sandbox, remote, bytes, options.timeoutMs, t))),
  );
}

/**
 * A download of one file as an async iterable of Buffers (at most 256 KiB
 * each). It opens on `open()` or the first iteration (a missing file
 * rejects there); `size` is known once open. Breaking out of the loop,
 * `cancel()` or the signal ends it. Iterate it once.
 */
export class DownloadStream implements AsyncIterable<Buffer>, AsyncDisposable {
  readonly #open: () => Promise<NativeDownloadSource>;
  readonly #transfer: Transfer;
  #handle: Promise<NativeDownloadSource> | null = null;
  #source: NativeDownloadSource | null = null;
  #used = false;
  #cancelled = false;
  #read = 0;

  /** @internal */
  constructor(
    n: NativeClient,
    sandbox: string,
    remote: string,
    options: CallOptions,
    transfer: Transfer,
  ) {
    this.#transfer = transfer;
    this.#open = () =>
      withSignal(transfer.signal, (t) =>
        call(n.downloadStream(sandbox, remote, transfer.report, options.timeoutMs, t)),
      );
  }

  /** Opens the download (idempotent); rejects when the file cannot be read. */
  async open(): Promise<void> {
    if (this.#cancelled) throw cancelled("the download was cancelled");
    this.#handle ??= this.#open();
    this.#source = await this.#handle;
  }

  /** The file's size in bytes once open, else null. */
  get size(): number | null {
    return this.#source?.size ?? null;
  }

  /** The file's absolute path in the sandbox once open, else null. */
  get source(): string | null {
    return this.#source?.source ?? null;
  }

  /** Bytes handed out so far. */
  get bytesRead(): number {
    return this.#read;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer, void, undefined> {
    if (this.#used) throw new TypeError("a DownloadStream can be consumed only once");
    this.#used = true;
    let source: NativeDownloadSource | null = null;
    let stop = () => {};
    let ended = false;
    try {
      await this.open();
      const open = this.#source as NativeDownloadSource;
      source = open;
      stop = onAbort(this.#transfer.signal, () => open.cancel());
      for (;;) {
        const chunk = await call(open.next());
        if (chunk === null) {
          ended = true;
          break;
        }
        this.#read += chunk.length;
        yield chunk;
      }
    } catch (err) {
      throw this.#transfer.failure(err);
    } finally {
      stop();
      this.#transfer.release();
      if (!ended) source?.cancel();
    }
    // The last report may be the one that threw.
    const thrown = this.#transfer.failure(null);
    if (thrown !== null) throw thrown;
  }

  /** The download as a `Readable` (consumes this stream). */
  toReadable(): Readable {
    return Readable.from(this, { objectMode: false });
  }

  /** Ends the download (idempotent). */
  cancel(): void {
    this.#cancelled = true;
    this.#used = true;
    this.#transfer.release();
    this.#handle?.then(
      (h) => h.cancel(),
      () => {},
    );
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.cancel();
  }
}
