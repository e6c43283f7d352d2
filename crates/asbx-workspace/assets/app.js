// asbx chat page: plain JS, no build step.
//
// One rendering path for history and live turns: an assistant message is a
// list of content blocks (step, text, error). History renders the persisted
// blocks; a live turn folds SSE events (step, delta, stdout, result, error,
// session_ended) into the same nodes and re-renders step rows in place by
// step id, so a live thread and the same thread reloaded are the same DOM.
// Tool output and error text go through textContent; the answer's Markdown
// goes through marked and then DOMPurify (vendor/README.md).
//
// Stable hooks for tests (and anyone scripting the page): a message node has
// data-role (user | assistant); its parts have data-part (steps, text,
// error); a step row has data-step-id, data-step-name and data-status, its
// live output is data-part=output; a failure has data-code and its stderr is
// data-part=stderr; a chat in the list has data-chat-id; the composer has
// data-busy while a turn runs.
"use strict";

const $ = (id) => document.getElementById(id);
// `ownTurns`: the turns this page ran or attached to (their end is already
// on screen: a chat event about one must not re-read the thread).
const state = { chatId: null, turn: null, pending: [], abort: null, settings: {}, ownTurns: new Set() };

async function api(path, options = {}) {
  const res = await fetch(path, { credentials: "same-origin", ...options });
  if (!res.ok) {
    let detail = res.statusText;
    try { const p = await res.json(); detail = p.detail || p.title || detail; } catch (_) {}
    const err = new Error(detail);
    err.status = res.status;
    throw err;
  }
  return res.status === 204 ? null : res.json();
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

// ---- rendering -----------------------------------------------------------

function pretty(v) {
  return typeof v === "string" ? v : JSON.stringify(v, null, 2);
}

// Markdown to sanitised DOM: marked makes HTML, with any raw HTML in the
// answer shown as text, not markup; DOMPurify then keeps only safe markup (no
// scripts, handlers, styles, forms or images: an image URL would let a
// model's answer call out to any host), links open in a new tab without a
// referrer. Without the libraries, the text is shown as it is.
const PURIFY = {
  FORBID_TAGS: ["style", "img", "form", "input", "button", "textarea", "select", "iframe", "svg", "math"],
  FORBID_ATTR: ["style"],
  RETURN_DOM_FRAGMENT: true,
};
const HTML_ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
if (window.marked) {
  marked.use({ renderer: { html: (token) => token.text.replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]) } });
}
if (window.DOMPurify) {
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") { node.setAttribute("target", "_blank"); node.setAttribute("rel", "noopener noreferrer"); }
  });
}
function renderMarkdown(target, text) {
  if (!window.marked || !window.DOMPurify) { target.textContent = text; return; }
  target.replaceChildren(DOMPurify.sanitize(marked.parse(text, { gfm: true, breaks: false }), PURIFY));
}

// One step row: a head line (status, name, duration, and why it failed),
// the live output (open, monospace, capped, following its end), then
// arguments and result behind a disclosure.
function renderStep(row, step) {
  row.className = "step " + step.status;
  row.dataset.stepId = step.id;
  row.dataset.stepName = step.name || "";
  row.dataset.status = step.status;
  row.replaceChildren();
  const head = el("div", "head");
  head.append(el("span", "badge", step.status), el("strong", "", step.name));
  if (step.durationMs !== undefined) head.append(el("span", "muted", step.durationMs + " ms"));
  if (step.status === "failed" && step.error) {
    const why = el("span", "err", step.error);
    why.dataset.part = "step-error";
    head.append(why);
  }
  row.append(head);
  const out = el("details", "output");
  out.dataset.part = "output";
  out.open = true;
  out.append(el("summary", "", "Output"), el("pre"));
  out.hidden = true;
  row.append(out);
  renderOutput(row, step);
  const io = el("details", "io");
  io.dataset.part = "io";
  io.append(el("summary", "", "Arguments and result"));
  if (step.args !== undefined) io.append(el("pre", "args", "args: " + pretty(step.args)));
  if (step.result !== undefined) io.append(el("pre", "result", "result: " + pretty(step.result)));
  row.append(io);
}

