// The base of the generated typed raw stubs (src/gen/raw.ts): protobuf-es
// messages in and out, bytes through the core's raw boundary (owner routing
// applies). `RawCalls` (client.raw) supplies the two byte-level calls.
import {
  create,
  type DescMessage,
  fromBinary,
  type MessageInitShape,
  type MessageShape,
  toBinary,
} from "@bufbuild/protobuf";
import type { CallOptions } from "./signal.js";

export interface RawCallOptions extends CallOptions {
  /** Request metadata as `[key, value]` pairs. */
  metadata?: ReadonlyArray<readonly [string, string]>;
}

/** What a byte-level raw stream offers (`RawStream`). */
export interface ByteStream extends AsyncIterable<Buffer> {
  send(message: Uint8Array): Promise<void>;
  closeSend(): void;
  recv(): Promise<Buffer | null>;
  responseMetadata(): Promise<Array<[string, string]>>;
  trailers(): Array<[string, string]> | null;
  cancel(): void;
}

/**
 * A typed streaming call: `send` requests (client and bidi streaming),
 * `closeSend`, then iterate the replies. Leaving the loop early cancels it.
 */
export class TypedStream<I extends DescMessage, O extends DescMessage>
  implements AsyncIterable<MessageShape<O>>, AsyncDisposable
{
  readonly #bytes: ByteStream;
  readonly #input: I;
  readonly #output: O;

  /** @internal Builds one (the constructor is private: not public API). */
  static _create<I extends DescMessage, O extends DescMessage>(
    bytes: ByteStream,
    input: I,
    output: O,
  ): TypedStream<I, O> {
    return new TypedStream(bytes, input, output);
  }

  private constructor(bytes: ByteStream, input: I, output: O) {
    this.#bytes = bytes;
    this.#input = input;
    this.#output = output;
  }

  async send(message: MessageInitShape<I>): Promise<void> {
    await this.#bytes.send(toBinary(this.#input, create(this.#input, message)));
  }

  /** Half-closes the call. Idempotent. */
  closeSend(): void {
    this.#bytes.closeSend();
  }

  /** The next reply, or null when the server ended the stream OK. */
  async recv(): Promise<MessageShape<O> | null> {
    const bytes = await this.#bytes.recv();
    return bytes === null ? null : fromBinary(this.#output, bytes);
  }

  responseMetadata(): Promise<Array<[string, string]>> {
    return this.#bytes.responseMetadata();
  }

  trailers(): Array<[string, string]> | null {
    return this.#bytes.trailers();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<MessageShape<O>, void, undefined> {
    for await (const bytes of this.#bytes) yield fromBinary(this.#output, bytes);
  }

  cancel(): void {
    this.#bytes.cancel();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.cancel();
  }
}

/** Typed calls over the two byte-level ones a subclass supplies. */
export abstract class TypedRawBase {
  /** A unary call: encoded request in, encoded response and metadata out. */
  abstract unary(
    path: string,
    request: Uint8Array,
    options?: RawCallOptions,
  ): Promise<{ bytes: Buffer; metadata: Array<[string, string]> }>;

  /** A streaming call on encoded messages. */
  abstract stream(path: string, options?: RawCallOptions): Promise<ByteStream>;

  protected async typedUnary<I extends DescMessage, O extends DescMessage>(
    path: string,
    input: I,
    output: O,
    request: MessageInitShape<I>,
    options: RawCallOptions,
  ): Promise<MessageShape<O>> {
    const answer = await this.unary(path, toBinary(input, create(input, request)), options);
    return fromBinary(output, answer.bytes);
  }

  /** Opens the stream; with `first`, sends it and half-closes (server streaming). */
  protected async typedStream<I extends DescMessage, O extends DescMessage>(
    path: string,
    input: I,
    output: O,
    first: MessageInitShape<I> | undefined,
    options: RawCallOptions,
  ): Promise<TypedStream<I, O>> {
    const stream = TypedStream._create(await this.stream(path, options), input, output);
    if (first !== undefined) {
      try {
        await stream.send(first);
        stream.closeSend();
      } catch (err) {
        stream.cancel();
        throw err;
      }
    }
    return stream;
  }
}
