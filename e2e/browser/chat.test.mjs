// End-to-end browser test of the web chat page (issue 5).
//
// Starts the real system (`target/debug/asbx up` on a free loopback port,
// real runner, real jail, the built-in scripted model), drives Debian's
// headless chromium with playwright-core, and checks the live chat: a shell
// step's output shows while it runs, the answer appears word by word and
// renders as sanitised Markdown, a crashed turn says why with its stderr,
// after a reload the thread is the same DOM as it was live, and an encrypted
// run through /api/runs opens in the page with WebCrypto alone. A second
// test (issue 10) picks a named environment and a model in the settings
// panel, has the turn write a file into the chat's bag through the
// in-sandbox workspace API, cuts the network under the live turn (a TCP
// proxy between the browser and asbx) and sees the page resume it with
// Last-Event-ID and no reload, sees another tab follow the chat live, and
// pages back through a long thread. A third (issue 28) loads the page
// through a plain TCP forwarder on another port, as an SSH tunnel does
// (`Host: localhost:<its port>`), runs a turn there, and sees a command
// that exits 3 shown failed with its exit code and its output. A fourth
// (issue 27) fills the workspace's fair share of the runners with an API
// run and sees the page say that its turn is queued, run it once the room
// frees, and leave the queue on Stop.
//
// Run: `node --test e2e/browser/` after `cargo build -p asbx` (as root: the
// jail needs it). Environment: ASBX_BIN (default target/debug/asbx),
// CHROMIUM (default /usr/bin/chromium).
//
// Network: loopback only. Chromium is started with background networking,
// component updates, sync and QUIC off, no proxy, and a host resolver that
// resolves nothing but localhost; the page is only ever loaded from
// 127.0.0.1 or localhost.

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

// The scripted model follows a JSON prompt. The first turn runs a shell
// step printing a line every 300 ms, then streams a Markdown answer word by
// word; the second crashes the agent (exit code 3, "scripted crash" on its
// stderr); the third answers with markup that must not become live HTML.
const ANSWER = "**Done** and `dusted`: every word of this answer streams on its own.";
const ANSWER_TEXT = "Done and dusted: every word of this answer streams on its own.";
const TICKS = "tick1\ntick2\ntick3\ntick4\ntick5\n";
const PROMPT = JSON.stringify({
  script: [
    { tool: "shell", args: { command: "for i in 1 2 3 4 5; do echo tick$i; sleep 0.3; done" } },
    { say: ANSWER, stream_ms: 120 },
  ],
});
const CRASH = JSON.stringify({ script: [{ crash: 3 }] });
const ENCRYPTED_PROMPT = JSON.stringify({
  script: [
    { tool: "shell", args: { command: "echo tool-secret-marker" } },
    { say: "the secret answer is 42", stream_ms: 1 },
  ],
});

