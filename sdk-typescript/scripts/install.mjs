// `npm install` of @openshell/sdk: makes sure the native addon is there.
//
// 1. A per-platform package (@openshell/sdk-<platform>, an optional
//    dependency of a published release) is installed: nothing to do.
// 2. Otherwise the addon is built from the Rust workspace this package sits
//    in, with cargo (debug profile unless OPENSHELL_SDK_PROFILE=release; the
//    target dir is CARGO_TARGET_DIR, else the workspace's target/), and
//    copied to native/openshell-sdk.<platform>.node.
//
// 3. From a source tree without dist/ (tsc output), it compiles the
//    TypeScript too: with the package's own typescript when its dev
//    dependencies are installed, else with the pinned typescript and
//    @types/node (the versions of devDependencies) installed into a
//    temporary folder for the one compile.
//
// Before all that, when the package's runtime dependencies cannot be
// resolved from it, they are installed into its own node_modules
// (`npm install --omit=dev --ignore-scripts`): npm installs a folder
// dependency (`npm install <checkout>/sdk-typescript`) as a symlink and
// does not install that folder's dependencies.
//
// OPENSHELL_SDK_SKIP_BUILD=1 skips the build (the loader then needs one of
// the two, or OPENSHELL_SDK_NATIVE naming an addon file).
import { spawnSync } from "node:child_process";
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  realpathSync,
  rmSync,
} from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { platformName } from "./platform.mjs";

const here = dirname(realpathSync(fileURLToPath(import.meta.url)));
const packageDir = resolve(here, "..");
const platform = platformName();
const manifest = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

/**
 * Whether package `name` is installed where Node looks for it from the
 * package folder (its node_modules, then each parent's). By folder, not by
 * `require.resolve`: a package's exports may hide its package.json, and
 * @types/node has no entry point at all.
 */
function resolvable(name) {
  for (let dir = packageDir; ; dir = dirname(dir)) {
    if (existsSync(join(dir, "node_modules", name, "package.json"))) return true;
    if (dirname(dir) === dir) return false;
  }
}

/** npm with the parent install's per-project settings left out. */
function runNpm(args, cwd) {
  const env = { ...process.env };
  for (const key of Object.keys(env)) {
    // Set by the npm running this script for *its* project (global,
    // prefix, omit, save...): they must not steer this nested install.
    if (
      key.toLowerCase().startsWith("npm_config_") &&
      !/_(registry|cache|userconfig)$/i.test(key)
    ) {
      delete env[key];
    }
  }
  const run = spawnSync(npm, args, { cwd, env, stdio: ["ignore", "inherit", "inherit"] });
  if (run.error) console.error(`@openshell/sdk: could not run npm: ${run.error.message}`);
  return run.status ?? 1;
}

function runtimeDependencies() {
  const missing = Object.keys(manifest.dependencies ?? {}).filter((name) => !resolvable(name));
  if (missing.length === 0) return 0;
  console.error(`@openshell/sdk: installing its dependencies (${missing.join(", ")})`);
  return runNpm(
    ["install", "--omit=dev", "--ignore-scripts", "--no-audit", "--no-fund", "--no-save"],
    packageDir,
  );
}

function prebuilt() {
  try {
    createRequire(join(packageDir, "package.json")).resolve(`@openshell/sdk-${platform}`);
    return true;
  } catch {
    return false;
  }
}

function workspace() {
  let dir = packageDir;
  for (;;) {
    const manifest = join(dir, "Cargo.toml");
    if (existsSync(manifest) && readFileSync(manifest, "utf8").includes("bindings/node")) {
      return dir;
    }
    const parent = dirname(dir);
    if (parent === dir) return null;
    dir = parent;
  }
}

function libraryName() {
  if (process.platform === "win32") return "openshell_sdk_node.dll";
  if (process.platform === "darwin") return "libopenshell_sdk_node.dylib";
  return "libopenshell_sdk_node.so";
}

/** The compiler of the package's dev dependencies, or null. */
function ownTsc() {
  if (!resolvable("@types/node")) return null;
  try {
    return createRequire(join(packageDir, "package.json")).resolve("typescript/bin/tsc");
  } catch {
    return null;
  }
}

function compile() {
  if (existsSync(join(packageDir, "dist", "src", "index.js"))) return 0;
  const project = ["-p", join(packageDir, "tsconfig.build.json")];
  console.error("@openshell/sdk: compiling the TypeScript sources");
  let tsc = ownTsc();
  let toolDir = null;
  const extra = [];
  if (tsc === null) {
    // The pinned compiler and Node types, for this one compile only.
    const dev = manifest.devDependencies ?? {};
    const tools = ["typescript", "@types/node"].map((name) => `${name}@${dev[name]}`);
    toolDir = mkdtempSync(join(tmpdir(), "openshell-sdk-tsc-"));
    const status = runNpm(
      [
        "install",
        "--no-save",
        "--no-package-lock",
        "--no-audit",
        "--no-fund",
        "--ignore-scripts",
        "--prefix",
        toolDir,
        ...tools,
      ],
      toolDir,
    );
    if (status !== 0) {
      rmSync(toolDir, { recursive: true, force: true });
      return status;
    }
    tsc = join(toolDir, "node_modules", "typescript", "bin", "tsc");
    extra.push("--typeRoots", join(toolDir, "node_modules", "@types"));
  }
  const run = spawnSync(process.execPath, [tsc, ...project, ...extra], { stdio: "inherit" });
  if (toolDir !== null) rmSync(toolDir, { recursive: true, force: true });
  if (run.error) console.error(`@openshell/sdk: could not run tsc: ${run.error.message}`);
  return run.status ?? 1;
}

function main() {
  if (process.env.OPENSHELL_SDK_SKIP_BUILD === "1") return 0;
  const installed = runtimeDependencies();
  if (installed !== 0) return installed;
  const compiled = compile();
  if (compiled !== 0) return compiled;
  if (prebuilt()) return 0;
  const root = workspace();
  if (root === null) {
    console.error(
      `@openshell/sdk: no prebuilt addon for ${platform} and no Rust workspace to build one from; ` +
        "install from a release that publishes this platform, or from the source tree",
    );
    return 1;
  }
  const release = process.env.OPENSHELL_SDK_PROFILE === "release";
  const cargo = process.env.CARGO || "cargo";
  const args = ["build", "-p", "openshell-sdk-node", ...(release ? ["--release"] : [])];
  console.error(`@openshell/sdk: building the native addon (${cargo} ${args.join(" ")})`);
  const built = spawnSync(cargo, args, { cwd: root, stdio: ["ignore", "inherit", "inherit"] });
  if (built.error) {
    console.error(`@openshell/sdk: could not run ${cargo}: ${built.error.message}`);
    return 1;
  }
  if (built.status !== 0) return built.status ?? 1;
  const targetDir = process.env.CARGO_TARGET_DIR
    ? resolve(root, process.env.CARGO_TARGET_DIR)
    : join(root, "target");
  const library = join(targetDir, release ? "release" : "debug", libraryName());
  mkdirSync(join(packageDir, "native"), { recursive: true });
  copyFileSync(library, join(packageDir, "native", `openshell-sdk.${platform}.node`));
  return 0;
}

process.exitCode = main();
