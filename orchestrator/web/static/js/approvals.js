// approvals.js: what the approvals view and the task page share. An approval is a command a
// device will not run until a person decides: its card shows the command (tool and
// arguments), the reason, the task/node and device, its times, the screenshot a GUI action was
// planned on, and, while pending, Approve / Deny with an optional reason (operators and admins
// only; a local-only approval is decided at the device with `orrery agent approve ID`).
// An approval of `approval.ask_person` is a model's question to a person: its card shows the
// question (the approval's reason) and a reply box; "Reply" approves it with the reply as the
// decision's reason, which is what the model reads.
// Cards are keyed by approval id and redrawn only when the approval changes, so a reason being
// typed survives the view's polling.

import { api, authHeaders, failure } from "./api.js";
import { h, pill, replace } from "./dom.js";
import { pretty, shortId } from "./format.js";
import { flash, timeAgo, timeAt } from "./ui.js";

export const ASK_PERSON = "approval.ask_person";

export const APPROVAL_STATES = ["pending", "approved", "denied", "expired", "cancelled"];
const CHANGED = "orrery:approvals-changed";

/** Tell the top bar's pending count (and anyone listening) that a decision was made. */
export function approvalsChanged() {
  document.dispatchEvent(new CustomEvent(CHANGED));
}

export function onApprovalsChanged(fn) {
  document.addEventListener(CHANGED, fn);
  return () => document.removeEventListener(CHANGED, fn);
}

/** POST approve|deny; resolves to the decided approval, rejects with the server's ApiError. */
export async function decide(id, verb, reason) {
  const body = reason ? { reason } : {};
  const out = await api(`/v1/approvals/${encodeURIComponent(id)}/${verb}`, { method: "POST", body });
  approvalsChanged();
  return out;
}

/**
 * Screenshots need the Authorization header, which an <img src> cannot send: they are fetched
 * here and shown through object URLs (one per approval, revoked by `clear()`).
 */
export class Screenshots {
  constructor() {
    this.urls = new Map(); // approval id -> Promise<object URL>
  }

  load(approval) {
    let p = this.urls.get(approval.id);
    if (!p) {
      p = fetch(approval.screenshot_url, { headers: authHeaders(), cache: "no-store", credentials: "omit" }).then(async (resp) => {
        if (!resp.ok) throw await failure(resp);
        return URL.createObjectURL(await resp.blob());
      });
      this.urls.set(approval.id, p);
      p.catch(() => this.urls.delete(approval.id)); // try again on the next draw
    }
    return p;
  }

  clear() {
    for (const p of this.urls.values()) p.then((url) => URL.revokeObjectURL(url), () => {});
    this.urls.clear();
  }
}

/**
 * A keyed list of approval cards. `update(items)` adds, moves, redraws (when changed) and
 * removes cards. Options: role() -> the key's role (null: unknown, buttons shown and the server
 * decides), deviceName(id), taskName(id), showTask (link to the task and node), onDecided(approval).
 */
export class ApprovalList {
  constructor({ role = () => null, deviceName = (id) => id, taskName = () => "", showTask = true, onDecided = () => {}, id } = {}) {
    this.role = role;
    this.taskName = taskName;
    this.deviceName = deviceName;
    this.showTask = showTask;
    this.onDecided = onDecided;
    this.el = h("div", { class: "approval-list", id });
    this.cards = new Map(); // id -> {el, sig, approval, reason input, error}
    this.busy = new Set();
    this.shots = new Screenshots();
  }

  update(items) {
    const seen = new Set();
    items.forEach((a, i) => {
      seen.add(a.id);
      let card = this.cards.get(a.id);
      if (!card) {
        card = { el: h("article", { class: "card approval", dataset: { approvalId: a.id } }), sig: "", error: "" };
        this.cards.set(a.id, card);
      }
      card.approval = a;
      this.draw(card);
      if (this.el.children[i] !== card.el) this.el.insertBefore(card.el, this.el.children[i] || null);
    });
    for (const [id, card] of this.cards) {
      if (!seen.has(id)) {
        card.el.remove();
        this.cards.delete(id);
      }
    }
  }

  /** Redraw every card (e.g. once the role or device names are known). */
  refresh() {
    for (const card of this.cards.values()) {
      card.sig = "";
      this.draw(card);
    }
  }

