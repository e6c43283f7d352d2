// The SDK against a real `asbx up` (scripted model, auth required).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AsbxClient, AsbxError } from "../dist/index.js";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { missing, startUp, script, recordingFetch, cgroupsOf, pidsWith } from "./harness.mjs";

const why = missing();
if (why) console.log(`SKIP sdk.test.mjs: ${why}`);
let up;
before(async () => {
  if (!why) up = await startUp();
});
const sessions = new Set();
after(async () => {
  if (!up) return;
  await up.stop();
  // Nothing is left behind: no sandbox cgroup, no process, no data dir.
  assert.ok(sessions.size >= 8, `saw ${sessions.size} sessions`);
  for (const id of sessions) assert.deepEqual(cgroupsOf(`asbx-${id}`), [], `cgroups of ${id} left behind`);
  assert.deepEqual(cgroupsOf(`asbx-warm-${up.pid}-`), [], "warm sandboxes left behind");
  assert.deepEqual(pidsWith(up.data), [], "processes of this asbx up left behind");
  assert.ok(!existsSync(up.data), "the data dir is removed");
});
const t = (name, fn) => test(name, { skip: why }, fn);
const client = (extra = {}) => new AsbxClient({ baseUrl: up.url, apiKey: up.key, ...extra });

async function collect(iterable) {
  const out = [];
  for await (const ev of iterable) {
    if (ev.sessionId) sessions.add(ev.sessionId);
    out.push(ev);
  }
  return out;
}

async function eventually(what, fn, ms = 15_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

t("a chat turn streams typed events, and chats list, read, attach and delete", async () => {
  const c = client();
  const turn = c.chat({
    message: script({ tool: "shell", args: { command: "echo sdk-chat-out && ls -la" } }, { say: "hello from the chat", stream_ms: 1 }),
  });
  const events = await collect(turn);
  const types = events.map((e) => e.type);
  assert.equal(types[0], "turn");
  assert.equal(types.at(-1), "done");
  assert.ok(types.includes("session_init") && types.includes("step") && types.includes("session_ended"), types.join());
  assert.ok(!types.includes("log"), "log lines are not relayed to a chat");
  const stdout = events.filter((e) => e.type === "stdout").map((e) => e.chunk).join("");
  assert.match(stdout, /sdk-chat-out/);
  assert.equal(turn.text, "hello from the chat");
  assert.equal(turn.result, "hello from the chat");
  assert.equal(turn.termination.reason, "completed");
  assert.equal(turn.done.status, "succeeded");
  assert.equal(events[0].chatId, turn.chatId);
  const seqs = events.filter((e) => e.seq !== undefined).map((e) => e.seq);
  assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), "in order");

  // An attachment reaches the sandbox of the next turn. (With attachments
  // the prompt gets a file list appended, so the scripted model runs its
  // demo: `uname -sr && ls -la` of the working directory.)
  const file = await c.chats.upload(new TextEncoder().encode("attached-7431\n"), {
    name: "notes.txt",
    mimeType: "text/plain",
    chatId: turn.chatId,
  });
  assert.ok(file.id);
  const second = c.chat({ chatId: turn.chatId, message: "what is attached?", attachmentIds: [file.id] });
  const out = (await collect(second)).filter((e) => e.type === "stdout").map((e) => e.chunk).join("");
  assert.match(out, / attachments\n/);
  assert.doesNotMatch(stdout, / attachments\n/, "positive control: no attachments dir in the first turn");
  const list = await c.chats.list();
  assert.ok(list.some((chat) => chat.id === turn.chatId), JSON.stringify(list));
  const thread = await c.chats.get(turn.chatId);
  assert.equal(thread.messages.length, 4);
  assert.ok(JSON.stringify(thread.messages[2]).includes(file.id), JSON.stringify(thread.messages[2]));
  await c.chats.delete(turn.chatId);
  await assert.rejects(c.chats.get(turn.chatId), (e) => e instanceof AsbxError && e.status === 404 && e.code === "not_found");
});

