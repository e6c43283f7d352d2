// End-to-end browser test of the web chat page (issue 5).
//
// Starts the real system (`target/debug/asbx up` on a free loopback port,
// real runner, real jail, the built-in scripted model), drives Debian's
// headless chromium with playwright-core, sends a message that makes the
// scripted model run one `shell` step, sees that step's row go from running to
// succeeded in place, sees the answer, reloads and sees the same thread.
//
// Run: `node --test e2e/browser/` after `cargo build -p asbx` (as root: the
// jail needs it). Environment: ASBX_BIN (default target/debug/asbx),
// CHROMIUM (default /usr/bin/chromium).
//
// Network: loopback only. Chromium is started with background networking,
// component updates, sync and QUIC off, no proxy, and a host resolver that
// resolves nothing; the page is only ever loaded from 127.0.0.1.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
const ASBX_BIN = process.env.ASBX_BIN || path.join(ROOT, "target", "debug", "asbx");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";

// Hang guards only, never assertions on speed: a first sandbox boot on a
// busy CI machine can be slow.
const STARTUP_LIMIT_MS = 120_000;
const WAIT_LIMIT_MS = 180_000;

// The scripted model follows a JSON prompt: run one shell step, then answer.
// The `sleep 1` keeps the step visibly running for a moment.
const ANSWER = "done and dusted";
const PROMPT = JSON.stringify({
  script: [
    { tool: "shell", args: { command: "sleep 1; echo hi" } },
    { say: ANSWER },
  ],
});

// Variables that would change the model or where things connect.
const SCRUBBED_ENV = [
  "OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
  "ASBX_MODEL", "ASBX_LISTEN", "DATABASE_URL", "SANDBOX_URL", "ASBX_RUNNER_TOKEN",
  "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy",
];

function cleanEnv(extra) {
  const env = { ...process.env, ...extra };
  for (const k of SCRUBBED_ENV) delete env[k];
  return env;
}

