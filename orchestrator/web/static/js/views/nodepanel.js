// views/nodepanel.js: the side panel for one node of a task: facts, error, commands (tool and
// arguments), attempts (device, batch, timings, each result with status, error and JSON), and
// output; long JSON is cut with "show more". A second tab loads the task's LLM transcript
// (GET /v1/tasks/{id}/llm: this node's calls, then planning and DAG edits; none or 404 means none).
// Once the task has finished, "Re-run from here" runs this node and its descendants again.
// Above the tabs: the node's approvals (pending first) with Approve / Deny (approvals.js), and
// (nodescreen.js) the live view of its device while it runs on one with a screen, and the
// screen recordings its attempts left.

import { api } from "../api.js";
import { h, icon, pill, replace } from "../dom.js";
import { duration, labelList, pretty, shortId, span } from "../format.js";
import { confirmButton, liveDuration, loading, timeAt, timeRange } from "../ui.js";
import { NodeScreen } from "../nodescreen.js";
import { childrenSections, fanOutText, verifySection } from "./children.js";

const CUT_LINES = 18;
const CUT_CHARS = 1400;

export class NodePanel {
  constructor({ taskId, deviceName, onClose, canRerun = () => false, onRerun = async () => {}, approvals = null }) {
    this.taskId = taskId;
    this.deviceName = deviceName;
    this.canRerun = canRerun;
    this.rerunButton = confirmButton({
      id: "rerun-node",
      label: "Re-run from here",
      confirmLabel: "Confirm re-run",
      title: "A new task: this node and everything after it run again; the nodes before it keep their outputs",
      iconName: "rerun",
      run: () => (this.node ? onRerun(this.node.id) : null),
    });
    this.actions = h("div", { class: "panel-actions" }, this.rerunButton);
    this.approvalList = approvals;
    this.allApprovals = [];
    this.approvalBox = h("section", { class: "node-approvals", id: "node-approvals", hidden: true });
    if (approvals) this.approvalBox.append(h("h3", {}, "Approval"), approvals.el);
    this.screen = new NodeScreen({ taskId });
    this.tab = "details";
    this.expanded = new Set();
    this.signature = "";
    this.node = null;
    this.llmShown = null; // the node whose transcript the body shows
    this.title = h("h2", { class: "panel-title" });
    this.state = h("span");
    this.tabs = {
      details: tabButton("Details", () => this.setTab("details")),
      llm: tabButton("LLM transcript", () => this.setTab("llm")),
    };
    this.body = h("div", { class: "panel-body", id: "node-panel-body" });
    this.el = h(
      "aside",
      { class: "panel card", id: "node-panel", "aria-label": "Node details" },
      h(
        "div",
        { class: "panel-head" },
        h("div", { class: "panel-heading" }, h("div", { class: "eyebrow" }, "Node"), this.title),
        this.state,
        h("button", { class: "icon-button", type: "button", "aria-label": "Close", title: "Close (Esc)", onclick: onClose }, icon("close")),
      ),
      this.actions,
      this.approvalBox,
      this.screen.el,
      h("div", { class: "tabs", role: "tablist" }, this.tabs.details, this.tabs.llm),
      this.body,
    );
    this.el.hidden = true;
  }

  show(task, node) {
    const changedNode = this.node?.id !== node.id;
    const sig = JSON.stringify([node, this.tab]);
    this.node = node;
    this.task = task;
    this.el.hidden = false;
    this.el.dataset.nodeId = node.id;
    if (changedNode) this.rerunButton.reset();
    this.refreshActions();
    if (changedNode) this.drawApprovals();
    this.screen.update(node);
    if (!changedNode && sig === this.signature) return;
    this.signature = sig;
    if (changedNode) {
      this.expanded.clear();
      this.childFilter = "all";
    }
    this.title.textContent = node.id;
    this.title.title = node.id;
    replace(this.state, pill(node.state));
    for (const [name, b] of Object.entries(this.tabs)) b.setAttribute("aria-selected", String(name === this.tab));
    const scroll = changedNode ? 0 : this.body.scrollTop;
    if (this.tab === "details") {
      this.llmShown = null;
      replace(this.body, this.details(node));
      this.body.scrollTop = scroll;
    } else this.showLlm(node);
  }

