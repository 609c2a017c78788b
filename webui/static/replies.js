/* One message of the chat page and the replies to it.
 *
 * Regenerate adds another reply to the last message (an alternative, a turn in the same
 * slot); they are paged with ‹ 1/2 ›, each with its own rating panel. One of them is in use:
 * the next message continues from it. The newest is in use until the person chooses another
 * with "Use this reply" (POST /api/turns/<id>/pick, which also stores the preference as a
 * pair). Only the last message's replies can change; earlier ones can be paged, not picked
 * (the API answers 409). */
"use strict";

class Replies {
  /** ``chat``: {suggestedTags, isLast(replies), isBusy()}, asked by the page. */
  constructor(userText, chat) {
    const {el} = Reinf;
    this.chat = chat;
    this.turns = [];              // the replies to the message, oldest first
    this.shown = -1;              // the one on screen
    this.panels = new Map();      // turn id -> its RatingPanel, made when first shown
    this.panel = null;            // the panel on screen
    this.picking = false;         // a pick is in flight
    this.saved = null;            // the turn whose pick this page stored
    this.replyText = el("div", {class: "text"});
    this.meta = el("div", {class: "meta"});
    this.prev = el("button", {type: "button", class: "small alt-nav alt-prev",
                              "aria-label": "Previous reply", onclick: () => this.page(-1)}, "‹");
    this.count = el("span", {class: "alt-count"});
    this.next = el("button", {type: "button", class: "small alt-nav alt-next",
                              "aria-label": "Next reply", onclick: () => this.page(1)}, "›");
    this.pickButton = el("button", {type: "button", class: "small alt-pick",
                                    onclick: () => this.pick()}, "Use this reply");
    this.state = el("span", {class: "alt-state", role: "status", "aria-live": "polite"});
    this.pager = el("div", {class: "alternatives", role: "group", hidden: true,
                            "aria-label": "Replies to this message"},
                    this.prev, this.count, this.next, this.pickButton, this.state);
    this.node = el("li", {class: "turn"},
      el("div", {class: "msg user"}, el("span", {class: "who"}, "You"),
         el("div", {class: "text"}, userText)),
      el("div", {class: "msg bot"}, el("span", {class: "who"}, "Reinf"), this.replyText,
         this.meta, this.pager));
  }

  get current() {
    return this.turns[this.shown] || null;
  }

  static describe(t) {
    const parts = [`turn ${t.turn_id}`, `checkpoint ${t.checkpoint_id || "base"}`];
    if (t.ttft_ms !== null && t.ttft_ms !== undefined) {
      parts.push(`first token ${Math.round(t.ttft_ms)} ms`);
    }
    if (t.interrupted) parts.push("stopped");
    if (t.style) parts.push(`asked for in a style: ${t.style}`);  // explore_styles
    return parts.join(" · ");
  }

  /** The replies are ``turns``; show ``turnId``, else the one in use, else the newest. */
  set(turns, turnId) {
    this.turns = turns;
    let i = turns.findIndex((t) => t.turn_id === turnId);
    if (i < 0) i = turns.findIndex((t) => t.picked);
    this.show(i < 0 ? turns.length - 1 : i);
  }

  /** Show reply ``i``: its text, its details and its rating panel. */
  show(i) {
    const t = this.turns[i];
    this.shown = i;
    Reinf.text(this.replyText, t.reply);
    Reinf.text(this.meta, Replies.describe(t));
    this.node.dataset.turnId = String(t.turn_id);
    let panel = this.panels.get(t.turn_id);
    if (!panel) {
      panel = new RatingPanel(t.turn_id, t.rating, this.chat.suggestedTags, t.reply, t.rewrite);
      this.panels.set(t.turn_id, panel);
    }
    if (this.panel !== panel) {
      if (this.panel) this.panel.node.remove();
      this.node.append(panel.node);
      this.panel = panel;
    }
    this.render();
  }

  render() {
    const n = this.turns.length;
    this.pager.hidden = n < 2 || this.shown < 0;
    if (this.pager.hidden) return;
    const t = this.current;
    const last = this.chat.isLast(this);
    const busy = this.chat.isBusy();
    Reinf.text(this.count, `${this.shown + 1}/${n}`);
    this.count.setAttribute("aria-label", `reply ${this.shown + 1} of ${n}`);
    this.prev.disabled = this.shown === 0 || busy;
    this.next.disabled = this.shown === n - 1 || busy;
    this.pickButton.hidden = t.picked;
    this.pickButton.disabled = !last || busy || this.picking;
    this.pickButton.title = last ?
      "Continue the conversation from this reply (stores that you prefer it)" :
      "Only the last message's reply can change: the conversation went on from the one in use";
    let note = t.picked ? "in use" : "not in use";
    if (t.picked && last) note = "in use: your next message continues from this reply";
    if (t.picked && this.saved === t.turn_id) note += " · preference saved";
    Reinf.text(this.state, note);
    this.state.classList.toggle("in-use", !!t.picked);
  }

  page(step) {
    const i = this.shown + step;
    if (i >= 0 && i < this.turns.length && !this.chat.isBusy()) this.show(i);
  }

  /** Fetch every reply to the message and show ``turnId`` (else the one in use). */
  async load(turnId) {
    const {turns} = await Reinf.api("GET", `/api/turns/${turnId}/alternatives`);
    this.set(turns, turnId);
  }

  /** Show the reply in use, the one the next message continues from. */
  showInUse() {
    const i = this.turns.findIndex((t) => t.picked);
    if (this.turns.length > 1 && i >= 0 && i !== this.shown) this.show(i);
  }

  /** While another reply streams in: an empty reply, counted as the newest. */
  startAnother() {
    const n = this.turns.length + 1;
    this.node.classList.remove("failed");
    Reinf.text(this.replyText, "");
    Reinf.text(this.meta, "another reply…");
    if (this.panel) {
      this.panel.node.remove();
      this.panel = null;
    }
    this.pager.hidden = false;
    Reinf.text(this.count, `${n}/${n}`);
    this.prev.disabled = this.next.disabled = true;
    this.pickButton.hidden = true;
    Reinf.text(this.state, "");
  }

  /** Use the reply on screen: the conversation continues from it. */
  async pick() {
    const t = this.current;
    if (!t || t.picked || this.chat.isBusy() || !this.chat.isLast(this)) return;
    this.picking = true;
    this.render();
    try {
      const {turn} = await Reinf.api("POST", `/api/turns/${t.turn_id}/pick`, {});
      for (const other of this.turns) other.picked = other.turn_id === turn.turn_id;
      this.saved = turn.turn_id;
    } catch (err) {
      Reinf.toast(Reinf.describeError(err), "error");
      this.load(t.turn_id).catch(() => {});
    } finally {
      this.picking = false;
      this.render();
    }
  }
}