t("a second turn on a busy chat is a 409 AsbxError; cancel ends the first", async () => {
  const c = client();
  const first = c.chat({ message: script({ sleep_ms: 20_000 }, { say: "late" }) });
  const it = first[Symbol.asyncIterator]();
  assert.equal((await it.next()).value.type, "turn");
  const second = c.chat({ chatId: first.chatId, message: "again" });
  await assert.rejects(second.ready, (e) => {
    assert.ok(e instanceof AsbxError, String(e));
    assert.equal(e.status, 409);
    assert.equal(e.code, "turn_in_flight");
    return true;
  });
  await assert.rejects(collect(second), (e) => e instanceof AsbxError && e.status === 409);
  await first.cancel();
  for (let r = await it.next(); !r.done; r = await it.next());
  assert.equal(first.done.status, "cancelled");
  assert.equal(first.termination.reason, "terminated");
  assert.equal(first.termination.terminatedBy, "daemon");
});

t("a run with a client tool answered by a callback", async () => {
  const calls = [];
  const run = client().runs.create({
    prompt: script({ tool: "pick_color", args: { hint: "warm" } }, { say: "picked" }),
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
  const call = events.find((e) => e.type === "tool_call");
  assert.ok(call, events.map((e) => e.type).join());
  assert.equal(call.toolName, "pick_color");
  assert.deepEqual(calls, [{ hint: "warm" }]);
  const applied = events.find((e) => e.type === "tool_result_applied");
  assert.equal(applied?.callId, call.callId);
  assert.equal(run.result, "picked");
  assert.equal(run.termination.reason, "completed");
  assert.equal(run.termination.stats.toolCalls, 1);
  const info = await eventually("the run to settle", async () => {
    const i = await run.info();
    return i.status !== "running" && i;
  });
  assert.equal(info.status, "succeeded");
});

t("a tool call answered twice is a 409; a bad request a 400 naming the field", async () => {
  const c = client();
  const run = c.runs.create({
    prompt: script({ tool: "ask", args: {} }, { sleep_ms: 2_000 }, { say: "ok" }),
    clientTools: [{ name: "ask", description: "asks", parameters: { type: "object" } }],
  });
  let conflict;
  for await (const ev of run) {
    sessions.add(ev.sessionId);
    if (ev.type === "tool_call") {
      await run.respond(ev.callId, { result: "first" });
      conflict = await c.runs.toolResult(run.id, ev.callId, { result: "second" }).catch((e) => e);
    }
  }
  assert.ok(conflict instanceof AsbxError, String(conflict));
  assert.equal(conflict.status, 409);
  assert.equal(run.result, "ok");

  const bad = c.runs.create({ prompt: "x", filter: { types: ["no_such_type"] } });
  await assert.rejects(bad.ready, (e) => {
    assert.ok(e instanceof AsbxError);
    assert.equal(e.status, 400);
    assert.equal(e.code, "invalid_request");
    assert.ok(e.errors.some((f) => f.field.startsWith("filter")), JSON.stringify(e.errors));
    return true;
  });
});

t("a dropped run connection resumes after the last seq: no gap, no duplicate", async () => {
  const words = Array.from({ length: 40 }, (_, i) => `w${i}`).join(" ");
  const rec = recordingFetch({ cut: { bytes: 900, match: (url, init) => init.method === "POST" && url.endsWith("/api/runs") } });
  const run = client({ fetch: rec.fetch }).runs.create({ prompt: script({ say: words, stream_ms: 15 }) });
  const events = await collect(run);
  assert.ok(rec.cut(), "the connection was cut");
  const seqs = events.map((e) => e.seq);
  assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1), "every seq once, in order");
  assert.equal(events.filter((e) => e.type === "delta").map((e) => e.text).join(""), words);
  assert.equal(events.at(-1).type, "session_ended");
  const resumes = rec.requests.filter((r) => r.url.includes(`/api/runs/${run.id}/events?after=`));
  assert.ok(resumes.length >= 1, JSON.stringify(rec.requests));
  const after = Number(new URL(resumes[0].url).searchParams.get("after"));
  assert.ok(after > 0 && after < seqs.length, `resumed after ${after} of ${seqs.length}`);
});

