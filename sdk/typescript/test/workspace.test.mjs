// Environments, models, chat settings, history paging and the workspace's
// chat events (docs/api-environments.md, spec D/E) against a real `asbx up`.
// A route the binary does not have yet is skipped out loud.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AsbxClient, AsbxError } from "../dist/index.js";
import { missing, startUp, script } from "./harness.mjs";

const why = missing();
if (why) console.log(`SKIP workspace.test.mjs: ${why}`);
let up;
before(async () => {
  if (!why) up = await startUp();
});
after(async () => {
  await up?.stop();
});
const client = () => new AsbxClient({ baseUrl: up.url, apiKey: up.key });

/** Runs `fn`; a 404 for the route itself (`route ... not found`) skips the test out loud. */
async function orSkip(t, route, fn) {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof AsbxError && e.status === 404 && e.detail.startsWith("route ")) {
      console.log(`SKIP ${t.name}: ${route} is not served by this binary (${e.detail})`);
      t.skip(`${route} missing`);
      return undefined;
    }
    throw e;
  }
}

async function drain(it) {
  const out = [];
  for await (const ev of it) out.push(ev);
  return out;
}

test("models and environments: secrets write-only, 409 on a taken name, used by a run", { skip: why }, async (t) => {
  const c = client();
  const models = await orSkip(t, "GET /api/models", () => c.models());
  if (!models) return;
  assert.ok(models.length >= 1);
  assert.equal(models.filter((m) => m.default).length, 1, JSON.stringify(models));
  const name = `sdk-env-${process.pid}`;
  const env = await c.environments.create({
    name,
    variables: { SDK_VAR: "var-9917" },
    secrets: { SDK_SECRET: "secret-4471" },
  });
  assert.equal(env.name, name);
  assert.deepEqual(env.secretNames, ["SDK_SECRET"]);
  assert.ok(!JSON.stringify(env).includes("secret-4471"), "a secret value is never answered");
  assert.ok(!JSON.stringify(await c.environments.list()).includes("secret-4471"));
  await assert.rejects(c.environments.create({ name }), (e) => e instanceof AsbxError && e.status === 409 && e.code === "conflict");

  const run = c.runs.create({
    prompt: script({ tool: "shell", args: { command: 'echo "$SDK_VAR/$SDK_SECRET"' } }, { say: "ok" }),
    environment: name,
  });
  const out = (await drain(run)).filter((e) => e.type === "stdout").map((e) => e.chunk).join("");
  assert.match(out, /var-9917\/secret-4471/);

  // PUT replaces the definition, but absent `secrets` keeps them all ...
  const kept = await c.environments.update(env.id, { name, variables: { SDK_VAR: "var-2" } });
  assert.deepEqual(kept.secretNames, ["SDK_SECRET"]);
  assert.equal(kept.variables.SDK_VAR, "var-2");
  // ... and a secret set to null is deleted.
  const updated = await c.environments.update(env.id, { name, variables: { SDK_VAR: "var-2" }, secrets: { SDK_SECRET: null } });
  assert.deepEqual(updated.secretNames, []);
  await c.environments.delete(env.id);
  await assert.rejects(c.environments.get(env.id), (e) => e instanceof AsbxError && e.status === 404);
});

test("usage: every quota, unlimited by default", { skip: why }, async () => {
  const u = await client().usage();
  const names = ["concurrent-sandboxes", "requests-per-minute", "sandbox-seconds-per-day", "storage-mb", "tokens-per-day"];
  assert.deepEqual(Object.keys(u.quotas).sort(), names);
  assert.deepEqual(Object.keys(u.used).sort(), names);
  for (const n of names) assert.equal(u.quotas[n], null);
  assert.ok(u.used["concurrent-sandboxes"] >= 0);
});

test("chat settings: chosen with the first turn, changed with updateSettings", { skip: why }, async (t) => {
  const c = client();
  const models = await orSkip(t, "GET /api/models", () => c.models());
  if (!models) return;
  const turn = c.chat({ message: script({ say: "set" }), settings: { systemPrompt: "Answer in one word." } });
  await drain(turn);
  assert.equal(turn.done.status, "succeeded");
  const thread = await c.chats.get(turn.chatId);
  assert.equal(thread.settings?.systemPrompt, "Answer in one word.", JSON.stringify(thread.settings));
  assert.equal(thread.settings.effective.systemPrompt, "Answer in one word.");
  const model = models.find((m) => m.default).id;
  const view = await c.chats.updateSettings(turn.chatId, { model, systemPrompt: "Two words." });
  assert.equal(view.effective.model, model);
  assert.equal(view.effective.systemPrompt, "Two words.");
  // With an existing chat, settings in the turn are refused.
  const bad = c.chat({ chatId: turn.chatId, message: "x", settings: { systemPrompt: "no" } });
  await assert.rejects(bad.ready, (e) => e instanceof AsbxError && e.status === 400);
});

