// main.js: boots the dashboard: sign-in gate, hash router (#/devices, #/devices/<id>, #/tasks,
// #/tasks/<id>[?node=<id>], #/approvals[?state=], #/schedules, #/schedules/<id>)
// and view lifecycle (each view returns a cleanup that stops its timers and streams).

import { clearKey, getKey, onUnauthorized } from "./api.js";
import { createShell } from "./shell.js";
import { startTicker } from "./ui.js";
import { mountApprovals } from "./views/approvals.js";
import { mountDevice } from "./views/device.js";
import { mountDevices } from "./views/devices.js";
import { mountSchedule, mountSchedules } from "./views/schedules.js";
import { mountSignIn } from "./views/signin.js";
import { mountTask } from "./views/task.js";
import { mountTasks } from "./views/tasks.js";

const app = document.getElementById("app");
let shell = null;
let cleanup = () => {};

function route() {
  const hash = location.hash || "#/devices";
  const [path, qs] = hash.slice(1).split("?");
  const params = new URLSearchParams(qs || "");
  const parts = path.split("/").filter(Boolean);
  if (parts[0] === "tasks" && parts[1]) return { name: "task", nav: "tasks", id: decodeURIComponent(parts[1]), params };
  if (parts[0] === "tasks") return { name: "tasks", nav: "tasks", params };
  if (parts[0] === "approvals") return { name: "approvals", nav: "approvals", params };
  if (parts[0] === "schedules" && parts[1]) return { name: "schedule", nav: "schedules", id: decodeURIComponent(parts[1]), params };
  if (parts[0] === "schedules") return { name: "schedules", nav: "schedules", params };
  if (parts[0] === "devices" && parts[1]) return { name: "device", nav: "devices", id: decodeURIComponent(parts[1]), params };
  return { name: "devices", nav: "devices", params };
}

function render() {
  cleanup();
  cleanup = () => {};
  if (!getKey()) {
    showSignIn("");
    return;
  }
  if (!shell) {
    shell = createShell({ onSignOut: signOut });
    app.replaceChildren(shell.root);
  }
  const r = route();
  shell.setActive(r.nav);
  const view = shell.main;
  view.replaceChildren();
  view.dataset.view = r.name;
  if (r.name === "task") cleanup = mountTask(view, r.id, r.params);
  else if (r.name === "approvals") cleanup = mountApprovals(view, r.params);
  else if (r.name === "tasks") cleanup = mountTasks(view, r.params);
  else if (r.name === "device") cleanup = mountDevice(view, r.id);
  else if (r.name === "schedules") cleanup = mountSchedules(view);
  else if (r.name === "schedule") cleanup = mountSchedule(view, r.id);
  else cleanup = mountDevices(view);
  const titles = { tasks: "Tasks", devices: "Devices", approvals: "Approvals", schedules: "Schedules" };
  document.title = `${["task", "device", "schedule"].includes(r.name) ? r.id : titles[r.name]} · Orrery`;
}

function showSignIn(message) {
  cleanup();
  cleanup = () => {};
  shell?.stop();
  shell = null;
  document.title = "Sign in · Orrery";
  const root = document.createElement("div");
  app.replaceChildren(root);
  cleanup = mountSignIn(root, { message, onSignedIn: render });
}

function signOut() {
  clearKey();
  showSignIn("");
}

onUnauthorized((detail) => showSignIn(detail));
window.addEventListener("hashchange", render);
startTicker();
render();
