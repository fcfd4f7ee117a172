// ui.js: small shared widgets: live relative times, flash messages, empty states and the
// node-count bar used by the task list and the task page.

import { h, icon } from "./dom.js";
import { ago, clock, duration, iso, sameDay, span, when } from "./format.js";

export const NODE_STATES = ["pending", "ready", "queued", "running", "waiting_approval", "taken_over", "verifying", "succeeded", "failed", "skipped", "cancelled"];
export const TASK_STATES = ["planning", "running", "succeeded", "failed", "cancelled"];
export const TERMINAL_TASK = new Set(["succeeded", "failed", "cancelled"]);
export const TERMINAL_NODE = new Set(["succeeded", "failed", "skipped", "cancelled"]);

// What an operator can ask of a device (devices list and device page).
export const DEVICE_ACTIONS = [
  { verb: "drain", label: "Drain", hint: "Finish the current batch, then take no new work" },
  { verb: "cordon", label: "Cordon", hint: "Take no new work" },
  { verb: "uncordon", label: "Uncordon", hint: "Back to service" },
];

// True when asking `verb` of a device in `state` would change nothing (its button is disabled).
export function actionIsMoot(state, verb) {
  return (
    state === "revoked" ||
    state === "stopped" || // only Resume lifts an emergency stop
    (verb === "drain" && (state === "draining" || state === "drained")) ||
    (verb === "cordon" && state === "cordoned") ||
    (verb === "uncordon" && (state === "idle" || state === "busy"))
  );
}

/** <time> that keeps saying "3 s ago" (updated by the ticker). */
export function timeAgo(value) {
  if (!value) return h("span", { class: "muted" }, "never");
  return h("time", { datetime: iso(value), title: `${when(value)} (${iso(value)})`, dataset: { ago: value } }, ago(value));
}

/** Absolute short time with the relative one as a tooltip. */
export function timeAt(value) {
  if (!value) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: iso(value), title: iso(value) }, when(value));
}

/** "start → end", the end as a bare time when it is the same day. */
export function timeRange(start, end) {
  if (!start) return h("span", { class: "muted" }, "not started");
  const tail = end
    ? sameDay(start, end)
      ? h("time", { datetime: iso(end), title: iso(end) }, clock(end))
      : timeAt(end)
    : h("span", { class: "muted" }, "now");
  return h("span", { class: "nowrap" }, timeAt(start), " → ", tail);
}

/** A duration that keeps growing while `end` is missing (updated by the ticker). */
export function liveDuration(start, end) {
  const ms = span(start, end);
  if (ms === null) return h("span", { class: "muted" }, "—");
  if (end) return h("span", { class: "num" }, duration(ms));
  return h("span", { class: "num live-duration", dataset: { since: start } }, duration(ms));
}

let ticker = null;

/** One timer for the whole page: refresh every relative time and running duration. */
export function startTicker() {
  if (ticker) return;
  ticker = setInterval(() => {
    for (const el of document.querySelectorAll("[data-ago]")) el.textContent = ago(el.dataset.ago);
    for (const el of document.querySelectorAll("[data-since]")) el.textContent = duration(span(el.dataset.since, null));
  }, 1000);
}

/** A dismissable message at the top of the page; errors stay longer. */
export function flash(message, kind = "error", title = "") {
  const region = document.getElementById("flash");
  if (!region) return;
  const item = h(
    "div",
    { class: `flash flash-${kind}`, role: kind === "error" ? "alert" : "status" },
    h("div", { class: "flash-body" }, title ? h("strong", {}, title) : null, h("span", { class: "flash-text" }, message)),
    h("button", { class: "icon-button", type: "button", "aria-label": "Dismiss", onclick: () => item.remove() }, icon("close", 14)),
  );
  region.append(item);
  while (region.children.length > 4) region.firstElementChild.remove();
  setTimeout(() => item.remove(), kind === "error" ? 12_000 : 5_000);
}

export function emptyState(title, text) {
  return h("div", { class: "empty" }, h("div", { class: "empty-title" }, title), text ? h("p", {}, text) : null);
}

export function loading(text = "Loading…") {
  return h("div", { class: "loading" }, h("span", { class: "spinner", "aria-hidden": "true" }), text);
}

/** A thin stacked bar of node states plus "done/total". */
export function countsBar(counts) {
  const total = Object.values(counts || {}).reduce((a, b) => a + b, 0);
  const done = [...TERMINAL_NODE].reduce((a, st) => a + (counts?.[st] || 0), 0);
  const title = NODE_STATES.filter((st) => counts?.[st])
    .map((st) => `${counts[st]} ${st}`)
    .join(", ");
  const bar = h("div", { class: "counts-bar", "aria-hidden": "true" });
  for (const st of NODE_STATES) {
    const n = counts?.[st] || 0;
    if (!n) continue;
    const seg = h("span", { class: `seg st-${st}` });
    seg.style.flexGrow = String(n);
    bar.append(seg);
  }
  return h(
    "div",
    { class: "counts", title: title || "no nodes" },
    bar,
    h("span", { class: "counts-text num" }, total ? `${done}/${total}` : "—"),
  );
}

/** "3 succeeded · 1 failed" chips. */
export function countChips(counts) {
  return h(
    "div",
    { class: "chips" },
    NODE_STATES.filter((st) => counts?.[st]).map((st) =>
      h("span", { class: `chip st-${st}` }, h("span", { class: "swatch" }), `${counts[st]} ${st}`),
    ),
  );
}

/**
 * A button that asks for a second click within 5 s before it acts (for actions with side
 * effects: cancel, re-run). `run` is awaited with the button disabled.
 */
export function confirmButton({ id, label, confirmLabel, title, kind = "", iconName = null, run }) {
  const text = h("span", {}, label);
  const button = h(
    "button",
    { class: ["button small", kind], type: "button", id, title },
    iconName ? icon(iconName, 14) : null,
    text,
  );
  let timer = null;
  const reset = () => {
    clearTimeout(timer);
    button.classList.remove("confirm");
    text.textContent = label;
  };
  button.addEventListener("click", async () => {
    if (!button.classList.contains("confirm")) {
      button.classList.add("confirm");
      text.textContent = confirmLabel;
      timer = setTimeout(reset, 5000);
      return;
    }
    reset();
    button.disabled = true;
    try {
      await run();
    } finally {
      button.disabled = false;
    }
  });
  button.reset = reset;
  return button;
}
