// The napi-rs platform name of this machine ("linux-x64-gnu", ...). Kept in
// step with scripts/platform.mjs, which the install script uses before the
// package is compiled. Only Linux needs the C library told apart; that is
// done lazily and cheaply (the loader first looks for an addon it can use
// without knowing it).
import { readFileSync } from "node:fs";

/** `platform-arch` without the C library suffix. */
export function platformBase(): string {
  return `${process.platform}-${process.arch}`;
}

/** Every suffix an addon of this platform and architecture can carry. */
export function platformSuffixes(): string[] {
  if (process.platform === "win32") return ["-msvc"];
  if (process.platform === "linux") return ["-gnu", "-musl"];
  return [""];
}

interface Report {
  header?: { glibcVersionRuntime?: string };
}

function libc(): string {
  // The loader's text names its C library: glibc's ldd is a script that
  // says "GNU C Library", musl's is the musl loader itself.
  try {
    const ldd = readFileSync("/usr/bin/ldd", "latin1");
    if (ldd.includes("musl")) return "-musl";
    if (ldd.includes("GNU C Library") || ldd.includes("glibc")) return "-gnu";
  } catch {
    // no ldd (a minimal image): ask the process report
  }
  // excludeNetwork: Node 20.13 and newer (not in the @types/node 20 typings).
  const report = process.report as
    | (NodeJS.ProcessReport & { excludeNetwork?: boolean })
    | undefined;
  if (report === undefined) return "-gnu";
  // Without the network section, whose interface and DNS lookups are
  // what can make getReport() take seconds.
  const before = report.excludeNetwork;
  try {
    report.excludeNetwork = true;
    const r = report.getReport() as Report;
    return r?.header?.glibcVersionRuntime ? "-gnu" : "-musl";
  } catch {
    return "-gnu";
  } finally {
    report.excludeNetwork = before ?? false;
  }
}

let cached: string | null = null;

/** The full platform name (detects the C library on Linux, once). */
export function platformName(): string {
  if (cached === null) {
    const suffix =
      process.platform === "win32" ? "-msvc" : process.platform === "linux" ? libc() : "";
    cached = `${platformBase()}${suffix}`;
  }
  return cached;
}
