// Runs over the WebSocket transport (`transport: "websocket"`, `GET
// /api/runs/ws`, docs/protocol.md §13) against a real `asbx up`, from
// Node.js through the `ws` package: a run with a client tool completes,
// an encrypted one decrypts, a run is attached after a seq, a refused
// dispatch rejects with the server's code, and cancel goes over the socket.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AsbxClient, AsbxError } from "../dist/index.js";
import { missing, startUp, script } from "./harness.mjs";

const why = missing();
if (why) console.log(`SKIP ws.test.mjs: ${why}`);
let up;
before(async () => {
  if (!why) up = await startUp();
});
after(async () => {
  if (up) await up.stop();
});
const t = (name, fn) => test(name, { skip: why }, fn);
const client = (extra = {}) => new AsbxClient({ baseUrl: up.url, apiKey: up.key, transport: "websocket", ...extra });

async function collect(iterable) {
  const out = [];
  for await (const ev of iterable) out.push(ev);
  return out;
}

t("a run driven over a WebSocket from Node.js completes, with its client tool answered on the socket", async () => {
  const calls = [];
  const run = client().runs.create({
    prompt: script({ tool: "pick_color", args: { hint: "warm" } }, { say: "picked over ws" }),
    tools: {
      pick_color: {
        description: "Asks the user for a color.",
        parameters: { type: "object", properties: { hint: { type: "string" } } },
        handler: async (args) => {
          calls.push(args);
          return { color: "amber" };
        },
      },
    },
  });
  const events = await collect(run);
  const types = events.map((e) => e.type);
  assert.equal(types[0], "session_init");
  assert.equal(types.at(-1), "session_ended");
  const seqs = events.map((e) => e.seq);
  assert.deepEqual(seqs, seqs.map((_, i) => i + 1), "every line once, in order");
  assert.deepEqual(calls, [{ hint: "warm" }]);
  assert.ok(types.includes("tool_result_applied"), types.join());
  assert.equal(run.result, "picked over ws");
  assert.equal(run.termination.reason, "completed");
  assert.equal(run.id, events[0].sessionId);

  // Attaching over a socket after seq 2: the rest, from the stored lines.
  const rest = await collect(client().runs.attach(run.id, { after: 2 }));
  assert.deepEqual(rest.map((e) => e.seq), seqs.slice(2));
  assert.equal(rest.at(-1).type, "session_ended");
});

t("an encrypted run decrypts over a WebSocket", async () => {
  const run = client().runs.create({
    prompt: script({ tool: "secret_tool", args: {} }, { say: "sealed over ws" }),
    encrypt: true,
    tools: { secret_tool: { handler: () => ({ value: 42 }) } },
  });
  const events = await collect(run);
  assert.equal(run.result, "sealed over ws");
  assert.ok(events.some((e) => e.type === "tool_result_applied"));
  assert.equal(run.termination.reason, "completed");
});

t("a refused dispatch rejects with the server's code; cancel over the socket ends the run", async () => {
  const bad = client().runs.create({ prompt: "x", filter: { types: ["no_such_type"] } });
  await assert.rejects(bad.ready, (e) => {
    assert.ok(e instanceof AsbxError);
    assert.equal(e.code, "invalid_request");
    return true;
  });
  const unauthorized = new AsbxClient({ baseUrl: up.url, apiKey: "asbx_wrong", transport: "websocket" });
  await assert.rejects(unauthorized.runs.create({ prompt: script({ say: "never" }) }).ready, (e) => {
    assert.ok(e instanceof AsbxError);
    assert.equal(e.status, 401);
    return true;
  });

  const run = client().runs.create({
    prompt: script({ tool: "shell", args: { command: "sleep 30" } }),
  });
  const events = [];
  for await (const ev of run) {
    events.push(ev);
    if (ev.type === "step" && ev.status === "running") await run.cancel();
  }
  assert.equal(run.termination.reason, "terminated");
  assert.equal(run.termination.terminatedBy, "daemon");
});