t("a dropped chat connection re-attaches with Last-Event-ID: no gap, no duplicate", async () => {
  const words = Array.from({ length: 30 }, (_, i) => `c${i}`).join(" ");
  const rec = recordingFetch({ cut: { bytes: 1200, match: (url, init) => init.method === "POST" && url.endsWith("/chat/stream") } });
  const turn = client({ fetch: rec.fetch }).chat({ message: script({ say: words, stream_ms: 15 }) });
  const events = await collect(turn);
  assert.ok(rec.cut(), "the connection was cut");
  assert.equal(events.filter((e) => e.type === "turn").length, 1);
  assert.equal(turn.text, words);
  const seqs = events.filter((e) => e.seq !== undefined).map((e) => e.seq);
  assert.equal(new Set(seqs).size, seqs.length, "no duplicate");
  assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b));
  assert.equal(events.at(-1).type, "done");
  const resumes = rec.requests.filter((r) => r.url.endsWith(`/api/assistant/chats/${turn.chatId}/stream`));
  assert.ok(resumes.length >= 1 && Number(resumes[0].headers["last-event-id"]) > 0, JSON.stringify(rec.requests));
});

t("an encrypted run: the wire is ciphertext, the SDK opens every line and seals the tool answer", async () => {
  const marker = "sealed-marker-5529";
  const rec = recordingFetch();
  const run = client({ fetch: rec.fetch }).runs.create({
    prompt: script(
      { tool: "shell", args: { command: `echo ${marker}-out` } },
      { tool: "secret_tool", args: {} },
      { say: `${marker} answer` },
    ),
    encrypt: true,
    tools: { secret_tool: { handler: () => ({ value: 42 }) } },
  });
  const events = await collect(run);
  assert.ok(run.init.encryption?.serverPublicKey, "session_init carries the server key");
  assert.equal(run.result, `${marker} answer`);
  assert.match(events.filter((e) => e.type === "stdout").map((e) => e.chunk).join(""), new RegExp(`${marker}-out`));
  assert.ok(events.some((e) => e.type === "tool_result_applied"), "the sealed tool answer reached the agent");
  assert.equal(run.termination.reason, "completed");
  assert.equal(typeof run.termination.stats.durationMs, "number");
  const wire = rec.wire.join("");
  assert.ok(wire.includes('"encrypted"'), "lines travel sealed");
  assert.ok(!wire.includes(marker), "no plaintext on the wire");
  const answer = rec.requests.find((r) => r.url.endsWith("/tool-result"));
  assert.ok(answer, "a tool answer was posted");
});

t("an encrypted run verifies the runner's signature under a pinned key, and a wrong pin refuses it", async () => {
  const pinned = readFileSync(join(up.data, "runner", "identity.pub"), "utf8").trim();
  const run = client({ runnerPublicKey: pinned }).runs.create({ prompt: script({ say: "signed" }), encrypt: true });
  await collect(run);
  assert.equal(run.result, "signed");
  assert.equal(run.init.encryption.identityKey, pinned);
  // A key that is not the runner's (a fresh P-256 point): refused, typed.
  const pair = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, ["sign"]);
  const stranger = Buffer.from(await crypto.subtle.exportKey("raw", pair.publicKey)).toString("base64url");
  const refused = client({ runnerPublicKey: stranger }).runs.create({ prompt: script({ say: "never read" }), encrypt: true });
  await assert.rejects(collect(refused), (e) => e instanceof AsbxError && e.code === "signature_invalid");
  assert.equal(refused.result, undefined);
  // Let the refused run end before the suite's teardown counts sessions.
  await eventually("the refused run to end", async () => (await client().runs.get(refused.id)).status !== "running");
});

t("a failed run carries its termination info (exit code, stderr)", async () => {
  const c = client();
  const run = c.runs.create({ prompt: script({ crash: 3 }) });
  const events = await collect(run);
  assert.equal(events.at(-1).type, "session_ended");
  const term = run.termination;
  assert.equal(term.reason, "error", JSON.stringify(term));
  assert.equal(term.exitCode, 3);
  assert.ok(term.message, "a message when not completed");
  assert.match(term.stderr?.head ?? "", /scripted crash/);
  assert.equal(run.error?.code, "sandbox_crashed");
  // The relay settles the run just after the stream's last line.
  const info = await eventually("the run to settle", async () => {
    const i = await c.runs.get(run.id);
    return i.status !== "running" && i;
  });
  assert.equal(info.status, "failed");
  assert.equal(info.termination.exitCode, 3);
});

