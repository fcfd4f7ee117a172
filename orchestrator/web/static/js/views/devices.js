// views/devices.js: the fleet at a glance. Polls GET /v1/devices every 2 s (there is no device
// event stream), updates rows in place, and offers Drain / Cordon / Uncordon to operators;
// a refusal (e.g. 403 for a viewer key) shows the server's problem detail. A device's name
// opens its page; its current batch links to the task it belongs to.

import { api } from "../api.js";
import { h, pill, replace } from "../dom.js";
import { labelList, serverNow } from "../format.js";
import { DEVICE_ACTIONS as ACTIONS, actionIsMoot, emptyState, flash, loading, timeAgo } from "../ui.js";
import { currentBatch } from "./device.js";

const POLL_MS = 2000;
const STATES = ["idle", "busy", "suspect", "offline", "draining", "drained", "cordoned", "stopped", "enrolled", "revoked"];

export function mountDevices(root) {
  const summary = h("div", { class: "summary chips" });
  const updated = h("span", { class: "updated muted" });
  const tbody = h("tbody");
  const table = h(
    "table",
    { class: "table devices-table", id: "devices-table" },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["Device", "State", "Platform", "Labels", "Current batch", "Queue", "Last seen", ""].map((t, i) =>
          h("th", { scope: "col", class: i === 5 ? "right" : null }, t),
        ),
      ),
    ),
    tbody,
  );
  const body = h("div", { class: "card table-card" }, loading("Loading devices…"));
  root.append(
    h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h("div", {}, h("h1", {}, "Devices"), summary),
        h("div", { class: "page-actions" }, updated),
      ),
      body,
    ),
  );

  const rows = new Map();
  const busy = new Set(); // devices with an action in flight
  let timer = null;
  let stopped = false;
  let inFlight = false;
  let again = false;
  const controller = new AbortController();

  /** One poll at a time; a request for another while one runs is served right after it. */
  async function poll() {
    if (inFlight) {
      again = true;
      return;
    }
    inFlight = true;
    clearTimeout(timer);
    try {
      const page = await api("/v1/devices", { signal: controller.signal });
      draw(page.items || []);
      replace(updated, h("span", { class: "live-dot", "aria-hidden": "true" }), "Live · updated ", timeAgo(new Date(serverNow()).toISOString()));
    } catch (err) {
      if (!stopped && err.name !== "AbortError") replace(updated, h("span", { class: "warn" }, `Not updating: ${err.message}`));
    } finally {
      inFlight = false;
    }
    if (stopped) return;
    if (again) {
      again = false;
      poll();
    } else timer = setTimeout(poll, POLL_MS);
  }

  function draw(devices) {
    if (!devices.length) {
      replace(
        body,
        emptyState(
          "No devices enrolled yet",
          "Enroll one with `orrery devices enroll NAME`, then start `orrery agent` on it with the token.",
        ),
      );
      rows.clear();
      replace(summary);
      return;
    }
    if (!body.contains(table)) replace(body, table);
    const counts = {};
    for (const d of devices) counts[d.state] = (counts[d.state] || 0) + 1;
    replace(
      summary,
      h("span", { class: "chip" }, `${devices.length} device${devices.length === 1 ? "" : "s"}`),
      STATES.filter((st) => counts[st]).map((st) =>
        h("span", { class: `chip st-${st}` }, h("span", { class: "swatch" }), `${counts[st]} ${st}`),
      ),
    );
    const seen = new Set();
    devices.forEach((d, i) => {
      seen.add(d.id);
      let row = rows.get(d.id);
      if (!row) {
        row = { tr: h("tr", { dataset: { deviceId: d.id } }), sig: "" };
        rows.set(d.id, row);
      }
      const sig = JSON.stringify([d.name, d.state, d.labels, d.platform, d.info, d.tools?.length, d.current_batch, d.current_task_id, d.current_node_id, d.queue_length, d.last_seen, busy.has(d.id)]);
      if (sig !== row.sig) {
        row.sig = sig;
        fillRow(row.tr, d);
      }
      if (tbody.children[i] !== row.tr) tbody.insertBefore(row.tr, tbody.children[i] || null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.tr.remove();
        rows.delete(id);
      }
    }
  }

  function fillRow(tr, d) {
    tr.dataset.state = d.state;
    const info = d.info || {};
    const os = [info.os, info.version].filter(Boolean).join(" ");
    replace(
      tr,
      h(
        "td",
        {},
        h("a", { class: "strong device-name", href: `#/devices/${encodeURIComponent(d.id)}` }, d.name),
        h("div", { class: "mono muted small", title: d.id }, d.id),
      ),
      h(
        "td",
        { title: d.cordon_reason || null },
        pill(d.state, "device"),
        d.takeover?.taken_over
          ? h(
              "span",
              { class: "badge badge-warn takeover-badge", title: `taken over by ${d.takeover.by || d.takeover.source || "someone"}${d.takeover.reason ? `: ${d.takeover.reason}` : ""}` },
              "taken over",
            )
          : null,
      ),
      h(
        "td",
        {},
        h("div", {}, d.platform || "other"),
        h("div", { class: "muted small clip", title: os }, [os, `${(d.tools || []).length} tools`].filter(Boolean).join(" · ")),
      ),
      h(
        "td",
        {},
        h(
          "div",
          { class: "labels" },
          labelList(d.labels).map((l) => h("span", { class: "label" }, l)),
          labelList(d.labels).length ? null : h("span", { class: "muted" }, "—"),
        ),
      ),
      h("td", { class: "current" }, currentBatch(d)),
      h("td", { class: "right num" }, String(d.queue_length ?? 0)),
      h("td", { class: "nowrap" }, timeAgo(d.last_seen)),
      h("td", { class: "actions" }, ACTIONS.map((a) => actionButton(d, a))),
    );
  }

  function actionButton(d, action) {
    const state = d.state;
    // The API shows one combined state: we only know the admin state for active devices.
    const disabled =
      busy.has(d.id) ||
      actionIsMoot(state, action.verb);
    return h(
      "button",
      {
        class: "button small",
        type: "button",
        title: action.hint,
        disabled,
        dataset: { action: action.verb },
        onclick: () => act(d, action),
      },
      action.label,
    );
  }

  async function act(d, action) {
    busy.add(d.id);
    redraw(d.id);
    try {
      const out = await api(`/v1/devices/${encodeURIComponent(d.id)}/${action.verb}`, { method: "POST" });
      flash(`${d.name} is now ${out.state}.`, "ok");
    } catch (err) {
      flash(err.message, "error", `${action.label} ${d.name} refused`);
    } finally {
      busy.delete(d.id);
      if (!stopped) poll();
    }
  }

  function redraw(id) {
    const row = rows.get(id);
    if (row) for (const b of row.tr.querySelectorAll("button")) b.disabled = true;
  }

  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
  };
}