// The step's live output, kept at its end while the reader is there.
function renderOutput(row, step) {
  const box = row.querySelector(":scope > .output");
  const output = step.output;
  if (!box || !output || (!output.text && !output.truncated)) return;
  box.hidden = false;
  const pre = box.querySelector("pre");
  const atEnd = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 4;
  pre.textContent = output.text;
  let note = box.querySelector(".note");
  if (output.truncated && !note) {
    note = el("div", "note", "Output truncated here; the step's result keeps the tool's own bounded output.");
    box.append(note);
  }
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

// A failed or stopped turn in plain words, then how it ended, the message,
// and the sandbox's stderr on demand.
const WHY = {
  cancelled: "This turn was stopped.",
  sandbox_crashed: "The sandbox crashed.",
  runner_lost: "This turn was interrupted: the workspace lost it before it ended.",
  upstream_failed: "This turn was interrupted: the connection to the sandbox runner broke.",
  model_error: "The model answered with an error.",
  model_timeout: "The model did not answer in time.",
  step_limit_exceeded: "The turn used all the steps it was allowed.",
  tool_limit_exceeded: "The turn used all the tool calls it was allowed.",
  duration_limit_exceeded: "The turn ran out of time.",
  runtime_cap_exceeded: "The sandbox ran past the runner's hard time limit.",
  setup_failed: "The sandbox's setup script failed.",
  otp_rejected: "The sandbox could not start: its one-time token was refused.",
  bootstrap_failed: "The sandbox could not start.",
  writeback_failed: "The files the turn wrote could not be saved.",
  encrypted_error: "The turn failed.",
  internal: "Something went wrong inside asbx.",
};

function renderError(box, failure) {
  box.replaceChildren();
  if (!failure) return;
  box.className = "err failure";
  box.dataset.code = failure.code;
  box.append(el("div", "why", WHY[failure.code] || "The turn failed."));
  const t = failure.termination;
  if (t) {
    const how = [t.terminatedBy === "daemon" ? "Ended by the runner" : "Ended by the agent"];
    if (t.exitCode !== undefined) how.push("exit code " + t.exitCode);
    if (t.signal !== undefined) how.push("signal " + t.signal);
    box.append(el("div", "how", how.join(", ") + "."));
  }
  box.append(el("div", "message", failure.message + " (" + failure.code + ")"));
  const stderr = t && t.stderr;
  if (stderr && (stderr.head || stderr.tail)) {
    const d = el("details", "stderr");
    d.dataset.part = "stderr";
    const lines = stderr.totalLines + (stderr.totalLines === 1 ? " line" : " lines");
    d.append(el("summary", "", "Standard error (" + lines + (stderr.truncated ? ", cut" : "") + ")"));
    if (stderr.head && stderr.tail && stderr.truncated) {
      d.append(el("pre", "head", stderr.head), el("pre", "tail", stderr.tail));
    } else {
      d.append(el("pre", "tail", stderr.tail || stderr.head));
    }
    box.append(d);
  }
}

function part(cls, name, text) {
  const e = el("div", cls, text);
  e.dataset.part = name;
  return e;
}

function assistantNode() {
  const node = el("div", "msg assistant");
  node.dataset.role = "assistant";
  node.append(part("steps", "steps"), part("text md", "text"), part("err", "error"));
  node._text = "";
  return node;
}

// Shows the answer text; while it streams, a token is drawn at once and the
// tokens that follow within the same frame are drawn together at its end.
function setText(node, text, now) {
  node._text = text;
  const draw = () => { node._dirty = false; renderMarkdown(node.querySelector(".text"), node._text); };
  if (now) { cancelAnimationFrame(node._frame || 0); node._frame = 0; draw(); return; }
  if (node._frame) { node._dirty = true; return; }
  draw();
  node._frame = requestAnimationFrame(() => { node._frame = 0; if (node._dirty) draw(); });
}

function stepRow(node, id) {
  const steps = node.querySelector(".steps");
  let row = [...steps.children].find((r) => r.dataset.stepId === id);
  if (!row) { row = el("div", "step"); row._step = { id }; steps.append(row); }
  return row;
}

// Applies one block (persisted) or one live event to an assistant message
// node. History and the live stream go through here alike, so a reload
// renders exactly what the live stream rendered.
function applyBlock(node, block) {
  if (block.type === "step") {
    const row = stepRow(node, block.id);
    const { type, seq, ts, sessionId, ...fields } = block;
    row._step = { ...row._step, ...fields };
    renderStep(row, row._step);
  } else if (block.type === "stdout") {
    const row = [...node.querySelector(".steps").children].find((r) => r.dataset.stepId === block.stepId);
    if (!row) return; // output of a step never announced: the server drops it too
    const step = row._step;
    step.output = step.output || { text: "" };
    step.output.text += block.chunk;
    if (block.truncated) step.output.truncated = true;
    renderOutput(row, step);
  } else if (block.type === "text") {
    setText(node, block.text, true);
  } else if (block.type === "delta") {
    setText(node, node._text + block.text, false);
  } else if (block.type === "error") {
    node._failure = { code: block.code, message: block.message, termination: block.termination };
    if (node._text) setText(node, node._text, true);
    renderError(node.querySelector(".err"), node._failure);
  } else if (block.type === "session_ended") {
    if (block.reason === "completed") return;
    const { type, seq, ts, sessionId, stats, ...rest } = block;
    const termination = { ...rest, stats };
    node._failure = node._failure || {
      code: block.reason === "terminated" ? "cancelled" : "internal",
      message: block.message || "the session ended without an answer",
    };
    node._failure.termination = termination;
    renderError(node.querySelector(".err"), node._failure);
  }
}

// The end of a live turn: what the persisted message does at its end too
// (steps still running are shown failed, the text is drawn now).
function settleNode(node) {
  setText(node, node._text, true);
  node.querySelectorAll(".steps > .step").forEach((row) => {
    if (row._step.status === "running") {
      row._step = { ...row._step, status: "failed", error: row._step.error || "the turn ended before this step finished" };
      renderStep(row, row._step);
    }
  });
}

function chip(file) {
  const c = el("span", "chip");
  const a = el("a", "", file.name || file.path);
  a.href = "/api/files/" + encodeURIComponent(file.id);
  c.append(a);
  return c;
}

function renderMessage(m) {
  if (m.role === "user") {
    const node = el("div", "msg user");
    node.dataset.role = "user";
    const text = m.content.filter((b) => b.type === "text").map((b) => b.text).join("\n");
    node.append(part("text", "text", text));
    if (m.fileAttachments && m.fileAttachments.length) {
      const chips = el("div", "chips");
      m.fileAttachments.forEach((f) => chips.append(chip(f)));
      node.append(chips);
    }
    return node;
  }
  const node = assistantNode();
  m.content.forEach((b) => applyBlock(node, b));
  if (m.id && state.chatId) node.append(forkButton(state.chatId, m.id));
  if (m.turnId) node.append(auditView(m.turnId));
  return node;
}

// "Fork from here": a new chat with the history up to this answer and the
// working directory as its turn left it (POST /api/assistant/chats/{id}/fork).
function forkButton(chatId, messageId) {
  const b = el("button", "fork", "fork from here");
  b.type = "button";
  b.addEventListener("click", async () => {
    try {
      const forked = await api("/api/assistant/chats/" + encodeURIComponent(chatId) + "/fork", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ afterMessageId: messageId }),
      });
      openChat(forked.id);
    } catch (e) { showStatus(e.message, true); }
  });
  return b;
}

