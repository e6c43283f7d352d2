// asbx chat page: plain JS, no build step.
//
// One rendering path for history and live turns: an assistant message is a
// list of content blocks (step, text, error). History renders the persisted
// blocks; a live turn folds SSE events into the same blocks and re-renders
// step rows in place by step id. All text goes through textContent.
//
// Stable hooks for tests (and anyone scripting the page): a message node has
// data-role (user | assistant); its parts have data-part (steps, text,
// error); a step row has data-step-id, data-step-name and data-status; a chat
// in the list has data-chat-id; the composer has data-busy while a turn runs.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { chatId: null, turn: null, pending: [], abort: null };

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

function renderStep(row, step) {
  row.className = "step " + step.status;
  row.dataset.stepId = step.id;
  row.dataset.stepName = step.name || "";
  row.dataset.status = step.status;
  row.replaceChildren();
  const summary = el("summary");
  summary.append(el("span", "badge", step.status), el("strong", "", step.name));
  if (step.durationMs !== undefined) summary.append(el("span", "muted", step.durationMs + " ms"));
  row.append(summary);
  if (step.args !== undefined) row.append(el("pre", "", "args: " + pretty(step.args)));
  if (step.result !== undefined) row.append(el("pre", "", "result: " + pretty(step.result)));
  if (step.error) row.append(el("pre", "err", "error: " + step.error));
}

function part(cls, name, text) {
  const e = el("div", cls, text);
  e.dataset.part = name;
  return e;
}

function assistantNode() {
  const node = el("div", "msg assistant");
  node.dataset.role = "assistant";
  node.append(part("steps", "steps"), part("text", "text"), part("err", "error"));
  return node;
}

// Applies one block to an assistant message node (steps update in place).
function applyBlock(node, block) {
  if (block.type === "step") {
    const steps = node.querySelector(".steps");
    let row = [...steps.children].find((r) => r.dataset.stepId === block.id);
    if (!row) { row = el("details", "step"); steps.append(row); }
    const prev = row._step || {};
    const merged = { ...prev, ...block };
    row._step = merged;
    renderStep(row, merged);
  } else if (block.type === "text") {
    node.querySelector(".text").textContent = block.text;
  } else if (block.type === "delta") {
    node.querySelector(".text").textContent += block.text;
  } else if (block.type === "error") {
    node.querySelector(".err").textContent = "Error (" + block.code + "): " + block.message;
  }
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
  return node;
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
  if (!id) { loadChats(); return; }
  let chat;
  try { chat = await api("/api/assistant/chats/" + encodeURIComponent(id)); }
  catch (e) { showStatus(e.message, true); state.chatId = null; return; }
  $("chat-title").textContent = chat.title;
  chat.messages.forEach((m) => $("thread").append(renderMessage(m)));
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

// Reads an SSE response, folding events into the assistant node.
async function consume(res, node) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let finished = false;
  let turnId = null;
  state.abort = { abort: () => reader.cancel() };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) event = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
        }
        if (!data) continue;
        const payload = JSON.parse(data);
        if (event === "turn") {
          state.turn = payload.turnId;
          turnId = payload.turnId;
          if (!state.chatId) { state.chatId = payload.chatId; location.hash = "chat=" + payload.chatId; loadChats(); }
        } else if (event === "step" || event === "delta") {
          applyBlock(node, { ...payload, type: event });
        } else if (event === "result") {
          applyBlock(node, { type: "text", text: payload.message });
        } else if (event === "error") {
          applyBlock(node, { type: "error", code: payload.code, message: payload.message });
        } else if (event === "done") {
          finished = true;
        }
        scrollDown();
      }
    }
  } catch (e) {
    if (!finished) showStatus("Connection lost: " + e.message, true);
  }
  state.abort = null;
  state.turn = null;
  setBusy(false);
  if (finished && state.chatId) {
    // Swap in the persisted message, so the live view ends exactly as a
    // reload will show it.
    const chat = await api("/api/assistant/chats/" + encodeURIComponent(state.chatId)).catch(() => null);
    if (chat) {
      renderBag(chat.files);
      $("chat-title").textContent = chat.title;
      const saved = chat.messages.filter((m) => m.role === "assistant" && m.turnId === turnId).pop();
      if (saved && node.isConnected) node.replaceWith(renderMessage(saved));
    }
    loadChats();
  }
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
  if (attachments.length) body.attachmentIds = attachments.map((f) => f.id);
  let res;
  try {
    res = await fetch("/api/assistant/chat/stream", {
      method: "POST",
      credentials: "same-origin",
      headers: { "content-type": "application/json" },
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
  start().catch((e) => showStatus(e.message, true));
});
