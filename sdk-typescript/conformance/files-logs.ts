// The files, logs and watch ops of scenarios.json: what the TypeScript SDK
// observed, reported the way the other runners report it.
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Client, EventWatch, WatchEvent } from "../src/index.js";

/** What the ops need of the runner. */
export interface FilesRunner {
  readonly client: Client;
  target(step: Record<string, unknown>): string;
  subst(value: unknown): unknown;
}

type Step = Record<string, unknown>;
type Result = Record<string, unknown>;
type Op = (r: FilesRunner, step: Step, signal: AbortSignal) => Promise<Result>;

export class FilesStepFailed extends Error {}

const TEXT_LIMIT = 4096;
const LOGS_WAIT_MS = 15_000;
const WATCH_WAIT_MS = 20_000;
// Quiet time after the first event before watch_logs runs its command.
const SETTLE_MS = 1_000;
// How long watch_logs waits for that quiet at most.
const SETTLE_LIMIT_MS = 60_000;

const str = (r: FilesRunner, v: unknown): string => {
  const s = r.subst(v);
  return typeof s === "string" ? s : "";
};
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The next event of `events`, or null after `ms` (the watch keeps running). */
async function within(
  events: AsyncIterator<WatchEvent>,
  pending: { next: Promise<IteratorResult<WatchEvent>> | null },
  ms: number,
): Promise<WatchEvent | null> {
  pending.next ??= events.next();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
  });
  try {
    const got = await Promise.race([pending.next, timeout]);
    if (got === null) return null;
    pending.next = null;
    if (got.done) throw new FilesStepFailed("the watch ended");
    return got.value;
  } finally {
    clearTimeout(timer);
  }
}

function follow(r: FilesRunner, name: string, signal: AbortSignal, resumeAfter?: string) {
  const watch: EventWatch = r.client.sandboxes.events(name, {
    logs: true,
    sources: ["sandbox"],
    resumeAfter,
    signal,
  });
  return { watch, events: watch[Symbol.asyncIterator](), pending: { next: null } };
}

export const FILES_LOGS_OPS: Record<string, Op> = {
  async write_file(r, step, signal) {
    const content = str(r, step.content);
    const summary = await r.client.writeFile(r.target(step), str(r, step.path), content, {
      signal,
    });
    return { bytes: summary.bytes };
  },
  async read_file(r, step, signal) {
    const data = await r.client.readFile(r.target(step), str(r, step.path), { signal });
    return {
      content: data.subarray(0, TEXT_LIMIT).toString("utf8"),
      content_bytes: data.length,
    };
  },
  // Random bytes to a local file, uploaded by path, downloaded by path to
  // another, compared.
  async file_round_trip(r, step, signal) {
    const name = r.target(step);
    const remote = str(r, step.remote);
    const data = randomBytes(Number(step.size));
    const dir = mkdtempSync(join(tmpdir(), "conformance-files-"));
    try {
      const sent = join(dir, "sent.bin");
      const back = join(dir, "back.bin");
      writeFileSync(sent, data);
      const summary = await r.client.upload(name, sent, remote, { signal });
      await r.client.download(name, remote, back, { signal });
      return { bytes: summary.bytes, same: readFileSync(back).equals(data) };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
  async logs(r, step, signal) {
    const query = {
      tail: typeof step.tail === "number" ? step.tail : undefined,
      sources: typeof step.source === "string" ? [step.source] : undefined,
      minLevel: typeof step.min_level === "string" ? step.min_level : undefined,
      signal,
    };
    const waitFor = typeof step.wait_for === "string" ? step.wait_for : null;
    const deadline = Date.now() + LOGS_WAIT_MS;
    for (;;) {
      const { lines } = await r.client.sandboxes.logs(r.target(step), query);
      const messages = lines.map((l) => l.message);
      if (waitFor === null || messages.includes(waitFor) || Date.now() > deadline) {
        return { messages, sources: lines.map((l) => l.source) };
      }
      await sleep(200);
    }
  },
  // Follows the sandbox's supervisor lines, lets earlier steps' lines
  // arrive, then resumes after the last one seen in a new watch, runs the
  // command and reads until its own exec line.
  async watch_logs(r, step, signal) {
    const name = r.target(step);
    const command = r.subst(step.command) as string[];
    const first = follow(r, name, signal);
    let last: string;
    let ordered = true;
    try {
      const opened = await within(first.events, first.pending, WATCH_WAIT_MS);
      if (opened === null) throw new FilesStepFailed(`no first event in ${WATCH_WAIT_MS} ms`);
      last = opened.cursor;
      const settleBy = Date.now() + SETTLE_LIMIT_MS;
      for (;;) {
        if (Date.now() > settleBy) {
          throw new FilesStepFailed(
            `the watch did not go quiet for ${SETTLE_MS} ms within ${SETTLE_LIMIT_MS} ms`,
          );
        }
        const event = await within(first.events, first.pending, SETTLE_MS);
        if (event === null) break;
        ordered &&= event.cursor >= last;
        last = event.cursor;
      }
    } finally {
      first.watch.cancel();
    }
    const resumedAfter = last;
    const resumed = follow(r, name, signal, resumedAfter);
    try {
      await r.client.exec(name, command, { signal });
      const deadline = Date.now() + WATCH_WAIT_MS;
      for (;;) {
        const left = deadline - Date.now();
        const event = left > 0 ? await within(resumed.events, resumed.pending, left) : null;
        if (event === null) throw new FilesStepFailed(`no exec line in ${WATCH_WAIT_MS} ms`);
        ordered &&= event.cursor >= last;
        last = event.cursor;
        if (
          event.kind === "log" &&
          event.line.message === "exec finished" &&
          event.line.fields.argv0 === command[0] &&
          event.cursor > resumedAfter
        ) {
          const code = Number(event.line.fields.exit_code);
          if (!Number.isInteger(code)) {
            throw new FilesStepFailed(`an exec line without exit_code: ${String(event.line)}`);
          }
          return { finished_exit_code: code, cursors_ordered: ordered };
        }
      }
    } finally {
      resumed.watch.cancel();
    }
  },
  async watch_events(r, step, signal) {
    const watch = r.client.sandboxes.events(r.target(step), {
      resumeAfter: String(r.subst(step.resume_after)),
      signal,
    });
    const events = watch[Symbol.asyncIterator]();
    try {
      const event = await within(events, { next: null }, WATCH_WAIT_MS);
      if (event === null) throw new FilesStepFailed(`no event in ${WATCH_WAIT_MS} ms`);
      return { first: event.kind };
    } finally {
      watch.cancel();
    }
  },
};
