// sse.js: Server-Sent Events over fetch(), because EventSource cannot send an Authorization
// header. Parses `id:` / `event:` / `data:` frames (per the HTML spec's rules), and reconnects
// after a drop with `?after=<last id>` so no event is missed or repeated.

import { authHeaders, failure } from "./api.js";

/** Feed decoded text in, get complete events out. */
export class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buffer = "";
    this.skipLF = false;
    this.reset();
  }

  reset() {
    this.id = null;
    this.type = "";
    this.data = [];
  }

  push(text) {
    // A CR LF pair split across two chunks is one line end, not two.
    if (this.skipLF && text.startsWith("\n")) text = text.slice(1);
    this.skipLF = text.endsWith("\r");
    this.buffer += text;
    const lines = this.buffer.split(/\r\n|\r|\n/);
    this.buffer = lines.pop(); // an incomplete last line waits for more text
    for (const line of lines) this.line(line);
  }

  line(line) {
    if (line === "") {
      if (this.data.length) this.onEvent({ id: this.id, type: this.type || "message", data: this.data.join("\n") });
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // a comment, e.g. keep-alive
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "id") this.id = value;
    else if (field === "event") this.type = value;
    else if (field === "data") this.data.push(value);
  }
}

/**
 * Follow `url` until `stop()` or until `isDone()` says the stream need not come back.
 * onEvent({id, type, data}) gets parsed JSON data; onStatus("live" | "reconnecting" | "ended"
 * | "error", detail) reports the connection for the UI.
 */
export class EventFeed {
  constructor(url, { onEvent, onStatus = () => {}, isDone = () => false, after = 0 }) {
    this.url = url;
    this.onEvent = onEvent;
    this.onStatus = onStatus;
    this.isDone = isDone;
    this.lastId = after;
    this.controller = null;
    this.stopped = false;
    this.ended = false;
  }

  start() {
    this.loop();
    return this;
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
  }

  async loop() {
    let delay = 500;
    while (!this.stopped) {
      try {
        const gotAny = await this.once();
        if (gotAny) delay = 500;
        if (this.ended) {
          this.onStatus("ended"); // 204: the task ended and nothing follows the cursor
          return;
        }
      } catch (err) {
        if (this.stopped) return;
        if (err.status && err.status < 500 && err.status !== 429) {
          this.onStatus("error", err.message); // 401/403/404: retrying will not help
          return;
        }
      }
      if (this.stopped) return;
      if (this.isDone()) {
        this.onStatus("ended");
        return;
      }
      this.onStatus("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, delay * (0.5 + Math.random() / 2)));
      delay = Math.min(delay * 2, 10_000);
    }
  }

  async once() {
    this.controller = new AbortController();
    const sep = this.url.includes("?") ? "&" : "?";
    const resp = await fetch(`${this.url}${sep}after=${encodeURIComponent(this.lastId)}`, {
      headers: { Accept: "text/event-stream", ...authHeaders() },
      signal: this.controller.signal,
      cache: "no-store",
      credentials: "omit",
    });
    if (!resp.ok) throw await failure(resp);
    if (resp.status === 204) {
      this.ended = true;
      return false;
    }
    this.onStatus("live");
    let gotAny = false;
    let closing = null; // an `error` event: the server ends the stream and says why (key_revoked)
    const parser = new SseParser((ev) => {
      gotAny = true;
      if (ev.type === "error") {
        try {
          closing = JSON.parse(ev.data);
        } catch {
          closing = { detail: ev.data };
        }
        return;
      }
      const n = Number(ev.id);
      if (Number.isFinite(n) && n > this.lastId) this.lastId = n;
      let data = null;
      try {
        data = JSON.parse(ev.data);
      } catch {
        return; // not ours to show
      }
      this.onEvent({ id: n, type: ev.type, data });
    });
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(value);
      }
    } finally {
      reader.releaseLock?.();
    }
    if (closing) {
      const err = new Error(closing.detail || closing.code || "the stream was closed by the server");
      err.status = 401;
      throw err;
    }
    return gotAny;
  }
}