// One line of an audit record: its kind and figures, never more than the
// record holds (no secret or content is ever in one).
function auditLine(r) {
  const f = {
    egress: () => `${r.method || ""} ${r.host}:${r.port} ${r.allowed ? "allowed" : "refused " + (r.code || "")} ↑${r.bytesOut} ↓${r.bytesIn}${r.secret ? " secret " + r.secret : ""}`,
    model_call: () => `${r.provider}:${r.model} status ${r.status} tokens ${r.inputTokens ?? "?"}/${r.outputTokens ?? "?"}`,
    tool_call: () => `${r.name} ${r.status}${r.exitCode != null ? " exit " + r.exitCode : ""}${r.durationMs != null ? " " + r.durationMs + " ms" : ""}`,
    callback: () => r.route,
    file_write: () => `${r.path} (${r.size} B, ${r.via})`,
    file_read: () => `${r.path} (${r.size} B, ${r.via})`,
  }[r.kind];
  return `#${r.id} ${r.kind} ${f ? f() : ""}`;
}

// The run's audit records, read when opened (`GET /api/runs/{id}/audit`).
function auditView(runId) {
  const box = el("details", "audit");
  box.append(el("summary", "", "Audit"));
  const list = el("ul", "audit-list");
  box.append(list);
  box.addEventListener("toggle", async () => {
    if (!box.open || box.dataset.loaded) return;
    box.dataset.loaded = "true";
    try {
      const res = await fetch("/api/runs/" + encodeURIComponent(runId) + "/audit", { credentials: "same-origin" });
      if (!res.ok) throw new Error("HTTP " + res.status);
      const lines = (await res.text()).split("\n").filter((l) => l.trim());
      if (!lines.length) list.append(el("li", "muted", "No records"));
      lines.forEach((l) => list.append(el("li", "", auditLine(JSON.parse(l)))));
    } catch (e) {
      list.append(el("li", "error", "Could not read the audit: " + e.message));
    }
  });
  return box;
}

