// graph.js: draws a task's DAG as SVG from layout.js and keeps it live: node colours follow
// state changes in place, the selected node is highlighted, and the view scrolls, pans (drag
// the background) and zooms (buttons or Ctrl + wheel) for graphs larger than the screen.
// Each node shows its id, state, tool, and where it ran: "web-1 · 2 attempts" (device names
// come from the `deviceName` callback; ids until the names are known).

import { h, icon, s } from "./dom.js";
import { NODE_STATES } from "./ui.js";
import { layout, pathData } from "./layout.js";

const EDGE_KINDS = ["success", "failure", "always"];
const NODE_W = 184;
const NODE_H = 66;
const MIN_ZOOM = 0.1;
const MAX_ZOOM = 2.5;
const AUTO_MIN_ZOOM = 0.55; // fitting never shrinks text below this: scroll instead

export class DagView {
  constructor({ onSelect, deviceName = (id) => id }) {
    this.onSelect = onSelect;
    this.deviceName = deviceName;
    this.zoom = 1;
    this.autoFit = true; // until the user zooms, keep the graph fitted when the view resizes
    this.selected = null;
    this.nodeEls = new Map();
    this.edgeEls = [];
    this.size = { width: 0, height: 0 };
    this.signature = "";
    this.svg = s("svg", { class: "dag", role: "group", "aria-label": "Task graph" });
    this.scroller = h("div", { class: "graph-scroll", tabindex: "-1" }, this.svg);
    this.zoomLabel = h("span", { class: "zoom-label num" }, "100%");
    this.el = h(
      "div",
      { class: "graph" },
      this.scroller,
      h(
        "div",
        { class: "graph-tools", role: "toolbar", "aria-label": "Zoom" },
        toolButton("minus", "Zoom out", () => this.zoomBy(1 / 1.25)),
        this.zoomLabel,
        toolButton("plus", "Zoom in", () => this.zoomBy(1.25)),
        toolButton("fit", "Fit to view", () => {
          this.autoFit = true;
          this.fit(MIN_ZOOM);
        }),
      ),
      legend(),
    );
    this.installPanAndZoom();
    this.resizer = new ResizeObserver(() => {
      if (this.autoFit && this.signature) this.fit(AUTO_MIN_ZOOM);
    });
    this.resizer.observe(this.scroller);
  }

  destroy() {
    this.resizer.disconnect();
  }