  /** Show the node actions the task's state (and the key's role) allow. */
  refreshActions() {
    const allowed = Boolean(this.node) && this.canRerun();
    this.actions.hidden = !allowed;
    if (!allowed) this.rerunButton.reset();
  }

  hide() {
    this.el.hidden = true;
    this.node = null;
    this.signature = "";
    this.drawApprovals();
    this.screen.update(null);
  }

  /** The task's approvals; the panel shows the open node's, the pending ones first. */
  setApprovals(items) {
    this.allApprovals = items;
    this.drawApprovals();
  }

  drawApprovals() {
    if (!this.approvalList) return;
    const mine = this.node ? this.allApprovals.filter((a) => a.node_id === this.node.id) : [];
    mine.sort((a, b) => Number(b.state === "pending") - Number(a.state === "pending"));
    this.approvalBox.hidden = !mine.length;
    this.approvalBox.firstElementChild.textContent = mine.length > 1 ? `Approvals (${mine.length})` : "Approval";
    this.approvalList.update(mine);
  }

  destroy() {
    this.approvalList?.destroy();
    this.screen.destroy();
  }

  setTab(tab) {
    this.tab = tab;
    this.signature = "";
    if (this.node) this.show(this.task, this.node);
  }

  details(node) {
    const ran = node.started_at
      ? [timeRange(node.started_at, node.finished_at), " · ", liveDuration(node.started_at, node.finished_at)]
      : h("span", { class: "muted" }, "not started");
    const facts = [
      ["Kind", node.kind],
      node.for_each ? ["Fan-out", fanOutText(node.for_each)] : ["Placement", placementText(node.placement)],
      node.queued_on ? ["Queued on", this.device(node.queued_on)] : null,
      ["Ran", ran],
      ["Retry", retryText(node.retry)],
      node.timeout_s ? ["Timeout", `${node.timeout_s} s`] : null,
      node.priority ? ["Priority", String(node.priority)] : null,
    ].filter(Boolean);
    const attempts = node.attempts || [];
    return [
      h(
        "dl",
        { class: "facts" },
        facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
      ),
      node.error ? errorBox(node.error) : null,
      node.children
        ? childrenSections(this, node)
        : section(
            `Attempts (${attempts.length})`,
            attempts.length ? [...attempts].reverse().map((a) => this.attemptCard(a)) : h("p", { class: "muted" }, "No attempt yet."),
          ),
      verifySection(node),
      node.kind === "agent"
        ? section("Instruction", h("p", { class: "instruction" }, node.instruction || ""))
        : section(
            `Commands (${(node.commands || []).length})`,
            (node.commands || []).map((c, i) => commandCard(c, i)),
          ),
      section("Output", node.output === null || node.output === undefined ? h("p", { class: "muted" }, "No output.") : this.json(node.output, "output")),
    ];
  }

  /** Open or close a part of the panel (a child, a long value) and draw it again. */
  toggle(key) {
    if (this.expanded.has(key)) this.expanded.delete(key);
    else this.expanded.add(key);
    this.redraw();
  }

  redraw() {
    this.signature = "";
    if (this.node) this.show(this.task, this.node);
  }

  attemptCard(a, siblings = this.node?.attempts || []) {
    const several = siblings.length > 1;
    const sent = new Map((a.commands || []).map((c) => [c.call_id, c]));
    const templates = (this.node?.commands || []).map((c) => JSON.stringify(c.arguments ?? {}));
    return h(
      "div",
      { class: "attempt", dataset: { attempt: String(a.n) } },
      h(
        "div",
        { class: "attempt-head" },
        h("span", { class: "attempt-n" }, a.kind === "verify" ? `#${a.n} verify` : `#${a.n}`),
        pill(a.status),
        h("span", { class: "attempt-device", title: a.device_id }, this.device(a.device_id)),
        h("span", { class: "spacer" }),
        h("span", { class: "muted small num" }, a.started_at ? (a.ended_at ? duration(span(a.started_at, a.ended_at)) : liveDuration(a.started_at, null)) : ""),
      ),
      h(
        "div",
        { class: "attempt-meta muted small" },
        h("span", { class: "mono", title: a.batch_id }, `batch ${shortId(a.batch_id, 14)}`),
        " · ",
        timeRange(a.started_at, a.ended_at),
      ),
      a.error && (several || !sameError(a.error, this.node?.error)) ? errorBox(a.error) : null,
      (a.results || []).map((r, i) =>
        h(
          "div",
          { class: "result" },
          h(
            "div",
            { class: "result-head" },
            pill(r.status || "unknown", "result"),
            h("span", { class: "mono strong" }, sent.get(r.call_id)?.tool || r.namespace || r.call_id || `result ${i + 1}`),
            h("span", { class: "spacer" }),
            r.duration_ms !== null && r.duration_ms !== undefined ? h("span", { class: "muted small num" }, duration(r.duration_ms)) : null,
          ),
          resolvedArgs(sent.get(r.call_id), templates[i], (v) => this.json(v, `a${a.n}.args${i}`)),
          r.error && !sameError(r.error, a.error) ? errorBox(r.error) : null,
          r.result === null || r.result === undefined ? null : this.json(r.result, `a${a.n}.r${i}`),
        ),
      ),
    );
  }

