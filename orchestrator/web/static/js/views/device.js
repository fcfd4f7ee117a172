// views/device.js: one device (#/devices/<id>): its state, labels, info (and the policy its
// agent reports), what it is running now (linked to the task), its tools (description,
// whether a retry is safe, the input schema on demand), its recent attempts (each linked to
// its task) and its state history. Operators get an emergency Stop (two clicks, with an
// optional reason) and Resume; a stopped device shows why in a banner. Polls every 3 s; each section is redrawn only when its data
// changed, so an opened schema stays open. A "Live view" card shows the device's screen
// (liveview.js); operators can take the device over (with a reason) and hand it back (with a
// note), and while it is taken over their clicks and keys on the live image go to the device.

import { api, myRole } from "../api.js";
import { h, icon, pill, replace, sectionDrawer } from "../dom.js";
import { duration, labelList, pretty, shortId, span } from "../format.js";
import { liveView } from "../liveview.js";
import { DEVICE_ACTIONS as ACTIONS, actionIsMoot, confirmButton, emptyState, flash, loading, timeAgo, timeAt, timeRange } from "../ui.js";

const POLL_MS = 3000;
const LIST_LIMIT = 25;

export function mountDevice(root, deviceId) {
  const base = `/v1/devices/${encodeURIComponent(deviceId)}`;
  const controller = new AbortController();
  let stopped = false;
  let timer = null;
  let device = null;
  let acting = false;
  let role = null; // null: the server does not say; the buttons show and the server decides
  const section = sectionDrawer();

  // Made once, so a redraw keeps the typed reason and a pending confirmation.
  const stopReason = h("input", {
    class: "stop-reason-input",
    id: "stop-reason",
    type: "text",
    maxlength: "200",
    placeholder: "Reason (optional)",
    "aria-label": "Reason for the emergency stop",
  });
  const stopButton = confirmButton({
    id: "stop-device",
    label: "Stop",
    confirmLabel: "Confirm stop",
    title: "Emergency stop: kill what runs now, take no work, refuse every action tool until resumed",
    kind: "danger-outline",
    run: () => setStopped(true),
  });
  const resumeButton = h(
    "button",
    { class: "button small", type: "button", id: "resume-device", title: "Lift the emergency stop", onclick: () => setStopped(false) },
    "Resume",
  );

  const takeoverReason = h("input", {
    class: "stop-reason-input",
    id: "takeover-reason",
    type: "text",
    maxlength: "200",
    placeholder: "Why take it over",
    "aria-label": "Reason for taking the device over",
  });
  const takeoverButton = h(
    "button",
    { class: "button small", type: "button", id: "take-over", title: "Pause the device's work and drive its screen yourself", onclick: () => takeover(true) },
    "Take over",
  );
  const handbackNote = h("input", {
    class: "stop-reason-input",
    id: "handback-note",
    type: "text",
    maxlength: "2000",
    placeholder: "Note for the model (optional)",
    "aria-label": "Note when handing the device back",
  });
  const handbackButton = h(
    "button",
    { class: "button small", type: "button", id: "hand-back", title: "Give the device back to its work", onclick: () => takeover(false) },
    "Hand back",
  );
  const live = liveView(deviceId);

  const head = h("div", { class: "device-head" });
  const overview = h("section", { class: "card device-card", id: "device-overview" });
  const tools = h("section", { class: "card device-card", id: "device-tools" });
  const attempts = h("section", { class: "card device-card", id: "device-attempts" });
  const history = h("section", { class: "card device-card", id: "device-history" });
  const page = h(
    "div",
    { class: "page device-page" },
    head,
    h("div", { class: "device-grid" }, h("div", { class: "device-main" }, live.el, overview, tools), h("div", { class: "device-side" }, attempts, history)),
  );
  root.append(h("div", { class: "page" }, loading("Loading device…")));

  async function poll() {
    clearTimeout(timer);
    let d;
    try {
      d = await api(base, { signal: controller.signal });
    } catch (err) {
      if (stopped || err.name === "AbortError") return;
      if (!device) {
        replace(root, h("div", { class: "page" }, backLink(), emptyState(err.status === 404 ? "No such device" : "Could not load the device", err.message)));
        return;
      }
      schedule();
      return;
    }
    if (stopped) return;
    const first = !device;
    device = d;
    if (first) {
      replace(root, page);
      document.title = `${d.name} · Orrery`;
    }
    drawHead();
    live.setDriving(Boolean(d.takeover?.taken_over) && d.takeover?.source !== "owner" && role !== "viewer");
    section("overview", overview, d, () => drawOverview(d));
    section("tools", tools, d.tools, () => drawTools(d.tools || []));
    // The device's own id from here on: the route may have used its name or an id prefix.
    const id = encodeURIComponent(d.id);
    const [att, hist] = await Promise.all([
      listOf(`/v1/devices/${id}/attempts?limit=${LIST_LIMIT}`),
      listOf(`/v1/devices/${id}/history?limit=${LIST_LIMIT}`),
    ]);
    if (stopped) return;
    section("attempts", attempts, att, () => drawAttempts(att));
    section("history", history, hist, () => drawHistory(hist));
    schedule();
  }

  function schedule() {
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  /** {items} or {error}: one list failing leaves the rest of the page working. */
  async function listOf(path) {
    try {
      const out = await api(path, { signal: controller.signal });
      return { items: out.items || [] };
    } catch (err) {
      return { error: err.status === 404 ? "This server does not offer it." : err.message, status: err.status || 0 };
    }
  }

  // ---- header ------------------------------------------------------------------------------

  function drawHead() {
    const d = device;
    replace(
      head,
      h(
        "div",
        { class: "task-title-row" },
        h("div", { class: "crumbs" }, backLink(), h("span", { class: "crumb-sep" }, "/")),
        h("h1", { class: "task-name device-title", title: d.name }, d.name),
        h("span", { id: "device-state" }, pill(d.state, "device")),
        h("span", { class: "spacer" }),
        ACTIONS.map((a) => actionButton(d, a)),
        takeoverControls(d),
        stopControls(d),
      ),
      takeoverBanner(d),
      d.state === "stopped"
        ? h(
            "div",
            { class: "stop-banner", id: "device-stopped", role: "status" },
            h("strong", {}, "Emergency stop."),
            " ",
            h("span", { id: "device-stop-reason" }, sentence(d.stop_reason || "stopped by an operator")),
            " It takes no work and its agent refuses every action tool until it is resumed.",
            (d.control_applied ?? 0) < (d.control_generation ?? 0)
              ? h(
                  "span",
                  { id: "device-stop-pending", class: "muted" },
                  " Its agent has not confirmed the stop yet (it is sent until it does; an offline agent gets it when it reconnects).",
                )
              : null,
          )
        : null,
      h(
        "div",
        { class: "task-meta" },
        meta("ID", h("span", { class: "mono" }, d.id)),
        meta("Platform", [d.platform || "other", d.info?.os ? ` · ${[d.info.os, d.info.version].filter(Boolean).join(" ")}` : ""]),
        meta("Last seen", timeAgo(d.last_seen)),
        meta("Enrolled", timeAt(d.created_at)),
        meta("Queue", String(d.queue_length ?? 0)),
      ),
    );
  }

  function actionButton(d, action) {
    const state = d.state;
    const disabled =
      acting ||
      actionIsMoot(state, action.verb);
    return h(
      "button",
      { class: "button small", type: "button", title: action.hint, disabled, dataset: { action: action.verb }, onclick: () => act(action) },
      action.label,
    );
  }

  function stopControls(d) {
    if (role === "viewer" || d.state === "revoked") return null;
    if (d.state === "stopped") {
      resumeButton.disabled = acting;
      return resumeButton;
    }
    return [stopReason, stopButton];
  }

  function takeoverControls(d) {
    if (role === "viewer" || d.state === "revoked") return null;
    const t = d.takeover;
    if (t?.taken_over) {
      if (t.source === "owner") return null; // the owner hands it back at the device
      handbackButton.disabled = acting;
      return [handbackNote, handbackButton];
    }
    takeoverButton.disabled = acting;
    return [takeoverReason, takeoverButton];
  }

  function takeoverBanner(d) {
    const t = d.takeover;
    if (!t?.taken_over) return null;
    const who = t.source === "owner" ? "its owner, at the device" : `${t.by || "an operator"}`;
    return h(
      "div",
      { class: "stop-banner takeover-banner", id: "device-taken-over", role: "status" },
      h("strong", {}, "Taken over"),
      ` by ${who}`,
      t.since ? [" ", h("span", { class: "muted", id: "device-takeover-since" }, "(", timeAgo(t.since), ")")] : null,
      t.reason ? [": ", h("span", { id: "device-takeover-reason" }, t.reason)] : null,
      ". Its work is paused until it is handed back.",
    );
  }

  async function takeover(take) {
    const verb = take ? "takeover" : "handback";
    const body = take ? { reason: takeoverReason.value.trim() } : { note: handbackNote.value.trim() };
    if (take && !body.reason) {
      takeoverReason.focus();
      flash("Say why you take the device over: the reason is recorded and shown.", "error", "A reason is needed");
      return;
    }
    acting = true;
    drawHead();
    try {
      await api(`/v1/devices/${encodeURIComponent(device.id)}/${verb}`, { method: "POST", body });
      (take ? takeoverReason : handbackNote).value = "";
      flash(take ? `You have ${device.name} now.` : `${device.name} is handed back.`, "ok");
    } catch (err) {
      flash(err.message, "error", `${take ? "Take over" : "Hand back"} ${device.name} refused`);
    } finally {
      acting = false;
      if (!stopped) poll();
    }
  }

  async function setStopped(stop) {
    acting = true;
    drawHead();
    const verb = stop ? "stop" : "resume";
    try {
      const body = stop ? { reason: stopReason.value.trim() } : undefined;
      const out = await api(`/v1/devices/${encodeURIComponent(device.id)}/${verb}`, { method: "POST", body });
      if (stop) stopReason.value = "";
      flash(`${device.name} is now ${out.state}.`, "ok");
    } catch (err) {
      flash(err.message, "error", `${stop ? "Stop" : "Resume"} ${device.name} refused`);
    } finally {
      acting = false;
      if (!stopped) poll();
    }
  }

  async function act(action) {
    acting = true;
    drawHead();
    try {
      const out = await api(`/v1/devices/${encodeURIComponent(device.id)}/${action.verb}`, { method: "POST" });
      flash(`${device.name} is now ${out.state}.`, "ok");
    } catch (err) {
      flash(err.message, "error", `${action.label} ${device.name} refused`);
    } finally {
      acting = false;
      if (!stopped) poll();
    }
  }

  // ---- overview: labels, now running, info, policy -------------------------------------------

  function drawOverview(d) {
    const info = { ...(d.info || {}) };
    const policy = info.policy;
    delete info.policy;
    const labels = labelList(d.labels);
    return [
      h("h2", { class: "card-title" }, "Overview"),
      h(
        "dl",
        { class: "facts device-facts" },
        h("dt", {}, "Labels"),
        h(
          "dd",
          { id: "device-labels" },
          labels.length ? h("div", { class: "labels" }, labels.map((l) => h("span", { class: "label" }, l))) : h("span", { class: "muted" }, "none"),
        ),
        h("dt", {}, "Running"),
        h("dd", { id: "device-current" }, currentBatch(d)),
        h("dt", {}, "Connection"),
        h("dd", {}, `${d.connected ? "connected" : "not connected"} · ${d.liveness || "—"}${d.admin_state && d.admin_state !== "active" ? ` · ${d.admin_state}` : ""}`),
        // Why it is cordoned (an operator, or a safety budget its agent breached)
        d.cordon_reason ? [h("dt", {}, "Cordoned"), h("dd", { id: "device-cordon-reason", class: "warn strong" }, d.cordon_reason)] : null,
      ),
      policy && typeof policy === "object" ? drawPolicy(policy) : null,
      h("h3", { class: "sub-title" }, "Info"),
      Object.keys(info).length ? h("pre", { class: "json", id: "device-info" }, pretty(info)) : h("p", { class: "muted" }, "The agent reported nothing else."),
    ];
  }

  function drawPolicy(p) {
    const list = (v, none) => (Array.isArray(v) ? (v.length ? v.join(", ") : none) : v === null || v === undefined ? none : String(v));
    const rows = [
      ["Shell allowed", p.shell_allow === null || p.shell_allow === undefined ? "any command (no allow list)" : list(p.shell_allow, "nothing")],
      ["Shell denied", list(p.shell_deny, "—")],
      ["Needs approval", list(p.approval_required, "—")],
      ["Unattended", p.unattended === undefined ? "—" : p.unattended ? "yes" : "no"],
      ["Kill switch", p.kill_switch ? "ON: the agent refuses all work" : "off (the owner can turn it on at run time)"],
      ["Safety budgets", budgets(p.safety_budgets)],
    ];
    const known = new Set(["shell_allow", "shell_deny", "approval_required", "unattended", "kill_switch", "safety_budgets"]);
    const extra = Object.fromEntries(Object.entries(p).filter(([k]) => !known.has(k)));
    return h(
      "div",
      { id: "device-policy" },
      h("h3", { class: "sub-title" }, "Policy (reported by the agent)"),
      h(
        "dl",
        { class: "facts device-facts" },
        rows.map(([k, v]) => [h("dt", {}, k), h("dd", { class: k === "Kill switch" && p.kill_switch ? "warn strong" : null }, v)]),
      ),
      Object.keys(extra).length ? h("pre", { class: "json" }, pretty(extra)) : null,
    );
  }

  function budgets(b) {
    if (!b || typeof b !== "object") return "—";
    const n = b.max_destructive_per_minute, m = b.max_consecutive_bad_outcomes;
    const parts = [n ? `${n} destructive actions a minute` : null, m ? `${m} uncertain or refused outcomes in a row` : null].filter(Boolean);
    return parts.length ? `at most ${parts.join("; at most ")}` : "none";
  }

  // ---- tools -------------------------------------------------------------------------------

  function drawTools(list) {
    const sorted = [...list].sort((a, b) => String(a.name).localeCompare(String(b.name)));
    return [
      h("h2", { class: "card-title" }, `Tools (${sorted.length})`),
      sorted.length
        ? h("div", { class: "tool-list" }, sorted.map(toolRow))
        : h("p", { class: "muted" }, "No tools reported yet: the agent sends its catalogue when it connects."),
    ];
  }

  function toolRow(t) {
    const ann = t.annotations || {};
    const safe = Boolean(ann.read_only || ann.idempotent);
    const props = Object.keys(t.input_schema?.properties || {});
    return h(
      "details",
      { class: "tool", dataset: { tool: t.name } },
      h(
        "summary",
        {},
        h("span", { class: "mono strong tool-name", title: t.name }, t.name),
        h(
          "span",
          { class: "tool-badges" },
          h(
            "span",
            {
              class: `badge ${safe ? "badge-ok" : "badge-warn"}`,
              dataset: { retrySafe: String(safe) },
              title: safe
                ? "A failed or uncertain attempt may be retried"
                : "Neither read-only nor idempotent: not retried unless the command says idempotent: true",
            },
            safe ? "retry-safe" : "not retry-safe",
          ),
          // Why it is safe: read-only implies idempotent, so one reason is enough.
          ann.read_only ? h("span", { class: "badge" }, "read-only") : ann.idempotent ? h("span", { class: "badge" }, "idempotent") : null,
          ann.destructive ? h("span", { class: "badge badge-danger" }, "destructive") : null,
        ),
        h("span", { class: "tool-desc" }, firstLine(t.description) || h("span", { class: "muted" }, "no description")),
      ),
      h(
        "div",
        { class: "tool-body" },
        t.description && t.description.trim() !== firstLine(t.description) ? h("p", { class: "tool-long" }, t.description.trim()) : null,
        h("div", { class: "eyebrow" }, props.length ? `Input schema · ${props.join(", ")}` : "Input schema"),
        h("pre", { class: "json tool-schema" }, pretty(t.input_schema || {})),
      ),
    );
  }

  // ---- attempts and history ----------------------------------------------------------------

  function drawAttempts(out) {
    const title = h("h2", { class: "card-title" }, "Recent attempts");
    if (out.error) return [title, h("p", { class: "muted", id: "attempts-unavailable" }, `Attempts are not available: ${out.error}`)];
    if (!out.items.length) return [title, h("p", { class: "muted" }, "No work has run on this device yet.")];
    return [
      title,
      h(
        "table",
        { class: "table compact", id: "attempts-table" },
        h("thead", {}, h("tr", {}, ["Task · node", "Status", "When", "Took"].map((t) => h("th", { scope: "col" }, t)))),
        h(
          "tbody",
          {},
          out.items.map((a) =>
            h(
              "tr",
              { dataset: { taskId: a.task_id, nodeId: a.node_id, status: a.status } },
              h(
                "td",
                {},
                h(
                  "a",
                  { class: "attempt-task", href: `#/tasks/${encodeURIComponent(a.task_id)}`, title: a.task_id },
                  h("span", { class: "strong" }, a.task_name || shortId(a.task_id, 14)),
                ),
                h("div", { class: "muted small" }, h("span", { class: "mono" }, a.node_id), ` · attempt ${a.n}`),
                a.error ? h("div", { class: "small error-line", title: a.error.message || "" }, h("span", { class: "mono" }, a.error.code || "error"), " ", a.error.message || "") : null,
              ),
              h("td", {}, pill(a.status, "result")),
              h("td", { class: "nowrap small" }, timeRange(a.started_at, a.ended_at)),
              h("td", { class: "nowrap small num" }, a.started_at && a.ended_at ? duration(span(a.started_at, a.ended_at)) : "—"),
            ),
          ),
        ),
      ),
    ];
  }

  function drawHistory(out) {
    const title = h("h2", { class: "card-title" }, "State history");
    if (out.error) return [title, h("p", { class: "muted", id: "history-unavailable" }, `History is not available: ${out.error}`)];
    if (!out.items.length) return [title, h("p", { class: "muted" }, "No state changes recorded yet.")];
    return [
      title,
      h(
        "ol",
        { class: "timeline", id: "history-list" },
        out.items.map((e) =>
          h(
            "li",
            { dataset: { state: e.state } },
            pill(e.state, "device"),
            h("span", { class: "timeline-reason" }, e.reason || ""),
            h("span", { class: "spacer" }),
            h("span", { class: "small muted nowrap" }, timeAt(e.at)),
          ),
        ),
      ),
    ];
  }

  myRole().then((r) => {
    role = r;
    if (!stopped && device) drawHead();
  });
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
    live.stop();
  };
}

