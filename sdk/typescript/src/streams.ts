/**
 * Readers of the two stream formats (docs/protocol.md §4 and §7): NDJSON
 * lines and Server-Sent Events. Both yield only complete records: a record
 * cut by a dropped connection is never yielded (the resume picks it up).
 */

/** Complete `\n`-terminated lines of a body, without the newline. */
export async function* ndjsonLines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line.trim()) yield line;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** One SSE message (a comment is never yielded). */
export interface SseMessage {
  event: string;
  data: string;
  id?: string;
}

/** The messages of an SSE body (WHATWG event stream rules, no `retry`). */
export async function* sseMessages(body: ReadableStream<Uint8Array>): AsyncGenerator<SseMessage> {
  let event = "";
  let data: string[] = [];
  let id: string | undefined;
  for await (const raw of rawLines(body)) {
    if (raw === "") {
      if (data.length) {
        yield { event: event || "message", data: data.join("\n"), ...(id !== undefined ? { id } : {}) };
      }
      event = "";
      data = [];
      id = undefined;
      continue;
    }
    if (raw.startsWith(":")) continue;
    const colon = raw.indexOf(":");
    const field = colon < 0 ? raw : raw.slice(0, colon);
    let value = colon < 0 ? "" : raw.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = value;
  }
}

/** Every line of a body, empty ones included (SSE needs them). */
async function* rawLines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        yield line;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}
