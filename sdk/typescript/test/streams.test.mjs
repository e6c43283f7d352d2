// The stream readers and the crypto helpers, without a server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { ndjsonLines, sseMessages } from "../dist/streams.js";
import { ClientKeyPair, b64u, unb64u } from "../dist/crypto.js";
import { AsbxError } from "../dist/index.js";

const body = (chunks, error) =>
  new ReadableStream({
    start(c) {
      for (const ch of chunks) c.enqueue(new TextEncoder().encode(ch));
      if (error) c.error(error);
      else c.close();
    },
  });

async function all(it) {
  const out = [];
  for await (const x of it) out.push(x);
  return out;
}

test("NDJSON lines split across chunks, and a cut last line is not yielded", async () => {
  const lines = await all(ndjsonLines(body(['{"a":1}\n{"b"', ':2}\r\n\n{"c":', "3"])));
  assert.deepEqual(lines, ['{"a":1}', '{"b":2}']);
  const cut = ndjsonLines(body(['{"a":1}\n{"b"'], new TypeError("terminated")));
  await assert.rejects(all(cut), /terminated/);
});

test("SSE: events, ids, multi-line data, comments; a cut event is not yielded", async () => {
  const msgs = await all(
    sseMessages(body(["event: turn\ndata: {}\n\n: heartbeat\n\nid: 3\nevent: del", "ta\ndata: a\ndata: b\n\nid: 4\ndata: cut"])),
  );
  assert.deepEqual(msgs, [
    { event: "turn", data: "{}" },
    { event: "delta", data: "a\nb", id: "3" },
  ]);
});

test("base64url round trip; a sealed answer opens only with its own callId", async () => {
  const bytes = new Uint8Array(300).map((_, i) => i & 255);
  assert.deepEqual(unb64u(b64u(bytes)), bytes);
  assert.doesNotMatch(b64u(bytes), /[+/=]/);
  // Two parties agree on the key (the server's half played by a second pair).
  const a = await ClientKeyPair.generate();
  const b = await ClientKeyPair.generate();
  const init = (pub) => ({ algorithm: "ECDH-P256+HKDF-SHA256+AES-256-GCM", serverPublicKey: pub, salt: b64u(new Uint8Array(32)) });
  const ka = await a.session(init(b.publicKey), "s1");
  const kb = await b.session(init(a.publicKey), "s1");
  const sealed = await ka.sealToolResult("call-1", { result: { ok: true } });
  // openLine's additional data is `sessionId.seq.type`: "s1.tool-result.call-1"
  // is the same string with seq="tool-result", type="call-1".
  assert.deepEqual(await kb.openLine("tool-result", "call-1", sealed), { result: { ok: true } });
  await assert.rejects(kb.openLine("tool-result", "call-2", sealed), (e) => e instanceof AsbxError && e.code === "decryption_failed");
  const other = await (await ClientKeyPair.generate()).session(init(a.publicKey), "s1");
  await assert.rejects(other.openLine("tool-result", "call-1", sealed), (e) => e.code === "decryption_failed");
});

test("AsbxError from problem+json keeps code, detail and field errors", async () => {
  const res = new Response(
    JSON.stringify({ type: "urn:asbx:problem:invalid_request", title: "Invalid", status: 400, detail: "bad", code: "invalid_request", errors: [{ field: "prompt", message: "empty" }] }),
    { status: 400, headers: { "content-type": "application/problem+json" } },
  );
  const e = await AsbxError.fromResponse(res);
  assert.equal(e.status, 400);
  assert.equal(e.code, "invalid_request");
  assert.equal(e.detail, "bad");
  assert.deepEqual(e.errors, [{ field: "prompt", message: "empty" }]);
  const plain = await AsbxError.fromResponse(new Response("oops", { status: 502 }));
  assert.equal(plain.code, "http_502");
});