// Runs in the page (its own origin, its WebCrypto): docs/protocol.md §4.
async function encryptedRunInThePage(prompt) {
  const subtle = crypto.subtle;
  const curve = { name: "ECDH", namedCurve: "P-256" };
  const b64u = (bytes) => btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  const unb64u = (s) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
  const pair = await subtle.generateKey(curve, false, ["deriveBits"]);
  const raw = new Uint8Array(await subtle.exportKey("raw", pair.publicKey));
  const res = await fetch("/api/runs", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt, protocol: 2, encryption: { clientPublicKey: b64u(raw) } }),
  });
  const body = await res.text();
  const lines = body.split("\n").filter((l) => l).map((l) => JSON.parse(l));
  const init = lines[0];
  const server = await subtle.importKey("raw", unb64u(init.encryption.serverPublicKey), curve, false, []);
  const keyOf = async (own) => {
    const secret = await subtle.deriveBits({ name: "ECDH", public: server }, own, 256);
    const ikm = await subtle.importKey("raw", secret, "HKDF", false, ["deriveKey"]);
    return subtle.deriveKey(
      { name: "HKDF", hash: "SHA-256", salt: unb64u(init.encryption.salt),
        info: new TextEncoder().encode("asbx-e2e-v1:" + init.sessionId) },
      ikm, { name: "AES-GCM", length: 256 }, false, ["decrypt"]);
  };
  const open = async (key, line) => {
    const aad = new TextEncoder().encode(`${line.sessionId}.${line.seq}.${line.type}`);
    try {
      const plain = await subtle.decrypt(
        { name: "AES-GCM", iv: unb64u(line.encrypted.iv), additionalData: aad },
        key, unb64u(line.encrypted.ciphertext));
      return JSON.parse(new TextDecoder().decode(plain));
    } catch {
      return null;
    }
  };
  const sealed = lines.slice(1).filter((l) => l.encrypted);
  const key = await keyOf(pair.privateKey);
  const opened = [];
  for (const l of sealed) opened.push(await open(key, l));
  const texts = opened.filter(Boolean).map((o) => JSON.stringify(o));
  const target = sealed.findIndex((l) => l.type === "result");
  const base = sealed[target];
  const ct = base.encrypted.ciphertext;
  const mid = Math.floor(ct.length / 2);
  const tampered = { ...base, encrypted: { ...base.encrypted,
    ciphertext: ct.slice(0, mid) + (ct[mid] === "A" ? "B" : "A") + ct.slice(mid + 1) } };
  const reordered = { ...base, seq: sealed[target - 1].seq };
  const relabelled = { ...base, type: "error" };
  const altered = [];
  for (const l of [tampered, reordered, relabelled]) altered.push((await open(key, l)) !== null);
  const other = await subtle.generateKey(curve, false, ["deriveBits"]);
  const wrong = await keyOf(other.privateKey);
  let openedWithWrongKey = 0;
  for (const l of sealed) if ((await open(wrong, l)) !== null) openedWithWrongKey += 1;
  return {
    status: res.status,
    plaintextOnTheWire: body.includes("secret"),
    initType: init.type,
    sealed: sealed.length,
    opened: opened.filter(Boolean).length,
    texts,
    altered,
    openedWithWrongKey,
  };
}

const HOSTILE_ANSWER =
  "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>" +
  "[click](javascript:window.pwned=3) <b style=\"color:red\" onclick=\"window.pwned=4\">bold</b>";
