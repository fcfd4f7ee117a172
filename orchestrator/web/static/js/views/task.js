// views/task.js: one task, live. Draws the DAG (graph.js), follows GET /v1/tasks/{id}/events
// (sse.js) and recolours nodes as events arrive; re-fetches the task at most every 500 ms for
// attempt details, and redraws after `dag.edited`. Clicking a node opens its side panel.
// A finished task can be re-run (whole, or from the selected node: POST /v1/tasks/{id}/rerun);
// the page then moves to the new task, which says which task it re-runs.
// A node waiting for approval (`waiting_approval`) is named in a banner under the title; its
// panel shows its approvals with Approve / Deny (approvals.js). `?node=<id>` opens a node's panel.
// What the task's commands published is listed above the graph, with downloads (artifacts.js).

import { api, myRole, query } from "../api.js";
import { ApprovalList } from "../approvals.js";
import { ArtifactList } from "../artifacts.js";
import { h, icon, pill, replace } from "../dom.js";
import { labelList, shortId } from "../format.js";
import { DagView } from "../graph.js";
import { EventFeed } from "../sse.js";
import { confirmButton, countChips, emptyState, flash, liveDuration, loading, TERMINAL_TASK, timeAgo, timeAt } from "../ui.js";
import { NodePanel } from "./nodepanel.js";

const REFETCH_MS = 500;
const TERMINAL_NODE = new Set(["succeeded", "failed", "skipped", "cancelled"]);

