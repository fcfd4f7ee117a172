// views/tasks.js: the task list, newest first: state, node counts, timings; filter by state
// (`?state=`), page with `next_cursor` (older) and a stack of earlier cursors (newer). The page
// on screen is refreshed every few seconds so running tasks move along.

import { api, query } from "../api.js";
import { h, icon, pill, replace } from "../dom.js";
import { countsBar, emptyState, liveDuration, loading, TASK_STATES, timeAgo, timeAt } from "../ui.js";

const PAGE_SIZE = 25;
const REFRESH_MS = 3000;

export function mountTasks(root, params) {
  let state = TASK_STATES.includes(params.get("state")) ? params.get("state") : "";
  const limit = Math.min(500, Math.max(1, Number.parseInt(params.get("limit"), 10) || PAGE_SIZE));
  const cursors = [null]; // cursors[i] opens page i
  let page = 0;
  let next = null;
  let timer = null;
  let stopped = false;
  let generation = 0;
  let drawn = ""; // what the table shows, to skip redrawing the same page
  const controller = new AbortController();

  const filter = h(
    "div",
    { class: "segmented", role: "group", "aria-label": "Filter by state" },
    ["", ...TASK_STATES].map((st) =>
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
  const newer = h("button", { class: "button small", type: "button", id: "page-newer", onclick: () => go(page - 1) }, icon("chevronLeft", 14), "Newer");
  const older = h("button", { class: "button small", type: "button", id: "page-older", onclick: () => go(page + 1) }, "Older", icon("chevronRight", 14));
  const pageInfo = h("span", { class: "muted small" });
  const body = h("div", { class: "card table-card" }, loading("Loading tasks…"));
  root.append(
    h(
      "div",
      { class: "page" },
      h("div", { class: "page-head" }, h("div", {}, h("h1", {}, "Tasks")), filter),
      body,
      h("div", { class: "pager" }, pageInfo, h("div", { class: "spacer" }), newer, older),
    ),
  );

  function setState(st) {
    state = st;
    for (const b of filter.children) b.setAttribute("aria-pressed", String((b.dataset.state === "all" ? "" : b.dataset.state) === st));
    const q = new URLSearchParams();
    if (st) q.set("state", st);
    if (limit !== PAGE_SIZE) q.set("limit", String(limit));
    history.replaceState(null, "", q.toString() ? `#/tasks?${q}` : "#/tasks");
    cursors.length = 1;
    go(0);
  }

  function go(n) {
    if (n < 0 || n >= cursors.length + (next ? 1 : 0)) return;
    if (n === cursors.length) cursors.push(next);
    page = n;
    newer.disabled = older.disabled = true; // until this page's cursor is known
    replace(body, loading("Loading tasks…"));
    load();
  }

  async function load() {
    clearTimeout(timer);
    const mine = ++generation;
    try {
      const out = await api(`/v1/tasks${query({ state, limit, cursor: cursors[page] })}`, { signal: controller.signal });
      if (mine !== generation || stopped) return;
      next = out.next_cursor;
      draw(out.items || []);
    } catch (err) {
      if (stopped || err.name === "AbortError" || mine !== generation) return;
      drawn = "";
      replace(body, emptyState("Could not load tasks", err.message));
    }
    newer.disabled = page === 0;
    older.disabled = !next;
    pageInfo.textContent = `Page ${page + 1}`;
    if (!stopped) timer = setTimeout(load, REFRESH_MS);
  }

  function draw(tasks) {
    const sig = JSON.stringify([state, page, tasks]);
    if (sig === drawn && body.querySelector("table, .empty")) return; // nothing new: keep the DOM
    drawn = sig;
    if (!tasks.length) {
      replace(
        body,
        emptyState(
          state ? `No ${state} tasks` : "No tasks yet",
          state ? "Try another filter." : "Submit one with `orrery submit dag.yaml` or POST /v1/tasks.",
        ),
      );
      return;
    }
    const rows = tasks.map((t) => {
      const href = `#/tasks/${encodeURIComponent(t.id)}`;
      const tr = h(
        "tr",
        { class: "clickable", dataset: { taskId: t.id, state: t.state } },
        h("td", {}, h("a", { href, class: "strong task-link" }, t.name || t.id), h("div", { class: "mono muted small" }, t.id)),
        h("td", {}, pill(t.state, "task")),
        h("td", {}, countsBar(t.node_counts)),
        h("td", { class: "nowrap" }, timeAt(t.created_at), h("div", { class: "muted small" }, timeAgo(t.created_at))),
        h("td", { class: "nowrap" }, timeAt(t.finished_at)),
        h("td", { class: "right nowrap" }, isOver(t) && !t.finished_at ? "—" : liveDuration(t.created_at, t.finished_at)),
      );
      tr.addEventListener("click", (ev) => {
        if (ev.target.closest("a") || window.getSelection()?.toString()) return;
        location.hash = href;
      });
      return tr;
    });
    replace(
      body,
      h(
        "table",
        { class: "table tasks-table", id: "tasks-table" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ["Task", "State", "Nodes", "Created", "Finished", "Duration"].map((t, i) =>
              h("th", { scope: "col", class: i === 5 ? "right" : null }, t),
            ),
          ),
        ),
        h("tbody", {}, rows),
      ),
    );
  }

  load();
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
  };
}

function isOver(t) {
  return ["succeeded", "failed", "cancelled"].includes(t.state);
}
