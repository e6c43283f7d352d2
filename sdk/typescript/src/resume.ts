/**
 * The resume loop shared by runs and chat turns: read a stream, and when
 * the connection drops, reopen it after the last `seq` seen
 * (docs/protocol.md §4 and §7), skipping anything already yielded, so the
 * caller sees every record once, in order.
 */

import { AsbxError } from "./errors.js";

/** One record of a stream. */
export interface Frame<T> {
  /** The record's `seq`, when it has one; records at or below the last seen are skipped. */
  seq?: number;
  /** What to yield (nothing when absent). */
  value?: T;
  /** The stream's last record. */
  end?: boolean;
}

/**
 * How a dropped stream is reconnected (and how long a retried request
 * waits when the server names no `Retry-After`).
 */
export interface RetryOptions {
  /** Reconnects in a row without a new line before giving up (default 6). */
  maxAttempts?: number;
  /** Wait before the first reconnect (default 100 ms). */
  initialDelayMs?: number;
  /** Each further wait is the last times this (default 2). */
  backoffMultiplier?: number;
  /** The longest wait (default 30 000 ms). */
  maxDelayMs?: number;
  /** @deprecated The old name of `maxAttempts`. */
  attempts?: number;
  /** @deprecated The old name of `initialDelayMs`. */
  delayMs?: number;
}

/** The settings in force, defaults filled in. */
export interface RetryPolicy {
  maxAttempts: number;
  initialDelayMs: number;
  backoffMultiplier: number;
  maxDelayMs: number;
}

/** `options` with the defaults filled in; a bad value is a `RangeError`. */
export function retryPolicy(options: RetryOptions = {}): RetryPolicy {
  const p: RetryPolicy = {
    maxAttempts: options.maxAttempts ?? options.attempts ?? 6,
    initialDelayMs: options.initialDelayMs ?? options.delayMs ?? 100,
    backoffMultiplier: options.backoffMultiplier ?? 2,
    maxDelayMs: options.maxDelayMs ?? 30_000,
  };
  if (!(p.maxAttempts >= 0) || !(p.initialDelayMs >= 0) || !(p.maxDelayMs >= 0) || !(p.backoffMultiplier >= 1)) {
    throw new RangeError("retry: maxAttempts and delays must be >= 0, backoffMultiplier >= 1");
  }
  return p;
}

/** Milliseconds before the n-th retry or reconnect (from 0). */
export function delayOf(policy: RetryPolicy, n: number): number {
  return Math.min(policy.initialDelayMs * policy.backoffMultiplier ** Math.min(n, 64), policy.maxDelayMs);
}

export interface ResumableSource<T> {
  first: Promise<Response>;
  frames(res: Response): AsyncIterable<Frame<T>>;
  /** The stream after `after`, or `null` when there is nothing more to read. */
  reopen(after: number): Promise<Response | null>;
  /** Called when a stream ended cleanly without its last record: `true` stops. */
  stopAfterCleanEnd(): Promise<boolean>;
  /** The abort reason once aborted. */
  aborted(): { reason: unknown } | undefined;
  /** Rejects with the abort reason when aborted. */
  abortWait: Promise<never>;
  retry: RetryPolicy;
}

/** Errors a reconnect can't fix. */
function fatal(e: unknown): boolean {
  if (!(e instanceof AsbxError)) return false;
  if (e.status === 0) return e.code !== "connection_lost";
  return e.status < 500 && e.status !== 408 && e.status !== 429;
}

function sleep(ms: number, abortWait: Promise<never>): Promise<void> {
  return Promise.race([new Promise<void>((r) => setTimeout(r, ms)), abortWait]);
}

export async function* resumable<T>(src: ResumableSource<T>): AsyncGenerator<T> {
  let res: Response | null = await Promise.race([src.first, src.abortWait]);
  let last = 0;
  let failures = 0;
  for (;;) {
    let ended = false;
    let progressed = false;
    let dropped: unknown;
    let clean = false;
    if (res) {
      try {
        for await (const f of src.frames(res)) {
          if (f.seq !== undefined) {
            if (f.seq <= last) continue;
            last = f.seq;
          }
          progressed = true;
          if (f.value !== undefined) yield f.value;
          if (f.end) {
            ended = true;
            break;
          }
        }
        clean = true;
      } catch (e) {
        const a = src.aborted();
        if (a) throw a.reason;
        if (fatal(e)) throw e;
        dropped = e;
      }
    }
    if (ended) return;
    const a = src.aborted();
    if (a) throw a.reason;
    failures = progressed ? 1 : failures + 1;
    if (clean) {
      try {
        if (await src.stopAfterCleanEnd()) return;
      } catch (e) {
        if (fatal(e)) throw e;
        dropped = e;
      }
    }
    if (failures > src.retry.maxAttempts) {
      throw new AsbxError({
        status: 0,
        code: "connection_lost",
        detail: `the stream dropped after seq ${last} and ${src.retry.maxAttempts} reconnects failed`,
        cause: dropped,
      });
    }
    await sleep(delayOf(src.retry, failures - 1), src.abortWait);
    try {
      res = await Promise.race([src.reopen(last), src.abortWait]);
      if (res === null) return;
    } catch (e) {
      const a = src.aborted();
      if (a) throw a.reason;
      if (fatal(e)) throw e;
      res = null;
    }
  }
}
