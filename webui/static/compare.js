/* The compare page: one prompt answered by the bare base model, the active checkpoint and,
 * if chosen, another checkpoint (POST /api/compare), shown side by side as A, B (, C).
 * Blind by default: which reply came from which checkpoint shows only after the pick
 * (POST /api/compare/<id>/pick), which stores the preference as pairs. The comparison's id
 * goes into the address (?c=<id>), so a reload shows it again (GET /api/compare/<id>). */
"use strict";

(() => {
  const {el, text, api, describeError} = Reinf;
  const $ = (id) => document.getElementById(id);
  const form = $("compare-form");
  const promptBox = $("compare-prompt");
  const state = {
    current: null,        // the comparison shown (the API's answer)
    recent: new Map(),    // turn id -> recent prompt (GET /api/prompts)
    busy: false,
  };

  // --- the form: recent prompts, checkpoints -------------------------------------------

  async function loadChoices() {
    const [prompts, checkpoints] = await Promise.allSettled([
      api("GET", "/api/prompts?limit=20"), api("GET", "/api/checkpoints")]);
    if (prompts.status === "fulfilled") {
      for (const p of prompts.value.prompts) {
        state.recent.set(String(p.turn_id), p);
        const line = p.prompt.replace(/\s+/g, " ").trim();
        $("recent-prompts").append(el("option", {value: String(p.turn_id)},
          line.length > 70 ? line.slice(0, 69) + "…" : line));
      }
    }
    $("recent-prompts").disabled = state.recent.size === 0;
    if (checkpoints.status === "fulfilled") {
      const {checkpoints: rows, active_checkpoint: active} = checkpoints.value;
      for (const c of rows) {
        if (c.checkpoint_id === active || c.status === "deleted") continue;
        $("compare-checkpoint").append(el("option", {value: c.checkpoint_id},
          c.checkpoint_id + (c.status === "rejected" ? " (rejected by the gate)" : "")));
      }
    }
    $("compare-checkpoint").disabled = $("compare-checkpoint").options.length < 2;
  }

  $("recent-prompts").addEventListener("change", () => {
    const chosen = state.recent.get($("recent-prompts").value);
    if (chosen) promptBox.value = chosen.prompt;
  });
  promptBox.addEventListener("input", () => {
    // edited: it is a new prompt now, not that message with its conversation's context
    const chosen = state.recent.get($("recent-prompts").value);
    if (chosen && promptBox.value !== chosen.prompt) $("recent-prompts").value = "";
  });

  /** The request: a recent message by its turn (its reply's context comes along), or the
   * typed text as a new conversation's first message. */
  function request() {
    const body = {blind: $("compare-blind").checked};
    const chosen = state.recent.get($("recent-prompts").value);
    if (chosen && promptBox.value === chosen.prompt) body.turn_id = chosen.turn_id;
    else body.prompt = promptBox.value;
    if ($("compare-checkpoint").value) body.checkpoint = $("compare-checkpoint").value;
    return body;
  }

  // --- errors: one line in the page ---------------------------------------------------

  function showError(...parts) {
    const box = $("compare-error");
    box.replaceChildren(...parts);
    box.hidden = parts.length === 0;
  }

  function explain(err, body) {
    if (err instanceof Reinf.ApiError && err.status === 409 && body && !body.checkpoint) {
      const others = $("compare-checkpoint").options.length > 1;
      return ["Compare needs a trained checkpoint: the model is serving the bare base model, " +
              "so there is nothing to compare it with yet. Train a round on the ",
              el("a", {href: "/training"}, "Training page"),
              others ? " first, or choose a checkpoint under “Also compare with”." : " first."];
    }
    if (err instanceof Reinf.ApiError && err.status === 501) {
      return ["Compare needs a model, and none is loaded in this server: start it with " +
              "`reinf serve`."];
    }
    return [describeError(err)];
  }

  // --- the replies --------------------------------------------------------------------

  function source(reply) {
    if (!reply.role) return null;
    if (reply.role === "base") return "base model";
    if (reply.role === "active") return `active checkpoint ${reply.checkpoint_id}`;
    return `checkpoint ${reply.checkpoint_id}`;
  }

  function predicted(reply) {
    if (reply.predicted_score === null || reply.predicted_score === undefined) {
      return "no rating model yet";
    }
    return `predicted rating ${Number(reply.predicted_score).toFixed(1)} / 5`;
  }

  function replyCard(c, reply) {
    const picked = c.picked !== null && c.picked !== undefined;
    const won = c.picked === reply.slot;
    const from = source(reply);
    const dataset = {slot: reply.slot};
    if (reply.role) Object.assign(dataset, {role: reply.role, checkpoint: reply.checkpoint_id});
    return el("article", {class: "compare-reply" + (won ? " winner" : ""), dataset,
                          "aria-label": `Reply ${reply.slot}`},
      el("header", {class: "compare-head"},
        el("h2", {}, `Reply ${reply.slot}`),
        won ? el("span", {class: "chip"}, "your pick") : null,
        el("span", {class: "compare-source" + (from ? " revealed" : "")},
           from || "hidden until you pick")),
      reply.text ? el("div", {class: "text"}, reply.text) :
        el("div", {class: "text muted"}, "(an empty reply)"),
      el("p", {class: "meta predicted",
               title: "the score the rating model of the active checkpoint expects you " +
                      "to give this reply"},
         predicted(reply),
         reply.finish_reason === "length" ? " · cut off at max_new_tokens" : ""),
      picked ? null : el("button", {type: "button", class: "primary",
                                    dataset: {pick: reply.slot}, onclick: () => pick(reply.slot)},
                         `${reply.slot} is better`));
  }

  function outcome(c) {
    const n = c.pairs.length;
    const stored = `Stored ${n} pair${n === 1 ? "" : "s"}` +
      (n && c.pairs[0].pair_id !== undefined ?
        ` (#${c.pairs.map((p) => p.pair_id).join(", #")})` : "");
    const named = (r) => r.role ? `${r.slot} (${source(r)})` : r.slot;
    if (c.picked === "tie") {
      return `${stored}: a tie, ${c.replies.map(named).join(" and ")} are as good.`;
    }
    if (c.picked === "both_bad") {
      return `${stored}: ${c.replies.map(named).join(" and ")} are all bad.`;
    }
    const winner = c.replies.find((r) => r.slot === c.picked);
    const others = c.replies.filter((r) => r.slot !== c.picked);
    return `${stored}: ${named(winner)} is better than ${others.map(named).join(" and ")}.`;
  }

  function render(c) {
    state.current = c;
    const picked = c.picked !== null && c.picked !== undefined;
    text($("compare-asked"), c.prompt);
    $("compare-replies").replaceChildren(...c.replies.map((r) => replyCard(c, r)));
    $("compare-replies").dataset.count = String(c.replies.length);
    for (const button of $("compare-picks").querySelectorAll("button")) {
      button.disabled = picked || state.busy;
    }
    $("compare-picks").hidden = picked;
    text($("compare-outcome"), picked ? outcome(c) : c.blind ?
      "Which reply is better? You see which is which after your pick." :
      "Which reply is better? (Not blind: you see where each came from.)");
    $("compare-outcome").classList.toggle("done", picked);
    $("compare-again").hidden = !picked;
    $("compare-result").hidden = false;
  }

  /** On a phone the replies come below the form, out of sight: bring them up. */
  function showResult() {
    if (window.matchMedia("(max-width: 720px)").matches) {
      $("compare-result").scrollIntoView({block: "start"});
    }
  }

  function setBusy(on, message) {
    state.busy = on;
    $("compare-go").disabled = on;
    $("compare-again").disabled = on;
    form.setAttribute("aria-busy", String(on));
    text($("compare-busy"), on ? message : "");
    for (const button of document.querySelectorAll("#compare-result button[data-pick]")) {
      button.disabled = on || (state.current && state.current.picked != null);
    }
  }

  async function compare(body) {
    if (state.busy) return;
    showError();
    const n = body.checkpoint ? 3 : 2;
    setBusy(true, `Generating ${n} replies, one after another…`);
    try {
      const c = await api("POST", "/api/compare", body);
      history.replaceState(null, "", `/compare?c=${encodeURIComponent(c.compare_id)}`);
      setBusy(false);
      render(c);
      showResult();
    } catch (err) {
      setBusy(false);
      showError(...explain(err, body));
    }
  }

  async function pick(winner) {
    const c = state.current;
    if (!c || state.busy) return;
    showError();
    setBusy(true, "Storing your pick…");
    try {
      const picked = await api("POST", `/api/compare/${encodeURIComponent(c.compare_id)}/pick`,
                               {winner});
      setBusy(false);
      render(picked);
    } catch (err) {
      setBusy(false);
      showError(...explain(err, null));
    }
  }

  // --- wiring ---------------------------------------------------------------------------

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (!promptBox.value.trim()) {
      showError("Type a prompt to compare, or pick a recent message.");
      return;
    }
    compare(request());
  });
  promptBox.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  for (const button of $("compare-picks").querySelectorAll("button[data-pick]")) {
    button.addEventListener("click", () => pick(button.dataset.pick));
  }
  $("compare-again").addEventListener("click", () => form.requestSubmit());

  async function reopen(id) {
    try {
      const c = await api("GET", `/api/compare/${encodeURIComponent(id)}`);
      promptBox.value = c.prompt;
      render(c);
      showResult();
    } catch (err) {
      history.replaceState(null, "", "/compare");
      showError(err instanceof Reinf.ApiError && err.status === 404 ?
        "That comparison has expired (they wait an hour, and a restart forgets them): " +
        "compare again." : describeError(err));
    }
  }

  loadChoices().catch(() => {});  // the form works without the lists
  const wanted = new URLSearchParams(location.search).get("c");
  if (wanted && /^[0-9a-f]{8,64}$/i.test(wanted)) reopen(wanted);
  else promptBox.focus();
})();