  device(id) {
    const name = this.deviceName(id);
    return name && name !== id ? h("span", {}, h("strong", {}, name), " ", h("span", { class: "mono muted small" }, shortId(id, 14))) : h("span", { class: "mono" }, id || "—");
  }

  /** Pretty JSON in a <pre>, cut to a few lines with a "show more" toggle. */
  json(value, key) {
    const text = pretty(value);
    const lines = text.split("\n");
    const long = lines.length > CUT_LINES || text.length > CUT_CHARS;
    const open = this.expanded.has(key);
    let shown = text;
    if (long && !open) {
      shown = lines.slice(0, CUT_LINES).join("\n");
      if (shown.length > CUT_CHARS) shown = shown.slice(0, CUT_CHARS);
      shown += "\n…";
    }
    const pre = h("pre", { class: "json" }, shown);
    if (!long) return pre;
    const more = h(
      "button",
      {
        class: "link-button show-more",
        type: "button",
        onclick: () => {
          if (open) this.expanded.delete(key);
          else this.expanded.add(key);
          this.signature = "";
          this.show(this.task, this.node);
        },
      },
      open ? "show less" : `show more (${lines.length} lines, ${text.length.toLocaleString()} chars)`,
    );
    return h("div", { class: "json-wrap" }, pre, more);
  }

  showLlm(node) {
    if (this.llmShown !== node.id) replace(this.body, loading("Loading the LLM transcript…"));
    const seq = (this.llmSeq = (this.llmSeq || 0) + 1);
    api(`/v1/tasks/${encodeURIComponent(this.taskId)}/llm`).then(
      (body) => this.drawLlm(node, seq, body, null),
      (err) => this.drawLlm(node, seq, null, err),
    );
  }

  drawLlm(node, seq, body, err) {
    if (seq !== this.llmSeq || this.tab !== "llm" || this.node?.id !== node.id) return; // superseded
    const scroll = this.llmShown === node.id ? this.body.scrollTop : 0;
    this.llmShown = node.id;
    if (err && err.status !== 404) {
      replace(this.body, h("div", { class: "callout error" }, err.message));
      return;
    }
    const items = err ? [] : body?.items || [];
    const mine = items.filter((e) => e.node_id === node.id);
    const taskLevel = items.filter((e) => !e.node_id);
    if (!mine.length && !taskLevel.length) {
      replace(
        this.body,
        h(
          "div",
          { class: "empty small-empty", id: "llm-empty" },
          h("div", { class: "empty-title" }, "No LLM calls"),
          h("p", {}, "This task was given as an explicit DAG and has no agent steps."),
        ),
      );
      return;
    }
    replace(
      this.body,
      section(
        `This node (${mine.length})`,
        mine.length ? mine.map((e, i) => this.llmEntry(e, `n${i}`)) : h("p", { class: "muted" }, "No LLM calls for this node."),
      ),
      taskLevel.length
        ? section(`Planning and re-planning (${taskLevel.length})`, taskLevel.map((e, i) => this.llmEntry(e, `t${i}`)))
        : null,
    );
    this.body.scrollTop = scroll;
  }

