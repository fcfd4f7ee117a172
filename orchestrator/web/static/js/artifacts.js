// artifacts.js: the task page's artifacts: what the task's commands published with
// files.publish_artifact, newest first, each with its size, sha256, node, device, time and a
// Download button. The API key stays in the tab: a download asks the server for a short-lived
// link signed for that one artifact version (POST .../link) and lets the browser follow it, so
// the file streams to disk and the key never appears in a URL.

import { api } from "./api.js";
import { h, replace } from "./dom.js";
import { flash, timeAgo, timeAt } from "./ui.js";

/** 1536 -> "1.5 KiB", 52428800 -> "50.0 MiB". */
export function bytes(n) {
  if (!Number.isFinite(n)) return "—";
  const units = ["bytes", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${n} bytes` : `${value.toFixed(1)} ${units[unit]}`;
}

export class ArtifactList {
  constructor({ taskId, deviceName, signal }) {
    this.base = `/v1/tasks/${encodeURIComponent(taskId)}/artifacts`;
    this.deviceName = deviceName;
    this.signal = signal;
    this.items = [];
    this.signature = "";
    this.busy = false;
    this.again = false;
    this.el = h("section", { class: "card artifacts-card", id: "task-artifacts", hidden: true });
  }

  /** Ask for the list again (one request at a time; a call meanwhile asks once more after). */
  async refresh() {
    if (this.busy) {
      this.again = true;
      return;
    }
    this.busy = true;
    try {
      const out = await api(`${this.base}?limit=500`, { signal: this.signal });
      this.items = out.items || [];
      this.draw();
    } catch {
      /* the card keeps what it showed; the next node event asks again */
    } finally {
      this.busy = false;
      if (this.again && !this.signal.aborted) {
        this.again = false;
        this.refresh();
      }
    }
  }

  /** Draw the list; unchanged (same artifacts, same device names) it is left alone, so a button
   * being clicked is never swapped for a new one. */
  draw() {
    this.el.hidden = !this.items.length;
    const signature = JSON.stringify(this.items.map((a) => [a.id, this.deviceName(a.device_id)]));
    if (!this.items.length || signature === this.signature) return;
    this.signature = signature;
    replace(
      this.el,
      h("h2", { class: "card-title" }, this.items.length === 1 ? "1 artifact" : `${this.items.length} artifacts`),
      h(
        "table",
        { class: "table compact", id: "artifacts-table" },
        h("thead", {}, h("tr", {}, ["Name", "Size", "SHA-256", "Node", "Device", "Published", ""].map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, this.items.map((a) => this.row(a))),
      ),
    );
  }

  row(a) {
    const button = h("button", { class: "button small", type: "button", dataset: { download: a.name } }, "Download");
    button.addEventListener("click", () => this.download(a, button));
    return h(
      "tr",
      { dataset: { name: a.name, version: String(a.version), sha256: a.sha256 } },
      h("td", {}, h("span", { class: "mono strong" }, a.name), a.version > 1 ? h("span", { class: "muted small" }, ` v${a.version}`) : null),
      h("td", { class: "nowrap num", title: `${a.size} bytes` }, bytes(a.size)),
      h("td", { class: "mono small artifact-sha", title: a.sha256 }, `${a.sha256.slice(0, 16)}…`),
      h("td", { class: "mono small" }, a.node_id),
      h("td", { class: "small" }, this.deviceName(a.device_id)),
      h("td", { class: "nowrap small", title: timeAt(a.created_at) }, timeAgo(a.created_at)),
      h("td", { class: "right" }, button),
    );
  }

  async download(a, button) {
    button.disabled = true;
    try {
      const link = await api(`${this.base}/${encodeURIComponent(a.name)}/link?version=${a.version}`, { method: "POST", signal: this.signal });
      const anchor = h("a", { href: link.url, download: a.name, hidden: true });
      document.body.append(anchor);
      anchor.click();
      anchor.remove();
    } catch (err) {
      if (err.name !== "AbortError") flash(err.message, "error", `Could not download ${a.name}`);
    } finally {
      button.disabled = false;
    }
  }
}