t("a wrong API key is a 401 AsbxError", async () => {
  const wrong = new AsbxClient({ baseUrl: up.url, apiKey: "asbx_wrong_key" });
  const run = wrong.runs.create({ prompt: "hello" });
  await assert.rejects(run.ready, (e) => e instanceof AsbxError && e.status === 401 && typeof e.code === "string" && e.code.length > 0);
  await assert.rejects(wrong.chats.list(), (e) => e instanceof AsbxError && e.status === 401);
  // Positive control: the right key is accepted.
  assert.ok(Array.isArray(await client().chats.list()));
});

t("aborting a run's signal cancels the run on the server", async () => {
  const c = client();
  const ac = new AbortController();
  const run = c.runs.create({ prompt: script({ sleep_ms: 30_000 }, { say: "late" }), signal: ac.signal });
  await assert.rejects(
    (async () => {
      for await (const ev of run) {
        if (ev.type !== "session_init") continue;
        sessions.add(ev.sessionId);
        // Positive control of the cleanup check: the live sandbox has cgroups.
        if ((process.env.ASBX_TEST_PROFILE ?? "strict") === "strict") {
          const live = [...cgroupsOf(`asbx-${ev.sessionId}`), ...cgroupsOf(`asbx-warm-${up.pid}-`)];
          assert.notDeepEqual(live, [], "a live sandbox has a cgroup");
        }
        ac.abort();
      }
    })(),
    (e) => e.name === "AbortError",
  );
  const info = await eventually("the run to be cancelled", async () => {
    const i = await c.runs.get(run.id);
    return i.status !== "running" && i;
  });
  assert.equal(info.status, "failed");
  assert.equal(info.error?.code, "cancelled");
  assert.equal(info.termination?.reason, "terminated");
  assert.equal(info.termination?.terminatedBy, "daemon");

  // Aborted before the server even answered: the run is still found and cancelled.
  const early = new AbortController();
  const run2 = c.runs.create({ prompt: script({ sleep_ms: 30_000 }, { say: "late" }), signal: early.signal });
  early.abort();
  await assert.rejects(collect(run2), (e) => e.name === "AbortError");
  const id = await run2.ready;
  const info2 = await eventually("the early-aborted run to be cancelled", async () => {
    const i = await c.runs.get(id);
    return i.status !== "running" && i;
  });
  assert.equal(info2.error?.code, "cancelled");
});

t("an encrypted run resumed after a cut opens every line once", async () => {
  const words = Array.from({ length: 30 }, (_, i) => `e${i}`).join(" ");
  const rec = recordingFetch({ cut: { bytes: 1500, match: (url, init) => init.method === "POST" && url.endsWith("/api/runs") } });
  const run = client({ fetch: rec.fetch }).runs.create({ prompt: script({ say: words, stream_ms: 15 }), encrypt: true });
  const events = await collect(run);
  assert.ok(rec.cut(), "the connection was cut");
  const seqs = events.map((e) => e.seq);
  assert.deepEqual(seqs, Array.from({ length: seqs.length }, (_, i) => i + 1));
  assert.equal(events.filter((e) => e.type === "delta").map((e) => e.text).join(""), words);
  assert.equal(run.result, words);
  assert.ok(!rec.wire.join("").includes(" e17 "), "no plaintext on the wire");
  assert.ok(rec.requests.some((r) => /\/events\?after=[1-9]/.test(r.url)), JSON.stringify(rec.requests.map((r) => r.url)));
});

t("aborting a chat turn's signal cancels the turn", async () => {
  const c = client();
  const ac = new AbortController();
  const turn = c.chat({ message: script({ sleep_ms: 30_000 }, { say: "late" }), signal: ac.signal });
  await assert.rejects(
    (async () => {
      for await (const ev of turn) {
        if (ev.sessionId) sessions.add(ev.sessionId);
        if (ev.type === "session_init") ac.abort();
      }
    })(),
    (e) => e.name === "AbortError",
  );
  const thread = await eventually("the turn to be cancelled", async () => {
    const th = await c.chats.get(turn.chatId);
    const last = th.messages.at(-1);
    return last?.role === "assistant" && th;
  });
  const blocks = JSON.stringify(thread.messages.at(-1).content);
  assert.match(blocks, /cancelled/, blocks);
});