function scrollDown() { const t = $("thread"); t.scrollTop = t.scrollHeight; }

// ---- chats ---------------------------------------------------------------

async function loadChats() {
  const chats = await api("/api/assistant/chats");
  const list = $("chat-list");
  list.replaceChildren();
  for (const c of chats) {
    const li = el("li", c.id === state.chatId ? "active" : "", c.title);
    li.title = c.title;
    li.dataset.chatId = c.id;
    li.onclick = () => openChat(c.id);
    list.append(li);
  }
}

function renderBag(files) {
  const list = $("bag-list");
  list.replaceChildren();
  files.forEach((f) => { const li = el("li"); li.append(chip(f)); list.append(li); });
  $("bag").hidden = files.length === 0;
}

async function openChat(id) {
  if (state.abort) { state.abort.abort(); state.abort = null; }
  state.chatId = id;
  location.hash = id ? "chat=" + id : "";
  $("thread").replaceChildren();
  $("delete-chat").hidden = !id;
  $("chat-title").textContent = "New chat";
  renderBag([]);
  setBusy(false);
  if (!id) { showSettings({}); loadChats(); return; }
  let chat;
  try { chat = await api("/api/assistant/chats/" + encodeURIComponent(id)); }
  catch (e) { showStatus(e.message, true); state.chatId = null; return; }
  $("chat-title").textContent = chat.title;
  if (chat.forkedFrom) {
    const from = chat.forkedFrom;
    const a = el("a", "forked-from", " (forked from another chat)");
    a.href = "#chat=" + from;
    a.addEventListener("click", (e) => { e.preventDefault(); openChat(from); });
    $("chat-title").append(a);
  }
  showSettings(chat.settings || {});
  chat.messages.forEach((m) => $("thread").append(renderMessage(m)));
  showEarlier(id, chat.before);
  renderBag(chat.files);
  scrollDown();
  loadChats();
  if (chat.activeTurnId) {
    // A turn is still in flight (the page was reloaded): re-attach to it.
    const node = assistantNode();
    $("thread").append(node);
    setBusy(true);
    const res = await fetch("/api/assistant/chats/" + encodeURIComponent(id) + "/stream", { credentials: "same-origin" });
    if (res.ok) await consume(res, node); else { node.remove(); setBusy(false); }
  }
}

// ---- chat settings ---------------------------------------------------------
// Model (GET /api/models), named environment (GET /api/environments) and
// system prompt. A new chat sends them with its first turn; an existing one
// PUTs them (skills and MCP servers set through the API are kept).

async function loadSettingChoices() {
  const [models, envs] = await Promise.all([
    api("/api/models").catch(() => ({ models: [] })),
    api("/api/environments").catch(() => ({ environments: [] })),
  ]);
  const m = $("set-model");
  m.replaceChildren();
  models.models.forEach((x) => {
    const o = el("option", null, x.id + (x.default ? " (default)" : ""));
    o.value = x.id;
    if (x.default) o.selected = true;
    m.append(o);
  });
  state.environments = envs.environments;
  const e = $("set-env");
  e.replaceChildren(Object.assign(el("option", null, "None"), { value: "" }));
  envs.environments.forEach((x) => { const o = el("option", null, x.name); o.value = x.id; e.append(o); });
  renderEnvironments();
  showSettings(state.settings);
}

