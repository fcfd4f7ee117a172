// views/signin.js: the sign-in screen. The key is checked with one GET before it is kept (in
// sessionStorage, for this tab only); a refusal shows the server's problem detail.

import { api, setKey } from "../api.js";
import { h } from "../dom.js";
import { logo } from "../shell.js";

export function mountSignIn(root, { message = "", onSignedIn }) {
  const error = h("div", { class: "signin-error", role: "alert", id: "signin-error" }, message);
  error.hidden = !message;
  const input = h("input", {
    id: "api-key",
    name: "api-key",
    type: "password",
    autocomplete: "off",
    spellcheck: "false",
    placeholder: "orrk_…",
    required: true,
    "aria-describedby": "signin-error signin-hint",
  });
  const button = h("button", { class: "button primary", type: "submit" }, "Sign in");
  const form = h(
    "form",
    { class: "signin-card", novalidate: true },
    h("div", { class: "signin-brand" }, logo(36), h("span", {}, "Orrery")),
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Connect to ", h("strong", {}, location.host), " with an API key."),
    h("label", { for: "api-key" }, "API key"),
    input,
    error,
    button,
    h(
      "p",
      { class: "hint", id: "signin-hint" },
      "On first start, ",
      h("code", {}, "orrery serve"),
      " writes an admin key to ",
      h("code", {}, "<data-dir>/admin.key"),
      ". The key is kept in this browser tab only.",
    ),
  );
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = input.value.trim();
    if (!key) {
      showError("Paste an API key first.");
      return;
    }
    button.disabled = true;
    button.textContent = "Signing in…";
    try {
      await api("/v1/devices", { key, signOut: false });
      setKey(key);
      input.value = "";
      onSignedIn();
    } catch (err) {
      showError(err.status ? err.message : `Cannot reach the server: ${err.message}`);
      input.select();
    } finally {
      button.disabled = false;
      button.textContent = "Sign in";
    }
  });
  function showError(text) {
    error.textContent = text;
    error.hidden = false;
  }
  root.replaceChildren(h("div", { class: "signin" }, form));
  input.focus();
  return () => {};
}
