// The napi-rs platform name of this machine ("linux-x64-gnu", ...): the
// suffix of the per-platform package and of the addon file name. Kept in
// step with src/platform.ts.
import { readFileSync } from "node:fs";

function libc() {
  // The loader's text names its C library: glibc's ldd is a script that
  // says "GNU C Library", musl's is the musl loader itself.
  try {
    const ldd = readFileSync("/usr/bin/ldd", "latin1");
    if (ldd.includes("musl")) return "-musl";
    if (ldd.includes("GNU C Library") || ldd.includes("glibc")) return "-gnu";
  } catch {
    // no ldd (a minimal image): ask the process report
  }
  const report = process.report;
  if (report === undefined) return "-gnu";
  // Without the network section, whose lookups can make getReport() slow.
  const before = report.excludeNetwork;
  try {
    report.excludeNetwork = true;
    return report.getReport()?.header?.glibcVersionRuntime ? "-gnu" : "-musl";
  } catch {
    return "-gnu";
  } finally {
    report.excludeNetwork = before ?? false;
  }
}

export function platformName() {
  const suffix =
    process.platform === "win32" ? "-msvc" : process.platform === "linux" ? libc() : "";
  return `${process.platform}-${process.arch}${suffix}`;
}
