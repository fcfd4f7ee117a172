// views/schedules.js: cron schedules. The list (#/schedules): each schedule's cron in
// words, its next runs in its own time zone, its last run's task (linked, with its state), its
// overlap policy and state, and Pause / Resume for operators. One schedule (#/schedules/<id>):
// the same facts, what waits in its queue, the task it submits, and its ticks with what happened
// at each (created with its task, queued, skipped, missed, failed). Both poll every 3 s.

import { api, myRole } from "../api.js";
import { h, icon, pill, replace, sectionDrawer } from "../dom.js";
import { parseTime, pretty, serverNow, shortId } from "../format.js";
import { confirmButton, emptyState, flash, loading, timeAgo, timeAt } from "../ui.js";

const POLL_MS = 3000;
const TICKS = 50;

export function mountSchedules(root) {
  const controller = new AbortController();
  const updated = h("span", { class: "updated muted" });
  const body = h("div", { class: "card table-card" }, loading("Loading schedules…"));
  const busy = new Set();
  let role = null;
  let items = [];
  let stopped = false;
  let timer = null;
  let drawn = "";
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
          h("h1", {}, "Schedules"),
          h("p", { class: "muted small page-intro" }, "Each tick of a schedule's cron submits its task; a tick while the previous task still runs is skipped or queued."),
        ),
        h("div", { class: "page-actions" }, updated),
      ),
      body,
    ),
  );

  async function poll() {
    clearTimeout(timer);
    try {
      const out = await api("/v1/schedules?limit=500", { signal: controller.signal });
      if (stopped) return;
      items = out.items || [];
      draw();
      replace(updated, h("span", { class: "live-dot", "aria-hidden": "true" }), "Live · updated ", timeAgo(new Date(serverNow()).toISOString()));
    } catch (err) {
      if (stopped || err.name === "AbortError") return;
      replace(updated, h("span", { class: "warn" }, `Not updating: ${err.message}`));
      if (!items.length) replace(body, emptyState("Could not load schedules", err.message));
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }

  function draw() {
    const sig = JSON.stringify([items, [...busy], role]);
    if (sig === drawn) return;
    drawn = sig;
    if (!items.length) {
      replace(body, emptyState("No schedules yet", "Create one with `orrery schedules create schedule.yaml` or POST /v1/schedules."));
      return;
    }
    replace(
      body,
      h(
        "table",
        { class: "table schedules-table", id: "schedules-table", dataset: { role: role || "" } },
        h("thead", {}, h("tr", {}, ["Schedule", "When", "Next runs", "Last run", "Overlap", "State", ""].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, items.map(row)),
      ),
    );
  }

  function row(s) {
    const href = `#/schedules/${encodeURIComponent(s.id)}`;
    return h(
      "tr",
      { dataset: { scheduleId: s.id, paused: String(s.paused) } },
      h("td", {}, h("a", { class: "strong schedule-link", href }, s.name), h("div", { class: "mono muted small" }, s.id)),
      h("td", {}, h("div", { class: "schedule-when" }, s.description), h("div", { class: "mono muted small" }, `${s.cron} · ${s.timezone}`)),
      h("td", { class: "next-runs" }, nextRuns(s.next_runs, 3)),
      h("td", { class: "last-run" }, lastRun(s.last_run)),
      h("td", {}, s.overlap === "queue" ? `queue (≤ ${s.max_queued})` : "skip"),
      h("td", {}, pill(s.paused ? "paused" : "active", "schedule")),
      h("td", { class: "actions" }, role === "viewer" ? null : pauseButton(s, busy, () => poll())),
    );
  }

  myRole().then((r) => {
    role = r;
    if (!stopped) draw();
  });
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
  };
}

