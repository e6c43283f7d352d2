/**
 * Ties a caller's `AbortSignal` to a stream: the abort reason, a promise
 * that rejects with it, and a hook run once on abort.
 */

export class AbortLink {
  #reason: { reason: unknown } | undefined;
  readonly wait: Promise<never>;
  #reject!: (reason: unknown) => void;
  /** Aborts the stream's own requests. */
  readonly controller = new AbortController();

  constructor(signal: AbortSignal | undefined, onAbort: () => void) {
    this.wait = new Promise<never>((_, reject) => {
      this.#reject = reject;
    });
    this.wait.catch(() => {});
    if (!signal) return;
    const fire = () => {
      if (this.#reason) return;
      this.#reason = { reason: signal.reason ?? new DOMException("aborted", "AbortError") };
      this.#reject(this.#reason.reason);
      onAbort();
    };
    if (signal.aborted) queueMicrotask(fire);
    else signal.addEventListener("abort", fire, { once: true });
  }

  aborted(): { reason: unknown } | undefined {
    return this.#reason;
  }
}
