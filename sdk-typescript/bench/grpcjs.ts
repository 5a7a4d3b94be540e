// What a grpc-js user would write without @openshell/sdk: a client loaded
// from proto/ with @grpc/proto-loader (no generated code, no grpc-tools),
// and a ForwardTcp pump: a local TCP listener whose every connection opens
// one ForwardTcp stream (first frame `init`, then `data` frames both ways,
// `eof` on half-close), with backpressure both ways.
import { type AddressInfo, createServer, type Server, type Socket } from "node:net";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

export interface ForwardFrame {
  init?: { sandbox: string; tcp: { host: string; port: number } };
  data?: Buffer;
  eof?: Record<string, never>;
}

/** One ExecSandbox event (oneof `payload`, snake_case fields as in the proto). */
export interface ExecEventMessage {
  stdout?: { data: Buffer };
  stderr?: { data: Buffer };
  exit?: { exit_code: number };
}

type Callback<T> = (err: grpc.ServiceError | null, value?: T) => void;

/** The methods the benchmark uses, as proto-loader exposes them. */
export interface OpenShellGrpcClient extends grpc.Client {
  GetSandbox(
    request: { name: string },
    callback: Callback<{ sandbox?: { metadata?: { name?: string } } }>,
  ): grpc.ClientUnaryCall;
  ExecSandbox(request: {
    sandbox: string;
    command: string[];
  }): grpc.ClientReadableStream<ExecEventMessage>;
  ForwardTcp(): grpc.ClientDuplexStream<ForwardFrame, ForwardFrame>;
}

/** A grpc-js client of `openshell.v1.OpenShell` at `host:port` (cleartext), with a bearer token when given. */
export function grpcJsClient(
  protoDir: string,
  address: string,
  token?: string,
): OpenShellGrpcClient {
  const definition = protoLoader.loadSync(join(protoDir, "openshell", "openshell.proto"), {
    keepCase: true,
    longs: String,
    enums: String,
    defaults: false,
    oneofs: true,
    includeDirs: [protoDir],
  });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    openshell: { v1: { OpenShell: new (a: string, c: grpc.ChannelCredentials) => unknown } };
  };
  const Service = loaded.openshell.v1.OpenShell as new (
    a: string,
    c: grpc.ChannelCredentials,
    o: grpc.ClientOptions,
  ) => unknown;
  const interceptors: grpc.Interceptor[] = [];
  if (token !== undefined) {
    interceptors.push(
      (options, nextCall) =>
        new grpc.InterceptingCall(nextCall(options), {
          start(metadata, listener, next) {
            metadata.set("authorization", `Bearer ${token}`);
            next(metadata, listener);
          },
        }),
    );
  }
  return new Service(address, grpc.credentials.createInsecure(), {
    interceptors,
  }) as OpenShellGrpcClient;
}

/** Pumps one local connection through one ForwardTcp stream. */
function pump(
  client: OpenShellGrpcClient,
  socket: Socket,
  sandbox: string,
  remotePort: number,
): void {
  socket.setNoDelay(true);
  const call = client.ForwardTcp();
  call.write({ init: { sandbox, tcp: { host: "127.0.0.1", port: remotePort } } });
  socket.on("data", (data: Buffer) => {
    if (!call.write({ data })) {
      socket.pause();
      call.once("drain", () => socket.resume());
    }
  });
  socket.on("end", () => {
    call.write({ eof: {} });
    call.end();
  });
  call.on("data", (frame: ForwardFrame) => {
    if (frame.data !== undefined && frame.data.length > 0 && !socket.write(frame.data)) {
      call.pause();
      socket.once("drain", () => call.resume());
    }
    if (frame.eof !== undefined) socket.end();
  });
  call.on("end", () => socket.end());
  call.on("error", () => socket.destroy());
  socket.on("error", () => call.cancel());
  socket.on("close", () => call.cancel());
}

/** Listens on 127.0.0.1 (a free port) and forwards each connection to `remotePort` in `sandbox`. */
export async function grpcJsForward(
  client: OpenShellGrpcClient,
  sandbox: string,
  remotePort: number,
): Promise<{ port: number; close(): Promise<void> }> {
  const open = new Set<Socket>();
  const server: Server = createServer((socket) => {
    open.add(socket);
    socket.on("close", () => open.delete(socket));
    pump(client, socket, sandbox, remotePort);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const socket of open) socket.destroy();
      }),
  };
}
