// dom.js: tiny, safe DOM builders. Text always goes in through textContent / text nodes,
// attributes through setAttribute, so server-provided strings are never parsed as markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

function applyAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = String(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

/** h("div", {class: "x", onclick: fn}, "text", child, [more]) -> HTMLElement */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

/** s("path", {d: "..."}) -> SVGElement */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  applyAttrs(el, attrs);
  append(el, children);
  return el;
}

/** Replace every child of `el` with `children`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A coloured state badge; `kind` picks the palette ("node", "task" or "device"). */
/** A redraw that skips a section whose data did not change: `section(name, el, data, draw)`
 * replaces `el` with `draw()` only when `data` differs from what it last drew there. */
export function sectionDrawer() {
  const sigs = {};
  return (name, el, data, draw) => {
    const sig = JSON.stringify(data);
    if (sigs[name] === sig) return;
    sigs[name] = sig;
    replace(el, draw());
  };
}

export function pill(state, kind = "node") {
  return h("span", { class: `pill pill-${kind} st-${state}`, dataset: { state } }, state);
}

/** A small inline icon from the sprite-free set below (decorative, hidden from readers). */
export function icon(name, size = 16) {
  const paths = ICONS[name] || ICONS.dot;
  return s(
    "svg",
    { class: "icon", width: size, height: size, viewBox: "0 0 24 24", "aria-hidden": "true", focusable: "false" },
    paths.map((d) => s("path", { d })),
  );
}

const ICONS = {
  dot: ["M12 8a4 4 0 1 1 0 8a4 4 0 0 1 0-8z"],
  devices: ["M4 5h16v10H4z", "M8 19h8", "M12 15v4"],
  tasks: ["M5 6h3v3H5z", "M16 6h3v3h-3z", "M10.5 15h3v3h-3z", "M8 7.5h8", "M6.5 9v3.5h5.5v2.5", "M17.5 9v3.5H12"],
  plus: ["M12 5v14", "M5 12h14"],
  minus: ["M5 12h14"],
  fit: ["M4 9V4h5", "M20 9V4h-5", "M4 15v5h5", "M20 15v5h-5"],
  close: ["M6 6l12 12", "M18 6L6 18"],
  logout: ["M10 5H5v14h5", "M14 8l4 4-4 4", "M18 12H9"],
  back: ["M15 6l-6 6 6 6"],
  chevronLeft: ["M15 6l-6 6 6 6"],
  chevronRight: ["M9 6l6 6-6 6"],
  rerun: ["M4 12a8 8 0 0 1 14-5.3", "M18 3v4h-4", "M20 12a8 8 0 0 1-14 5.3", "M6 21v-4h4"],
  approvals: ["M12 3l7 3v5c0 4.5-3 8.2-7 10c-4-1.8-7-5.5-7-10V6z", "M8.5 12l2.5 2.5l4.5-5"],
  external: ["M14 5h5v5", "M19 5l-8 8", "M17 14v5H5V7h5"],
  schedules: ["M12 3a9 9 0 1 1 0 18a9 9 0 0 1 0-18z", "M12 7v5l3.5 2"],
};
