// The resume loop against a scripted fake server (no asbx needed): the
// cases a real server rarely shows on demand.
import { test } from "node:test";
import assert from "node:assert/strict";
import { AsbxClient, AsbxError } from "../dist/index.js";

const line = (seq, type, extra = {}) => JSON.stringify({ seq, ts: 1, sessionId: "r1", type, ...extra }) + "\n";
const ndjson = (text, headers = {}) =>
  new Response(text, { status: 200, headers: { "content-type": "application/x-ndjson", ...headers } });

/** A fetch answering from `routes` ("METHOD path" -> handler), recording every call. */
function fake(routes) {
  const calls = [];
  const f = async (url, init = {}) => {
    const u = new URL(url);
    const key = `${init.method ?? "GET"} ${u.pathname}${u.search}`;
    calls.push(key);
    const h = routes[key];
    if (!h) return new Response(JSON.stringify({ code: "not_found", status: 404, title: "Not found", detail: key }), { status: 404 });
    return h();
  };
  return { fetch: f, calls };
}

test("a run settled without session_ended ends with the run record's account", async () => {
  const srv = fake({
    "POST /api/runs": () => ndjson(line(1, "session_init", { protocolVersion: 2, limits: {} }) + line(2, "delta", { text: "hi" }), { "x-asbx-run-id": "r1" }),
    "GET /api/runs/r1": () => Response.json({ id: "r1", status: "failed", error: { code: "runner_lost", message: "gone" }, termination: null }),
    "GET /api/runs/r1/events?after=2": () => ndjson(""),
  });
  const client = new AsbxClient({ baseUrl: "http://asbx.test", fetch: srv.fetch, retry: { delayMs: 1 } });
  const run = client.runs.create({ prompt: "x" });
  const seqs = [];
  for await (const ev of run) seqs.push(ev.seq);
  assert.deepEqual(seqs, [1, 2]);
  assert.deepEqual(run.error, { code: "runner_lost", message: "gone" });
  assert.deepEqual(srv.calls, ["POST /api/runs", "GET /api/runs/r1", "GET /api/runs/r1/events?after=2", ]);
});

test("a stream that keeps failing ends with connection_lost after the retries", async () => {
  let n = 0;
  const srv = fake({
    "POST /api/runs": () => ndjson(line(1, "session_init", { protocolVersion: 2, limits: {} }), { "x-asbx-run-id": "r1" }),
    "GET /api/runs/r1": () => Response.json({ id: "r1", status: "running" }),
    "GET /api/runs/r1/events?after=1": () => {
      n++;
      return new Response("boom", { status: 503 });
    },
  });
  const client = new AsbxClient({ baseUrl: "http://asbx.test", fetch: srv.fetch, retry: { attempts: 3, delayMs: 1 } });
  await assert.rejects(
    (async () => {
      for await (const _ of client.runs.create({ prompt: "x" })) void _;
    })(),
    (e) => e instanceof AsbxError && e.code === "connection_lost",
  );
  assert.ok(n >= 2 && n <= 3, `reconnected ${n} times`);
});

test("a 410 past the retention is not retried: AsbxError events_gone", async () => {
  const srv = fake({
    "GET /api/runs/r1/events?after=5": () =>
      new Response(JSON.stringify({ code: "events_gone", status: 410, title: "Gone", detail: "older", oldestSeq: 9 }), { status: 410 }),
  });
  const client = new AsbxClient({ baseUrl: "http://asbx.test", fetch: srv.fetch, retry: { delayMs: 1 } });
  await assert.rejects(
    (async () => {
      for await (const _ of client.runs.attach("r1", { after: 5 })) void _;
    })(),
    (e) => e instanceof AsbxError && e.status === 410 && e.code === "events_gone" && e.problem.oldestSeq === 9,
  );
  assert.equal(srv.calls.length, 1);
});

test("lines repeated by a replay are yielded and acted on once", async () => {
  const lines = [
    line(1, "session_init", { protocolVersion: 2, limits: {} }),
    line(2, "tool_call", { callId: "c1", toolName: "t", args: {} }),
    line(3, "delta", { text: "a" }),
    line(4, "result", { message: "a" }),
    line(5, "session_ended", { reason: "completed", terminatedBy: "agent", stats: {} }),
  ];
  let posted = 0;
  const srv = fake({
    "POST /api/runs": () => ndjson(lines.slice(0, 3).join(""), { "x-asbx-run-id": "r1" }),
    "GET /api/runs/r1": () => Response.json({ id: "r1", status: "running" }),
    // A replay that starts too early: seq 2 and 3 again.
    "GET /api/runs/r1/events?after=3": () => ndjson(lines.slice(1).join("")),
    "POST /api/runs/r1/tool-result": () => (posted++, Response.json({})),
  });
  const client = new AsbxClient({ baseUrl: "http://asbx.test", fetch: srv.fetch, retry: { delayMs: 1 } });
  let calls = 0;
  const run = client.runs.create({ prompt: "x", tools: { t: { handler: () => ++calls } } });
  const seqs = [];
  for await (const ev of run) seqs.push(ev.seq);
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(seqs, [1, 2, 3, 4, 5]);
  assert.equal(calls, 1);
  assert.equal(posted, 1);
  assert.equal(run.result, "a");
});