// The workspace's named environments: listed with their secrets' names
// only (the values are write-only), edited by name, deleted.
function renderEnvironments() {
  const list = $("env-list");
  list.replaceChildren();
  (state.environments || []).forEach((env) => {
    const li = el("li");
    li.dataset.envId = env.id;
    const secrets = env.secretNames.length ? " · secrets set: " + env.secretNames.join(", ") : "";
    li.append(el("span", null, env.name + secrets + " "));
    // Secrets set at the egress proxy: where, never the value.
    const injected = Object.entries(env.injectedSecrets || {});
    if (injected.length) {
      const ul = el("ul", "env-injected");
      injected.forEach(([name, i]) => {
        ul.append(el("li", null, name + " → " + i.header + " on " + i.hosts.join(", ") + " (set at the egress proxy; the sandbox sees asbx-secret:" + name + ")"));
      });
      li.append(ul);
    }
    const edit = el("button", "link", "Edit");
    edit.type = "button";
    edit.onclick = () => {
      $("env-name").value = env.name;
      $("env-vars").value = Object.entries(env.variables).map(([k, v]) => k + "=" + v).join("\n");
      $("env-secrets").value = "";
      $("env-setup").value = env.setupScript || "";
      $("env-hosts").value = (env.allowedHosts || []).join(", ");
    };
    const del = el("button", "link danger", "Delete");
    del.type = "button";
    del.onclick = async () => {
      if (!confirm("Delete the environment " + env.name + "?")) return;
      await api("/api/environments/" + encodeURIComponent(env.id), { method: "DELETE" }).catch((e) => showStatus(e.message, true));
      loadSettingChoices();
    };
    li.append(edit, del);
    list.append(li);
  });
}

function pairs(text) {
  const out = {};
  text.split("\n").map((l) => l.trim()).filter(Boolean).forEach((l) => {
    const i = l.indexOf("=");
    if (i > 0) out[l.slice(0, i).trim()] = l.slice(i + 1);
  });
  return out;
}