export function mountSchedule(root, ref) {
  const controller = new AbortController();
  const head = h("div", { class: "device-head" });
  const overview = h("section", { class: "card device-card", id: "schedule-overview" });
  const ticks = h("section", { class: "card device-card", id: "schedule-ticks" });
  const page = h("div", { class: "page device-page" }, head, h("div", { class: "device-grid" }, h("div", { class: "device-main" }, overview), h("div", { class: "device-side" }, ticks)));
  const busy = new Set();
  const section = sectionDrawer();
  let schedule = null;
  let role = null;
  let stopped = false;
  let timer = null;
  const deleteButton = confirmButton({
    id: "delete-schedule",
    label: "Delete",
    confirmLabel: "Confirm delete",
    title: "Delete the schedule and its tick history; the tasks it made stay",
    kind: "danger-outline",
    run: remove,
  });
  root.append(h("div", { class: "page" }, loading("Loading schedule…")));

  async function poll() {
    clearTimeout(timer);
    let s;
    let t;
    try {
      s = await api(`/v1/schedules/${encodeURIComponent(ref)}?next=10`, { signal: controller.signal });
      t = await api(`/v1/schedules/${encodeURIComponent(s.id)}/ticks?limit=${TICKS}`, { signal: controller.signal });
    } catch (err) {
      if (stopped || err.name === "AbortError") return;
      if (!schedule) {
        replace(root, h("div", { class: "page" }, backLink(), emptyState(err.status === 404 ? "No such schedule" : "Could not load the schedule", err.message)));
        return;
      }
      timer = setTimeout(poll, POLL_MS);
      return;
    }
    if (stopped) return;
    if (!schedule) {
      replace(root, page);
      document.title = `${s.name} · Orrery`;
    }
    schedule = s;
    section("head", head, [s, [...busy], role], drawHead);
    section("overview", overview, s, () => drawOverview(s));
    section("ticks", ticks, t.items, () => drawTicks(t.items || []));
    timer = setTimeout(poll, POLL_MS);
  }

  function drawHead() {
    const s = schedule;
    return [
      h(
        "div",
        { class: "task-title-row" },
        h("div", { class: "crumbs" }, backLink(), h("span", { class: "crumb-sep" }, "/")),
        h("h1", { class: "task-name device-title", title: s.name }, s.name),
        h("span", { id: "schedule-state", dataset: { role: role || "" } }, pill(s.paused ? "paused" : "active", "schedule")),
        h("span", { class: "spacer" }),
        role === "viewer" ? null : [pauseButton(s, busy, () => poll()), deleteButton],
      ),
      h(
        "div",
        { class: "task-meta" },
        meta("ID", h("span", { class: "mono" }, s.id)),
        meta("Cron", h("span", { class: "mono" }, s.cron)),
        meta("Time zone", s.timezone),
        meta("Created", timeAt(s.created_at)),
        s.paused && s.paused_at ? meta("Paused", timeAgo(s.paused_at)) : null,
      ),
    ];
  }

  function drawOverview(s) {
    const task = s.task || {};
    const nodes = task.dag?.nodes || [];
    return [
      h("h2", { class: "card-title" }, "Overview"),
      h(
        "dl",
        { class: "facts device-facts" },
        h("dt", {}, "When"),
        h("dd", { id: "schedule-description" }, `${s.description} (${s.timezone})`),
        h("dt", {}, "Overlap"),
        h("dd", {}, s.overlap === "queue" ? `queue: a tick waits for the previous task (at most ${s.max_queued} waiting)` : "skip: a tick while the previous task runs is skipped"),
        h("dt", {}, "Late ticks"),
        h("dd", {}, `after an outage the most recent missed tick still runs if it is at most ${s.starting_deadline_s} s old`),
        h("dt", {}, "Last run"),
        h("dd", { id: "schedule-last-run" }, lastRun(s.last_run)),
        h("dt", {}, "Task"),
        h("dd", {}, task.request ? h("span", {}, "planned from: ", h("em", {}, task.request)) : `${task.name || s.name}: ${nodes.length} node${nodes.length === 1 ? "" : "s"} (${nodes.map((n) => n.id).join(", ")})`),
      ),
      h("h3", { class: "sub-title" }, "Next runs"),
      h("div", { id: "schedule-next-runs" }, nextRuns(s.next_runs, 10, s.paused ? "None while paused." : "It never fires again.")),
      s.queued?.length ? [h("h3", { class: "sub-title" }, "Queued"), h("div", { id: "schedule-queued" }, nextRuns(s.queued, 100))] : null,
      h("details", { class: "schedule-task" }, h("summary", { class: "sub-title" }, "Task body"), h("pre", { class: "json" }, pretty(task))),
    ];
  }

  function drawTicks(items) {
    const title = h("h2", { class: "card-title" }, "Ticks");
    if (!items.length) return [title, h("p", { class: "muted" }, "No tick yet: the first one comes at the first next run.")];
    return [
      title,
      h(
        "table",
        { class: "table compact", id: "ticks-table" },
        h("thead", {}, h("tr", {}, ["Tick", "Outcome", "Task", ""].map((t) => h("th", { scope: "col" }, t)))),
        h(
          "tbody",
          {},
          items.map((t) =>
            h(
              "tr",
              { dataset: { outcome: t.outcome, at: t.at } },
              h("td", { class: "nowrap small" }, zoned(t.local)),
              h("td", {}, pill(t.outcome, "tick")),
              h("td", {}, t.task_id ? taskLink(t.task_id, t.task_state) : h("span", { class: "muted" }, "—")),
              h("td", { class: "small muted tick-detail" }, t.detail || ""),
            ),
          ),
        ),
      ),
    ];
  }

  async function remove() {
    try {
      await api(`/v1/schedules/${encodeURIComponent(schedule.id)}`, { method: "DELETE" });
      flash(`${schedule.name} is deleted; the tasks it made stay.`, "ok");
      location.hash = "#/schedules";
    } catch (err) {
      flash(err.message, "error", `Delete ${schedule.name} refused`);
    }
  }

  myRole().then((r) => {
    role = r;
    if (!stopped && schedule) section("head", head, [schedule, [...busy], role], drawHead);
  });
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
    controller.abort();
  };
}