// Starts `asbx up --listen 127.0.0.1:0`; resolves with the process and the
// URL from its banner line `  open  http://127.0.0.1:PORT`.
function startAsbx(dataDir) {
  const child = spawn(ASBX_BIN, ["up", "--listen", "127.0.0.1:0"], {
    cwd: ROOT,
    env: cleanEnv({ ASBX_DATA: dataDir, ASBX_LOG: process.env.ASBX_LOG || "warn" }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  const output = [];
  const keep = (chunk) => {
    output.push(chunk.toString());
    if (output.length > 400) output.splice(0, output.length - 400);
  };
  child.stderr.on("data", keep);
  const ready = new Promise((resolve, reject) => {
    let buf = "";
    const timer = setTimeout(
      () => reject(new Error(`asbx printed no banner in ${STARTUP_LIMIT_MS} ms:\n${output.join("")}`)),
      STARTUP_LIMIT_MS,
    );
    child.stdout.on("data", (chunk) => {
      keep(chunk);
      buf += chunk.toString();
      const m = buf.match(/^\s*open\s+(http:\/\/127\.0\.0\.1:(\d+))\s*$/m);
      if (m) {
        clearTimeout(timer);
        if (m[2] === "2024") reject(new Error("asbx got port 2024, which this test must not touch"));
        else resolve(m[1]);
      }
    });
    child.on("error", (e) => { clearTimeout(timer); reject(e); });
    child.on("exit", (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`asbx exited (${code ?? signal}) before its banner:\n${output.join("")}`));
    });
  });
  return { child, ready, output };
}

// SIGTERM, then SIGKILL if it is still alive a few seconds later. Only the
// process this test started, by its PID.
async function stopProcess(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = new Promise((resolve) => setTimeout(() => resolve("timeout"), 5_000));
  if ((await Promise.race([exited, timer])) === "timeout") {
    child.kill("SIGKILL");
    await exited;
  }
}

// The thread as data: one entry per message, with its step rows.
async function threadSnapshot(page) {
  return page.$$eval("#thread > [data-role]", (nodes) =>
    nodes.map((n) => ({
      role: n.dataset.role,
      text: (n.querySelector(":scope > [data-part=text]")?.textContent || "").trim(),
      error: (n.querySelector(":scope > [data-part=error]")?.textContent || "").trim(),
      steps: [...n.querySelectorAll("[data-step-id]")].map((r) => ({
        id: r.dataset.stepId,
        name: r.dataset.stepName,
        status: r.dataset.status,
      })),
    })),
  );
}

// Waits until the composer is idle (the turn has settled and the persisted
// message has been swapped in) and returns the thread.
async function settledThread(page) {
  await page.waitForSelector("#composer[data-busy=false]");
  return threadSnapshot(page);
}

function assertTurnShown(thread, stepId) {
  assert.equal(thread.length, 2, JSON.stringify(thread));
  const [user, assistant] = thread;
  assert.equal(user.role, "user");
  assert.equal(user.text, PROMPT);
  assert.equal(assistant.role, "assistant");
  assert.equal(assistant.error, "", "no error shown");
  assert.equal(assistant.text, ANSWER);
  assert.deepEqual(assistant.steps, [{ id: stepId, name: "shell", status: "succeeded" }]);
}

test("web chat: live step row, result, same thread after a reload", { timeout: 600_000 }, async (t) => {
  assert.ok(existsSync(ASBX_BIN), `${ASBX_BIN} is missing: run cargo build -p asbx first`);
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: apt-get install chromium`);

  // Cleanup runs last-in first-out: browser, then asbx, then the temp dir.
  const cleanups = [];
  t.after(async () => {
    for (const undo of cleanups.reverse()) {
      try { await undo(); } catch (e) { t.diagnostic(`cleanup: ${e.message}`); }
    }
  });
  const tmp = await mkdtemp(path.join(tmpdir(), "asbx-e2e-browser-"));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));

  const asbx = startAsbx(path.join(tmp, "data"));
  cleanups.push(() => stopProcess(asbx.child));
  const base = await asbx.ready;

  const context = await chromium.launchPersistentContext(path.join(tmp, "chromium"), {
    executablePath: CHROMIUM,
    headless: true,
    chromiumSandbox: false,
    env: cleanEnv({}),
    args: [
      "--no-sandbox",
      "--headless",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--no-first-run",
      "--disable-quic",
      "--no-proxy-server",
      // Resolve no host names at all: the page lives on 127.0.0.1.
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ],
  });
  cleanups.push(() => context.close());
  context.setDefaultTimeout(WAIT_LIMIT_MS);
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  page.on("console", (m) => {
    // Failed loads are reported by URL below; the page has no favicon.
    if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) pageErrors.push(m.text());
  });
  page.on("response", (r) => {
    if (r.status() >= 400 && new URL(r.url()).pathname !== "/favicon.ico") {
      pageErrors.push(`${r.status()} ${r.request().method()} ${r.url()}`);
    }
  });

  try {
    // 1. Open the page and send the message.
    await page.goto(base);
    await page.waitForSelector("#app:not([hidden])");
    await page.fill("#message", PROMPT);
    await page.click("#send");

    // 2. A shell step row shows up running, then the same row (by step id)
    //    turns succeeded.
    const running = await page.waitForSelector(
      "[data-role=assistant] [data-step-name=shell][data-status=running]",
    );
    const stepId = await running.getAttribute("data-step-id");
    assert.ok(stepId, "the step row has an id");
    await page.waitForSelector(`[data-role=assistant] [data-step-id="${stepId}"][data-status=succeeded]`);

    // 3. The answer is shown.
    await page.waitForFunction(
      (answer) => [...document.querySelectorAll("[data-role=assistant] > [data-part=text]")]
        .some((e) => e.textContent.trim() === answer),
      ANSWER,
    );
    const live = await settledThread(page);
    assertTurnShown(live, stepId);
    const chatId = new URL(page.url()).hash.match(/chat=([A-Za-z0-9_-]+)/)?.[1];
    assert.ok(chatId, `the page names the chat in its URL: ${page.url()}`);
    await page.waitForSelector(`#chat-list [data-chat-id="${chatId}"]`);

    // 4. Reload: the same chat renders the same thread from history.
    await page.reload();
    await page.waitForSelector(`#thread [data-step-id="${stepId}"]`);
    assert.deepEqual(await settledThread(page), live);

    // 5. A fresh page (no chat in the URL): open the chat from the list.
    await page.goto(base);
    await page.waitForSelector("#app:not([hidden])");
    await page.click(`#chat-list [data-chat-id="${chatId}"]`);
    await page.waitForSelector(`#thread [data-step-id="${stepId}"]`);
    assert.deepEqual(await settledThread(page), live);
    assert.deepEqual(pageErrors, [], "no errors in the page");
  } catch (e) {
    t.diagnostic(`asbx output (tail):\n${asbx.output.join("").slice(-8_000)}`);
    t.diagnostic(`page html (tail):\n${(await page.content().catch(() => "")).slice(-4_000)}`);
    throw e;
  }
});