async function saveEnvironment(ev) {
  ev.preventDefault();
  const name = $("env-name").value.trim();
  const body = {
    name,
    variables: pairs($("env-vars").value),
    setupScript: $("env-setup").value.trim() ? $("env-setup").value : undefined,
    allowedHosts: $("env-hosts").value.split(",").map((h) => h.trim()).filter(Boolean),
  };
  const secrets = pairs($("env-secrets").value);
  if (Object.keys(secrets).length) body.secrets = secrets;
  const existing = (state.environments || []).find((x) => x.name === name);
  try {
    await api(existing ? "/api/environments/" + encodeURIComponent(existing.id) : "/api/environments", {
      method: existing ? "PUT" : "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    $("env-form").reset();
    showStatus("Environment " + name + " saved.");
    await loadSettingChoices();
  } catch (e) { showStatus(e.message, true); }
}

function showSettings(settings) {
  state.settings = settings;
  const model = settings.model || (settings.effective && settings.effective.model);
  if (model) $("set-model").value = model;
  $("set-env").value = settings.environmentId || "";
  $("set-prompt").value = settings.systemPrompt || "";
  const extra = {};
  if (settings.skills && settings.skills.length) extra.skills = settings.skills;
  if (settings.mcpServers && settings.mcpServers.length) extra.mcpServers = settings.mcpServers;
  $("set-extra").value = Object.keys(extra).length ? JSON.stringify(extra, null, 1) : "";
}

function chosenSettings() {
  const out = {};
  let extra = {};
  if ($("set-extra").value.trim()) {
    try { extra = JSON.parse($("set-extra").value); }
    catch (_) { throw new Error("Skills and MCP servers: not valid JSON"); }
  }
  if (extra.skills && extra.skills.length) out.skills = extra.skills;
  if (extra.mcpServers && extra.mcpServers.length) out.mcpServers = extra.mcpServers;
  if ($("set-model").value) out.model = $("set-model").value;
  if ($("set-env").value) out.environmentId = $("set-env").value;
  if ($("set-prompt").value.trim()) out.systemPrompt = $("set-prompt").value;
  return out;
}

async function saveSettings() {
  if (!state.chatId) { showStatus("Settings apply from this chat's first message."); return; }
  try {
    const saved = await api("/api/assistant/chats/" + encodeURIComponent(state.chatId) + "/settings", {
      method: "PUT",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(chosenSettings()),
    });
    showSettings(saved);
    showStatus("Settings saved.");
  } catch (e) { showStatus(e.message, true); }
}

// A long thread loads a page at a time (newest first): "Load earlier" at
// the top fetches the page before the cursor and keeps the view in place.
function showEarlier(id, before) {
  const old = $("earlier");
  if (old) old.remove();
  if (before === null || before === undefined) return;
  const b = el("button", "link", "Load earlier messages");
  b.id = "earlier";
  b.type = "button";
  b.onclick = async () => {
    b.disabled = true;
    let page;
    try {
      page = await api("/api/assistant/chats/" + encodeURIComponent(id) + "?before=" + encodeURIComponent(before));
    } catch (e) { showStatus(e.message, true); b.disabled = false; return; }
    if (state.chatId !== id) return;
    const t = $("thread");
    const height = t.scrollHeight;
    b.remove();
    const first = t.firstChild;
    page.messages.forEach((m) => t.insertBefore(renderMessage(m), first));
    t.scrollTop += t.scrollHeight - height;
    showEarlier(id, page.before);
  };
  $("thread").prepend(b);
}

// ---- a turn --------------------------------------------------------------

function setBusy(busy) {
  $("send").disabled = busy;
  $("composer").dataset.busy = busy ? "true" : "false";
  $("stop").hidden = !busy;
  showStatus(busy ? "Working…" : "");
}

function showStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "muted";
}

// Reads an SSE response, folding events into the assistant node. A
// dropped connection resumes by itself with Last-Event-ID (the frames after
// the last one folded in, so no text twice), backing off up to 30 s, until
// the turn's `done` or until the turn is no longer in flight (then the
// thread is read back).
async function consume(res, node) {
  let chatId = state.chatId;
  let lastId = null;
  let finished = false;
  let left = false;
  let noTurn = false;
  for (let attempt = 0; ; attempt++) {
    const outcome = await consumeOnce(res, node, (id) => { lastId = id; attempt = 0; });
    // A new chat learns its id from the turn's first event.
    if (chatId === null) chatId = state.chatId;
    if (outcome === "done") { finished = true; break; }
    // Refused after waiting in the queue, or the queue given up: no turn ran.
    if (outcome === "refused" || outcome === "unqueued") { delete $("composer").dataset.queued; noTurn = true; break; }
    if (outcome === "left" || state.chatId !== chatId) { left = true; break; }
    const id = chatId;
    if (!id) break;
    showStatus("Reconnecting…", true);
    $("composer").dataset.reconnecting = "true";
    await new Promise((r) => setTimeout(r, Math.min(30000, 500 * 2 ** Math.min(attempt, 6))));
    if (state.chatId !== id) { left = true; break; }
    const headers = lastId === null ? {} : { "Last-Event-ID": lastId };
    try {
      res = await fetch("/api/assistant/chats/" + encodeURIComponent(id) + "/stream", { credentials: "same-origin", headers });
    } catch (_) { res = null; continue; }
    if (res.status === 404) { res = null; break; }
    if (!res.ok) { res = null; continue; }
    showStatus("Working…");
  }
  delete $("composer").dataset.reconnecting;
  state.abort = null;
  state.turn = null;
  if (left) return;
  setBusy(false);
  // The error block says why; the thread is as it was.
  if (noTurn) return;
  if (!finished && state.chatId) {
    // The turn ended while we were away: the thread has how.
    return openChat(state.chatId);
  }
  if (finished && state.chatId) {
    // The live view stays as it is (it renders what a reload renders); only
    // the bag and the title may have changed.
    const chat = await api("/api/assistant/chats/" + encodeURIComponent(state.chatId)).catch(() => null);
    if (chat) {
      renderBag(chat.files);
      $("chat-title").textContent = chat.title;
    }
    loadChats();
  }
}

// One SSE response: "done" after the turn's done, "left" when the page
// stopped reading (another chat), "dropped" when the connection ended first.
async function consumeOnce(res, node, onId) {
  if (!res) return "dropped";
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let left = false;
  let unqueued = false;
  state.abort = {
    abort: () => { left = true; reader.cancel(); },
    // Stop while queued: closing the request gives up the turn's place.
    unqueue: () => { unqueued = true; reader.cancel(); },
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let event = "message", data = "", id = null;
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
          else if (line.startsWith("id:")) id = line.slice(3).trim();
        }
        if (id !== null) onId(id);
        if (!data) continue;
        const payload = JSON.parse(data);
        const t = $("thread");
        const nearEnd = t.scrollHeight - t.scrollTop - t.clientHeight < 80;
        if (event === "queued") {
          // Waiting for a sandbox (the workspace's fair share of the fleet).
          $("composer").dataset.queued = "true";
          showStatus("Queued: waiting for a sandbox (at most " + payload.waitS + " s)…");
          continue;
        } else if (event === "refused") {
          const p = payload.problem || {};
          applyBlock(node, { type: "error", code: p.code || String(payload.status), message: p.detail || "refused" });
          settleNode(node);
          return "refused";
        } else if (event === "turn") {
          if ($("composer").dataset.queued) { delete $("composer").dataset.queued; showStatus("Working…"); }
          state.turn = payload.turnId;
          state.ownTurns.add(payload.turnId);
          if (!state.chatId) { state.chatId = payload.chatId; location.hash = "chat=" + payload.chatId; loadChats(); }
        } else if (event === "step" || event === "delta" || event === "stdout" || event === "session_ended") {
          applyBlock(node, { ...payload, type: event });
        } else if (event === "result") {
          applyBlock(node, { type: "text", text: payload.message });
        } else if (event === "error") {
          applyBlock(node, { type: "error", code: payload.code, message: payload.message });
        } else if (event === "done") {
          settleNode(node);
          // As the thread from history shows it (renderMessage).
          if (payload.messageId && state.chatId) node.append(forkButton(state.chatId, payload.messageId));
          if (payload.turnId) node.append(auditView(payload.turnId));
          if (nearEnd) scrollDown();
          return "done";
        }
        if (nearEnd) scrollDown();
      }
    }
  } catch (_) {
    // A network error: resumed by the caller.
  }
  if (unqueued) {
    applyBlock(node, { type: "error", code: "cancelled", message: "Left the queue: no turn ran." });
    settleNode(node);
    return "unqueued";
  }
  return left ? "left" : "dropped";
}