const HOSTILE = JSON.stringify({ script: [{ say: HOSTILE_ANSWER }] });

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
function startAsbx(dataDir, extraEnv = {}) {
  const child = spawn(ASBX_BIN, ["up", "--listen", "127.0.0.1:0"], {
    cwd: ROOT,
    env: cleanEnv({ ASBX_DATA: dataDir, ASBX_LOG: process.env.ASBX_LOG || "warn", ...extraEnv }),
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

// Starts Debian's headless chromium with a profile under `tmp` (closed by
// `cleanups`): no background networking, no proxy, and a host resolver that
// resolves nothing but 127.0.0.1 (and localhost, unless `localhost` is
// false). The page, and the list its errors are pushed to.
async function openBrowser(tmp, cleanups, { localhost = true } = {}) {
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
      "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" + (localhost ? ", EXCLUDE localhost" : ""),
    ],
  });
  cleanups.push(() => context.close());
  context.setDefaultTimeout(WAIT_LIMIT_MS);
  const page = context.pages()[0] ?? (await context.newPage());
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  return { context, page, pageErrors };
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

// The rendered thread, normalised: its HTML with runs of whitespace between
// tags dropped. Scroll positions and other state live outside the DOM.
async function threadDom(page) {
  return page.$eval("#thread", (t) => t.innerHTML.replace(/>\s+</g, "><"));
}

// Waits until the composer is idle (the turn has settled).
async function settled(page) {
  await page.waitForSelector("#composer[data-busy=false]");
}

async function send(page, prompt) {
  await page.fill("#message", prompt);
  await page.click("#send");
}

test("web chat: streaming text, live tool output, a crash explained, sanitised Markdown, the same DOM after a reload, an encrypted run opened with WebCrypto", { timeout: 600_000 }, async (t) => {
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

  const { context, page, pageErrors } = await openBrowser(tmp, cleanups, { localhost: false });
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
    // 1. Open the page and send the first message; watch the answer's text
    //    as it changes.
    await page.goto(base);
    await page.waitForSelector("#app:not([hidden])");
    await page.evaluate(() => {
      window.seenTexts = [];
      new MutationObserver(() => {
        const t = document.querySelector("[data-role=assistant] > [data-part=text]");
        const text = t ? t.textContent : "";
        if (text && window.seenTexts[window.seenTexts.length - 1] !== text) {
          if (!window.seenTexts.length) window.firstTextAt = Date.now();
          window.seenTexts.push(text);
        }
      }).observe(document.getElementById("thread"), { subtree: true, childList: true, characterData: true });
    });
    await send(page, PROMPT);

    // 2. A shell step row shows up running and shows its output live: the
    //    second line is on the page while the step still runs.
    const running = await page.waitForSelector(
      "[data-role=assistant] [data-step-name=shell][data-status=running]",
    );
    const stepId = await running.getAttribute("data-step-id");
    assert.ok(stepId, "the step row has an id");
    const liveOutput = await page.waitForFunction((id) => {
      const row = document.querySelector(`[data-step-id="${id}"]`);
      const pre = row && row.querySelector("[data-part=output]:not([hidden]) pre");
      return pre && pre.textContent.includes("tick2") ? { status: row.dataset.status, text: pre.textContent } : null;
    }, stepId);
    const seen = await liveOutput.jsonValue();
    assert.equal(seen.status, "running", "output shown while the step runs");
    assert.ok(!seen.text.includes("tick5"), `not all at once: ${JSON.stringify(seen.text)}`);
    await page.waitForSelector(`[data-role=assistant] [data-step-id="${stepId}"][data-status=succeeded]`);

    // 3. The answer streams in (several growing versions), then renders as
    //    sanitised Markdown.
    await page.waitForFunction(
      (answer) => [...document.querySelectorAll("[data-role=assistant] > [data-part=text]")]
        .some((e) => e.textContent.trim() === answer),
      ANSWER_TEXT,
    );
    await settled(page);
    const texts = await page.evaluate(() => window.seenTexts);
    const partial = texts.filter((t) => t.trim() && t.trim() !== ANSWER_TEXT);
    assert.ok(partial.length >= 3, `text appeared word by word: ${JSON.stringify(texts)}`);
    for (let i = 1; i < partial.length; i++) {
      assert.ok(partial[i].length >= partial[i - 1].length, `text only grows: ${JSON.stringify(partial)}`);
    }
    const answerHtml = await page.$eval("[data-role=assistant] > [data-part=text]", (e) => e.innerHTML);
    assert.match(answerHtml, /<strong>Done<\/strong>/);
    assert.match(answerHtml, /<code>dusted<\/code>/);
    const output = await page.$eval(`[data-step-id="${stepId}"] [data-part=output] pre`, (e) => e.textContent);
    assert.equal(output, TICKS);

    const chatId = new URL(page.url()).hash.match(/chat=([A-Za-z0-9_-]+)/)?.[1];
    assert.ok(chatId, `the page names the chat in its URL: ${page.url()}`);
    await page.waitForSelector(`#chat-list [data-chat-id="${chatId}"]`);

    // A figure, not an assertion: from the runner stamping the model's first
    // token to that token on the page (the finished turn's stream is still
    // attachable for a minute, and replays from its start).
    const replay = await (await fetch(`${base}/api/assistant/chats/${chatId}/stream`)).text();
    const firstDelta = replay.split("\n\n").find((f) => f.includes("event: delta"));
    if (firstDelta) {
      const ts = JSON.parse(firstDelta.split("\n").find((l) => l.startsWith("data: ")).slice(6)).ts;
      const shownAt = await page.evaluate(() => window.firstTextAt);
      t.diagnostic(`first token: stamped by the runner to shown on the page in ${shownAt - ts} ms`);
    }

    // 4. A turn whose sandbox crashes says so in plain words, with the exit
    //    code, and its stderr on demand.
    await send(page, CRASH);
    await page.waitForSelector("[data-role=assistant]:nth-of-type(4) [data-part=error][data-code=sandbox_crashed] [data-part=stderr]");
    await settled(page);
    const failure = await page.$eval("[data-role=assistant]:nth-of-type(4) [data-part=error]", (e) => e.textContent);
    assert.match(failure, /The sandbox crashed\./);
    assert.match(failure, /exit code 3/);
    assert.match(failure, /scripted crash/);

    // 5. Markup in an answer is shown as text, never as live HTML, and
    //    links are sanitised: no image, script, handler, style or
    //    javascript: link; nothing ran.
    await send(page, HOSTILE);
    await page.waitForFunction(() => document.querySelectorAll("[data-role=assistant]").length === 3 &&
      document.querySelector("[data-role=assistant]:nth-of-type(6) > [data-part=text]").textContent.includes("bold"));
    await settled(page);
    const hostile = await page.$eval("[data-role=assistant]:nth-of-type(6) > [data-part=text]", (e) => ({
      html: e.innerHTML,
      text: e.textContent,
      elements: [...e.querySelectorAll("*")].map((n) => n.tagName.toLowerCase()),
      links: [...e.querySelectorAll("a")].map((a) => a.getAttribute("href")),
    }));
    assert.deepEqual(hostile.elements, ["p", "a"], hostile.html);
    assert.deepEqual(hostile.links, [null], "the javascript: link has no href");
    assert.ok(hostile.text.includes("<img src=x onerror="), hostile.text);
    assert.ok(hostile.text.includes("<b style="), hostile.text);
    assert.equal(await page.evaluate(() => window.pwned), undefined);

    // 6. Reload: the thread from history is the same DOM as the live one
    //    (nothing was swapped in after the live turns).
    const live = await threadDom(page);
    await page.reload();
    await page.waitForSelector(`#thread [data-step-id="${stepId}"]`);
    await settled(page);
    assert.equal(await threadDom(page), live);

    // 7. A fresh page (no chat in the URL): open the chat from the list.
    await page.goto(base);
    await page.waitForSelector("#app:not([hidden])");
    await page.click(`#chat-list [data-chat-id="${chatId}"]`);
    await page.waitForSelector(`#thread [data-step-id="${stepId}"]`);
    await settled(page);
    assert.equal(await threadDom(page), live);

    // 8. End-to-end encryption in the browser, with WebCrypto alone: an
    //    encrypted run through the workspace's /api/runs opens under the key
    //    agreed with the runner; a tampered, a reordered and a relabelled
    //    line do not, and no line opens under a wrong key.
    const enc = await page.evaluate(encryptedRunInThePage, ENCRYPTED_PROMPT);
    assert.equal(enc.status, 200);
    assert.equal(enc.plaintextOnTheWire, false, "no plaintext on the wire");
    assert.equal(enc.initType, "session_init");
    assert.ok(enc.sealed >= 4, `sealed lines: ${enc.sealed}`);
    assert.equal(enc.opened, enc.sealed, "every sealed line opens");
    assert.ok(enc.texts.some((t) => t.includes("the secret answer is 42")), JSON.stringify(enc.texts));
    assert.ok(enc.texts.some((t) => t.includes("tool-secret-marker")), JSON.stringify(enc.texts));
    assert.deepEqual(enc.altered, [false, false, false], "tampered, reordered, relabelled");
    assert.equal(enc.openedWithWrongKey, 0);
    t.diagnostic(`encrypted run: ${enc.sealed} sealed lines opened in the page with WebCrypto`);
    assert.deepEqual(pageErrors, [], "no errors in the page");
  } catch (e) {
    t.diagnostic(`asbx output (tail):\n${asbx.output.join("").slice(-8_000)}`);
    t.diagnostic(`page html (tail):\n${(await page.content().catch(() => "")).slice(-4_000)}`);
    throw e;
  }
});