  destroy() {
    this.shots.clear();
  }

  draw(card) {
    const a = card.approval;
    const names = [this.deviceName(a.device_id), this.showTask ? this.taskName(a.task_id) : ""];
    const sig = JSON.stringify([a, this.role(), names, this.busy.has(a.id), card.error]);
    if (sig === card.sig) return;
    card.sig = sig;
    const typed = card.reason?.value || "";
    const asked = a.tool === ASK_PERSON;
    card.el.dataset.state = a.state;
    card.el.dataset.askPerson = String(asked);
    card.el.dataset.localOnly = String(Boolean(a.local_only));
    replace(
      card.el,
      h(
        "div",
        { class: "approval-head" },
        h("span", { class: "mono strong approval-tool" }, a.tool),
        h("span", { class: "approval-state" }, pill(a.state, "approval")),
        a.local_only ? h("span", { class: "badge badge-warn", title: "Only the device's owner decides, on the device" }, "local only") : null,
        h("span", { class: "spacer" }),
        h("span", { class: "mono muted small", title: a.id }, a.id),
      ),
      h(
        "dl",
        { class: "facts approval-facts" },
        this.showTask ? [h("dt", {}, "Task"), h("dd", {}, taskLink(a, this.taskName(a.task_id)))] : null,
        h("dt", {}, "Device"),
        h("dd", {}, this.deviceLink(a.device_id)),
        h("dt", {}, "Asked"),
        h("dd", {}, timeAt(a.created_at), " ", h("span", { class: "muted" }, "(", timeAgo(a.created_at), ")")),
        a.state === "pending"
          ? [h("dt", {}, "Expires"), h("dd", { class: "approval-expires" }, timeAt(a.expires_at))]
          : [
              h("dt", {}, "Decided"),
              h(
                "dd",
                { class: "approval-decided" },
                timeAt(a.decided_at),
                a.decided_by ? [" by ", h("span", { class: "mono" }, a.decided_by)] : null,
              ),
            ],
      ),
      asked
        ? h("p", { class: "ask-person-question", id: `question-${a.id}` }, h("span", { class: "eyebrow" }, "Question "), question(a))
        : [
            a.reason ? h("p", { class: "approval-reason" }, h("span", { class: "eyebrow" }, "Why "), a.reason) : null,
            h("div", { class: "llm-role" }, "arguments"),
            h("pre", { class: "json approval-args" }, pretty(a.arguments ?? {})),
          ],
      a.screenshot_url ? this.screenshot(a) : null,
      a.decision_reason
        ? h("p", { class: "approval-decision-reason" }, h("span", { class: "eyebrow" }, asked ? "Reply " : "Decision "), a.decision_reason)
        : null,
      card.error ? h("div", { class: "callout error approval-error", role: "alert" }, card.error) : null,
      a.state === "pending" ? this.actions(card, typed) : null,
    );
  }

  deviceLink(id) {
    const name = this.deviceName(id);
    return h(
      "a",
      { href: `#/devices/${encodeURIComponent(id)}`, class: "approval-device", title: id },
      name && name !== id ? [h("strong", {}, name), " ", h("span", { class: "mono muted small" }, shortId(id, 14))] : h("span", { class: "mono" }, id),
    );
  }

  screenshot(a) {
    const img = h("img", { class: "approval-shot", alt: `Screenshot the ${a.tool} action was planned on`, hidden: true });
    const note = h("span", { class: "muted small" }, "Loading the screenshot…");
    const box = h(
      "figure",
      {
        class: "approval-figure",
        title: "Click to enlarge",
        onclick: () => box.classList.toggle("enlarged"),
      },
      img,
      note,
    );
    this.shots.load(a).then(
      (url) => {
        img.src = url;
        img.hidden = false;
        note.remove();
      },
      (err) => {
        note.textContent = `No screenshot: ${err.message}`;
      },
    );
    return box;
  }

