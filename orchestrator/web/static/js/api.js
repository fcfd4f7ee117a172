// api.js: every call to the REST API goes through here. The API key lives in sessionStorage
// and is sent only as an Authorization header, never in a URL. Problems (RFC 9457) become
// ApiError with the server's `detail`; a 401 anywhere signs the user out.

import { noteServerDate } from "./format.js";

const KEY = "orrery.apiKey";
const listeners = new Set();

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || problem?.title || `HTTP ${status}`);
    this.status = status;
    this.code = problem?.code || "";
    this.problem = problem || {};
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY);
}

export function setKey(key) {
  sessionStorage.setItem(KEY, key);
  rolePromise = null;
}

export function clearKey() {
  sessionStorage.removeItem(KEY);
  rolePromise = null;
}

let rolePromise = null;

/** The signed-in key's role ("viewer", "operator", "admin"), or null when the server does not
 * say; asked once per key (GET /v1/api-keys/me). The server still decides: this only hides
 * what would be refused. */
export function myRole() {
  if (!rolePromise) {
    rolePromise = api("/v1/api-keys/me").then(
      (me) => me?.role || null,
      () => null,
    );
  }
  return rolePromise;
}

/** Called with the problem detail whenever the server answers 401. */
export function onUnauthorized(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function authHeaders(key = getKey()) {
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function problemOf(resp) {
  const type = resp.headers.get("content-type") || "";
  if (type.includes("json")) {
    try {
      return await resp.json();
    } catch {
      /* fall through */
    }
  }
  return { status: resp.status, title: resp.statusText, detail: `${resp.status} ${resp.statusText}` };
}

/** Turn a non-OK response into an ApiError (and sign out on 401 unless told not to). */
export async function failure(resp, { signOut = true } = {}) {
  const problem = await problemOf(resp);
  const err = new ApiError(resp.status, problem);
  if (resp.status === 401 && signOut) {
    clearKey();
    for (const fn of listeners) fn(err.message);
  }
  return err;
}

/**
 * api("/v1/devices") -> parsed JSON. Options: method, body (JSON), signal, key (override),
 * signOut (false to keep a 401 local, as the sign-in form does).
 */
export async function api(path, { method = "GET", body, signal, key, signOut = true } = {}) {
  const headers = { Accept: "application/json", ...authHeaders(key ?? getKey()) };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
    credentials: "omit",
  });
  noteServerDate(resp.headers.get("date"));
  if (!resp.ok) throw await failure(resp, { signOut });
  if (resp.status === 204) return null;
  return resp.json();
}

/** Build a query string from the defined values of `params`. */
export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const text = q.toString();
  return text ? `?${text}` : "";
}
