// Stored agents (`client.agents`, docs/api-agents.md) against a real `asbx up`:
// create, list, get, update, run, delete, and a bad definition's typed 400.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { AsbxClient, AsbxError } from "../dist/index.js";
import { missing, startUp, script } from "./harness.mjs";

const why = missing();
if (why) console.log(`SKIP agents.test.mjs: ${why}`);
let up;
before(async () => {
  if (!why) up = await startUp();
});
after(async () => {
  await up?.stop();
});
const client = () => new AsbxClient({ baseUrl: up.url, apiKey: up.key });

async function drain(it) {
  const out = [];
  for await (const ev of it) out.push(ev);
  return out;
}

test("agents: create, list, get, update, run, delete", { skip: why }, async () => {
  const c = client();
  const made = await c.agents.create({
    name: "ts agent",
    systemPrompt: "Be brief.",
    environment: { variables: { GREETING: "hi from agent" } },
    limits: { max_steps: 8 },
  });
  assert.ok(made.id && made.createdAt && made.updatedAt, JSON.stringify(made));
  assert.equal(made.name, "ts agent");
  assert.deepEqual(made.limits, { max_steps: 8 });
  assert.ok((await c.agents.list()).some((a) => a.id === made.id));
  assert.deepEqual(await c.agents.get(made.id), made);

  const { id, createdAt, updatedAt, ...definition } = made;
  void createdAt;
  void updatedAt;
  const updated = await c.agents.update(id, {
    ...definition,
    name: "ts agent, renamed",
    environment: { variables: { GREETING: "hi again" } },
  });
  assert.equal(updated.id, id);
  assert.equal(updated.name, "ts agent, renamed");
  assert.equal(updated.systemPrompt, "Be brief.");
  assert.equal((await c.agents.get(id)).name, "ts agent, renamed");

  const run = c.agents.run(id, {
    prompt: script({ tool: "shell", args: { command: "echo $GREETING" } }, { say: "ok" }),
    filter: { types: ["stdout", "result"] },
  });
  const events = await drain(run);
  assert.ok(events.every((e) => ["stdout", "result", "session_ended"].includes(e.type)), JSON.stringify(events.map((e) => e.type)));
  assert.equal(events.filter((e) => e.type === "stdout").map((e) => e.chunk).join(""), "hi again\n");
  assert.equal(run.result, "ok");
  const info = await c.runs.get(run.id);
  assert.equal(info.kind, "agent");
  assert.equal(info.agentId, id);

  await c.agents.delete(id);
  await assert.rejects(c.agents.get(id), (e) => e instanceof AsbxError && e.status === 404);
  assert.ok(!(await c.agents.list()).some((a) => a.id === id));
});

test("agents: a bad definition is a 400 naming the field", { skip: why }, async () => {
  await assert.rejects(
    client().agents.create({ name: "" }),
    (e) => e instanceof AsbxError && e.status === 400 && e.errors.some((f) => f.field === "name"),
  );
});
