/* The training page: runs and their metrics, the reward curve, mean rating per
 * checkpoint, what it learned (each round's win rate against the base, by the rating model
 * and by the person's picks, and the leaderboard of checkpoints), the active checkpoint with
 * rollback, "Train now", the reward hook's state, ratings waiting and the next run. */
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

  /** A checkpoint id's short name: r0007 of r0007-20261125-030648-8ce1; others whole. */
  function shortName(id) {
    const head = String(id).split("-")[0];
    return /^r\d+$/.test(head) ? head : String(id);
  }

  const percent = (rate) => `${Math.round(rate * 100)}%`;
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  const record = (r) => `${r.wins} won · ${r.ties} tied · ${r.losses} lost`;

  const MODEL = {name: "rating model", className: "model", shape: "circle", line: true};
  const PICKS = {name: "your picks", className: "picks", shape: "diamond", line: false};

  /** What it learned, round by round: the win rate of each round's checkpoint against the
   * base, by the rating model (the run's metrics.vs_base.by_rating_model) and by the
   * person's picks between that checkpoint and the base (GET /api/stats picks_vs_base). */
  function renderWinRate(runs, stats) {
    const picks = new Map((stats.picks_vs_base || []).map((p) => [p.checkpoint_id, p]));
    const rounds = runs.slice().reverse().filter((r) => r.checkpoint_id).map((r) => ({
      run: r, rejected: r.status === "rejected",
      model: (((r.metrics || {}).vs_base || {}).by_rating_model) || null,
      picks: picks.get(r.checkpoint_id) || null,
    })).map((x) => ({...x,
      model: x.model && Number.isFinite(x.model.win_rate) ?
        {...x.model, prompts: x.model.prompts ?? x.model.pairs} : null,
      picks: x.picks && x.picks.pairs ? x.picks : null,
    })).filter((x) => x.model || x.picks);
    const slots = rounds.map((x) => ({label: shortName(x.run.checkpoint_id)}));
    const modelPoints = [], pickPoints = [];
    rounds.forEach((x, i) => {
      const name = slots[i].label, state = x.rejected ? " (rejected round)" : "";
      if (x.model) {
        modelPoints.push({slot: i, rate: x.model.win_rate, hollow: x.rejected,
          title: `${name}${state}: rating model ${percent(x.model.win_rate)} against the ` +
                 `base — ${record(x.model)} on ${plural(x.model.prompts, "prompt")}`});
      }
      if (x.picks) {
        pickPoints.push({slot: i, rate: x.picks.win_rate, hollow: x.rejected,
          title: `${name}${state}: your picks ${percent(x.picks.win_rate)} against the base — ` +
                 `${record(x.picks)} of ${plural(x.picks.pairs, "pick")}`});
      }
    });
    const newest = rounds.slice().reverse().find((x) => x.model);
    const prompts = newest ? newest.model.prompts : null;
    Charts.rates($("winrate-chart"), slots,
      [{...MODEL, points: modelPoints}, {...PICKS, points: pickPoints}],
      "win rate of each round's checkpoint against the base model, by the rating model " +
      "and by your picks", {emptyMessage: runs.some((r) => r.checkpoint_id) ?
        "No win rate yet: rounds with a rating model measure it, and your picks between a " +
        "checkpoint and the base on the Compare page count too." :
        "No training rounds yet: after each round, its checkpoint and the base model answer " +
        "your newest prompts, and the win rate shows here."});
    const totalPicks = rounds.reduce((n, x) => n + (x.picks ? x.picks.pairs : 0), 0);
    const item = (series, hollow, ...parts) => el("li", {"data-series": series},
      Charts.swatch(hollow ? MODEL : series === "model" ? MODEL : PICKS, hollow),
      el("span", {}, ...parts));
    const legend = !rounds.length ? [] : [
      item("model", false, el("strong", {}, "Rating model"), ": its guess after each round, " +
        `on your ${prompts ? `${prompts} ` : ""}newest prompts (the checkpoint and the base ` +
        "each answer them; the reply it scores higher wins)"),
      item("picks", false, el("strong", {}, "Your picks"), ": " + (pickPoints.length ?
        "the replies you picked between that checkpoint and the base " +
        `(${plural(totalPicks, "pick")})` :
        "none yet (pick between a checkpoint and the base on the Compare page)")),
    ];
    if (rounds.some((x) => x.rejected)) {
      legend.push(item("rejected", true, "hollow: a rejected round (its checkpoint was not used)"));
    }
    $("winrate-legend").replaceChildren(...legend);
    $("winrate-legend").hidden = !legend.length;
    const rows = rounds.slice().reverse().map((x) => el("tr", {
      "data-checkpoint": x.run.checkpoint_id, class: x.rejected ? "rejected" : ""},
      el("td", {"data-label": "Round"}, `#${x.run.run_id}`),
      el("td", {"data-label": "Checkpoint"}, x.run.checkpoint_id,
         x.rejected ? " (rejected)" : ""),
      el("td", {"data-label": "Rating model", "data-series": "model"}, x.model ?
        `${percent(x.model.win_rate)} · ${record(x.model)} on ` +
        `${plural(x.model.prompts, "prompt")}` : "–"),
      el("td", {"data-label": "Your picks", "data-series": "picks"}, x.picks ?
        `${percent(x.picks.win_rate)} · ${record(x.picks)}` : "–")));
    if (!rows.length) {
      rows.push(el("tr", {}, el("td", {colspan: "4", class: "muted"}, "Nothing measured yet.")));
    }
    $("winrate-rows").replaceChildren(...rows);
  }

  /** GET /api/leaderboard: a Bradley-Terry score per checkpoint (base = 0) from the
   * person's picks between checkpoints, highest first, the active one marked. */
  function renderLeaderboard(board, activeId) {
    if (board.error) {
      text($("leaderboard-note"), `The leaderboard did not load: ${describeError(board.error)}`);
      $("leaderboard-rows").replaceChildren();
      return;
    }
    const rows = board.leaderboard.slice().sort((a, b) => b.score - a.score);
    const listed = rows.some((r) => r.checkpoint_id === activeId);
    text($("leaderboard-note"), rows.length ?
      `Bradley–Terry score from your ${plural(board.pairs, "pick")} between checkpoints: ` +
      "log-odds against the base model (0); 1.0 means preferred to the base about 73% of " +
      "the time. A checkpoint with few picks stays near 0." +
      (listed ? "" : ` The active checkpoint (${shortName(activeId)}) has no picks yet.`) : "");
    $("leaderboard-rows").replaceChildren(...rows.map((r, i) => {
      const active = r.checkpoint_id === activeId;
      return el("tr", {class: active ? "active" : "", "data-checkpoint": r.checkpoint_id},
        el("td", {"data-label": "#", class: "num"}, i + 1),
        el("td", {"data-label": "Checkpoint", title: r.checkpoint_id},
          shortName(r.checkpoint_id), active ? " (active)" : "",
          r.status === "rejected" ? el("span", {class: "muted"}, " rejected") : null),
        el("td", {"data-label": "Score", class: "num"},
          `${r.score > 0.005 ? "+" : ""}${formatNumber(r.score, 2)}`),
        el("td", {"data-label": "vs base", class: "num"},
          percent(1 / (1 + Math.exp(-r.score)))),
        el("td", {"data-label": "Picks", class: "num"}, r.pairs),
        el("td", {"data-label": "Won · tied · lost"}, `${r.wins} · ${r.ties} · ${r.losses}`));
    }));
    if (!rows.length) {
      $("leaderboard-rows").append(el("tr", {}, el("td", {colspan: "6", class: "muted"},
        "No picks between checkpoints yet: pick between replies on the Compare page or with " +
        "regenerate to rank checkpoints.")));
    }
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
      const [status, runs, checkpoints, stats, board] = await Promise.all([
        api("GET", "/api/status"), api("GET", "/api/runs?limit=100"),
        api("GET", "/api/checkpoints"), api("GET", "/api/stats"),
        // the rest of the page shows without it
        api("GET", "/api/leaderboard").catch((error) => ({error}))]);
      renderStatus(status);
      Reinf.showStatus(status);  // the header pill shows the same checkpoint as the card
      renderRuns(runs.runs);
      renderCheckpoints(checkpoints);
      renderCharts(stats);
      renderWinRate(runs.runs, stats);
      renderLeaderboard(board, checkpoints.active_checkpoint);
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
