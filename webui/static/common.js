/* Shared helpers for Reinf's pages. No build step, no framework.
 *
 * Safety rule: text from the user or the model is only ever put into the page with
 * textContent (via el() and text()), never parsed as HTML markup.
 */
"use strict";

const Reinf = (() => {
  const csrfMeta = document.querySelector('meta[name="csrf-token"]');
  const csrf = csrfMeta ? csrfMeta.content : "";

  /** Create an element: el("td", {class: "x", title: t}, "text", child, ...). */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /** Replace a node's content with plain text. */
  function text(node, value) {
    node.textContent = value === null || value === undefined ? "" : String(value);
    return node;
  }

  class ApiError extends Error {
    constructor(status, body) {
      const message = (body && (body.error && body.error.message || body.error)) ||
        `request failed (${status})`;
      super(typeof message === "string" ? message : JSON.stringify(message));
      this.status = status;
      this.fix = body && body.fix;
    }
  }

  /** Call the JSON API; resolves to the parsed body, rejects with an ApiError. */
  async function api(method, path, body, options) {
    const init = Object.assign({
      method,
      headers: {"X-Reinf-CSRF": csrf, "Accept": "application/json"},
      credentials: "same-origin",
    }, options || {});
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    if (options && options.raw) {
      if (!response.ok) throw new ApiError(response.status, await readJson(response));
      return response;
    }
    const data = await readJson(response);
    if (!response.ok) throw new ApiError(response.status, data);
    return data;
  }

  async function readJson(response) {
    try { return await response.json(); } catch (e) { return null; }
  }

  function describeError(err) {
    if (err instanceof ApiError) return err.fix ? `${err.message} — ${err.fix}` : err.message;
    return `network error: ${err && err.message ? err.message : err}`;
  }

  let toastTimer = null;
  function toast(message, kind) {
    const box = document.getElementById("toast");
    if (!box) return;
    text(box, message);
    box.className = "toast " + (kind || "info");
    box.hidden = false;
    clearTimeout(toastTimer);
    toastTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 8000 : 3500);
  }

  function formatTime(iso) {
    if (!iso) return "";
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return iso;
    return d.toLocaleString(undefined, {year: "numeric", month: "short", day: "numeric",
                                        hour: "2-digit", minute: "2-digit"});
  }

  function formatNumber(value, digits) {
    if (value === null || value === undefined || Number.isNaN(Number(value))) return "–";
    return Number(value).toFixed(digits === undefined ? 3 : digits);
  }

  function pageData() {
    const node = document.getElementById("page-data");
    if (!node) return {};
    try { return JSON.parse(node.textContent); } catch (e) { return {}; }
  }

  // The pill looks at the status again after this long: soon while a training round runs
  // (its checkpoint may become active any moment), now and then otherwise (a round the
  // schedule starts, a rollback from the terminal).
  const PILL_TRAINING_MS = 4000, PILL_IDLE_MS = 60000;
  let pillTimer = null;

  function pillLater(ms) {
    clearTimeout(pillTimer);
    pillTimer = setTimeout(refreshPill, ms);
  }

  /** Show a GET /api/status answer in the header pill (model and active checkpoint). Every
   * page that fetches the status passes it here, so the pill never lags behind the page. */
  function showStatus(s) {
    const pill = document.getElementById("status-pill");
    if (!pill || !s || !s.model) return;
    text(pill, `${s.model.model_path} · ${s.active_checkpoint}`);
    pill.dataset.checkpoint = s.active_checkpoint;
    pill.classList.toggle("warn", (s.warnings || []).length > 0);
    pill.title = (s.warnings || []).join("\n") || "model and active checkpoint";
    pillLater(s.training && s.training.running ? PILL_TRAINING_MS : PILL_IDLE_MS);
  }

  /** Fetch the status for the header pill. */
  async function refreshPill() {
    if (!document.getElementById("status-pill")) return;
    if (document.hidden) { pillLater(PILL_IDLE_MS); return; }  // nobody is looking
    try {
      showStatus(await api("GET", "/api/status"));
    } catch (e) {
      pillLater(PILL_IDLE_MS);  // the page still works without it
    }
  }

  // Inputs where a key press is not text: a digit there may still be a shortcut.
  const NOT_TEXT = ["button", "checkbox", "color", "file", "image", "radio", "range", "reset",
                    "submit"];

  /** Whether a key press on ``target`` types into it (a text field, a select's type-ahead). */
  function isTyping(target) {
    if (!target) return false;
    if (target.isContentEditable || ["TEXTAREA", "SELECT"].includes(target.tagName)) return true;
    return target.tagName === "INPUT" && !NOT_TEXT.includes(target.type);
  }

  return {el, text, api, ApiError, describeError, toast, formatTime, formatNumber, pageData,
          refreshPill, showStatus, isTyping, csrf};
})();

document.addEventListener("DOMContentLoaded", () => Reinf.refreshPill());
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) Reinf.refreshPill();
});