/** What the device is running now, linked to its task (or its batch id on older servers). */
export function currentBatch(d) {
  if (d.current_task_id) {
    return h(
      "a",
      { class: "current-task", href: `#/tasks/${encodeURIComponent(d.current_task_id)}`, title: d.current_batch || d.current_task_id, dataset: { taskId: d.current_task_id } },
      icon("tasks", 14),
      d.current_node_id ? h("span", { class: "mono" }, d.current_node_id) : null,
      h("span", { class: "muted small mono" }, shortId(d.current_task_id, 14)),
    );
  }
  if (d.current_batch) return h("span", { class: "mono", title: d.current_batch }, shortId(d.current_batch, 14));
  return h("span", { class: "muted" }, "—");
}

/** The stop's reason as a sentence of its own: "stopped by an operator: x" -> "Stopped by an operator: x." */
function sentence(text) {
  const t = String(text).trim();
  return t.charAt(0).toUpperCase() + t.slice(1) + (/[.!?]$/.test(t) ? "" : ".");
}

function firstLine(text) {
  return String(text || "")
    .trim()
    .split("\n")[0]
    .trim();
}

function meta(label, value) {
  return h("div", { class: "meta" }, h("span", { class: "meta-label" }, label), h("span", { class: "meta-value" }, value));
}

function backLink() {
  return h("a", { class: "back", href: "#/devices" }, icon("back", 14), "Devices");
}