// A TCP proxy between the browser and asbx whose live connections the test
// cuts, as a dropped network would. It rewrites the browser's idea of the
// origin (its own port) into asbx's, so Host and Origin checks see asbx.
async function cuttableProxy(target) {
  const net = await import("node:net");
  const { port: upPort } = new URL(target);
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(upPort), "127.0.0.1");
    sockets.add(client);
    sockets.add(upstream);
    const own = `127.0.0.1:${server.address().port}`;
    client.on("data", (b) => upstream.write(Buffer.from(b.toString("latin1").split(own).join(`127.0.0.1:${upPort}`), "latin1")));
    upstream.on("data", (b) => client.write(b));
    const end = () => { client.destroy(); upstream.destroy(); sockets.delete(client); sockets.delete(upstream); };
    client.on("error", end); upstream.on("error", end); client.on("close", end); upstream.on("close", end);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    cut: () => { for (const s of sockets) s.destroy(); sockets.clear(); },
    close: () => new Promise((r) => { for (const s of sockets) s.destroy(); server.close(r); }),
  };
}

test("assistant: an environment and a model chosen on the page, a file made through the in-sandbox API, a dropped network resumed, another tab updated live, history paged", { timeout: 600_000 }, async (t) => {
  assert.ok(existsSync(ASBX_BIN), `${ASBX_BIN} is missing: run cargo build -p asbx first`);
  const cleanups = [];
  t.after(async () => {
    for (const undo of cleanups.reverse()) {
      try { await undo(); } catch (e) { t.diagnostic(`cleanup: ${e.message}`); }
    }
  });
  const tmp = await mkdtemp(path.join(tmpdir(), "asbx-e2e-assistant-"));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));
  const asbx = startAsbx(path.join(tmp, "data"));
  cleanups.push(() => stopProcess(asbx.child));
  const base = await asbx.ready;
  const proxy = await cuttableProxy(base);
  cleanups.push(() => proxy.close());

  const { context, page, pageErrors } = await openBrowser(tmp, cleanups, { localhost: false });
  const resumes = [];
  page.on("request", (r) => {
    if (r.method() === "GET" && r.url().endsWith("/stream")) resumes.push(r.headers()["last-event-id"]);
  });

  await page.goto(proxy.url);
  await page.waitForSelector("#app:not([hidden])");
  await page.evaluate(() => { window.sameDocument = true; });
  // An environment made in the page: a variable and a write-only secret.
  await page.click("#settings > summary");
  await page.click("#environments > summary");
  await page.fill("#env-name", "staging");
  await page.fill("#env-vars", "GREETING=hello-from-env");
  await page.fill("#env-secrets", "TOKEN=s3cret-token");
  await page.click("#env-save");
  const envItem = await page.waitForSelector("#env-list li[data-env-id]");
  assert.match(await envItem.textContent(), /staging · secrets set: TOKEN/);
  assert.ok(!(await page.content()).includes("s3cret-token"), "the secret is not shown back");
  const envId = await envItem.getAttribute("data-env-id");
  await page.selectOption("#set-env", envId);
  await page.selectOption("#set-model", "scripted:demo");
  // A 5 MB attachment, hashed here and in the sandbox.
  const big = Buffer.alloc(5 * 1024 * 1024);
  for (let i = 0; i < big.length; i++) big[i] = (i * 131 + 7) & 0xff;
  const { createHash } = await import("node:crypto");
  const bigHash = createHash("sha256").update(big).digest("hex");
  await page.setInputFiles("#attach", { name: "big.bin", mimeType: "application/octet-stream", buffer: big });
  await page.waitForFunction(() => document.querySelector("#pending").textContent.includes("big.bin"));

  // The turn reads the environment, writes a file into the chat's bag
  // through the in-sandbox workspace API, and sleeps long enough for the
  // network to drop under it.
  const prompt = JSON.stringify({
    script: [
      { tool: "shell", args: { command: "echo $GREETING; sha256sum attachments/big.bin" } },
      { tool: "workspace_create_file", args: { path: "summary.txt", content: "a summary written in the sandbox" } },
      { tool: "shell", args: { command: "sleep 3; echo after-the-drop" } },
      { say: "All done, the summary is in the bag." },
    ],
  });
  await send(page, prompt);
  await page.waitForFunction(() => document.querySelector("#thread").textContent.includes("hello-from-env"));
  await page.waitForFunction((h) => document.querySelector("#thread").textContent.includes(h), bigHash);
  await page.waitForSelector("[data-step-name=shell][data-status=running] >> nth=0");
  // The network drops mid-turn; the page resumes by itself, no reload.
  await page.waitForFunction(() => document.querySelectorAll("[data-step-name=shell]").length >= 2);
  proxy.cut();
  await page.waitForFunction(() => document.querySelector("#thread").textContent.includes("All done, the summary is in the bag."));
  await settled(page);
  assert.equal(await page.evaluate(() => window.sameDocument), true, "no reload");
  assert.ok(resumes.some((id) => Number(id) > 0), `resumed with Last-Event-ID: ${JSON.stringify(resumes)}`);
  // What streamed after the drop shows once: the last step's live output
  // and the answer, no frame twice.
  const outputs = await page.$$eval("[data-step-name=shell] [data-part=output] pre", (p) => p.map((x) => x.textContent));
  assert.equal(outputs[outputs.length - 1], "after-the-drop\n", JSON.stringify(outputs));
  const answers = await page.$$eval("[data-role=assistant] > [data-part=text]", (n) => n.map((x) => x.textContent.trim()));
  assert.deepEqual(answers, ["All done, the summary is in the bag."]);
  await page.waitForFunction(() => document.querySelector("#bag-list").textContent.includes("summary.txt"));
  const chatId = await page.evaluate(() => location.hash.replace("#chat=", ""));
  const detail = await (await fetch(`${base}/api/assistant/chats/${chatId}`)).json();
  assert.equal(detail.settings.environmentId, envId);
  assert.ok(!JSON.stringify(detail).includes("s3cret-token"), "the secret is never answered");

  // Another tab on the same chat sees this tab's next turn live, without a
  // reload (GET /api/assistant/events).
  const page2 = await context.newPage();
  page2.on("pageerror", (e) => pageErrors.push(e.message));
  await page2.goto(`${base}/#chat=${chatId}`);
  await page2.waitForSelector("#app:not([hidden])");
  await page2.waitForFunction(() => document.querySelector("#thread").textContent.includes("All done"));
  await page2.evaluate(() => { window.sameDocument = true; });
  await send(page, JSON.stringify({ script: [{ say: "seen in the other tab" }] }));
  await page2.waitForFunction(() => document.querySelector("#thread").textContent.includes("seen in the other tab"));
  assert.equal(await page2.evaluate(() => window.sameDocument), true, "the other tab did not reload");
  await settled(page);
  await page2.close();

  // A long thread: the page shows the newest page and loads earlier ones.
  for (let i = 0; i < 50; i++) {
    const r = await fetch(`${base}/api/assistant/chat/stream`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ chatId, message: JSON.stringify({ script: [{ say: `reply ${i}` }] }) }),
    });
    await r.text();
  }
  await page.reload();
  await page.waitForSelector("#earlier");
  const before = await page.$$eval("[data-role]", (n) => n.length);
  assert.equal(before, 100, "the newest page");
  await page.click("#earlier");
  await page.waitForFunction((n) => document.querySelectorAll("[data-role]").length > n, before);
  const all = await page.$$eval("[data-role]", (n) => n.length);
  assert.equal(all, 104, "every message once");
  assert.equal(await page.$("#earlier"), null, "nothing older");
  assert.deepEqual(pageErrors, []);
});