/** Pause (or Resume) a schedule; `busy` holds the ids with a change in flight. */
function pauseButton(s, busy, after) {
  const verb = s.paused ? "resume" : "pause";
  return h(
    "button",
    {
      class: "button small",
      type: "button",
      disabled: busy.has(s.id),
      dataset: { action: verb },
      title: s.paused ? "Tick again from the next future tick (the paused time is not caught up)" : "No ticks until resumed",
      onclick: async () => {
        busy.add(s.id);
        after();
        try {
          const out = await api(`/v1/schedules/${encodeURIComponent(s.id)}/${verb}`, { method: "POST" });
          flash(`${out.name} is ${out.paused ? "paused" : "active again"}.`, "ok");
        } catch (err) {
          flash(err.message, "error", `${s.paused ? "Resume" : "Pause"} ${s.name} refused`);
        } finally {
          busy.delete(s.id);
          after();
        }
      },
    },
    s.paused ? "Resume" : "Pause",
  );
}

function nextRuns(list, count, none = "None while paused.") {
  if (!list?.length) return h("span", { class: "muted" }, none);
  return h("ol", { class: "run-list" }, list.slice(0, count).map((at) => h("li", {}, zoned(at), " ", h("span", { class: "muted small" }, until(at)))));
}

function lastRun(last) {
  if (!last) return h("span", { class: "muted" }, "never");
  return h("div", {}, taskLink(last.task_id, last.task_state, last.task_name), h("div", { class: "small muted" }, zoned(last.local)));
}

function taskLink(taskId, state, name) {
  return h(
    "a",
    { class: "tick-task", href: `#/tasks/${encodeURIComponent(taskId)}`, title: taskId, dataset: { taskId } },
    state ? pill(state, "task") : null,
    " ",
    h("span", { class: name ? "strong" : "mono small" }, name || shortId(taskId, 14)),
  );
}

/** A time as the schedule's zone has it ("2026-11-01 01:30:00 −04:00"): DST changes stay visible. */
function zoned(iso) {
  const text = String(iso || "");
  const offset = text.slice(19).replace("-", "−") || "UTC";
  return h("time", { datetime: text, title: text }, `${text.slice(0, 10)} ${text.slice(11, 19)} `, h("span", { class: "muted" }, offset));
}

/** "in 3 s", "in 5 min", "in 2 h", "in 4 d"; "now" for the past (a tick being fired). */
function until(iso) {
  const t = parseTime(iso);
  if (t === null) return "";
  const secs = Math.round((t - serverNow()) / 1000);
  if (secs <= 0) return "now";
  if (secs < 60) return `in ${secs} s`;
  const mins = Math.round(secs / 60);
  if (mins < 60) return `in ${mins} min`;
  const hours = Math.round(mins / 60);
  return hours < 48 ? `in ${hours} h` : `in ${Math.round(hours / 24)} d`;
}

function meta(label, value) {
  return h("div", { class: "meta" }, h("span", { class: "meta-label" }, label), h("span", { class: "meta-value" }, value));
}

function backLink() {
  return h("a", { class: "back", href: "#/schedules" }, icon("back", 14), "Schedules");
}
