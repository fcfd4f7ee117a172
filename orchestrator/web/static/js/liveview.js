// liveview.js: a device's screen, live. "Watch" opens a view (POST /v1/devices/<id>/views) and
// reads its frames (an SSE stream read with fetch, as sse.js does: EventSource cannot send the
// Authorization header); each `frame` replaces the image, the frame rate is shown, "Marks" draws
// the boxes of the device's last GUI observation over it, and an `ended` event is said in words.
// "Stop watching" (or leaving the page) closes the stream: the device stops streaming when its
// last viewer leaves. While the device is taken over (`setDriving(true)`), clicks, double
// clicks and the wheel on the image (mapped to the image's own pixels) and key presses go to the
// device through POST /v1/devices/<id>/input, and a "type text" box sends text; the device's
// refusal code is shown.

import { api, authHeaders, failure } from "./api.js";
import { h, replace } from "./dom.js";
import { SseParser } from "./sse.js";

const RETRIES = 3; // a stream that drops without `ended` is opened again this many times
const CLICK_WAIT_MS = 250; // a second click within this is a double click

const ENDED = {
  watch_disallowed: "The device's owner does not allow watching its screen.",
  no_screen: "The device has no screen to show.",
  lease_expired: "The device stopped streaming: no renewal reached it.",
  ended: "The device ended the stream.",
  error: "The device could not capture its screen.",
  device_offline: "The device went offline.",
  key_revoked: "Your API key was revoked.",
  view_unsupported: "This device's agent cannot stream its screen (it did not announce live views).",
  view_scope: "This view belongs to another device or another key.",
  view_expired: "The view expired; watch again.",
};

// Browser key names -> the device's (X keysym) names.
const KEY_NAMES = {
  Enter: "Return",
  Backspace: "BackSpace",
  ArrowLeft: "Left",
  ArrowRight: "Right",
  ArrowUp: "Up",
  ArrowDown: "Down",
  " ": "space",
  PageUp: "Prior",
  PageDown: "Next",
};