async function send(ev) {
  ev.preventDefault();
  const message = $("message").value;
  if (!message.trim()) return;
  const attachments = state.pending.slice();
  const user = renderMessage({
    role: "user",
    content: [{ type: "text", text: message }],
    fileAttachments: attachments.map((f) => ({ id: f.id, name: f.path })),
  });
  $("thread").append(user);
  const node = assistantNode();
  $("thread").append(node);
  scrollDown();
  setBusy(true);
  const body = { message };
  if (state.chatId) body.chatId = state.chatId;
  else {
    try { body.settings = chosenSettings(); }
    catch (e) { applyBlock(node, { type: "error", code: "settings", message: e.message }); setBusy(false); return; }
  }
  if (attachments.length) body.attachmentIds = attachments.map((f) => f.id);
  let res;
  try {
    res = await fetch("/api/assistant/chat/stream", {
      method: "POST",
      credentials: "same-origin",
      // Answered at once when the turn must wait for a sandbox (event
      // `queued`), not after the wait.
      headers: { "content-type": "application/json", "prefer": "queued-notice" },
      body: JSON.stringify(body),
    });
  } catch (e) {
    applyBlock(node, { type: "error", code: "network", message: e.message });
    setBusy(false);
    return;
  }
  if (!res.ok) {
    let p = {};
    try { p = await res.json(); } catch (_) {}
    applyBlock(node, { type: "error", code: p.code || String(res.status), message: p.detail || res.statusText });
    const chatId = res.headers.get("x-asbx-chat-id");
    if (chatId && !state.chatId) { state.chatId = chatId; location.hash = "chat=" + chatId; loadChats(); }
    setBusy(false);
    return;
  }
  $("message").value = "";
  state.pending = [];
  renderPending();
  await consume(res, node);
}

