// shell.js: the page frame once signed in: header with the logo, navigation (Devices,
// Tasks, Schedules, Approvals with the number of pending approvals, polled), the server this tab talks
// to (with its version) and sign out; views render below. `stop()` ends the polling.

import { api } from "./api.js";
import { onApprovalsChanged } from "./approvals.js";
import { h, icon, s } from "./dom.js";

const PENDING_POLL_MS = 4000;
const PENDING_LIMIT = 500;

export function logo(size = 26) {
  return s(
    "svg",
    { class: "logo", width: size, height: size, viewBox: "0 0 32 32", "aria-hidden": "true" },
    s("circle", { cx: 16, cy: 16, r: 4.5, class: "logo-sun" }),
    s("ellipse", { cx: 16, cy: 16, rx: 13, ry: 6.5, class: "logo-orbit", transform: "rotate(-28 16 16)" }),
    s("circle", { cx: 27.2, cy: 10.2, r: 2.6, class: "logo-planet" }),
  );
}

export function createShell({ onSignOut }) {
  const links = {
    devices: h("a", { href: "#/devices", class: "nav-link", dataset: { nav: "devices" } }, icon("devices"), "Devices"),
    tasks: h("a", { href: "#/tasks", class: "nav-link", dataset: { nav: "tasks" } }, icon("tasks"), "Tasks"),
    schedules: h("a", { href: "#/schedules", class: "nav-link", dataset: { nav: "schedules" } }, icon("schedules"), "Schedules"),
    approvals: h("a", { href: "#/approvals", class: "nav-link", dataset: { nav: "approvals" } }, icon("approvals"), "Approvals"),
  };
  const pending = h("span", { class: "nav-count", id: "approvals-count", hidden: true, "aria-live": "polite" });
  links.approvals.append(pending);
  const version = h("span", { class: "server-version" });
  const server = h(
    "div",
    { class: "server", title: `Connected to ${location.origin}` },
    h("span", { class: "server-dot", "aria-hidden": "true" }),
    h("span", { class: "server-host", id: "server-host" }, location.host),
    version,
  );
  const header = h(
    "header",
    { class: "topbar" },
    h("a", { class: "brand", href: "#/devices" }, logo(), h("span", {}, "Orrery")),
    h("nav", { class: "nav", "aria-label": "Main" }, links.devices, links.tasks, links.schedules, links.approvals),
    h("div", { class: "spacer" }),
    server,
    h(
      "button",
      { class: "button ghost small", type: "button", id: "sign-out", onclick: onSignOut },
      icon("logout", 15),
      "Sign out",
    ),
  );
  const main = h("main", { class: "view", id: "view" });
  const root = h("div", { class: "app" }, header, h("div", { id: "flash", class: "flash-region", "aria-live": "polite" }), main);

  fetch("/healthz", { cache: "no-store", credentials: "omit" })
    .then((r) => (r.ok ? r.json() : null))
    .then((body) => {
      if (body?.version) version.textContent = `v${body.version}`;
    })
    .catch(() => {});

  // The pending count: polled, and asked again at once after a decision made in this tab.
  let timer = null;
  let stopped = false;
  let inFlight = false;
  const controller = new AbortController();
  async function countPending() {
    if (stopped || inFlight) return;
    inFlight = true;
    clearTimeout(timer);
    try {
      const out = await api(`/v1/approvals?state=pending&limit=${PENDING_LIMIT}`, { signal: controller.signal });
      const n = (out.items || []).length;
      const text = out.next_cursor ? `${n}+` : String(n);
      pending.hidden = n === 0;
      pending.textContent = text;
      pending.dataset.count = String(n);
      links.approvals.title = n ? `${text} approval${n === 1 ? "" : "s"} pending` : "No approval pending";
    } catch {
      /* the count is a hint: keep the last one */
    } finally {
      inFlight = false;
    }
    if (!stopped) timer = setTimeout(countPending, PENDING_POLL_MS);
  }
  const unlisten = onApprovalsChanged(() => {
    if (inFlight) return;
    countPending();
  });
  countPending();

  return {
    root,
    main,
    stop() {
      stopped = true;
      clearTimeout(timer);
      controller.abort();
      unlisten();
    },
    setActive(name) {
      for (const [key, a] of Object.entries(links)) {
        a.classList.toggle("active", key === name);
        if (key === name) a.setAttribute("aria-current", "page");
        else a.removeAttribute("aria-current");
      }
    },
  };
}