test("history paging: the newest N before a cursor", { skip: why }, async (t) => {
  const c = client();
  const first = c.chat({ message: script({ say: "one" }) });
  await drain(first);
  await drain(c.chat({ chatId: first.chatId, message: script({ say: "two" }) }));
  const page = await c.chats.get(first.chatId, { limit: 2 });
  if (!("before" in page)) {
    console.log(`SKIP ${t.name}: GET /api/assistant/chats/{id}?limit= has no paging in this binary`);
    t.skip("no paging");
    return;
  }
  assert.equal(page.messages.length, 2);
  assert.ok(page.before !== null, "older messages remain");
  const older = await c.chats.get(first.chatId, { limit: 2, before: page.before });
  assert.equal(older.messages.length, 2);
  assert.equal(older.before, null);
  const all = await c.chats.get(first.chatId);
  assert.deepEqual([...older.messages, ...page.messages].map((m) => m.id), all.messages.map((m) => m.id));
});

test("workspace chat events: a turn started and ended", { skip: why }, async (t) => {
  const c = client();
  const ac = new AbortController();
  const seen = [];
  const events = c.events({ signal: ac.signal });
  const first = events.next();
  const started = await Promise.race([
    first.then(
      (r) => r,
      (e) => e,
    ),
    new Promise((r) => setTimeout(() => r("pending"), 300)),
  ]);
  if (started instanceof AsbxError && started.status === 404) {
    console.log(`SKIP ${t.name}: GET /api/assistant/events is not served by this binary`);
    t.skip("no events route");
    return;
  }
  if (started instanceof Error) throw started;
  const turn = c.chat({ message: script({ say: "evented" }) });
  await drain(turn);
  const deadline = setTimeout(() => ac.abort(), 10_000);
  const take = async (r) => {
    if (r.done) return true;
    if (r.value.chatId === turn.chatId) seen.push(r.value.state);
    return seen.includes("ended");
  };
  let stop = started === "pending" ? await take(await first) : await take(started);
  while (!stop) stop = await take(await events.next());
  clearTimeout(deadline);
  ac.abort();
  assert.ok(seen.includes("started") && seen.includes("ended"), JSON.stringify(seen));
});

test("audit: a run's records, and the workspace's in one chain", { skip: why }, async (t) => {
  const c = client();
  const run = c.runs.create({ prompt: script({ tool: "shell", args: { command: "echo audited" } }, { say: "ok" }) });
  await drain(run);
  const records = await orSkip(t, "GET /api/runs/{id}/audit", () => c.audit.ofRun(run.id));
  if (!records) return;
  const kinds = records.map((r) => r.kind);
  assert.ok(kinds.includes("tool_call") && kinds.includes("callback"), JSON.stringify(records));
  assert.ok(records.every((r) => r.runId === run.id));
  const all = await c.audit.list({ limit: 10000 });
  for (let i = 1; i < all.length; i++) {
    assert.equal(all[i].prevHash, all[i - 1].hash);
    assert.equal(all[i].id, all[i - 1].id + 1);
  }
  const last = all[all.length - 1];
  assert.deepEqual((await c.audit.list({ after: last.id - 1, limit: 1 })).map((r) => r.id), [last.id]);
});

test("a run starts from a chat's kept working directory (CONTRACT §11)", { skip: why }, async () => {
  const c = client();
  const turn = c.chat({ message: script({ tool: "shell", args: { command: "echo kept-5521 > notes.txt" } }, { say: "wrote" }) });
  await drain(turn);
  const run = c.runs.create({
    prompt: script({ tool: "shell", args: { command: "cat notes.txt" } }, { say: "read" }),
    workdir: { from: turn.chatId },
  });
  const out = (await drain(run)).filter((e) => e.type === "stdout").map((e) => e.chunk).join("");
  assert.match(out, /kept-5521/);
  // A chat that is not there is refused before any sandbox starts.
  const none = c.runs.create({ prompt: "x", workdir: { from: "no-such-chat" } });
  await assert.rejects(none.ready, (e) => e instanceof AsbxError && e.status === 404 && e.code === "not_found");
});