// A plain TCP forwarder on another loopback port, the shape of `ssh -L
// 9000:localhost:7878` or a forwarded port: bytes both ways, nothing
// rewritten, so the browser's Host and Origin name the forwarder's port.
async function forwarder(target) {
  const net = await import("node:net");
  const upPort = Number(new URL(target).port);
  const sockets = new Set();
  const server = net.createServer((client) => {
    const upstream = net.connect(upPort, "127.0.0.1");
    sockets.add(client);
    sockets.add(upstream);
    client.pipe(upstream);
    upstream.pipe(client);
    const end = () => { client.destroy(); upstream.destroy(); sockets.delete(client); sockets.delete(upstream); };
    for (const s of [client, upstream]) { s.on("error", end); s.on("close", end); }
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    port: server.address().port,
    close: () => new Promise((r) => { for (const s of sockets) s.destroy(); server.close(r); }),
  };
}

test("through a forwarded port (an SSH tunnel): the page loads under the tunnel's Host, a chat turn runs, a command that exits 3 shows failed with its exit code and its output", { timeout: 600_000 }, async (t) => {
  assert.ok(existsSync(ASBX_BIN), `${ASBX_BIN} is missing: run cargo build -p asbx first`);
  const cleanups = [];
  t.after(async () => {
    for (const undo of cleanups.reverse()) {
      try { await undo(); } catch (e) { t.diagnostic(`cleanup: ${e.message}`); }
    }
  });
  const tmp = await mkdtemp(path.join(tmpdir(), "asbx-e2e-tunnel-"));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));
  const asbx = startAsbx(path.join(tmp, "data"));
  cleanups.push(() => stopProcess(asbx.child));
  const base = await asbx.ready;
  const fwd = await forwarder(base);
  cleanups.push(() => fwd.close());
  assert.notEqual(fwd.port, 2024, "a port this test must not touch");
  assert.notEqual(String(fwd.port), new URL(base).port);
  const tunnel = `localhost:${fwd.port}`;

  const { page, pageErrors } = await openBrowser(tmp, cleanups);
  const hosts = new Set();
  page.on("request", (r) => hosts.add(new URL(r.url()).host));
  page.on("response", (r) => {
    if (r.status() >= 400 && new URL(r.url()).pathname !== "/favicon.ico") {
      pageErrors.push(`${r.status()} ${r.request().method()} ${r.url()}`);
    }
  });

  try {
    const res = await page.goto(`http://${tunnel}/`);
    assert.equal(res.status(), 200, `the page through the tunnel: ${await res.text()}`);
    await page.waitForSelector("#app:not([hidden])");
    await send(page, JSON.stringify({
      script: [
        { tool: "shell", args: { command: "echo partial-output; exit 3" } },
        { say: "Through the tunnel." },
      ],
    }));
    const step = "[data-role=assistant] [data-step-name=shell][data-status=failed]";
    await page.waitForSelector(step);
    await page.waitForFunction(() => [...document.querySelectorAll("[data-role=assistant] > [data-part=text]")]
      .some((e) => e.textContent.trim() === "Through the tunnel."));
    await settled(page);
    const shown = async () => page.$eval(step, (row) => ({
      badge: row.querySelector(".head .badge").textContent,
      why: row.querySelector("[data-part=step-error]")?.textContent ?? "",
      output: row.querySelector("[data-part=output] pre")?.textContent ?? "",
      result: row.querySelector("[data-part=io] pre.result")?.textContent ?? "",
    }));
    const live = await shown();
    assert.equal(live.badge, "failed");
    assert.match(live.why, /exited with code 3/);
    assert.equal(live.output, "partial-output\n");
    assert.match(live.result, /"exitCode": 3/);
    // The thread from history shows it the same way.
    await page.reload();
    await page.waitForSelector(step);
    await settled(page);
    assert.deepEqual(await shown(), live);
    assert.deepEqual([...hosts], [tunnel], "every request went through the tunnel");
    assert.deepEqual(pageErrors, [], "no errors in the page");
  } catch (e) {
    t.diagnostic(`asbx output (tail):\n${asbx.output.join("").slice(-8_000)}`);
    t.diagnostic(`page html (tail):\n${(await page.content().catch(() => "")).slice(-4_000)}`);
    throw e;
  }
});