export function mountTask(root, taskId, params = new URLSearchParams()) {
  const base = `/v1/tasks/${encodeURIComponent(taskId)}`;
  const controller = new AbortController();
  let task = null;
  let stopped = false;
  let selected = null;
  let feed = null;
  let lastSeq = 0; // the newest event id applied
  const eventStates = new Map(); // node id -> {state, seq, error}: newer than a snapshot may be
  let taskEvent = null; // {state, seq}
  const devices = new Map(); // device id -> name
  const askedDevices = new Set(); // ids looked up one by one (not in the list)
  let devicesAt = 0;
  let role = null; // the key's role once known; null shows every action (the server decides)
  const taskNames = new Map(); // task id -> name, for the "re-run of" link
  let approvals = []; // this task's approvals (all states), oldest first
  const banner = h("div", { class: "approval-banner", id: "approval-banner", hidden: true });

  const head = h("div", { class: "task-head" });
  const dag = new DagView({ onSelect: (id) => select(id), deviceName: (id) => deviceName(id) });
  const panel = new NodePanel({
    taskId,
    deviceName: (id) => deviceName(id),
    onClose: () => select(null),
    canRerun: () => canRerun(),
    onRerun: (nodeId) => rerun(nodeId),
    approvals: new ApprovalList({
      id: "node-approval-list",
      showTask: false,
      role: () => role,
      deviceName: (id) => deviceName(id),
      onDecided: () => loadApprovals(),
    }),
  });
  const graphCard = h("div", { class: "card graph-card" }, dag.el);
  const bodyEl = h("div", { class: "task-body" }, graphCard, panel.el);
  const artifacts = new ArtifactList({ taskId, deviceName: (id) => deviceName(id), signal: controller.signal });
  const page = h("div", { class: "page task-page" }, head, artifacts.el, bodyEl);
  root.append(h("div", { class: "page" }, loading("Loading task…")));

  const connection = h("span", { class: "conn", id: "stream-status" });
  const cancelButton = h("button", { class: "button danger-outline small", type: "button", id: "cancel-task" }, "Cancel task");
  const rerunButton = confirmButton({
    id: "rerun-task",
    label: "Re-run",
    confirmLabel: "Confirm re-run",
    title: "Run this task's DAG again as a new task",
    iconName: "rerun",
    run: () => rerun(null),
  });
  let confirmTimer = null;
  cancelButton.addEventListener("click", onCancel);

  const onKey = (ev) => {
    if (ev.key === "Escape" && selected) select(null);
  };
  document.addEventListener("keydown", onKey);

  // ---- data -------------------------------------------------------------------------------

  let fetchTimer = null;
  let fetching = false;
  let fetchAgain = false;
  let lastFetch = 0;

  /** Re-fetch the task soon: one request at a time, at most one per REFETCH_MS. */
  function scheduleFetch() {
    if (stopped) return;
    if (fetching) {
      fetchAgain = true;
      return;
    }
    if (fetchTimer) return;
    fetchTimer = setTimeout(fetchTask, Math.max(0, lastFetch + REFETCH_MS - Date.now()));
  }

  async function fetchTask() {
    fetchTimer = null;
    fetching = true;
    lastFetch = Date.now();
    const seqAtStart = lastSeq;
    try {
      const t = await api(base, { signal: controller.signal });
      if (!stopped) apply(t, seqAtStart);
    } catch (err) {
      if (stopped || err.name === "AbortError") return;
      if (!task) {
        replace(root, h("div", { class: "page" }, backLink(), emptyState(err.status === 404 ? "No such task" : "Could not load the task", err.message)));
        return;
      }
      flash(err.message, "error", "Could not refresh the task");
    } finally {
      fetching = false;
      if (fetchAgain && !stopped) {
        fetchAgain = false;
        scheduleFetch();
      }
    }
  }

  /** Take a snapshot, keeping states from events newer than the snapshot's request. */
  function apply(t, seqAtStart) {
    const first = !task;
    for (const n of t.nodes || []) {
      const ev = eventStates.get(n.id);
      if (ev && ev.seq > seqAtStart) n.state = ev.state;
    }
    if (taskEvent && taskEvent.seq > seqAtStart) t.state = taskEvent.state;
    t.node_counts = counts(t.nodes || []);
    task = t;
    if (first) {
      replace(root, page);
      startFeed();
      loadApprovals();
      artifacts.refresh();
    }
    drawHead();
    dag.render(task);
    if (selected) {
      const node = findNode(selected);
      if (node) panel.show(task, node);
      else select(null);
    } else if (first && params.get("node") && findNode(params.get("node"))) select(params.get("node"));
    if ([...usedDevices()].some((id) => !devices.has(id) && !askedDevices.has(id))) loadDevices();
    if (task.rerun_of && !taskNames.has(task.rerun_of)) loadTaskName(task.rerun_of);
  }

  async function loadTaskName(id) {
    taskNames.set(id, null);
    try {
      const t = await api(`/v1/tasks/${encodeURIComponent(id)}`, { signal: controller.signal });
      taskNames.set(id, t.name || "");
      if (!stopped && task) drawHead();
    } catch {
      /* the link shows the id */
    }
  }

  async function loadDevices() {
    if (Date.now() - devicesAt < 5000) return;
    devicesAt = Date.now();
    try {
      const out = await api("/v1/devices", { signal: controller.signal });
      for (const d of out.items || []) devices.set(d.id, d.name);
      // A device missing from the list (e.g. a revoked one) is asked for once by id.
      const missing = [...usedDevices()].filter((id) => !devices.has(id) && !askedDevices.has(id));
      for (const id of missing) askedDevices.add(id);
      await Promise.all(
        missing.map((id) =>
          api(`/v1/devices/${encodeURIComponent(id)}`, { signal: controller.signal }).then(
            (d) => devices.set(d.id, d.name),
            () => {},
          ),
        ),
      );
      if (stopped || !task) return;
      artifacts.draw();
      dag.render(task); // same shape: updates the device names on the nodes in place
      panel.approvalList?.refresh();
      if (selected) {
        panel.signature = "";
        const node = findNode(selected);
        if (node) panel.show(task, node);
      }
    } catch {
      /* names are a nicety: ids are shown instead */
    }
  }

  function usedDevices() {
    const ids = new Set();
    for (const n of task?.nodes || []) {
      if (n.queued_on) ids.add(n.queued_on);
      for (const a of n.attempts || []) if (a.device_id) ids.add(a.device_id);
      for (const c of n.children || []) ids.add(c.device_id);
    }
    return ids;
  }

  // ---- approvals --------------------------------------------------------------------------

  let approvalsBusy = false;
  let approvalsAgain = false;

  /** This task's approvals (asked again on approval events and after a decision here). */
  async function loadApprovals() {
    if (approvalsBusy) {
      approvalsAgain = true;
      return;
    }
    approvalsBusy = true;
    try {
      role = await myRole(); // before the first draw: a viewer never sees the buttons
      const out = await api(`/v1/approvals${query({ task_id: taskId, limit: 500 })}`, { signal: controller.signal });
      if (stopped) return;
      approvals = out.items || [];
      drawApprovals();
    } catch {
      /* the banner and panel keep what they showed; the next event asks again */
    } finally {
      approvalsBusy = false;
      if (approvalsAgain && !stopped) {
        approvalsAgain = false;
        loadApprovals();
      }
    }
  }

  function drawApprovals() {
    const waiting = approvals.filter((a) => a.state === "pending");
    banner.hidden = !waiting.length;
    replace(
      banner,
      h("strong", {}, waiting.length === 1 ? "1 command waits for approval:" : `${waiting.length} commands wait for approval:`),
      waiting.map((a) =>
        h(
          "button",
          { class: "button small", type: "button", dataset: { node: a.node_id }, onclick: () => select(a.node_id) },
          h("span", { class: "mono" }, a.node_id),
          " · ",
          h("span", { class: "mono" }, a.tool),
        ),
      ),
      h("span", { class: "spacer" }),
      h("a", { href: "#/approvals" }, "All approvals"),
    );
    panel.setApprovals(approvals);
  }

  function deviceName(id) {
    return devices.get(id) || id;
  }

  function findNode(id) {
    return (task?.nodes || []).find((n) => n.id === id);
  }

  // ---- live events ------------------------------------------------------------------------

  function startFeed() {
    if (TERMINAL_TASK.has(task.state)) {
      setConnection("ended");
      return;
    }
    feed = new EventFeed(`${base}/events`, {
      onEvent,
      onStatus: setConnection,
      isDone: () => TERMINAL_TASK.has(task?.state),
    }).start();
  }

  function onEvent({ id, type, data }) {
    if (Number.isFinite(id)) lastSeq = Math.max(lastSeq, id);
    if (type === "task.state") {
      taskEvent = { state: data.state, seq: id };
      task.state = data.state;
      if (data.error) task.error = data.error;
      drawHead();
      if (TERMINAL_TASK.has(data.state)) scheduleFetch();
    } else if (type === "node.state") {
      eventStates.set(data.node_id, { state: data.state, seq: id });
      const node = findNode(data.node_id);
      if (!node) {
        scheduleFetch(); // a node we have not seen: the DAG changed
        return;
      }
      node.state = data.state;
      if (data.error) node.error = data.error;
      dag.setState(node.id, node.state);
      task.node_counts = counts(task.nodes);
      drawCounts();
      if (selected === node.id) panel.show(task, node);
      scheduleFetch();
      if (data.state === "waiting_approval") loadApprovals();
      if (TERMINAL_NODE.has(data.state)) artifacts.refresh(); // a node's artifacts are recorded before it ends
    } else if (type === "approval.requested" || type === "approval.decided") {
      loadApprovals();
    } else if (type === "node.child") {
      // A fan-out child: its state on the node at once, the rest with the re-fetch.
      const child = (findNode(data.node_id)?.children || []).find((c) => c.device_id === data.device_id);
      if (child) {
        child.state = data.state;
        if (data.error) child.error = data.error;
        dag.update(findNode(data.node_id));
        if (selected === data.node_id) panel.show(task, findNode(data.node_id));
      }
      scheduleFetch();
    } else if (type === "node.attempt") {
      scheduleFetch();
    } else if (type === "dag.edited") {
      scheduleFetch();
    }
  }

  let connStatus = "";

  function setConnection(status, detail) {
    if (status === "live" && connStatus === "reconnecting") scheduleFetch(); // catch up after a drop
    connStatus = status;
    const text = { live: "Live", reconnecting: "Reconnecting…", ended: "Final", error: `Stream stopped: ${detail || ""}` }[status] || status;
    connection.className = `conn conn-${status}`;
    connection.dataset.status = status;
    replace(connection, h("span", { class: "conn-dot", "aria-hidden": "true" }), text);
  }

  // ---- header -----------------------------------------------------------------------------

  const countsSlot = h("div", { class: "task-counts" });

  function drawCounts() {
    replace(countsSlot, countChips(task.node_counts));
  }

  function drawHead() {
    const t = task;
    const running = !TERMINAL_TASK.has(t.state);
    cancelButton.hidden = !running;
    rerunButton.hidden = !canRerun();
    if (rerunButton.hidden) rerunButton.reset();
    panel.refreshActions();
    drawCounts();
    replace(
      head,
      h(
        "div",
        { class: "task-title-row" },
        h("div", { class: "crumbs" }, backLink(), h("span", { class: "crumb-sep" }, "/")),
        h("h1", { class: "task-name", title: t.name }, t.name || t.id),
        h("span", { id: "task-state" }, pill(t.state, "task")),
        connection,
        h("span", { class: "spacer" }),
        cancelButton,
        rerunButton,
      ),
      h(
        "div",
        { class: "task-meta" },
        meta("ID", h("span", { class: "mono" }, t.id)),
        t.rerun_of ? meta("Re-run of", rerunOfLink(t.rerun_of)) : null,
        meta("Created", [timeAt(t.created_at), " ", h("span", { class: "muted" }, "(", timeAgo(t.created_at), ")")]),
        meta("Finished", timeAt(t.finished_at)),
        meta("Duration", running || t.finished_at ? liveDuration(t.created_at, t.finished_at) : "—"),
        t.dag_version > 1 ? meta("DAG", `v${t.dag_version} (edited)`) : null,
        labelList(t.labels).length ? meta("Labels", labelList(t.labels).join(", ")) : null,
        countsSlot,
      ),
      t.request ? h("div", { class: "task-request" }, h("span", { class: "eyebrow" }, "Request"), h("p", {}, t.request)) : null,
      t.error ? h("div", { class: "callout error" }, h("span", { class: "error-code mono" }, t.error.code || "error"), h("span", {}, t.error.message || "")) : null,
      banner,
    );
  }

  async function onCancel() {
    if (!cancelButton.classList.contains("confirm")) {
      cancelButton.classList.add("confirm");
      cancelButton.textContent = "Confirm cancel";
      confirmTimer = setTimeout(resetCancel, 5000);
      return;
    }
    resetCancel();
    cancelButton.disabled = true;
    try {
      await api(`${base}/cancel`, { method: "POST" });
      flash("Cancelling: queued and pending nodes stop, running batches are told to stop.", "ok");
      scheduleFetch();
    } catch (err) {
      flash(err.message, "error", "Cancel refused");
    } finally {
      cancelButton.disabled = false;
    }
  }

  /** Re-running needs a finished task and (when the UI knows it) more than a viewer key. */
  function canRerun() {
    return Boolean(task) && TERMINAL_TASK.has(task.state) && role !== "viewer";
  }

  async function rerun(fromNode) {
    const id = task.id;
    try {
      const made = await api(`/v1/tasks/${encodeURIComponent(id)}/rerun`, {
        method: "POST",
        body: fromNode ? { from_node: fromNode } : {},
      });
      flash(fromNode ? `Re-running from ${fromNode} as a new task.` : "Re-running as a new task.", "ok");
      if (!stopped) location.hash = `#/tasks/${encodeURIComponent(made.id)}`;
    } catch (err) {
      if (err.name === "AbortError") return;
      const what = fromNode ? `Re-run from ${fromNode} refused` : "Re-run refused";
      // A viewer key (403) gets the server's own sentence: which role the route needs.
      flash(err.message, "error", what);
    }
  }

  function rerunOfLink(id) {
    const name = taskNames.get(id);
    return h(
      "a",
      { href: `#/tasks/${encodeURIComponent(id)}`, id: "rerun-of", title: id },
      name ? [h("span", { class: "strong" }, name), " "] : null,
      h("span", { class: "mono" }, shortId(id, 18)),
    );
  }

  function resetCancel() {
    clearTimeout(confirmTimer);
    cancelButton.classList.remove("confirm");
    cancelButton.textContent = "Cancel task";
  }

  // ---- selection --------------------------------------------------------------------------

  function select(id) {
    selected = id && findNode(id) ? id : null;
    dag.highlight(selected);
    bodyEl.classList.toggle("with-panel", Boolean(selected));
    if (selected) {
      panel.show(task, findNode(selected));
      loadDevices();
    } else panel.hide();
  }

  myRole().then((r) => {
    role = r;
    if (!stopped && task) drawHead();
  });
  loadDevices();
  fetchTask();
  return () => {
    stopped = true;
    feed?.stop();
    dag.destroy();
    clearTimeout(fetchTimer);
    clearTimeout(confirmTimer);
    rerunButton.reset();
    controller.abort();
    panel.destroy();
    document.removeEventListener("keydown", onKey);
  };
}

function counts(nodes) {
  const out = {};
  for (const n of nodes) out[n.state] = (out[n.state] || 0) + 1;
  return out;
}

function meta(label, value) {
  return h("div", { class: "meta" }, h("span", { class: "meta-label" }, label), h("span", { class: "meta-value" }, value));
}

function backLink() {
  return h("a", { class: "back", href: "#/tasks" }, icon("back", 14), "Tasks");
}
