// Every message and RPC of proto/ as @bufbuild/protobuf descriptors, built
// from the descriptor set compiled into the addon: encode and decode any
// message (binary or proto JSON) without generated code.
import {
  createFileRegistry,
  type DescMessage,
  type DescMethod,
  fromBinary,
  type Registry,
} from "@bufbuild/protobuf";
import { FileDescriptorSetSchema } from "@bufbuild/protobuf/wkt";
import { native } from "./native.js";

let cached: Registry | null = null;

/** The registry of proto/ (built once). */
export function registry(): Registry {
  cached ??= createFileRegistry(fromBinary(FileDescriptorSetSchema, native.descriptorSet()));
  return cached;
}

/** A method of `openshell.v1.OpenShell` by its name (`GetSandbox`). */
export function method(name: string, service = "openshell.v1.OpenShell"): DescMethod {
  const desc = registry().getService(service);
  const found = desc?.methods.find((m) => m.name === name);
  if (found === undefined) throw new TypeError(`no method ${service}/${name}`);
  return found;
}

/** The gRPC path of a method (`/openshell.v1.OpenShell/GetSandbox`). */
export function path(m: DescMethod): string {
  return `/${m.parent.typeName}/${m.name}`;
}

export type { DescMessage, DescMethod };
