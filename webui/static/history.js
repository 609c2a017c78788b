/* The history page: past turns with rating, tags, the reward the current mapper assigns,
 * the checkpoint that produced each, their conversation's system prompt and the person's
 * rewrite of the reply; filters by rating, tag and date; forget a turn or a whole
 * conversation. */
"use strict";

(() => {
  const {el, text, api, describeError, toast, formatTime, formatNumber} = Reinf;
  const $ = (id) => document.getElementById(id);
  const form = $("filters");

  function queryFromForm() {
    const params = new URLSearchParams();
    const rating = $("filter-rating").value;
    if (rating === "rated") params.set("rated", "true");
    else if (rating === "unrated") params.set("rated", "false");
    else if (/^\d-\d$/.test(rating)) {
      params.set("min_score", rating[0]);
      params.set("max_score", rating[2]);
    } else if (/^\d$/.test(rating)) {
      params.set("min_score", rating);
      params.set("max_score", rating);
    }
    const tag = $("filter-tag").value.trim();
    if (tag) params.set("tag", tag);
    if ($("filter-since").value) params.set("since", $("filter-since").value);
    if ($("filter-until").value) params.set("until", $("filter-until").value);
    params.set("limit", $("filter-limit").value || "50");
    return params;
  }

  function formFromQuery(params) {
    if (params.get("rated") === "true") $("filter-rating").value = "rated";
    else if (params.get("rated") === "false") $("filter-rating").value = "unrated";
    else if (params.get("min_score")) {
      const lo = params.get("min_score"), hi = params.get("max_score") || lo;
      $("filter-rating").value = lo === hi ? lo : `${lo}-${hi}`;
    }
    $("filter-tag").value = params.get("tag") || "";
    $("filter-since").value = params.get("since") || "";
    $("filter-until").value = params.get("until") || "";
    if (params.get("limit")) $("filter-limit").value = params.get("limit");
  }

  function clip(value, n) {
    return value.length > n ? value.slice(0, n - 1) + "…" : value;
  }

  /** A long text cell: the start, with the whole text behind a disclosure. */
  function longText(value, n) {
    if (value.length <= n) return el("span", {class: "cell-text"}, value);
    return el("details", {class: "cell-text"}, el("summary", {}, clip(value, n)),
              el("div", {class: "full-text"}, value));
  }

  /** The reply the person wrote instead: a mark, with the text behind a disclosure. */
  function rewriteBlock(rewrite) {
    return el("details", {class: "rewrite-block"},
      el("summary", {title: `rewritten ${formatTime(rewrite.updated_at || rewrite.created_at)}`},
         el("span", {class: "rewrite-mark"}, "✎ rewritten")),
      el("div", {class: "full-text"}, rewrite.text));
  }

  function row(t) {
    const r = t.rating;
    const reward = t.reward === null || t.reward === undefined ? "–" : formatNumber(t.reward, 2);
    return el("tr", {dataset: {turnId: String(t.turn_id)}},
      el("td", {"data-label": "When"}, formatTime(t.created_at)),
      el("td", {"data-label": "Conversation"},
         el("a", {href: `/?conversation=${t.conversation_id}`}, `#${t.conversation_id}`),
         ` turn ${t.index}`,
         // one of several replies to the same message (Regenerate): which one is in use
         t.alternatives > 1 ? el("span", {class: "muted alt-note"},
           ` · ${t.picked ? "in use" : "not in use"}, ${t.alternatives} replies`) : null),
      el("td", {"data-label": "Message", class: "message-cell"},
         t.system_prompt ? el("div", {class: "muted system-note"},
                              longText(`System: ${t.system_prompt}`, 70)) : null,
         longText(t.user_message, 120)),
      el("td", {"data-label": "Reply", class: "message-cell"},
         longText(t.reply, 160), t.interrupted ? el("em", {class: "muted"}, " (stopped)") : null,
         t.rewrite ? rewriteBlock(t.rewrite) : null),
      el("td", {"data-label": "Rating", class: "rating-cell"},
         r ? el("span", {class: `score-badge s${r.score}`, title: `rated ${r.score} of 5`},
                `${r.score}/5`) : el("span", {class: "muted"}, "–"),
         r && r.critical ? el("span", {class: "critical-badge"}, " critical") : null),
      el("td", {"data-label": "Tags"},
         r ? r.tags.map((tag) => el("span", {class: "chip"}, tag)) : null,
         r && r.comment ? el("div", {class: "muted comment"}, `“${clip(r.comment, 80)}”`) : null),
      el("td", {"data-label": "Reward", class: "num"}, reward),
      el("td", {"data-label": "Checkpoint"}, t.checkpoint_id || "base"),
      el("td", {"data-label": "Forget", class: "actions"},
         el("button", {type: "button", class: "danger small", onclick: () => forgetTurn(t)},
            "Delete turn"),
         el("button", {type: "button", class: "danger small",
                       onclick: () => forgetConversation(t)}, "Delete conversation")));
  }

  async function load() {
    const params = queryFromForm();
    history.replaceState(null, "", `/history?${params}`);
    try {
      const data = await api("GET", `/api/history?${params}`);
      $("history-rows").replaceChildren(...data.turns.map(row));
      text($("history-count"), data.count === 0 ? "No turns match." :
        `${data.count} turn${data.count === 1 ? "" : "s"}, newest first.`);
      const hook = $("hook-error");
      hook.hidden = !data.hook_error;
      text(hook, data.hook_error ? `Reward mapper is broken, so rewards are not shown: ${data.hook_error}` : "");
    } catch (err) {
      text($("history-count"), describeError(err));
    }
  }

  async function forgetTurn(t) {
    if (!confirm(`Delete turn ${t.turn_id} and its rating? It will never be trained on again.`)) return;
    try {
      await api("DELETE", `/api/turns/${t.turn_id}`);
      toast(`Turn ${t.turn_id} deleted`);
      load();
    } catch (err) { toast(describeError(err), "error"); }
  }

  async function forgetConversation(t) {
    if (!confirm(`Delete conversation #${t.conversation_id} with all its turns and ratings?`)) return;
    try {
      const {forgotten} = await api("DELETE", `/api/conversations/${t.conversation_id}`);
      toast(`Conversation deleted: ${forgotten.turns} turns, ${forgotten.ratings} ratings`);
      load();
    } catch (err) { toast(describeError(err), "error"); }
  }

  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  form.addEventListener("reset", () => setTimeout(load, 0));
  formFromQuery(new URLSearchParams(location.search));
  load();
})();