  /** (Re)draw the whole graph; keeps zoom and scroll when the shape has not changed. */
  render(task) {
    const nodes = task.nodes || [];
    const edges = (task.edges || []).map((e) => ({ from: e.from, to: e.to, on: e.on || "success" }));
    const signature = JSON.stringify([nodes.map((n) => n.id), edges]);
    if (signature === this.signature) {
      for (const n of nodes) this.update(n);
      return;
    }
    const first = !this.signature;
    this.signature = signature;
    const result = layout(
      nodes.map((n) => ({ id: n.id, width: NODE_W, height: NODE_H })),
      edges,
    );
    this.size = { width: Math.max(result.width, 200), height: Math.max(result.height, 120) };
    this.crossings = result.crossings;

    const edgeLayer = s("g", { class: "edges" });
    this.edgeEls = [];
    for (const r of result.edges) {
      const on = EDGE_KINDS.includes(r.edge.on) ? r.edge.on : "success";
      const path = s(
        "path",
        {
          class: `edge on-${on}`,
          d: pathData(r.points),
          "marker-end": `url(#arrow-${on})`,
          dataset: { from: r.from, to: r.to, on },
        },
        s("title", {}, `${r.from} → ${r.to} (on ${on})`),
      );
      this.edgeEls.push(path);
      edgeLayer.append(path);
    }

    const nodeLayer = s("g", { class: "nodes" });
    this.nodeEls = new Map();
    for (const n of nodes) {
      const pos = result.nodes.get(n.id);
      if (!pos) continue;
      const g = nodeShape(n, pos);
      g.addEventListener("click", () => this.onSelect(n.id));
      g.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          this.onSelect(n.id);
        }
      });
      this.nodeEls.set(n.id, g);
      nodeLayer.append(g);
      this.update(n);
    }

    this.svg.replaceChildren(markers(NODE_W, NODE_H), edgeLayer, nodeLayer);
    this.svg.setAttribute("viewBox", `0 0 ${this.size.width} ${this.size.height}`);
    this.svg.dataset.nodes = String(this.nodeEls.size);
    this.svg.dataset.crossings = String(result.crossings);
    if (this.selected) this.highlight(this.selected);
    if (first || this.autoFit) requestAnimationFrame(() => this.fit(AUTO_MIN_ZOOM));
    else this.applyZoom();
  }

  /** Update one node's state, subtitle, device line and tooltip in place. */
  update(node) {
    const g = this.nodeEls.get(node.id);
    if (!g) return;
    const sub = g.querySelector(".node-sub");
    if (sub) sub.textContent = truncate(subtitle(node), 26);
    const where = placed(node, this.deviceName);
    g.dataset.device = where.device;
    g.dataset.attempts = String(where.attempts);
    g.querySelector(".node-run").textContent = truncate(where.text, 30);
    this.setState(node.id, node.state, true);
  }

  setState(id, state, force = false) {
    const g = this.nodeEls.get(id);
    if (!g || (g.dataset.state === state && !force)) return;
    g.dataset.state = state;
    g.setAttribute("class", nodeClass(state, id === this.selected));
    g.querySelector(".node-state").textContent = state;
    const run = g.dataset.device ? ` on ${g.querySelector(".node-run").textContent}` : "";
    g.querySelector("title").textContent = `${id}: ${state}${run}`;
    g.setAttribute("aria-label", `Node ${id}, ${state}${run}`);
  }

  highlight(id) {
    this.selected = id;
    for (const [nid, g] of this.nodeEls) g.setAttribute("class", nodeClass(g.dataset.state, nid === id));
    for (const p of this.edgeEls) {
      const on = id && (p.dataset.from === id || p.dataset.to === id);
      p.classList.toggle("edge-hot", Boolean(on));
      p.classList.toggle("edge-dim", Boolean(id) && !on);
    }
  }

  /** Scroll so that a node is visible (used after selecting from elsewhere). */
  reveal(id) {
    const g = this.nodeEls.get(id);
    if (!g) return;
    const box = g.getBoundingClientRect();
    const view = this.scroller.getBoundingClientRect();
    if (box.left < view.left || box.right > view.right || box.top < view.top || box.bottom > view.bottom) {
      this.scroller.scrollLeft += box.left + box.width / 2 - (view.left + view.width / 2);
      this.scroller.scrollTop += box.top + box.height / 2 - (view.top + view.height / 2);
    }
  }

  fit(minZoom = MIN_ZOOM) {
    const pad = 16;
    const w = this.scroller.clientWidth - pad;
    const hgt = this.scroller.clientHeight - pad;
    if (w <= 0 || hgt <= 0 || !this.size.width) return;
    const k = Math.min(w / this.size.width, hgt / this.size.height, 1);
    this.zoom = clamp(k, Math.max(minZoom, MIN_ZOOM), MAX_ZOOM);
    this.applyZoom();
    this.scroller.scrollTo(0, 0);
  }

  zoomBy(factor, clientX, clientY) {
    this.autoFit = false;
    const rect = this.svg.getBoundingClientRect();
    const view = this.scroller.getBoundingClientRect();
    const px = clientX ?? view.left + view.width / 2;
    const py = clientY ?? view.top + view.height / 2;
    const cx = (px - rect.left) / this.zoom; // the graph point under the pointer
    const cy = (py - rect.top) / this.zoom;
    this.zoom = clamp(this.zoom * factor, MIN_ZOOM, MAX_ZOOM);
    this.applyZoom();
    const after = this.svg.getBoundingClientRect();
    this.scroller.scrollLeft += after.left + cx * this.zoom - px;
    this.scroller.scrollTop += after.top + cy * this.zoom - py;
  }

  applyZoom() {
    this.svg.setAttribute("width", String(Math.round(this.size.width * this.zoom)));
    this.svg.setAttribute("height", String(Math.round(this.size.height * this.zoom)));
    this.zoomLabel.textContent = `${Math.round(this.zoom * 100)}%`;
  }

  installPanAndZoom() {
    this.scroller.addEventListener(
      "wheel",
      (ev) => {
        if (!ev.ctrlKey && !ev.metaKey) return; // plain wheel scrolls natively
        ev.preventDefault();
        this.zoomBy(Math.exp(-ev.deltaY / 300), ev.clientX, ev.clientY);
      },
      { passive: false },
    );
    let drag = null;
    this.scroller.addEventListener("pointerdown", (ev) => {
      if (ev.button !== 0 || ev.target.closest?.(".node")) return;
      drag = { x: ev.clientX, y: ev.clientY, left: this.scroller.scrollLeft, top: this.scroller.scrollTop, moved: false };
      this.scroller.setPointerCapture(ev.pointerId);
    });
    this.scroller.addEventListener("pointermove", (ev) => {
      if (!drag) return;
      const dx = ev.clientX - drag.x;
      const dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) {
        drag.moved = true;
        this.scroller.classList.add("panning");
      }
      this.scroller.scrollLeft = drag.left - dx;
      this.scroller.scrollTop = drag.top - dy;
    });
    const end = (ev) => {
      if (!drag) return;
      const moved = drag.moved;
      drag = null;
      this.scroller.classList.remove("panning");
      if (this.scroller.hasPointerCapture(ev.pointerId)) this.scroller.releasePointerCapture(ev.pointerId);
      if (!moved && ev.type === "pointerup" && this.selected) this.onSelect(null); // a click on the background
    };
    this.scroller.addEventListener("pointerup", end);
    this.scroller.addEventListener("pointercancel", end);
  }
}

function nodeClass(state, selected) {
  return `node st-${state}${selected ? " selected" : ""}`;
}