test("queued: a turn waiting for its fair share says so, runs once room frees, and Stop leaves the queue", { timeout: 600_000 }, async (t) => {
  assert.ok(existsSync(ASBX_BIN), `${ASBX_BIN} is missing: run cargo build -p asbx first`);
  const cleanups = [];
  t.after(async () => {
    for (const undo of cleanups.reverse()) {
      try { await undo(); } catch (e) { t.diagnostic(`cleanup: ${e.message}`); }
    }
  });
  const tmp = await mkdtemp(path.join(tmpdir(), "asbx-e2e-queued-"));
  cleanups.push(() => rm(tmp, { recursive: true, force: true }));
  // A runner of 2 sandboxes: a workspace's fair share is 1.
  const asbx = startAsbx(path.join(tmp, "data"), { ASBX_MAX_SANDBOXES: "2", ASBX_QUEUE_WAIT_MS: "120000" });
  cleanups.push(() => stopProcess(asbx.child));
  const base = await asbx.ready;

  // Holds the share: an API run sleeping until it is cancelled.
  const hold = async () => {
    const ac = new AbortController();
    cleanups.push(() => ac.abort());
    const res = await fetch(`${base}/api/runs`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: JSON.stringify({ script: [{ sleep_ms: 110_000 }, { say: "late" }] }), protocol: 2 }),
      signal: ac.signal,
    });
    // The body is left unread: it ends when the run does.
    assert.equal(res.status, 200);
    return res.headers.get("x-asbx-run-id");
  };
  const cancel = async (id) => {
    const res = await fetch(`${base}/api/runs/${id}`, { method: "DELETE" });
    assert.equal(res.status, 202);
  };

  const { page, pageErrors } = await openBrowser(tmp, cleanups);

  try {
    await page.goto(base + "/");
    await page.waitForSelector("#app:not([hidden])");

    // Queued, then run once the held run is cancelled.
    const held = await hold();
    await send(page, JSON.stringify({ script: [{ say: "After the queue." }] }));
    await page.waitForSelector("#composer[data-queued=true]");
    assert.match(await page.textContent("#status"), /^Queued: waiting for a sandbox \(at most 1[12]\d s\)/);
    assert.equal(await page.$$eval("[data-role=assistant] > [data-part=text]", (es) => es.map((e) => e.textContent.trim()).join("")), "", "nothing ran yet");
    await cancel(held);
    await page.waitForFunction(() => [...document.querySelectorAll("[data-role=assistant] > [data-part=text]")]
      .some((e) => e.textContent.trim() === "After the queue."));
    await settled(page);
    assert.equal(await page.$("#composer[data-queued]"), null, "no longer queued");
    const chatId = new URL(page.url()).hash.replace("#chat=", "");
    assert.ok(chatId, "the new chat learnt its id from the turn");

    // Queued again, then Stop: the page leaves the queue, no turn runs.
    const held2 = await hold();
    await send(page, JSON.stringify({ script: [{ say: "never" }] }));
    await page.waitForSelector("#composer[data-queued=true]");
    await page.click("#stop");
    await settled(page);
    await page.waitForFunction(() => [...document.querySelectorAll("[data-role=assistant] [data-part=error]")]
      .some((e) => /Left the queue/.test(e.textContent)));
    await cancel(held2);
    // The chat has the first turn only: nothing of the one that left.
    const chat = await (await fetch(`${base}/api/assistant/chats/${chatId}`)).json();
    const texts = JSON.stringify(chat);
    assert.ok(texts.includes("After the queue."), texts.slice(0, 2_000));
    assert.ok(!texts.includes("never"), "the turn that left the queue was never recorded");
    assert.deepEqual(pageErrors, [], "no errors in the page");
  } catch (e) {
    t.diagnostic(`asbx output (tail):\n${asbx.output.join("").slice(-8_000)}`);
    t.diagnostic(`page html (tail):\n${(await page.content().catch(() => "")).slice(-4_000)}`);
    throw e;
  }
});
