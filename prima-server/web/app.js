// Prima's page: chat over /v1/chat/completions (streamed), the cluster over
// /v1/cluster/events (server-sent events). Plain JS, no library, same origin only.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];      // the conversation sent with each request
let running = null;      // the AbortController of the reply being streamed

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function bytes(n) {
  if (n == null) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}

function ms(v) { return v == null ? "–" : v.toFixed(v < 10 ? 1 : 0) + " ms"; }

function scrollDown() { const m = $("messages"); m.scrollTop = m.scrollHeight; }

function number(id) {
  const v = $(id).value.trim();
  return v === "" ? undefined : Number(v);
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = !!controller;
  $("stop").disabled = !controller;
}

// ---- chat ----

async function ask(text) {
  history.push({ role: "user", content: text });
  $("messages").append(el("div", "msg user", text));
  const reply = el("div", "msg assistant");
  reply.dataset.state = "streaming";
  const reasoning = el("span", "reasoning");
  const content = el("span", "content");
  const meta = el("span", "meta");
  reply.append(reasoning, content, meta);
  $("messages").append(reply);
  scrollDown();

  const body = {
    messages: history,
    stream: true,
    stream_options: { include_usage: true },
    temperature: number("temperature"),
    top_p: number("top_p"),
    max_tokens: number("max_tokens"),
    seed: number("seed"),
  };
  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  let first = null, chunks = 0, usage = null;
  try {
    const res = await fetch("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || res.status + " " + res.statusText);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) usage = chunk.usage;
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (!delta) continue;
        if (delta.content || delta.reasoning_content) {
          if (first === null) first = performance.now();
          chunks++;
        }
        if (delta.reasoning_content) reasoning.textContent += delta.reasoning_content;
        if (delta.content) content.textContent += delta.content;
        scrollDown();
      }
    }
    reply.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      reply.dataset.state = "stopped";
      meta.textContent = "stopped";
    } else {
      reply.dataset.state = "failed";
      reply.append(el("span", "error", " " + e.message));
    }
  } finally {
    setRunning(null);
  }
  history.push({ role: "assistant", content: content.textContent });
  if (reply.dataset.state === "done") {
    const tokens = usage ? usage.completion_tokens : chunks;
    const secs = first === null ? 0 : (performance.now() - first) / 1000;
    const ttft = first === null ? 0 : first - started;
    meta.textContent = tokens + " tokens · first after " + ms(ttft) +
      (secs > 0 && tokens > 1 ? " · " + ((tokens - 1) / secs).toFixed(1) + " tok/s" : "");
  }
}

$("ask").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  $("prompt").value = "";
  ask(text);
});

$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("ask").requestSubmit();
  }
});

// Dropping the stream cancels the generation on the server.
$("stop").addEventListener("click", () => { if (running) running.abort(); });

$("new").addEventListener("click", () => {
  if (running) running.abort();
  history.length = 0;
  $("messages").replaceChildren();
  $("prompt").focus();
});

// ---- cluster ----

function device(d, k) {
  const li = el("li", "device");
  li.dataset.name = d.name;
  li.dataset.link = d.link;
  const top = el("div", "top");
  top.append(el("span", "name", d.name), el("span", "role", d.role),
    el("span", "link link-" + d.link, d.link));
  const facts = [];
  if (d.backend) facts.push(d.backend);
  if (d.link === "up") {
    facts.push("window " + d.window + " × k=" + k + " → " + d.layers + " layers" +
      (d.gpu_layers ? " (" + d.gpu_layers + " on GPU per window)" : ""));
  }
  if (d.addr && d.addr !== "head") facts.push(d.addr);
  if (d.hop_ms != null && d.link === "up") facts.push("hop " + d.hop_ms.toFixed(1) + " ms");
  li.append(top, el("div", "facts", facts.join(" · ")));
  if (d.memory_limit != null || d.memory_used != null) {
    const share = d.memory_used != null && d.memory_limit ? Math.min(1, d.memory_used / d.memory_limit) : 0;
    li.append(el("div", "barlabel", "memory " + bytes(d.memory_used) + " / " + bytes(d.memory_limit)));
    const bar = el("div", "bar memory");
    const fill = el("span");
    fill.style.width = (share * 100).toFixed(1) + "%";
    bar.append(fill);
    li.append(bar);
  }
  if (d.share != null && d.link === "up") {
    li.append(el("div", "barlabel", "share of each token's compute " + (d.share * 100).toFixed(0) + "%"));
    const bar = el("div", "bar");
    const fill = el("span");
    fill.style.width = (d.share * 100).toFixed(1) + "%";
    bar.append(fill);
    li.append(bar);
  }
  return li;
}

function event(e) {
  const li = el("li", "", new Date(e.at).toLocaleTimeString() + " " + e.message);
  li.dataset.kind = e.kind;
  return li;
}

function snapshot(s) {
  $("model").textContent = s.model || "";
  $("scheduler").textContent = s.scheduler || "–";
  $("k").textContent = s.k;
  $("predicted").textContent = ms(s.predicted_tpot_ms);
  $("measured").textContent = ms(s.measured_tpot_ms);
  $("devices").replaceChildren(...s.devices.map((d) => device(d, s.k)));
  $("events").replaceChildren(...s.events.slice().reverse().map(event));
}

function watch() {
  const source = new EventSource("v1/cluster/events");
  const conn = $("conn");
  source.onopen = () => { conn.dataset.state = "open"; conn.textContent = "connected"; };
  source.onerror = () => { conn.dataset.state = "closed"; conn.textContent = "disconnected"; };
  source.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    switch (msg.type) {
      case "snapshot": snapshot(msg); break;
      case "event": $("events").prepend(event(msg)); break;
      case "generation": $("measured").textContent = ms(msg.tpot_ms); break;
      case "rate": $("rate").textContent = msg.tokens_per_s.toFixed(1); break;
    }
  };
}

watch();
