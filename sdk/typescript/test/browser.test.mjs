// The SDK in a browser: headless Debian chromium (playwright-core) loads
// dist/ as ES modules on the workspace's own origin and runs an encrypted
// run with a client tool, a chat turn, an AbortSignal and a 401 against a
// real `asbx up`, with the page's fetch and WebCrypto.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, dirname, normalize } from "node:path";
import { fileURLToPath } from "node:url";
import { missing, startUp, script } from "./harness.mjs";

const dist = join(dirname(fileURLToPath(import.meta.url)), "..", "dist");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const why = missing() ?? (existsSync(CHROMIUM) ? undefined : `${CHROMIUM} is missing (apt-get install chromium)`);
if (why) console.log(`SKIP browser.test.mjs: ${why}`);

let up;
let context;
let profile;
before(async () => {
  if (why) return;
  up = await startUp();
  const { chromium } = await import("playwright-core");
  profile = mkdtempSync(join(tmpdir(), "asbx-sdk-chromium-"));
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    chromiumSandbox: false,
    args: ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
      "--no-proxy-server", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
  });
  // dist/ served on the workspace's origin, as a bundler would ship it.
  await context.route(`${up.url}/__asbx_sdk/**`, (route) => {
    const rel = normalize(new URL(route.request().url()).pathname.slice("/__asbx_sdk/".length));
    if (rel.startsWith("..")) return route.fulfill({ status: 404 });
    const file = join(dist, rel);
    if (!existsSync(file)) return route.fulfill({ status: 404 });
    return route.fulfill({ status: 200, contentType: "text/javascript", body: readFileSync(file, "utf8") });
  });
});
after(async () => {
  await context?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  await up?.stop();
});

test("the SDK runs in a browser page", { skip: why, timeout: 60_000 }, async () => {
  const page = context.pages()[0] ?? (await context.newPage());
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  await page.goto(`${up.url}/healthz`);
  const out = await page.evaluate(
    async ({ key, runPrompt, chatPrompt, slowPrompt }) => {
      const { AsbxClient, AsbxError } = await import("/__asbx_sdk/index.js");
      const client = new AsbxClient({ baseUrl: location.origin, apiKey: key });
      const calls = [];
      const run = client.runs.create({
        prompt: runPrompt,
        encrypt: true,
        tools: { pick_color: { handler: (args) => (calls.push(args), { color: "amber" }) } },
      });
      const types = [];
      for await (const ev of run) types.push(ev.type);
      const turn = client.chat({ message: chatPrompt });
      for await (const _ of turn) void _;
      const ac = new AbortController();
      const slow = client.runs.create({ prompt: slowPrompt, signal: ac.signal });
      let aborted;
      try {
        for await (const ev of slow) if (ev.type === "session_init") ac.abort();
      } catch (e) {
        aborted = e.name;
      }
      let denied;
      try {
        await new AsbxClient({ baseUrl: location.origin, apiKey: "asbx_wrong" }).chats.list();
      } catch (e) {
        denied = { isAsbx: e instanceof AsbxError, status: e.status };
      }
      return {
        types,
        calls,
        result: run.result,
        reason: run.termination?.reason,
        chatText: turn.text,
        chatStatus: turn.done?.status,
        aborted,
        slowId: slow.id,
        denied,
      };
    },
    {
      key: up.key,
      runPrompt: script({ tool: "pick_color", args: { n: 1 } }, { say: "browser sealed answer" }),
      chatPrompt: script({ say: "hello browser", stream_ms: 1 }),
      slowPrompt: script({ sleep_ms: 30_000 }, { say: "late" }),
    },
  );
  assert.deepEqual(errors, []);
  assert.equal(out.types[0], "session_init");
  assert.equal(out.types.at(-1), "session_ended");
  assert.ok(out.types.includes("tool_result_applied"), out.types.join());
  assert.deepEqual(out.calls, [{ n: 1 }]);
  assert.equal(out.result, "browser sealed answer");
  assert.equal(out.reason, "completed");
  assert.equal(out.chatText, "hello browser");
  assert.equal(out.chatStatus, "succeeded");
  assert.equal(out.aborted, "AbortError");
  assert.deepEqual(out.denied, { isAsbx: true, status: 401 });
  // The aborted run was cancelled on the server.
  const deadline = Date.now() + 15_000;
  for (;;) {
    const res = await fetch(`${up.url}/api/runs/${out.slowId}`, { headers: { authorization: `Bearer ${up.key}` } });
    const info = await res.json();
    if (info.status !== "running") {
      assert.equal(info.error?.code, "cancelled");
      break;
    }
    assert.ok(Date.now() < deadline, "the aborted run was not cancelled");
    await new Promise((r) => setTimeout(r, 100));
  }
});