  llmEntry(e, key) {
    if (e.dag_edit !== undefined) {
      return h(
        "div",
        { class: "llm-call" },
        h("div", { class: "llm-head" }, h("strong", {}, `DAG edited → v${e.dag_edit}`), h("span", { class: "spacer" }), timeAt(e.at)),
        e.reason ? h("p", { class: "llm-reason" }, e.reason) : null,
        this.json(e.edits, `${key}.edits`),
      );
    }
    const tokens = (e.prompt_tokens || 0) + (e.completion_tokens || 0);
    return h(
      "div",
      { class: "llm-call" },
      h(
        "div",
        { class: "llm-head" },
        h("span", { class: "purpose" }, e.purpose || "call"),
        e.model ? h("span", { class: "mono small muted" }, e.model) : null,
        h("span", { class: "spacer" }),
        h(
          "span",
          { class: "muted small num", title: `${e.prompt_tokens || 0} prompt + ${e.completion_tokens || 0} completion tokens` },
          [tokens ? `${tokens.toLocaleString()} tok` : null, e.latency_ms ? duration(e.latency_ms) : null].filter(Boolean).join(" · "),
        ),
      ),
      h("div", { class: "muted small" }, timeAt(e.at)),
      e.error ? h("div", { class: "callout error" }, h("span", { class: "error-message" }, e.error)) : null,
      (e.messages || []).map((m, i) =>
        h(
          "div",
          { class: "llm-msg" },
          h("div", { class: "llm-role" }, m.role || "message"),
          this.json(messageText(m), `${key}.m${i}`),
        ),
      ),
      e.reply !== undefined && e.reply !== null ? [h("div", { class: "llm-role" }, "reply"), this.json(e.reply, `${key}.reply`)] : null,
    );
  }
}

/** A chat message's readable content: its text, else its tool calls, else the whole message. */
function messageText(m) {
  if (typeof m.content === "string" && m.content) return m.content;
  if (Array.isArray(m.content)) {
    const text = m.content.map((part) => (typeof part === "string" ? part : part?.text ?? pretty(part))).join("\n");
    if (text) return text;
  }
  if (m.tool_calls) return m.tool_calls;
  return m;
}

/** The arguments a command was sent with, when references made them differ from the DAG's. */
function resolvedArgs(command, template, json) {
  if (!command || command.arguments === undefined) return null;
  if (JSON.stringify(command.arguments) === template) return null;
  return h("div", { class: "resolved" }, h("div", { class: "llm-role" }, "arguments (references resolved)"), json(command.arguments));
}

function tabButton(text, onclick) {
  return h("button", { class: "tab", type: "button", role: "tab", onclick }, text);
}

function section(title, ...content) {
  return h("section", { class: "panel-section" }, h("h3", {}, title), ...content);
}

function commandCard(c, i) {
  return h(
    "div",
    { class: "command" },
    h(
      "div",
      { class: "command-head" },
      h("span", { class: "command-n muted" }, `${i + 1}`),
      h("span", { class: "mono strong" }, c.tool),
      h("span", { class: "spacer" }),
      c.timeout_s ? h("span", { class: "muted small" }, `timeout ${c.timeout_s} s`) : null,
    ),
    h("pre", { class: "json" }, pretty(c.arguments ?? {})),
  );
}

/** Errors repeat down the chain (result -> attempt -> node): show each once. */
function sameError(a, b) {
  return Boolean(a && b) && a.code === b.code && a.message === b.message;
}

function errorBox(error) {
  return h(
    "div",
    { class: "callout error" },
    h("span", { class: "error-code mono" }, error.code || "error"),
    h("span", { class: "error-message" }, error.message || pretty(error)),
  );
}

function placementText(p) {
  if (!p) return "any capable device";
  const parts = [];
  if (p.device) parts.push(`device ${p.device}`);
  const labels = labelList(p.labels);
  if (labels.length) parts.push(labels.join(", "));
  if (p.platform) parts.push(p.platform);
  return parts.length ? parts.join(" · ") : "any capable device";
}

function retryText(r) {
  if (!r || !r.max_attempts) return "—";
  if (r.max_attempts === 1) return "no retries";
  return `up to ${r.max_attempts} attempts, backoff ${r.backoff_s ?? 1} s (max ${r.backoff_max_s ?? 60} s)`;
}
