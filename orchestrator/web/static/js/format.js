// format.js: human-readable times, durations and compact JSON for the views.

let skewMs = 0; // server clock minus browser clock, learnt from HTTP Date headers

/** Remember the server's clock (from a response's Date header) so "3 s ago" is right. */
export function noteServerDate(header) {
  const server = Date.parse(header || "");
  if (Number.isNaN(server)) return;
  const skew = server + 500 - Date.now();
  // Date has a 1 s resolution and servers cache it for up to a second: only a clock that is
  // clearly off (a browser on another machine) is corrected.
  skewMs = Math.abs(skew) > 5000 ? skew : 0;
}

export function serverNow() {
  return Date.now() + skewMs;
}

export function parseTime(value) {
  if (!value) return null;
  const t = Date.parse(value);
  return Number.isNaN(t) ? null : t;
}

/** "just now", "3 s ago", "5 min ago", "2 h ago", "4 d ago". */
export function ago(value) {
  const t = parseTime(value);
  if (t === null) return "never";
  const secs = Math.max(0, Math.round((serverNow() - t) / 1000));
  if (secs < 1) return "just now";
  if (secs < 60) return `${secs} s ago`;
  const mins = Math.floor(secs / 60);
  if (mins < 60) return `${mins} min ago`;
  const hours = Math.floor(mins / 60);
  if (hours < 48) return `${hours} h ago`;
  return `${Math.floor(hours / 24)} d ago`;
}

/** "0.12 s", "4.3 s", "2 min 05 s", "1 h 02 min". */
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "—";
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${(ms / 1000).toFixed(2)} s`;
  const secs = ms / 1000;
  if (secs < 60) return `${secs.toFixed(1)} s`;
  const whole = Math.round(secs);
  const mins = Math.floor(whole / 60);
  if (mins < 60) return `${mins} min ${String(whole % 60).padStart(2, "0")} s`;
  return `${Math.floor(mins / 60)} h ${String(mins % 60).padStart(2, "0")} min`;
}

/** Duration between two ISO timestamps; a missing end means "still going". */
export function span(start, end) {
  const a = parseTime(start);
  if (a === null) return null;
  const b = end ? parseTime(end) : serverNow();
  return b === null ? null : b - a;
}

const dateFmt = new Intl.DateTimeFormat(undefined, {
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  hourCycle: "h23",
});

/** A short local date-time, e.g. "Nov 29, 18:18:52". */
export function when(value) {
  const t = parseTime(value);
  return t === null ? "—" : dateFmt.format(new Date(t));
}

const clockFmt = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" });

/** Just the time of day, e.g. "18:18:52" (for the end of a span that started the same day). */
export function clock(value) {
  const t = parseTime(value);
  return t === null ? "—" : clockFmt.format(new Date(t));
}

export function sameDay(a, b) {
  const x = parseTime(a);
  const y = parseTime(b);
  return x !== null && y !== null && new Date(x).toDateString() === new Date(y).toDateString();
}

/** Full ISO text for tooltips. */
export function iso(value) {
  const t = parseTime(value);
  return t === null ? "" : new Date(t).toISOString();
}

/** Indented JSON, with short arrays and objects of plain values kept on one line. */
export function pretty(value) {
  if (value === undefined) return "";
  if (typeof value === "string") return value;
  try {
    return prettyAt(value, "");
  } catch {
    return String(value);
  }
}

function prettyAt(value, indent) {
  if (value === null || typeof value !== "object") return JSON.stringify(value) ?? String(value);
  const entries = Array.isArray(value) ? value.map((v) => [null, v]) : Object.entries(value);
  if (!entries.length) return Array.isArray(value) ? "[]" : "{}";
  const [open, close] = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
  const flat = entries.every(([, v]) => v === null || typeof v !== "object");
  if (flat) {
    const inline = `${open}${entries.map(([k, v]) => (k === null ? "" : `${JSON.stringify(k)}: `) + JSON.stringify(v)).join(", ")}${close}`;
    if (inline.length + indent.length <= 72) return inline;
  }
  const inner = `${indent}  `;
  const lines = entries.map(([k, v]) => `${inner}${k === null ? "" : `${JSON.stringify(k)}: `}${prettyAt(v, inner)}`);
  return `${open}\n${lines.join(",\n")}\n${indent}${close}`;
}

/** `{role: "web"}` -> ["role=web"] */
export function labelList(labels) {
  return Object.entries(labels || {})
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${v}`);
}

/** Shorten an id for display: "b_6f40b7f0f319e8543d30" -> "b_6f40b7f0…". */
export function shortId(id, keep = 10) {
  if (!id) return "";
  return id.length > keep + 1 ? `${id.slice(0, keep)}…` : id;
}