function nodeShape(node, pos) {
  const { width: w, height: hgt } = pos;
  return s(
    "g",
    {
      class: nodeClass(node.state, false),
      transform: `translate(${pos.x - w / 2},${pos.y - hgt / 2})`,
      tabindex: "0",
      role: "button",
      "aria-label": `Node ${node.id}, ${node.state}`,
      dataset: { nodeId: node.id, state: node.state },
    },
    s("title", {}, `${node.id}: ${node.state}`),
    node.for_each ? s("rect", { class: "node-stack", x: 5, y: -5, width: w, height: hgt, rx: 9 }) : null,
    node.for_each ? s("rect", { class: "node-stack", x: 2.5, y: -2.5, width: w, height: hgt, rx: 9 }) : null,
    s("rect", { class: "node-box", width: w, height: hgt, rx: 9 }),
    s("rect", { class: "node-accent", x: 0, y: 0, width: 5, height: hgt, "clip-path": "url(#node-clip)" }),
    s("circle", { class: "node-dot", cx: 19, cy: 18, r: 4.5 }),
    s("text", { class: "node-title", x: 31, y: 22 }, truncate(node.id, 20)),
    s("text", { class: "node-state", x: 14, y: 40 }, node.state),
    s("text", { class: "node-sub", x: w - 12, y: 40, "text-anchor": "end" }, truncate(subtitle(node), 26)),
    s("text", { class: "node-run", x: 14, y: 57 }, ""),
  );
}

/** Where a node ran or waits: the device of its latest attempt (else the one it is queued on)
 * and how many attempts it made, e.g. {text: "web-1 · 2 attempts", device: "web-1", attempts: 2}. */
export function placed(node, deviceName = (id) => id) {
  if (node.children) return fanned(node);
  const attempts = node.attempts || [];
  const last = attempts[attempts.length - 1];
  if (last?.device_id) {
    const device = deviceName(last.device_id) || last.device_id;
    return { device, attempts: attempts.length, text: `${device} · ${attempts.length} attempt${attempts.length === 1 ? "" : "s"}` };
  }
  if (node.queued_on) {
    const device = deviceName(node.queued_on) || node.queued_on;
    return { device, attempts: 0, text: `queued on ${device}` };
  }
  return { device: "", attempts: 0, text: "" };
}

/** A fan-out node's progress: "3/12 done · 1 failed" (or how many devices it waits for). */
function fanned(node) {
  const kids = node.children || [];
  const count = (st) => kids.filter((c) => c.state === st).length;
  const done = kids.filter((c) => ["succeeded", "failed", "skipped", "cancelled"].includes(c.state)).length;
  const failed = count("failed");
  const text = kids.length ? `${done}/${kids.length} done${failed ? ` · ${failed} failed` : ""}` : "no devices yet";
  return { device: "", attempts: 0, text };
}

function subtitle(node) {
  if (node.for_each) return node.children ? `fan-out ×${node.children.length}` : "fan-out";
  if (node.kind === "agent") return "agent";
  const cmds = node.commands || [];
  if (!cmds.length) return node.kind || "";
  const tools = [...new Set(cmds.map((c) => c.tool))];
  return tools.length === 1 ? (cmds.length > 1 ? `${tools[0]} ×${cmds.length}` : tools[0]) : `${cmds.length} commands`;
}

function truncate(text, max) {
  const str = String(text ?? "");
  return str.length > max ? `${str.slice(0, max - 1)}…` : str;
}

function clamp(v, lo, hi) {
  return Math.min(hi, Math.max(lo, v));
}

function markers(w, hgt) {
  return s(
    "defs",
    {},
    // One clip for every node: clip paths use the user space of the node that refers to them.
    s("clipPath", { id: "node-clip" }, s("rect", { width: w, height: hgt, rx: 9 })),
    EDGE_KINDS.map((on) =>
      s(
        "marker",
        {
          id: `arrow-${on}`,
          class: `arrow on-${on}`,
          viewBox: "0 0 10 10",
          refX: 9,
          refY: 5,
          markerWidth: 7,
          markerHeight: 7,
          orient: "auto-start-reverse",
          markerUnits: "userSpaceOnUse",
        },
        s("path", { d: "M0,1 L10,5 L0,9 z" }),
      ),
    ),
  );
}

function toolButton(name, label, onclick) {
  return h("button", { class: "icon-button", type: "button", title: label, "aria-label": label, onclick }, icon(name));
}

function legend() {
  const states = NODE_STATES;
  return h(
    "div",
    { class: "legend", "aria-label": "Legend" },
    h(
      "div",
      { class: "legend-group" },
      states.map((st) => h("span", { class: `legend-item st-${st}` }, h("span", { class: "swatch" }), st)),
    ),
    h(
      "div",
      { class: "legend-group" },
      EDGE_KINDS.map((on) =>
        h(
          "span",
          { class: "legend-item" },
          s(
            "svg",
            { class: "legend-edge", width: 28, height: 10, viewBox: "0 0 28 10", "aria-hidden": "true" },
            s("path", { class: `edge on-${on}`, d: "M1,5 L27,5" }),
          ),
          `on ${on}`,
        ),
      ),
    ),
  );
}