async function stop() {
  if ($("composer").dataset.queued && state.abort) return state.abort.unqueue();
  if (!state.chatId) return;
  try { await api("/api/assistant/chats/" + encodeURIComponent(state.chatId) + "/cancel", { method: "POST" }); }
  catch (e) { showStatus(e.message, true); }
}

async function deleteChat() {
  if (!state.chatId || !confirm("Delete this chat and its files?")) return;
  await api("/api/assistant/chats/" + encodeURIComponent(state.chatId), { method: "DELETE" }).catch((e) => showStatus(e.message, true));
  openChat(null);
}

function renderPending() {
  const box = $("pending");
  box.replaceChildren();
  state.pending.forEach((f) => box.append(el("span", "chip", f.path)));
}

async function attach(ev) {
  for (const file of ev.target.files) {
    const q = "name=" + encodeURIComponent(file.name) + (state.chatId ? "&chatId=" + encodeURIComponent(state.chatId) : "");
    try {
      const info = await api("/api/assistant/files?" + q, {
        method: "POST",
        headers: { "content-type": file.type || "application/octet-stream" },
        body: file,
      });
      state.pending.push(info);
    } catch (e) { showStatus("Upload failed: " + e.message, true); }
  }
  ev.target.value = "";
  renderPending();
}

// ---- other tabs and devices ------------------------------------------------
// GET /api/assistant/events: the list follows every chat of the workspace;
// the open chat re-reads its thread when a turn another tab started begins
// or ends (and attaches to it while it runs), and its settings when changed.

function followChatEvents() {
  const es = new EventSource("/api/assistant/events");
  es.addEventListener("chat", async (e) => {
    let ev;
    try { ev = JSON.parse(e.data); } catch (_) { return; }
    loadChats();
    if (ev.chatId !== state.chatId) return;
    if (ev.state === "deleted") { openChat(null); return; }
    // This page's own turn is already on screen, also once it ended: its
    // `done` may come before the chat event that says it ended.
    if (state.turn || $("composer").dataset.busy === "true") return;
    if (ev.turnId && state.ownTurns.has(ev.turnId)) return;
    if (ev.state === "updated") {
      const chat = await api("/api/assistant/chats/" + encodeURIComponent(state.chatId)).catch(() => null);
      if (chat) showSettings(chat.settings || {});
      return;
    }
    openChat(state.chatId);
  });
}

// ---- sign-in and start ---------------------------------------------------

async function start() {
  let session;
  try { session = await api("/api/session"); }
  catch (e) {
    if (e.status === 401) { $("signin").hidden = false; $("app").hidden = true; return; }
    throw e;
  }
  $("signin").hidden = true;
  $("app").hidden = false;
  $("workspace-name").textContent = session.workspaceName || "";
  await loadSettingChoices();
  followChatEvents();
  const m = location.hash.match(/chat=([A-Za-z0-9_-]+)/);
  await openChat(m ? m[1] : null);
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").onsubmit = async (ev) => {
    ev.preventDefault();
    try {
      await api("/api/session", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ apiKey: $("signin-key").value }),
      });
      $("signin-error").hidden = true;
      start();
    } catch (e) { $("signin-error").textContent = e.message; $("signin-error").hidden = false; }
  };
  $("sign-out").onclick = async () => { await api("/api/session", { method: "DELETE" }).catch(() => {}); location.reload(); };
  $("new-chat").onclick = () => openChat(null);
  $("composer").onsubmit = send;
  $("message").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").onclick = stop;
  $("delete-chat").onclick = deleteChat;
  $("attach").onchange = attach;
  $("set-save").onclick = saveSettings;
  $("env-form").onsubmit = saveEnvironment;
  start().catch((e) => showStatus(e.message, true));
});