  actions(card, typed) {
    const a = card.approval;
    if (a.local_only) {
      return h(
        "div",
        { class: "callout approval-local" },
        h(
          "span",
          {},
          "Only the device's owner can decide this, on the device: ",
          h("code", {}, `orrery agent approve ${a.id}`),
          " or ",
          h("code", {}, `orrery agent deny ${a.id}`),
          ".",
        ),
      );
    }
    if (a.state === "pending" && a.requested_state) {
      return h(
        "p",
        { class: "callout approval-requested" },
        `${a.requested_state} by ${a.requested_by || "an operator"}: asked of the device, which has not confirmed it yet. `,
        "It takes effect when the device gets it, unless its owner decides there first.",
      );
    }
    if (this.role() === "viewer") {
      return h("p", { class: "muted small approval-viewer" }, "An operator or admin decides this (your key is a viewer's).");
    }
    const busy = this.busy.has(a.id);
    if (a.tool === ASK_PERSON) {
      card.reason = h("textarea", {
        class: "input ask-person-reply",
        maxlength: 2000,
        placeholder: "Your answer",
        "aria-label": "Your answer to the question",
        disabled: busy,
      });
      card.reason.value = typed;
      return h(
        "div",
        { class: "approval-actions ask-person-actions" },
        card.reason,
        h("button", { class: "button small primary", type: "button", disabled: busy, dataset: { reply: a.id }, onclick: () => this.reply(card) }, "Reply"),
      );
    }
    card.reason = h("input", {
      class: "input approval-reason-input",
      type: "text",
      maxlength: 2000,
      placeholder: "Reason (optional)",
      "aria-label": "Reason for the decision (optional)",
      disabled: busy,
    });
    card.reason.value = typed;
    const button = (verb, label, kind) =>
      h("button", { class: ["button small", kind], type: "button", disabled: busy, dataset: { decide: verb }, onclick: () => this.act(card, verb) }, label);
    return h(
      "div",
      { class: "approval-actions" },
      card.reason,
      button("approve", "Approve", "primary"),
      button("deny", "Deny", "danger-outline"),
    );
  }

  /** Answer a person's question: approve it with the reply as the decision's reason. */
  reply(card) {
    if (!card.reason?.value.trim()) {
      card.error = "Write an answer first: the reply is what the model reads.";
      card.sig = "";
      this.draw(card);
      return Promise.resolve();
    }
    return this.act(card, "approve");
  }

  async act(card, verb) {
    const a = card.approval;
    const reason = card.reason?.value.trim() || "";
    this.busy.add(a.id);
    card.error = "";
    this.draw(card);
    try {
      const out = await decide(a.id, verb, reason);
      card.approval = out;
      if (out.state === "pending" && out.requested_state) {
        // 202: asked of the device (the one arbiter), which has not confirmed it yet.
        flash(`${verb === "approve" ? "Approval" : "Denial"} asked of ${this.deviceName(a.device_id)}, which has not confirmed it yet (offline?).`, "ok");
      } else {
        const done = a.tool === ASK_PERSON ? "answered" : out.state;
        flash(`${a.tool} on ${this.deviceName(a.device_id)} ${done}.`, "ok");
      }
      this.onDecided(out);
    } catch (err) {
      card.error = `${verb === "approve" ? "Approve" : "Deny"} refused: ${err.message}`;
      flash(err.message, "error", `${verb === "approve" ? "Approve" : "Deny"} refused`);
      if (err.status === 409 || err.status === 403) {
        // Decided elsewhere (or only at the device): show what the server says it is now.
        api(`/v1/approvals/${encodeURIComponent(a.id)}`).then(
          (now) => {
            if (!this.cards.has(a.id)) return;
            card.approval = now;
            this.draw(card);
            this.onDecided(now);
          },
          () => {},
        );
      }
    } finally {
      this.busy.delete(a.id);
      if (this.cards.has(a.id)) this.draw(card);
    }
  }
}

/** The question a model asks a person: the approval's reason, else its `question` argument. */
function question(a) {
  return a.reason || a.arguments?.question || a.arguments?.text || "(the model asked nothing in words)";
}

function taskLink(a, name) {
  return h(
    "a",
    { class: "approval-task", href: `#/tasks/${encodeURIComponent(a.task_id)}?node=${encodeURIComponent(a.node_id)}`, title: a.task_id },
    name ? [h("strong", {}, name), " "] : null,
    h("span", { class: name ? "mono muted small" : "mono" }, shortId(a.task_id, 18)),
    " · node ",
    h("span", { class: "mono strong" }, a.node_id),
  );
}