/** One live view panel of `deviceId`; `el` to place it, `stop()` to end it. */
export function liveView(deviceId, { idPrefix = "live" } = {}) {
  const base = `/v1/devices/${encodeURIComponent(deviceId)}`;
  let controller = null;
  let frame = null; // the last frame's data
  let times = []; // arrival times of recent frames, for the rate
  let driving = false;
  let pendingClick = null;

  const image = h("img", { class: "live-image", id: `${idPrefix}-image`, alt: "The device's screen", draggable: "false" });
  const marks = h("div", { class: "live-marks", id: `${idPrefix}-marks`, "aria-hidden": "true" });
  const stage = h("div", { class: "live-stage", id: `${idPrefix}-stage`, tabindex: "0", hidden: true }, image, marks);
  const rate = h("span", { class: "small muted", id: `${idPrefix}-fps` }, "");
  const status = h("p", { class: "small muted live-status", id: `${idPrefix}-status`, role: "status" }, "Not watching.");
  const inputStatus = h("p", { class: "small live-input-status", id: `${idPrefix}-input-status`, role: "status" });
  const marksToggle = h("input", { type: "checkbox", id: `${idPrefix}-marks-toggle` });
  const watchButton = h("button", { class: "button small", type: "button", id: `${idPrefix}-watch` }, "Watch");
  const text = h("input", { type: "text", class: "live-text", id: `${idPrefix}-text`, maxlength: "2000", placeholder: "Type text on the device", "aria-label": "Text to type on the device" });
  const sendText = h("button", { class: "button small", type: "button", id: `${idPrefix}-send-text` }, "Type");
  const driveRow = h("div", { class: "live-drive", id: `${idPrefix}-drive`, hidden: true }, text, sendText);

  const el = h(
    "section",
    { class: "card device-card live-card", id: `${idPrefix}-view` },
    h(
      "div",
      { class: "live-head" },
      h("h2", { class: "card-title" }, "Live view"),
      h("span", { class: "spacer" }),
      rate,
      h("label", { class: "small live-marks-label" }, marksToggle, " Marks"),
      watchButton,
    ),
    status,
    stage,
    driveRow,
    inputStatus,
  );

  watchButton.addEventListener("click", () => (controller ? stop("Not watching.") : watch()));
  marksToggle.addEventListener("change", () => {
    drawMarks();
    if (controller) watch(); // the device sends marks only when asked: ask again
  });
  window.addEventListener("resize", drawMarks);
  image.addEventListener("load", drawMarks);
  stage.addEventListener("click", onClick);
  stage.addEventListener("wheel", onWheel, { passive: false });
  stage.addEventListener("keydown", onKey);
  sendText.addEventListener("click", () => {
    if (text.value) send({ kind: "type", text: text.value }).then((ok) => ok && (text.value = ""));
  });

  async function watch() {
    stop(null);
    const mine = new AbortController();
    controller = mine;
    watchButton.textContent = "Stop watching";
    say("Opening the view…");
    let view;
    try {
      view = await api(`${base}/views`, { method: "POST", body: { fps: 4, marks: marksToggle.checked }, signal: mine.signal });
    } catch (err) {
      if (controller === mine) stop(words(err.code, err.message));
      return;
    }
    for (let tries = 0; controller === mine && tries <= RETRIES; tries += 1) {
      try {
        const ended = await read(view.frames_url, mine);
        if (ended) {
          if (controller === mine) stop(words(ended.code, ended.message));
          return;
        }
      } catch (err) {
        if (mine.signal.aborted) return;
        if (err.status && err.status < 500) {
          if (controller === mine) stop(words(err.code, err.message));
          return;
        }
      }
      if (controller === mine) say("The stream dropped; opening it again…");
      await new Promise((resolve) => setTimeout(resolve, 500 * (tries + 1)));
    }
    if (controller === mine) stop("The stream dropped; press Watch to try again.");
  }

  /** Read one stream until it ends: the `ended` event's data, or null when it just dropped. */
  async function read(url, mine) {
    const resp = await fetch(url, {
      headers: { Accept: "text/event-stream", ...authHeaders() },
      signal: mine.signal,
      cache: "no-store",
      credentials: "omit",
    });
    if (!resp.ok) throw await failure(resp);
    say("Waiting for the first frame…");
    let ended = null;
    const parser = new SseParser((ev) => {
      let data;
      try {
        data = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (ev.type === "frame") show(data);
      else if (ev.type === "ended") ended = data;
    });
    const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
    try {
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.push(value);
      }
    } finally {
      reader.cancel().catch(() => {});
    }
    return ended;
  }

  function show(data) {
    frame = data;
    image.src = `data:${data.mime};base64,${data.image_b64}`;
    image.dataset.n = String(data.n);
    stage.hidden = false;
    const now = performance.now();
    times = [...times.filter((t) => now - t < 2000), now];
    rate.textContent = `${(times.length / 2).toFixed(1)} fps`;
    say(driving ? "Live. You have the device: click, scroll and type on the image." : "Live.");
  }

  function stop(message) {
    controller?.abort();
    controller = null;
    watchButton.textContent = "Watch";
    rate.textContent = "";
    times = [];
    if (message !== null) say(message);
  }

  function say(message) {
    status.textContent = message;
  }

  function drawMarks() {
    replace(marks);
    if (!marksToggle.checked || !frame || !image.naturalWidth) return;
    const sx = image.clientWidth / image.naturalWidth;
    const sy = image.clientHeight / image.naturalHeight;
    for (const m of frame.marks || []) {
      const box = h("div", { class: "live-mark", title: m.name || `#${m.id}` }, h("span", { class: "live-mark-id" }, String(m.id)));
      Object.assign(box.style, { left: `${m.x * sx}px`, top: `${m.y * sy}px`, width: `${m.w * sx}px`, height: `${m.h * sy}px` });
      marks.append(box);
    }
  }

  // ---- input while the device is taken over ---------------------------------------------------

  /** The event's point in the image's own pixels (what input `x, y` mean). */
  function point(ev) {
    const rect = image.getBoundingClientRect();
    const w = image.naturalWidth;
    const hgt = image.naturalHeight;
    const x = Math.floor(((ev.clientX - rect.left) * w) / rect.width);
    const y = Math.floor(((ev.clientY - rect.top) * hgt) / rect.height);
    return { x: Math.min(Math.max(x, 0), w - 1), y: Math.min(Math.max(y, 0), hgt - 1), frame_width: w, frame_height: hgt };
  }

  function onClick(ev) {
    if (!driving || !frame || !image.naturalWidth) return;
    stage.focus();
    const at = point(ev);
    const button = ev.button === 1 ? "middle" : ev.button === 2 ? "right" : "left";
    if (pendingClick && ev.detail >= 2) {
      clearTimeout(pendingClick);
      pendingClick = null;
      send({ kind: "double_click", button, ...at });
      return;
    }
    pendingClick = setTimeout(() => {
      pendingClick = null;
      send({ kind: "click", button, ...at });
    }, CLICK_WAIT_MS);
  }

  function onWheel(ev) {
    if (!driving || !frame) return;
    ev.preventDefault();
    const vertical = Math.abs(ev.deltaY) >= Math.abs(ev.deltaX);
    const direction = vertical ? (ev.deltaY > 0 ? "down" : "up") : ev.deltaX > 0 ? "right" : "left";
    send({ kind: "scroll", direction, ...point(ev) });
  }

  function onKey(ev) {
    if (!driving) return;
    if (["Shift", "Control", "Alt", "Meta"].includes(ev.key)) return;
    ev.preventDefault();
    const mods = [ev.ctrlKey && "ctrl", ev.altKey && "alt", ev.metaKey && "super"].filter(Boolean);
    if (ev.key.length === 1 && !mods.length) {
      send({ kind: "type", text: ev.key });
      return;
    }
    const name = KEY_NAMES[ev.key] || ev.key;
    send({ kind: "key", keys: [...mods, name.length === 1 ? name.toLowerCase() : name].join("+") });
  }

  /** Send one input; true if the device applied it, else its refusal is shown. */
  async function send(body) {
    inputStatus.textContent = "Sending…";
    inputStatus.className = "small live-input-status muted";
    try {
      await api(`${base}/input`, { method: "POST", body });
      inputStatus.textContent = `Sent: ${describe(body)}.`;
      return true;
    } catch (err) {
      inputStatus.className = "small live-input-status error-line";
      replace(inputStatus, "Refused: ", h("span", { class: "mono", id: `${idPrefix}-input-code` }, err.code || String(err.status || "error")), ` ${err.message}`);
      return false;
    }
  }

  return {
    el,
    watch,
    /** Whether pointer and keys on the image go to the device (it is taken over). */
    setDriving(on) {
      driving = Boolean(on);
      driveRow.hidden = !driving;
      stage.classList.toggle("driving", driving);
      if (!driving) inputStatus.textContent = "";
    },
    stop() {
      stop(null);
      clearTimeout(pendingClick);
      window.removeEventListener("resize", drawMarks);
    },
  };
}

function words(code, message) {
  const said = ENDED[code];
  if (said) return message && !said.includes(message) && code !== "device_offline" ? `${said} (${message})` : said;
  return message || `The view ended (${code || "unknown"}).`;
}

function describe(body) {
  if (body.kind === "type") return `typed ${body.text.length} character${body.text.length === 1 ? "" : "s"}`;
  if (body.kind === "key") return `key ${body.keys}`;
  if (body.kind === "scroll") return `scroll ${body.direction}`;
  return `${body.kind.replace("_", " ")} at ${body.x}, ${body.y}`;
}
