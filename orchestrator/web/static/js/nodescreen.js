// nodescreen.js: the node panel's screen sections. While the node runs on a device with a
// screen (a GUI desktop or a browser: it has `gui.*` or `browser.*` tools), the same live view
// as on the device page (liveview.js); and the screen recordings its attempts left (artifacts
// whose content type, or else whose name, says video), each in a <video controls>, fetched with
// the API key into a blob URL (the key never goes into a URL).

import { api, authHeaders, failure } from "./api.js";
import { h, replace } from "./dom.js";
import { liveView } from "./liveview.js";

const LIVE_STATES = new Set(["running", "waiting_approval", "taken_over", "verifying"]);
const VIDEO_NAME = /\.(webm|mp4|mkv|ogv|mov)$/i;

/** Is this artifact a screen recording? */
export function isVideo(a) {
  const type = a.content_type || a.media_type || "";
  return type ? type.startsWith("video/") : VIDEO_NAME.test(a.name || "");
}

export class NodeScreen {
  constructor({ taskId }) {
    this.taskId = taskId;
    this.screens = new Map(); // device id -> Promise<bool>: does it have a screen
    this.live = null; // { deviceId, view }
    this.recordings = new Map(); // artifact id -> blob URL
    this.recordingsKey = "";
    this.liveBox = h("section", { class: "node-live", id: "node-live", hidden: true });
    this.recordBox = h("section", { class: "node-recordings", id: "node-recordings", hidden: true });
    this.el = h("div", { class: "node-screen" }, this.liveBox, this.recordBox);
  }

  /** Show what fits `node` (null: the panel closed). */
  update(node) {
    this.updateLive(node);
    this.updateRecordings(node);
  }

  async updateLive(node) {
    const attempt = node && LIVE_STATES.has(node.state) ? [...(node.attempts || [])].reverse().find((a) => !a.ended_at) : null;
    const deviceId = attempt?.device_id || null;
    if (this.live?.deviceId === deviceId) return;
    this.stopLive();
    if (!deviceId || !(await this.hasScreen(deviceId))) return;
    if (this.live) return; // another update got here first
    const view = liveView(deviceId, { idPrefix: "node-live" });
    this.live = { deviceId, view };
    replace(this.liveBox, view.el);
    this.liveBox.hidden = false;
    view.watch();
  }

  stopLive() {
    this.live?.view.stop();
    this.live = null;
    replace(this.liveBox);
    this.liveBox.hidden = true;
  }

  hasScreen(deviceId) {
    if (!this.screens.has(deviceId)) {
      const found = api(`/v1/devices/${encodeURIComponent(deviceId)}`).then(
        (d) => (d.tools || []).some((t) => /^(gui|browser)\./.test(t.name || "")),
        () => false,
      );
      this.screens.set(deviceId, found);
    }
    return this.screens.get(deviceId);
  }

  async updateRecordings(node) {
    const batches = new Set((node?.attempts || []).map((a) => a.batch_id));
    const key = node ? JSON.stringify([node.id, node.state, [...batches]]) : "";
    if (key === this.recordingsKey) return;
    this.recordingsKey = key;
    if (!node || !batches.size) return this.drawRecordings([]);
    let items = [];
    try {
      const out = await api(`/v1/tasks/${encodeURIComponent(this.taskId)}/artifacts?limit=500&history=true`);
      items = (out.items || []).filter((a) => a.node_id === node.id && isVideo(a));
    } catch {
      return; // the section keeps what it showed
    }
    if (key === this.recordingsKey) this.drawRecordings(items, node);
  }

  drawRecordings(items, node = null) {
    for (const url of this.recordings.values()) URL.revokeObjectURL(url);
    this.recordings.clear();
    this.recordBox.hidden = !items.length;
    if (!items.length) return replace(this.recordBox);
    const attemptOf = new Map((node?.attempts || []).map((a) => [a.batch_id, a.n]));
    replace(
      this.recordBox,
      h("h3", {}, items.length === 1 ? "Screen recording" : `Screen recordings (${items.length})`),
      items.map((a) => {
        const video = h("video", { controls: true, preload: "metadata", class: "recording", dataset: { artifact: a.name } });
        const note = h("p", { class: "small muted" }, `${a.name}${attemptOf.has(a.batch_id) ? ` · attempt #${attemptOf.get(a.batch_id)}` : ""}`);
        this.load(a, video, note);
        return h("div", { class: "recording-item" }, video, note);
      }),
    );
  }

  async load(a, video, note) {
    try {
      const resp = await fetch(a.content_url, { headers: authHeaders(), cache: "no-store", credentials: "omit" });
      if (!resp.ok) throw await failure(resp);
      const url = URL.createObjectURL(await resp.blob());
      this.recordings.set(a.id, url);
      video.src = url;
    } catch (err) {
      note.textContent = `${a.name}: could not load the recording (${err.message})`;
    }
  }

  destroy() {
    this.stopLive();
    this.drawRecordings([]);
  }
}
