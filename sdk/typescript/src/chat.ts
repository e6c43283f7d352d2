/**
 * A chat turn (`POST /api/assistant/chat/stream`, docs/protocol.md §7) as
 * an async iterator of typed events: `turn` first, the turn's protocol 2
 * lines, `done` last; re-attached with `Last-Event-ID` after a dropped
 * connection; cancelled with an `AbortSignal`.
 */

import { AbortLink } from "./abort.js";
import type { Connection } from "./connection.js";
import { AsbxError } from "./errors.js";
import { resumable, type Frame } from "./resume.js";
import { sseMessages } from "./streams.js";
import type { ChatEvent, ChatSettings, DoneEvent, TerminationInfo, TurnEvent } from "./types.js";

export interface ChatOptions {
  /** The user's message. */
  message: string;
  /** Continue this chat; a new chat without it. */
  chatId?: string;
  /** Files uploaded with `client.chats.upload`. */
  attachmentIds?: string[];
  /** A new chat's settings (with `chatId` the server answers 400). */
  settings?: ChatSettings;
  /** Aborting it cancels the turn and ends the iteration. */
  signal?: AbortSignal;
}

export class ChatTurn implements AsyncIterable<ChatEvent> {
  /** The chat (`x-asbx-chat-id`), once the server answered. */
  chatId: string | undefined;
  /** The turn (`x-asbx-turn-id`), once the server answered. */
  turnId: string | undefined;
  /** Resolves when the server accepted the turn; rejects with its error. */
  readonly ready: Promise<{ chatId: string; turnId: string }>;
  /** The text streamed so far (`delta`s). */
  text = "";
  /** The `result` message, once seen. */
  result: string | undefined;
  /** How the turn's session ended, once seen. */
  termination: TerminationInfo | undefined;
  /** The `done` event, once seen. */
  done: DoneEvent | undefined;

  readonly #client: Connection;
  readonly #link: AbortLink;
  readonly #first: Promise<Response>;
  #iterator: AsyncGenerator<ChatEvent> | undefined;
  #sawTurn = false;
  #observed = 0;

  /** @internal */
  constructor(client: Connection, options: ChatOptions) {
    this.#client = client;
    const { signal, ...body } = options;
    const link = new AbortLink(signal, () => this.#onAbort());
    this.#link = link;
    this.#first = (async () => {
      const res = await client.request("POST", "/api/assistant/chat/stream", {
        json: body,
        accept: "text/event-stream",
        signal: link.controller.signal,
      });
      this.chatId = res.headers.get("x-asbx-chat-id") ?? undefined;
      this.turnId = res.headers.get("x-asbx-turn-id") ?? undefined;
      if (!this.chatId) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: "no x-asbx-chat-id header" });
      }
      return res;
    })();
    this.ready = this.#first.then(() => ({ chatId: this.chatId!, turnId: this.turnId! }));
    this.ready.catch(() => {});
  }

  [Symbol.asyncIterator](): AsyncGenerator<ChatEvent> {
    if (this.#iterator) throw new TypeError("a ChatTurn is iterated once");
    this.#iterator = resumable<ChatEvent>({
      first: this.#first,
      retry: this.#client.retry,
      abortWait: this.#link.wait,
      aborted: () => this.#link.aborted(),
      frames: (res) => this.#frames(res),
      reopen: async (after) => {
        try {
          return await this.#client.request("GET", `/api/assistant/chats/${encodeURIComponent(this.chatId!)}/stream`, {
            accept: "text/event-stream",
            headers: { "last-event-id": String(after) },
            signal: this.#link.controller.signal,
            retries: 0,
          });
        } catch (e) {
          // No turn in flight any more: it ended while we were away.
          if (e instanceof AsbxError && e.status === 404) return null;
          throw e;
        }
      },
      stopAfterCleanEnd: async () => false,
    });
    return this.#iterator;
  }

  /** Reads the turn to its end; resolves to its `done` event. */
  async finished(): Promise<DoneEvent | undefined> {
    for await (const _ of this) void _;
    return this.done;
  }

  /** Asks the runner to end the turn; the iteration goes on to `done`. */
  async cancel(): Promise<void> {
    const { chatId } = await this.ready;
    await this.#client.chats.cancel(chatId);
  }

  #onAbort(): void {
    this.#first.then(
      () => {
        this.#link.controller.abort(this.#link.aborted()?.reason);
        if (this.chatId) this.#client.chats.cancel(this.chatId).catch(() => {});
      },
      () => {},
    );
  }

  async *#frames(res: Response): AsyncGenerator<Frame<ChatEvent>> {
    if (!res.body) return;
    for await (const msg of sseMessages(res.body)) {
      let data: Record<string, unknown>;
      try {
        data = JSON.parse(msg.data) as Record<string, unknown>;
      } catch (cause) {
        throw new AsbxError({ status: 0, code: "protocol_error", detail: `event ${msg.event} is not JSON`, cause });
      }
      if (msg.event === "turn") {
        // Every (re-)attach starts with it: yield it once.
        const first = !this.#sawTurn;
        this.#sawTurn = true;
        yield { value: first ? ({ type: "turn", ...data } as TurnEvent) : undefined };
        continue;
      }
      if (msg.event === "done") {
        this.done = { type: "done", ...data } as DoneEvent;
        yield { value: this.done, end: true };
        return;
      }
      const event = { type: msg.event, ...data } as ChatEvent;
      const seq = msg.id !== undefined ? Number(msg.id) : undefined;
      // A replay may repeat frames (the resume loop drops them): act once.
      if (seq === undefined || !Number.isFinite(seq) || seq > this.#observed) {
        this.#observe(event);
        if (seq !== undefined && Number.isFinite(seq)) this.#observed = seq;
      }
      yield { seq: Number.isFinite(seq) ? seq : undefined, value: event };
    }
  }

  #observe(event: ChatEvent): void {
    switch (event.type) {
      case "delta":
        this.text += event.text;
        break;
      case "result":
        this.result = event.message;
        break;
      case "session_ended": {
        const { type: _t, seq: _s, ts: _ts, sessionId: _id, ...termination } = event;
        this.termination = termination;
        break;
      }
    }
  }
}
