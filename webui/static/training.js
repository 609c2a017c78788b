/* The training page: runs and their metrics, the reward curve, mean rating per
 * checkpoint, the active checkpoint with rollback, "Train now", the reward hook's state,
 * ratings waiting and the next run. */
"use strict";

(() => {
  const {el, text, api, describeError, toast, formatTime, formatNumber} = Reinf;
  const $ = (id) => document.getElementById(id);
  let polling = null;

  function renderStatus(s) {
    // config.yaml changed since the server started: what needs a restart, or that it no
    // longer loads (the server says it in one line; null when nothing is wrong).
    const change = (s.config_changed || {}).message || "";
    $("config-changed").hidden = !change;
    text($("config-changed"), change);
    text($("active-checkpoint"), s.active_checkpoint);
    $("rollback-parent").disabled = s.active_checkpoint === "base";
    text($("ratings-waiting"), `${s.ratings_waiting}` +
      (s.train_after_ratings ? ` / ${s.train_after_ratings}` : ""));
    const schedule = s.schedule || {};
    text($("next-run"), s.next_run ? `next run: ${formatTime(s.next_run)}` :
      !schedule.running ? "no scheduler running: use Train now" :
      schedule.scheduling === false ? "scheduled training is off (--no-train): use Train now" :
      "next run: when enough ratings arrive");
    const training = s.training || {};
    text($("training-state"), training.running ? "running…" : "idle");
    $("train-now").disabled = !!training.running;
    const run = s.last_run;
    text($("last-run"), run ? `last run #${run.run_id}: ${run.status}, ${formatTime(run.started_at)}` +
      (run.error ? ` — ${run.error}` : "") : "no runs yet");
    const hook = s.reward_hook || {};
    text($("hook-state"), hook.ok === false ? "broken" : `ok (${hook.mapper || "default"})`);
    $("hook-state").classList.toggle("bad", hook.ok === false);
    $("hook-error").hidden = !hook.error;
    text($("hook-error"), hook.error || "");
    // Stage 1 of a round: how well the rating model predicts held-out ratings (Spearman).
    text($("reward-consistency"), training.reward_consistency == null ? "not fitted yet" :
      `reward consistency ${formatNumber(training.reward_consistency, 2)}`);
    text($("training-mode"), training.last_mode ?
      `last round: ${training.last_mode === "rollouts" ? "fresh replies scored by the rating model" :
        "rated replies only"} (${training.last_mode_reason})` :
      `method: ${training.method || "rollouts"}; no round yet`);
    if (training.running && !polling) polling = setInterval(refresh, 3000);
    if (!training.running && polling) { clearInterval(polling); polling = null; }
  }

  function metric(run, name, digits) {
    return el("td", {class: "num", "data-label": name}, formatNumber(run.metrics[name], digits));
  }

  function renderRuns(runs) {
    $("run-rows").replaceChildren(...runs.map((r) => el("tr", {},
      el("td", {"data-label": "Run"}, `#${r.run_id}`),
      el("td", {"data-label": "Started"}, formatTime(r.started_at)),
      el("td", {"data-label": "Status"}, el("span", {class: `status ${r.status}`}, r.status)),
      el("td", {"data-label": "Trigger"}, r.trigger),
      el("td", {"data-label": "Samples", class: "num"}, r.samples),
      metric(r, "reward_mean"), metric(r, "kl", 4), metric(r, "clipfrac"),
      metric(r, "policy_loss"), metric(r, "value_loss"), metric(r, "seconds", 1),
      el("td", {"data-label": "Checkpoint"}, r.checkpoint_id || "–"),
      el("td", {"data-label": "Error", class: "error-cell"}, r.error || ""))));
    if (!runs.length) {
      $("run-rows").append(el("tr", {}, el("td", {colspan: "13", class: "muted"},
                                           "No training runs yet.")));
    }
  }

  function renderCheckpoints(data) {
    const rows = data.checkpoints.map((c) => el("tr", {class: c.active ? "active" : ""},
      el("td", {"data-label": "Checkpoint"}, c.checkpoint_id, c.active ? " (active)" : ""),
      el("td", {"data-label": "Created"}, formatTime(c.created_at)),
      el("td", {"data-label": "Status"}, c.status),
      el("td", {"data-label": "Parent"}, c.parent_id || "base"),
      el("td", {"data-label": "reward_mean", class: "num"}, formatNumber(c.metrics.reward_mean)),
      el("td", {"data-label": "kl", class: "num"}, formatNumber(c.metrics.kl, 4)),
      el("td", {class: "actions"}, c.active || c.status !== "promoted" ? null :
        el("button", {type: "button", onclick: () => rollback(c.checkpoint_id)}, "Activate"))));
    rows.push(el("tr", {class: data.active_checkpoint === "base" ? "active" : ""},
      el("td", {"data-label": "Checkpoint"}, "base",
         data.active_checkpoint === "base" ? " (active)" : ""),
      el("td", {colspan: "5", class: "muted"}, "the model without any adapter"),
      el("td", {class: "actions"}, data.active_checkpoint === "base" ? null :
        el("button", {type: "button", onclick: () => rollback("base")}, "Use base model"))));
    $("checkpoint-rows").replaceChildren(...rows);
  }

  function renderCharts(stats) {
    Charts.line($("reward-chart"), stats.reward_curve.map((p) => ({
      x: new Date(p.finished_at), y: p.reward_mean, label: `run #${p.run_id}`})),
      "reward_mean of each training run over time");
    Charts.bars($("rating-chart"), stats.rating_by_checkpoint.map((c) => ({
      label: c.checkpoint_id, value: c.mean_rating,
      note: `${c.ratings} rating${c.ratings === 1 ? "" : "s"}`})), 5,
      "mean rating of the replies each checkpoint produced");
  }

  async function refresh() {
    try {
      const [status, runs, checkpoints, stats] = await Promise.all([
        api("GET", "/api/status"), api("GET", "/api/runs?limit=100"),
        api("GET", "/api/checkpoints"), api("GET", "/api/stats")]);
      renderStatus(status);
      Reinf.showStatus(status);  // the header pill shows the same checkpoint as the card
      renderRuns(runs.runs);
      renderCheckpoints(checkpoints);
      renderCharts(stats);
    } catch (err) {
      toast(describeError(err), "error");
    }
  }

  async function rollback(target) {
    const label = target === null ? "the parent of the active checkpoint" : target;
    if (!confirm(`Switch the model to ${label}?`)) return;
    try {
      const result = await api("POST", "/api/rollback",
                               target === null ? {} : {checkpoint_id: target});
      toast(`Active checkpoint: ${result.active_checkpoint}`);
      refresh();  // the pill too
    } catch (err) { toast(describeError(err), "error"); }
  }

  $("train-now").addEventListener("click", async () => {
    $("train-now").disabled = true;
    try {
      await api("POST", "/api/train", {});
      toast("Training started");
    } catch (err) {
      toast(describeError(err), "error");
    }
    refresh();
  });
  $("rollback-parent").addEventListener("click", () => rollback(null));
  refresh();
})();
