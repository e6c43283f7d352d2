// A real `asbx up` for the SDK's tests: started on a loopback port with a
// temporary data directory and auth required, ended by its PID.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const here = dirname(fileURLToPath(import.meta.url));
export const repoRoot = resolve(here, "../../..");
export const ASBX = process.env.ASBX_BIN ?? join(repoRoot, "target/debug/asbx");

/** Why these tests can't run here, or undefined. */
export function missing() {
  if (!existsSync(ASBX)) return `${ASBX} is missing (cargo build -p asbx)`;
  if (process.getuid && process.getuid() !== 0 && !process.env.ASBX_TEST_PROFILE) {
    return "the jailed runner needs root (or set ASBX_TEST_PROFILE)";
  }
  return undefined;
}

/** Starts `asbx up`; resolves to {url, key, stop()}. */
export async function startUp({ requireAuth = true } = {}) {
  const data = mkdtempSync(join(tmpdir(), "asbx-sdk-"));
  const env = { ...process.env, ASBX_DATA: data, ASBX_LOG: "warn" };
  for (const k of ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ASBX_MODEL", "ASBX_RUNNER_TOKEN", "ASBX_METRICS_TOKEN", "ASBX_REQUIRE_AUTH"]) {
    delete env[k];
  }
  if (requireAuth) env.ASBX_REQUIRE_AUTH = "true";
  const profile = process.env.ASBX_TEST_PROFILE ?? "strict";
  const child = spawn(ASBX, ["up", "--listen", "127.0.0.1:0", "--profile", profile], {
    env,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const exited = new Promise((r) => child.once("exit", r));
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error("asbx up printed no banner in 30 s")), 30_000);
    const lines = createInterface({ input: child.stdout });
    lines.on("line", (line) => {
      const m = line.trim().match(/^open\s+(\S+)/);
      if (m) {
        clearTimeout(timer);
        resolveUrl(m[1]);
      }
    });
    child.once("exit", (code) => reject(new Error(`asbx up exited (${code}) before its banner`)));
  });
  child.stdout.resume();
  let key;
  if (requireAuth) {
    const out = execFileSync(ASBX, ["key", "--new-workspace", "sdk-tests"], { env, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    key = out.split("\n").map((l) => l.match(/^key\s+(\S+)/)?.[1]).find(Boolean);
    if (!key) throw new Error(`no key in: ${out}`);
  }
  return {
    url,
    key,
    data,
    pid: child.pid,
    async stop() {
      if (child.exitCode === null) {
        process.kill(child.pid, "SIGTERM");
        const t = setTimeout(() => child.exitCode === null && process.kill(child.pid, "SIGKILL"), 5_000);
        await exited;
        clearTimeout(t);
      }
      rmSync(data, { recursive: true, force: true });
    },
  };
}

/** `{"script": [...]}` for the scripted model. */
export const script = (...steps) => JSON.stringify({ script: steps });

/**
 * A fetch that records every request and cuts the body of the first
 * response whose URL matches `cut.match` after `cut.bytes` bytes (in the
 * middle of a line), as a dropped connection would.
 */
export function recordingFetch({ cut } = {}) {
  const requests = [];
  const wire = [];
  let cutDone = false;
  const f = async (input, init = {}) => {
    const url = String(input);
    const headers = new Headers(init.headers);
    requests.push({ method: init.method ?? "GET", url, headers: Object.fromEntries(headers) });
    const res = await fetch(input, init);
    if (!res.body) return res;
    const reader = res.body.getReader();
    const shouldCut = cut && !cutDone && cut.match(url, init);
    if (shouldCut) cutDone = true;
    let seen = 0;
    let broken = false;
    const body = new ReadableStream({
      async pull(controller) {
        if (broken) {
          controller.error(new TypeError("terminated: connection cut by the test"));
          return;
        }
        const { done, value } = await reader.read();
        if (done) return controller.close();
        wire.push(Buffer.from(value).toString("utf8"));
        if (shouldCut && seen + value.length >= cut.bytes) {
          controller.enqueue(value.subarray(0, cut.bytes - seen));
          reader.cancel().catch(() => {});
          broken = true;
          return;
        }
        seen += value.length;
        controller.enqueue(value);
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return { fetch: f, requests, wire, cut: () => cutDone };
}

const CONTROLLERS = ["memory", "pids", "cpu", "cpu,cpuacct", "freezer", "unified", ""];

/**
 * The sandbox cgroup directories that exist now whose name starts with
 * `prefix`: `asbx-<sessionId>`, or `asbx-warm-<runner pid>-` for the warm pool.
 */
export function cgroupsOf(prefix) {
  const out = [];
  for (const c of CONTROLLERS) {
    const dir = join("/sys/fs/cgroup", c, "asbx");
    let names = [];
    try {
      names = readdirSync(dir);
    } catch {
      continue;
    }
    for (const n of names) if (n.startsWith(prefix)) out.push(join(dir, n));
  }
  return out;
}

/** Processes whose command line contains `needle`. */
export function pidsWith(needle) {
  const out = [];
  for (const e of readdirSync("/proc")) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    let cmd = "";
    try {
      cmd = readFileSync(`/proc/${e}/cmdline`, "utf8").replaceAll("\0", " ");
    } catch {
      continue;
    }
    if (cmd.includes(needle)) out.push(Number(e));
  }
  return out;
}
