// `config_session`: takes over a sandbox's session with the SDK's
// ConfigSession on the sandbox's own token (its real supervisor stopped
// first), writes the step's settings one at a time and reports what the
// session saw: its counters, when each write arrived, the last applied
// settings. Push sessions are answered through the async iterator and
// explicit ack/reject, the others through an apply callback.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import {
  type ApplyResult,
  type Client,
  ConfigSession,
  type ConfigUpdate,
  Rejected,
} from "../src/index.js";

/** What the op needs of the runner. */
export interface ConfigRunner {
  readonly client: Client;
  readonly dataDir: string | null;
  target(step: Record<string, unknown>): string;
  subst(value: unknown): unknown;
}

export class ConfigStepFailed extends Error {}

// How long one write may take to reach the session before the step stops.
const ARRIVAL_LIMIT_MS = 15_000;

function processRunning(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  const state = stat
    .slice(stat.lastIndexOf(")") + 1)
    .trim()
    .split(/\s+/)[0];
  return state !== "Z" && state !== "X";
}

/** Polls `check` every 20 ms for at most `limitMs`. */
async function until(check: () => boolean, limitMs: number): Promise<boolean> {
  const deadline = performance.now() + limitMs;
  while (!check()) {
    if (performance.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  return true;
}

/**
 * The sandbox token the harness's cluster keeps for tests
 * (`<data-dir>/sandboxes/<id>/token`); the sandbox's supervisor is then
 * stopped by its PID (SIGTERM, bounded wait) so the step's session is the
 * sandbox's only one.
 */
export async function takeOver(dataDir: string, sandboxId: string): Promise<string> {
  const folder = join(dataDir, "sandboxes", sandboxId);
  const pid = Number(readFileSync(join(folder, "supervisor.pid"), "utf8").trim());
  // Guard against a reused PID: it must be this sandbox's supervisor.
  const args = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0");
  if (!args.some((a) => a.endsWith("openshell-supervisor")) || !args.includes(sandboxId)) {
    throw new ConfigStepFailed(`process ${pid} is not the supervisor of sandbox ${sandboxId}`);
  }
  const token = readFileSync(join(folder, "token"), "utf8").trim();
  process.kill(pid, "SIGTERM");
  if (!(await until(() => !processRunning(pid), 10_000))) {
    throw new ConfigStepFailed(`supervisor ${pid} did not stop within 10 s`);
  }
  return token;
}

function stringSettings(update: ConfigUpdate): Record<string, string> {
  return Object.fromEntries(
    Object.entries(update.settings).filter((e): e is [string, string] => typeof e[1] === "string"),
  );
}

/** `UpdateConfig` of one string setting (deleted when `value` is null), typed. */
export async function updateSetting(
  client: Client,
  sandbox: string,
  key: string,
  value: string | null,
  global: boolean,
): Promise<void> {
  await client.raw.updateConfig({
    sandbox: global ? "" : sandbox,
    settingKey: key,
    deleteSetting: value === null,
    global,
    ...(value === null ? {} : { settingValue: { value: { case: "stringValue", value } } }),
  });
}

interface Write {
  setting: string;
  value: string;
  global?: boolean;
}

export async function configSession(
  r: ConfigRunner,
  step: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  if (r.dataDir === null) throw new ConfigStepFailed("no OPENSHELL_CONFORMANCE_DATA_DIR");
  const name = r.target(step);
  const sandbox = await r.client.sandboxes.get(name);
  const token = await takeOver(r.dataDir, sandbox.id);
  const reject = step.reject as { setting: string; value: string } | undefined;
  const applied: Record<string, string>[] = [];

  const verdict = (update: ConfigUpdate): ApplyResult => {
    const settings = stringSettings(update);
    if (reject !== undefined && settings[reject.setting] === reject.value) {
      return new Rejected(`${reject.setting} must not be ${reject.value}`);
    }
    applied.push(settings);
    return undefined;
  };

  const announce = step.announce_push !== false;
  const session = new ConfigSession({
    endpoint: r.client.endpoint,
    sandboxId: sandbox.id,
    sandboxToken: token,
    apply: announce ? undefined : verdict,
    announcePush: announce,
    pollIntervalMs: Number(step.poll_interval ?? 10) * 1000,
  });
  const answering = announce
    ? (async () => {
        for await (const update of session) {
          const result = verdict(update);
          if (result instanceof Rejected) update.reject(result.reason);
          else update.ack();
        }
      })()
    : null;
  const writes: Record<string, unknown>[] = [];
  const globalsWritten: string[] = [];
  let bootstrapAnswered: boolean | null = null;
  let stats: ReturnType<ConfigSession["stats"]>;
  let lastApplied: Record<string, string>;
  try {
    session.start();
    if ((await session.waitMode(undefined, { timeoutMs: 30_000 })) === "push") {
      bootstrapAnswered = await until(() => session.stats().lastUpdateId >= 1n, 10_000);
    }
    const planned = bootstrapAnswered === false ? [] : (r.subst(step.writes ?? []) as Write[]);
    for (const write of planned) {
      const { setting: key, value } = write;
      const isGlobal = write.global === true;
      const rejectedBefore = session.stats().rejected;
      const started = performance.now();
      await updateSetting(r.client, name, key, value, isGlobal);
      if (isGlobal) globalsWritten.push(key);
      // A refused value arrives as a rejection, any other as applied.
      const arrived =
        reject !== undefined && key === reject.setting && value === reject.value
          ? await until(() => session.stats().rejected > rejectedBefore, ARRIVAL_LIMIT_MS)
          : await until(() => applied.at(-1)?.[key] === value, ARRIVAL_LIMIT_MS);
      const seconds = (performance.now() - started) / 1000;
      writes.push({ setting: key, value, arrived, seconds });
      if (!arrived) break;
    }
    // Observed before the clean-up below, whose deletions also arrive.
    stats = session.stats();
    lastApplied = applied.at(-1) ?? {};
  } finally {
    // Global settings would reach every later session: removed again.
    for (const key of globalsWritten) await updateSetting(r.client, name, key, null, true);
    await session.close();
    await answering?.catch(() => {});
  }
  return {
    stats: {
      mode: stats.mode,
      sessions_accepted: Number(stats.sessionsAccepted),
      updates_received: Number(stats.updatesReceived),
      last_update_id: Number(stats.lastUpdateId),
      rejected: Number(stats.rejected),
      polls: Number(stats.polls),
      served_by: stats.servedBy,
    },
    bootstrap_answered: bootstrapAnswered,
    writes,
    applied_settings: lastApplied,
  };
}
