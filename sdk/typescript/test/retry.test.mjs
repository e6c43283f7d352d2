// Reconnect and retry settings against a local scripted HTTP server (no asbx
// needed): a 503 with Retry-After then 200, a stream dropped several times,
// settings from ASBX_URL / ASBX_API_KEY, and a pinned runner key checked
// against a session_init signed here with WebCrypto.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { AsbxClient, AsbxError } from "../dist/index.js";

const line = (seq, type, extra = {}) => JSON.stringify({ seq, ts: 1, sessionId: "r1", type, ...extra }) + "\n";

/** A loopback server answering "METHOD /path?query" with `routes[key](req, res, n)`, n = that key's call count. */
async function scripted(routes) {
  const calls = [];
  const auth = [];
  const server = createServer((req, res) => {
    const key = `${req.method} ${req.url}`;
    const n = calls.filter((c) => c === key).length;
    calls.push(key);
    auth.push(req.headers.authorization);
    req.resume();
    const h = routes[key];
    if (!h) {
      res.writeHead(404, { "content-type": "application/problem+json" });
      return res.end(JSON.stringify({ code: "not_found", status: 404, detail: key }));
    }
    h(req, res, n);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${server.address().port}`;
  return {
    url,
    calls,
    auth,
    close: () => {
      server.closeAllConnections();
      return new Promise((r) => server.close(r));
    },
  };
}

const json = (res, status, body, headers = {}) => {
  res.writeHead(status, { "content-type": "application/json", ...headers });
  res.end(JSON.stringify(body));
};

/** Sends `data` as the start of a longer body, then cuts the connection. */
const dropAfter = (res, data, headers = {}) => {
  res.writeHead(200, { "content-type": "application/x-ndjson", "content-length": String(data.length + 1000), ...headers });
  res.write(data, () => setTimeout(() => res.destroy(), 10));
};

const MODELS = { models: [{ id: "scripted:test", default: true }] };
const busyThenOk = (_req, res, n) =>
  n === 0
    ? json(res, 503, { code: "at_capacity", status: 503, detail: "busy" }, { "retry-after": "1" })
    : json(res, 200, MODELS);

test("a 503 with Retry-After is sent again after the wait; without retries it is the caller's", async () => {
  const srv = await scripted({ "GET /api/models": busyThenOk });
  try {
    const t0 = Date.now();
    const models = await new AsbxClient({ baseUrl: srv.url, retry: { initialDelayMs: 1 } }).models();
    const waited = Date.now() - t0;
    assert.deepEqual(models.map((m) => m.id), ["scripted:test"]);
    assert.deepEqual(srv.calls, ["GET /api/models", "GET /api/models"]);
    assert.ok(waited >= 900, `Retry-After: 1 honoured, waited ${waited} ms`);
  } finally {
    await srv.close();
  }
  const again = await scripted({ "GET /api/models": busyThenOk });
  try {
    await assert.rejects(
      new AsbxClient({ baseUrl: again.url, maxRetries: 0 }).models(),
      (e) => e instanceof AsbxError && e.status === 503 && e.code === "at_capacity",
    );
    assert.equal(again.calls.length, 1);
  } finally {
    await again.close();
  }
});

test("retries stop at maxRetries; a 500 is not retried", async () => {
  const srv = await scripted({
    "GET /api/models": (_q, res) => json(res, 429, { code: "rate_limited", status: 429 }, { "retry-after": "0" }),
    "GET /api/runs/x": (_q, res) => json(res, 500, { code: "internal", status: 500 }),
  });
  try {
    const c = new AsbxClient({ baseUrl: srv.url, maxRetries: 3, retry: { initialDelayMs: 1 } });
    await assert.rejects(c.models(), (e) => e instanceof AsbxError && e.status === 429);
    assert.equal(srv.calls.filter((k) => k === "GET /api/models").length, 4);
    await assert.rejects(c.runs.get("x"), (e) => e instanceof AsbxError && e.status === 500);
    assert.equal(srv.calls.filter((k) => k === "GET /api/runs/x").length, 1);
  } finally {
    await srv.close();
  }
});

/** A run whose first answer drops after seq 1, whose next `drops` re-reads drop before any line, then the rest. */
function runRoutes(drops) {
  return {
    "POST /api/runs": (_q, res) => dropAfter(res, line(1, "session_init", { protocolVersion: 2, limits: {} }), { "x-asbx-run-id": "r1" }),
    "GET /api/runs/r1": (_q, res) => json(res, 200, { id: "r1", status: "running" }),
    "GET /api/runs/r1/events?after=1": (_q, res, n) => {
      if (n < drops) return dropAfter(res, "");
      res.writeHead(200, { "content-type": "application/x-ndjson" });
      res.end(line(2, "delta", { text: "hi" }) + line(3, "session_ended", { reason: "completed", terminatedBy: "agent", stats: {} }));
    },
  };
}

test("a stream dropped several times resumes within maxAttempts, and fails typed beyond it", async () => {
  const ok = await scripted(runRoutes(3));
  try {
    const c = new AsbxClient({ baseUrl: ok.url, retry: { maxAttempts: 4, initialDelayMs: 1, backoffMultiplier: 1.5 } });
    const seqs = [];
    for await (const ev of c.runs.create({ prompt: "x" })) seqs.push(ev.seq);
    assert.deepEqual(seqs, [1, 2, 3]);
    assert.equal(ok.calls.filter((k) => k === "GET /api/runs/r1/events?after=1").length, 4);
  } finally {
    await ok.close();
  }
  const bad = await scripted(runRoutes(3));
  try {
    const c = new AsbxClient({ baseUrl: bad.url, retry: { maxAttempts: 3, initialDelayMs: 1 } });
    const seqs = [];
    await assert.rejects(
      (async () => {
        for await (const ev of c.runs.create({ prompt: "x" })) seqs.push(ev.seq);
      })(),
      (e) => e instanceof AsbxError && e.code === "connection_lost",
    );
    assert.deepEqual(seqs, [1]);
    assert.equal(bad.calls.filter((k) => k === "GET /api/runs/r1/events?after=1").length, 3, "maxAttempts reconnects, no more");
  } finally {
    await bad.close();
  }
});

test("the URL and the key come from ASBX_URL and ASBX_API_KEY", async () => {
  const srv = await scripted({ "GET /api/models": (_q, res) => json(res, 200, MODELS) });
  const saved = { url: process.env.ASBX_URL, key: process.env.ASBX_API_KEY };
  try {
    process.env.ASBX_URL = srv.url;
    process.env.ASBX_API_KEY = "asbx_key_from_env";
    await new AsbxClient().models();
    await new AsbxClient({ apiKey: "asbx_key_given" }).models();
    assert.deepEqual(srv.auth, ["Bearer asbx_key_from_env", "Bearer asbx_key_given"]);
    delete process.env.ASBX_URL;
    assert.throws(() => new AsbxClient(), /ASBX_URL/);
    assert.throws(() => new AsbxClient({ baseUrl: srv.url, retry: { backoffMultiplier: 0.5 } }), RangeError);
  } finally {
    for (const [k, v] of [["ASBX_URL", saved.url], ["ASBX_API_KEY", saved.key]]) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await srv.close();
  }
});

const b64u = (buf) => Buffer.from(buf).toString("base64url");

/** A session_init signed by `identity` as docs/protocol.md §4 says, with `replace` applied after signing. */
async function signedInit(identity, replace = {}) {
  const ecdh = await crypto.subtle.generateKey({ name: "ECDH", namedCurve: "P-256" }, true, ["deriveBits"]);
  const serverPublicKey = b64u(await crypto.subtle.exportKey("raw", ecdh.publicKey));
  const salt = b64u(crypto.getRandomValues(new Uint8Array(32)));
  const msg = new TextEncoder().encode(`asbx-e2e-v1-sig:r1.${serverPublicKey}.${salt}`);
  const signature = b64u(await crypto.subtle.sign({ name: "ECDSA", hash: "SHA-256" }, identity.privateKey, msg));
  const identityKey = b64u(await crypto.subtle.exportKey("raw", identity.publicKey));
  return {
    algorithm: "ECDH-P256+HKDF-SHA256+AES-256-GCM",
    serverPublicKey,
    salt,
    signature,
    identityKey,
    ...replace,
  };
}

test("a pinned runner key accepts its signature and refuses a substituted key", async () => {
  const ecdsa = { name: "ECDSA", namedCurve: "P-256" };
  const runner = await crypto.subtle.generateKey(ecdsa, true, ["sign", "verify"]);
  const relay = await crypto.subtle.generateKey(ecdsa, true, ["sign", "verify"]);
  const pin = b64u(await crypto.subtle.exportKey("raw", runner.publicKey));
  const genuine = await signedInit(runner);
  const other = await signedInit(runner);
  const cases = [
    ["genuine", genuine, null],
    ["substituted serverPublicKey", { ...genuine, serverPublicKey: other.serverPublicKey }, "signature_invalid"],
    ["re-signed by a relay", await signedInit(relay), "signature_invalid"],
  ];
  for (const [name, init, want] of cases) {
    const srv = await scripted({
      "POST /api/runs": (_q, res) => {
        res.writeHead(200, { "content-type": "application/x-ndjson", "x-asbx-run-id": "r1" });
        res.end(
          line(1, "session_init", { protocolVersion: 2, limits: {}, encryption: init }) +
            line(2, "session_ended", { reason: "completed", terminatedBy: "agent", stats: {} }),
        );
      },
    });
    try {
      const run = new AsbxClient({ baseUrl: srv.url, runnerPublicKey: pin }).runs.create({ prompt: "x", encrypt: true });
      const got = (async () => {
        for await (const _ of run) void _;
      })();
      if (want) await assert.rejects(got, (e) => e instanceof AsbxError && e.code === want, name);
      else await got;
    } finally {
      await srv.close();
    }
  }
});
