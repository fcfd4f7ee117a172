// views/children.js: a fan-out node's children in its side panel: a filter by state
// (with counts), then one row per child (state, device, attempts, error), the most telling first
// (failed, verifying, running, then the rest in rollout order), at most SHOWN until "show all".
// A row opens to its attempts (the panel's attempt cards), verification and output. Also the
// node's fan-out facts and its verify commands.

import { h, pill } from "../dom.js";
import { labelList, pretty } from "../format.js";

const SHOWN = 60;
const FIRST = { failed: 0, verifying: 1, waiting_approval: 1, taken_over: 1, running: 2, queued: 3, ready: 3 };
const DONE = new Set(["succeeded", "failed", "skipped", "cancelled"]);

/** "labels role=web · canary 1 · at most 2 at once · fail after 3 failures" */
export function fanOutText(fe) {
  const parts = [];
  if (fe.devices) parts.push(`devices ${fe.devices.join(", ")}`);
  const labels = labelList(fe.labels);
  if (labels.length) parts.push(labels.join(", "));
  if (fe.platform) parts.push(fe.platform);
  if (!parts.length) parts.push("every capable device");
  if (fe.canary) parts.push(`canary ${fe.canary}`);
  if (fe.max_parallel) parts.push(`at most ${fe.max_parallel} at once`);
  if (fe.failure_budget) parts.push(`stops at ${fe.failure_budget} failed`);
  return parts.join(" · ");
}

/** The panel sections of a fan-out node: its children and the devices it left out. */
export function childrenSections(panel, node) {
  const kids = node.children || [];
  const filter = panel.childFilter || "all";
  const counts = {};
  for (const c of kids) counts[c.state] = (counts[c.state] || 0) + 1;
  const done = kids.filter((c) => DONE.has(c.state)).length;
  const buttons = ["all", ...Object.keys(counts).sort()].map((st) =>
    h(
      "button",
      {
        class: "button small",
        type: "button",
        "aria-pressed": String(filter === st),
        dataset: { filter: st },
        onclick: () => {
          panel.childFilter = st;
          panel.redraw();
        },
      },
      st === "all" ? `all ${kids.length}` : `${st} ${counts[st]}`,
    ),
  );
  const order = kids.map((c, i) => [c, i]).filter(([c]) => filter === "all" || c.state === filter);
  order.sort((a, b) => (FIRST[a[0].state] ?? 4) - (FIRST[b[0].state] ?? 4) || a[1] - b[1]);
  const all = panel.expanded.has("children:all");
  const shown = all ? order : order.slice(0, SHOWN);
  const rows = shown.map(([c]) => childRow(panel, node, c));
  const more =
    order.length > shown.length
      ? h(
          "button",
          { class: "link-button show-more", type: "button", onclick: () => panel.toggle("children:all") },
          `show all ${order.length}`,
        )
      : null;
  const left = node.fan_out?.left_out || [];
  return [
    section(
      `Children (${done}/${kids.length} done)`,
      kids.length ? [h("div", { class: "child-filter" }, buttons), h("div", { class: "children-list", id: "children-list" }, rows), more] : h("p", { class: "muted" }, "No child yet: it fans out when it becomes ready."),
    ),
    left.length
      ? section(
          `Left out (${left.length})`,
          h("ul", { class: "left-out" }, left.map((x) => h("li", {}, h("strong", {}, x.device), " — ", x.reason))),
        )
      : null,
  ];
}

function childRow(panel, node, c) {
  const key = `child:${c.device_id}`;
  const open = panel.expanded.has(key);
  const tries = (c.attempts || []).filter((a) => a.kind !== "verify").length;
  const row = h(
    "button",
    { class: "child-row", type: "button", "aria-expanded": String(open), dataset: { device: c.device, state: c.state }, onclick: () => panel.toggle(key) },
    pill(c.state),
    h("span", { class: "child-device", title: c.device_id }, c.device),
    h("span", { class: "muted small" }, tries ? `${tries} attempt${tries === 1 ? "" : "s"}` : ""),
    c.error && c.state !== "succeeded" ? h("span", { class: "error-code mono small" }, c.error.code) : null,
  );
  if (!open) return row;
  const detail = h(
    "div",
    { class: "child-detail" },
    c.error && c.state !== "succeeded" ? h("div", { class: "callout error" }, h("span", { class: "error-code mono" }, c.error.code), h("span", { class: "error-message" }, c.error.message || "")) : null,
    c.verification ? h("p", { class: "small" }, "verify: ", pill(c.verification.state)) : null,
    [...(c.attempts || [])].reverse().map((a) => panel.attemptCard(a, c.attempts)),
    c.output === null || c.output === undefined ? null : panel.json(c.output, `${key}.output`),
  );
  return h("div", {}, row, detail);
}

/** The node's verify commands and how they decided (or are deciding) its outcome. */
export function verifySection(node) {
  if (!(node.verify || []).length) return null;
  const v = node.verification;
  return section(
    `Verify (${node.verify.length})`,
    v ? h("p", { class: "small", id: "verification" }, pill(v.state), " ", verificationText(v)) : null,
    node.verify.map((c) => h("div", { class: "command" }, h("div", { class: "command-head" }, h("span", { class: "mono strong" }, c.tool)), h("pre", { class: "json" }, pretty(c.arguments ?? {})))),
  );
}

function verificationText(v) {
  const after = v.after === "success" ? "after its commands succeeded" : "its outcome was unknown (the device was lost mid-command)";
  return { checking: `checking ${after}`, probing: `${after}; waiting for a device to check it`, passed: `passed ${after}`, failed: `failed ${after}` }[v.state] || `${v.state} (${after})`;
}

function section(title, ...content) {
  return h("section", { class: "panel-section" }, h("h3", {}, title), ...content);
}
