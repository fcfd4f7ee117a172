// views/approvals.js: commands waiting for a person (#/approvals), oldest first (the order to
// decide them in), and the decided ones by state (`?state=approved|denied|expired|cancelled`, or
// `all`). Polls GET /v1/approvals every few seconds; a card decided here stays on the pending
// list with its new state until the view is left, so the operator sees what they did.

import { api, myRole, query } from "../api.js";
import { h, replace } from "../dom.js";
import { serverNow } from "../format.js";
import { APPROVAL_STATES, ApprovalList } from "../approvals.js";
import { emptyState, loading, timeAgo } from "../ui.js";

const POLL_MS = 3000;
const PAGE = 50;

export function mountApprovals(root, params) {
  const asked = params.get("state");
  let state = asked === "all" ? "" : APPROVAL_STATES.includes(asked) ? asked : "pending";
  let limit = PAGE;
  let role = null;
  let stopped = false;
  let timer = null;
  let generation = 0;
  let more = false;
  const decidedHere = new Map(); // id -> approval decided from this view (kept on the pending list)
  const devices = new Map(); // id -> name
  const tasks = new Map(); // id -> name ("" while asked, or when it has none)
  const controller = new AbortController();

  const list = new ApprovalList({
    id: "approvals-list",
    role: () => role,
    deviceName: (id) => devices.get(id) || id,
    taskName: (id) => tasks.get(id) || "",
    onDecided: (a) => {
      if (a.state !== "pending") decidedHere.set(a.id, a);
      poll();
    },
  });
  const filter = h(
    "div",
    { class: "segmented", role: "group", "aria-label": "Filter by state", id: "approvals-filter" },
    [...APPROVAL_STATES, ""].map((st) =>
      h(
        "button",
        {
          type: "button",
          class: ["seg-button", st && `st-${st}`],
          dataset: { state: st || "all" },
          "aria-pressed": String(st === state),
          onclick: () => setState(st),
        },
        st ? h("span", { class: "swatch" }) : null,
        st || "All",
      ),
    ),
  );
  const updated = h("span", { class: "updated muted" });
  const body = h("div", { class: "approvals-body" }, loading("Loading approvals…"));
  const moreButton = h("button", { class: "button small", type: "button", id: "approvals-more", hidden: true, onclick: showMore }, "Show more");
  root.append(
    h(
      "div",
      { class: "page" },
      h(
        "div",
        { class: "page-head" },
        h(
          "div",
          {},
          h("h1", {}, "Approvals"),
          h("p", { class: "muted small page-intro" }, "Commands a device will not run until someone approves them. Denied ones fail their node with approval_denied."),
        ),
        h("div", { class: "page-actions" }, updated, filter),
      ),
      body,
      h("div", { class: "pager" }, h("div", { class: "spacer" }), moreButton),
    ),
  );

  function setState(st) {
    state = st;
    limit = PAGE;
    decidedHere.clear();
    for (const b of filter.children) b.setAttribute("aria-pressed", String((b.dataset.state === "all" ? "" : b.dataset.state) === st));
    history.replaceState(null, "", st === "pending" ? "#/approvals" : `#/approvals?state=${st || "all"}`);
    list.update([]);
    replace(body, loading("Loading approvals…"));
    poll();
  }

  function showMore() {
    limit = Math.min(500, limit + PAGE);
    poll();
  }

  async function poll() {
    clearTimeout(timer);
    const mine = ++generation;
    try {
      // The queue oldest first (the order to decide in); a history newest first.
      const order = state === "pending" ? "oldest" : "newest";
      const out = await api(`/v1/approvals${query({ state, limit, order })}`, { signal: controller.signal });
      if (mine !== generation || stopped) return;
      more = Boolean(out.next_cursor) && limit < 500;
      draw(out.items || []);
      replace(updated, h("span", { class: "live-dot", "aria-hidden": "true" }), "Live · updated ", timeAgo(new Date(serverNow()).toISOString()));
    } catch (err) {
      if (stopped || err.name === "AbortError" || mine !== generation) return;
      replace(updated, h("span", { class: "warn" }, `Not updating: ${err.message}`));
      if (!body.contains(list.el)) replace(body, emptyState("Could not load approvals", err.message));
    }
    if (!stopped && mine === generation) timer = setTimeout(poll, POLL_MS);
  }

  function draw(items) {
    // A decision is final: what this view saw decided wins over an older listing of it.
    const ids = new Set(items.map((a) => a.id));
    const listed = items.map((a) => decidedHere.get(a.id) || a);
    const shown = state === "pending" ? [...listed, ...[...decidedHere.values()].filter((a) => !ids.has(a.id))] : listed;
    if (shown.some((a) => !devices.has(a.device_id))) loadDevices();
    loadTaskNames(shown);
    moreButton.hidden = !more;
    list.update(shown);
    if (!shown.length) {
      replace(
        body,
        emptyState(
          state === "pending" ? "Nothing waits for approval" : `No ${state || ""} approvals`.replace("  ", " "),
          state === "pending"
            ? "A command whose tool is on a device's approval_required list waits here until someone decides."
            : "Try another filter.",
        ),
      );
    } else if (!body.contains(list.el)) replace(body, list.el);
  }

  let devicesAt = 0;
  async function loadDevices() {
    if (Date.now() - devicesAt < 5000) return;
    devicesAt = Date.now();
    try {
      const out = await api("/v1/devices", { signal: controller.signal });
      for (const d of out.items || []) devices.set(d.id, d.name);
      if (!stopped) list.refresh();
    } catch {
      /* ids are shown instead of names */
    }
  }

  // The first draw waits for the role, so a viewer never sees buttons flash up.
  /** Task names for the links, each asked once (a few at a time). */
  function loadTaskNames(shown) {
    const missing = [...new Set(shown.map((a) => a.task_id))].filter((id) => !tasks.has(id)).slice(0, 20);
    for (const id of missing) {
      tasks.set(id, "");
      api(`/v1/tasks/${encodeURIComponent(id)}`, { signal: controller.signal }).then(
        (t) => {
          tasks.set(id, t.name || "");
          if (!stopped && t.name) list.refresh();
        },
        () => {},
      );
    }
  }

  myRole().then((r) => {
    role = r;
    if (!stopped) poll();
  });
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
    list.destroy();
  };
}
