/* The rating panel under each reply: score 1-5, suggested and free tags, a comment, the
 * "critical" flag, and the saved state with change and undo; and the rewrite, the reply the
 * person wanted instead.
 *
 * Choosing a score saves the rating (PUT /api/turns/<id>/rating). Once saved, changing
 * anything saves again; Undo deletes it (DELETE). Rewrite opens an editor filled with the
 * reply (or the rewrite saved before); Save stores it (PUT /api/turns/<id>/rewrite, one per
 * reply: saving again replaces it), Remove rewrite deletes it (DELETE).
 *
 * A saved score of 1 or 2 with no rewrite brings up a line under Rewrite that asks for one:
 * on a real model a low score only says what the person does not want, and a model that
 * seldom writes what they do want learns it from their rewrites far more than from scores
 * (docs/training.md, "Rewrites"). */
"use strict";

class RatingPanel {
  constructor(turnId, rating, suggestedTags, reply, rewrite) {
    this.turnId = turnId;
    this.suggested = suggestedTags || [];
    this.reply = reply || "";     // the reply's text: where a new rewrite starts
    this.rewrite = rewrite || null;  // the stored rewrite, or null
    this.rewriting = false;       // the rewrite editor is open
    this.rewriteBusy = false;     // a rewrite PUT or DELETE is in flight
    this.saved = null;            // the stored rating, or null
    this.score = null;
    this.tags = [];
    this.comment = "";
    this.critical = false;
    this.busy = false;
    this.saving = false;          // a PUT is in flight
    this.again = false;           // something changed meanwhile: save once more
    this.deleted = false;         // the turn is gone (404): nothing can be saved
    this.node = this.build();
    if (rating) this.adopt(rating);
    this.render();
    this.renderRewrite();
  }

  build() {
    const {el} = Reinf;
    const id = `r${this.turnId}`;
    this.scoreButtons = [1, 2, 3, 4, 5].map((n) => el("button", {
      type: "button", class: "score", "aria-pressed": "false", dataset: {score: String(n)},
      title: ["", "bad", "poor", "okay", "good", "great"][n], "aria-label": `Rate ${n} of 5`,
      onclick: () => this.setScore(n)}, String(n)));
    this.tagBox = el("div", {class: "tags", role: "group", "aria-label": "Tags"});
    this.freeTag = el("input", {type: "text", id: `${id}-tag`, maxlength: "64",
                                placeholder: "add a tag", class: "free-tag-input"});
    this.freeTag.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); this.addFreeTag(); }
    });
    this.commentBox = el("textarea", {id: `${id}-comment`, rows: "2", maxlength: "4000",
                                      placeholder: "what was good or bad?"});
    this.commentBox.addEventListener("change", () => {
      this.comment = this.commentBox.value;
      if (this.saved) this.save();
    });
    this.criticalBox = el("input", {type: "checkbox", id: `${id}-critical`});
    this.criticalBox.addEventListener("change", () => {
      this.critical = this.criticalBox.checked;
      if (this.saved) this.save();
    });
    this.stateText = el("span", {class: "rating-state-text"});
    this.undoButton = el("button", {type: "button", class: "link undo", hidden: true,
                                    onclick: () => this.undo()}, "Undo");
    this.rewriteButton = el("button", {type: "button", class: "small rewrite-open",
                                       "aria-expanded": "false", "aria-controls": `${id}-rewrite`,
                                       "aria-label": "Rewrite this reply",
                                       onclick: () => this.openRewrite()}, "Rewrite");
    this.rewriteMark = el("span", {class: "rewrite-mark", hidden: true}, "✎ rewritten");
    this.rewriteStateText = el("span", {class: "rewrite-state-text"});
    this.rewriteHint = el("p", {class: "rewrite-hint muted", hidden: true},
      "A low score says what you don't want. Rewrite the reply to show what you do: " +
      "a rewrite teaches it more than any score.");
    this.removeRewriteButton = el("button", {type: "button", class: "link rewrite-remove",
                                             hidden: true, "aria-label": "Remove rewrite",
                                             onclick: () => this.removeRewrite()},
                                  "Remove rewrite");
    this.rewriteBox = el("textarea", {id: `${id}-rewrite-text`, rows: "6", maxlength: "20000",
                                      "aria-label": "The reply you wanted (your rewrite)",
                                      "aria-describedby": `${id}-rewrite-keys`});
    this.rewriteBox.addEventListener("keydown", (event) => {
      if (event.key === "Escape") { event.preventDefault(); this.closeRewrite(); }
      else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        this.saveRewrite();
      }
    });
    this.saveRewriteButton = el("button", {type: "button", class: "primary small",
                                           "aria-label": "Save rewrite",
                                           onclick: () => this.saveRewrite()}, "Save");
    this.cancelRewriteButton = el("button", {type: "button", class: "small",
                                             "aria-label": "Cancel rewrite",
                                             onclick: () => this.closeRewrite()}, "Cancel");
    this.rewriteEditor = el("div", {class: "rewrite-editor", id: `${id}-rewrite`, hidden: true},
      el("label", {for: `${id}-rewrite-text`, class: "block-label"}, "The reply you wanted ",
         el("span", {class: "muted", id: `${id}-rewrite-keys`}, "(Ctrl+Enter saves, Esc cancels)")),
      this.rewriteBox,
      el("div", {class: "rewrite-buttons"}, this.saveRewriteButton, this.cancelRewriteButton));
    return el("section", {class: "rating", "aria-label": "Rate this reply",
                          dataset: {turnId: String(this.turnId)}},
      el("div", {class: "rating-row"},
        el("span", {class: "rating-label", id: `${id}-label`}, "Rate"),
        el("div", {class: "scores", role: "group", "aria-labelledby": `${id}-label`},
           this.scoreButtons),
        el("p", {class: "rating-state", role: "status", "aria-live": "polite"},
           this.stateText, " ", this.undoButton)),
      this.tagBox,
      el("details", {class: "rating-more"},
        el("summary", {}, "Tag, comment, critical"),
        el("div", {class: "free-tag"},
          el("label", {for: `${id}-tag`}, "Tag"), this.freeTag,
          el("button", {type: "button", onclick: () => this.addFreeTag()}, "Add")),
        el("label", {for: `${id}-comment`, class: "block-label"}, "Comment"), this.commentBox,
        el("label", {class: "check"}, this.criticalBox,
           " Critical — weigh this rating more")),
      el("div", {class: "rewrite", role: "group", "aria-label": "Rewrite"},
        el("div", {class: "rating-row"},
          this.rewriteButton, this.rewriteMark,
          el("p", {class: "rating-state rewrite-state", role: "status", "aria-live": "polite"},
             this.rewriteStateText, " ", this.removeRewriteButton)),
        this.rewriteHint,
        this.rewriteEditor));
  }

  adopt(rating) {
    this.saved = rating;
    this.score = rating.score;
    this.tags = [...rating.tags];
    this.comment = rating.comment || "";
    this.critical = !!rating.critical;
    if (document.activeElement !== this.commentBox) this.commentBox.value = this.comment;
    this.criticalBox.checked = this.critical;
  }

  render(message) {
    const {el, text} = Reinf;
    for (const button of this.scoreButtons) {
      button.setAttribute("aria-pressed", String(Number(button.dataset.score) === this.score));
      button.disabled = this.busy;
    }
    this.tagBox.replaceChildren();
    const all = [...this.suggested, ...this.tags.filter((t) => !this.suggested.includes(t))];
    for (const tag of all) {
      const on = this.tags.includes(tag);
      this.tagBox.append(el("button", {type: "button", class: "tag", "aria-pressed": String(on),
                                       onclick: () => this.toggleTag(tag)}, tag));
    }
    let state;
    if (message) state = message;
    else if (this.saved) {
      const r = this.saved;
      state = `Saved: ${r.score}/5` + (r.tags.length ? ` · ${r.tags.join(", ")}` : "") +
        (r.critical ? " · critical" : "") + (r.comment ? " · commented" : "");
    } else state = this.tags.length || this.comment ? "Pick a score to save" : "Not rated";
    text(this.stateText, state);
    this.node.classList.toggle("is-saved", !!this.saved);
    this.undoButton.hidden = !this.saved;
    this.renderHint();
  }

  /** The line asking for a rewrite: under a saved score of 1 or 2 that has none. */
  renderHint() {
    this.rewriteHint.hidden = !(this.saved && this.saved.score <= 2 && !this.rewrite &&
                                !this.rewriting && !this.deleted);
  }

  setScore(n) {
    this.score = n;
    this.save();
  }

  toggleTag(tag) {
    this.tags = this.tags.includes(tag) ? this.tags.filter((t) => t !== tag) : [...this.tags, tag];
    if (this.saved) this.save(); else this.render();
  }

  addFreeTag() {
    const tag = this.freeTag.value.trim();
    if (!tag) return;
    if (!this.tags.includes(tag)) this.tags.push(tag);
    this.freeTag.value = "";
    if (this.saved) this.save(); else this.render();
  }

  /** Store the panel's state. Saves never overlap: a change made while one is in flight
   * is sent right after it, so the last change always wins on the server too. */
  async save() {
    if (this.deleted) return;
    if (this.score === null) { this.render(); return; }
    if (this.saving) { this.again = true; return; }
    this.saving = true;
    try {
      do {
        this.again = false;
        await this.put();
      } while (this.again);
    } finally {
      this.saving = false;
    }
  }

  async put() {
    this.comment = this.commentBox.value;
    this.busy = true;
    this.render("Saving…");
    try {
      const rating = await Reinf.api("PUT", `/api/turns/${this.turnId}/rating`, {
        score: this.score, tags: this.tags, comment: this.comment, critical: this.critical});
      this.busy = false;
      if (this.again) this.saved = rating;  // newer edits go out next; keep them on screen
      else this.adopt(rating);
      this.render();
    } catch (err) {
      this.busy = false;
      if (this.saved) this.adopt(this.saved);
      else this.score = null;  // nothing was stored: no score may look chosen
      if (err.status === 404) { this.gone(); return; }
      this.render(`Not saved: ${Reinf.describeError(err)}`);
    }
  }

  /** The turn was deleted (forgotten, here or elsewhere): nothing here can be saved any
   * more. The server's fix names a command (`reinf history`), which is no help in a page. */
  gone() {
    this.deleted = true;
    this.saved = null;
    this.score = null;
    this.busy = true;  // keeps the score buttons disabled
    this.render("Not saved: this reply was deleted (forgotten)");
    this.undoButton.hidden = true;
    this.rewrite = null;
    this.rewriting = false;
    this.renderRewrite();  // its controls stay disabled: this.deleted
  }

  async undo() {
    this.busy = true;
    this.render("Removing…");
    try {
      await Reinf.api("DELETE", `/api/turns/${this.turnId}/rating`);
      this.busy = false;
      this.saved = null;
      this.score = null;
      this.render("Rating removed");
    } catch (err) {
      this.busy = false;
      if (err.status === 404) { this.gone(); return; }
      this.render(`Not removed: ${Reinf.describeError(err)}`);
    }
  }

  // --- the rewrite ------------------------------------------------------------------

  renderRewrite(message) {
    const {text} = Reinf;
    const has = !!this.rewrite;
    this.rewriteMark.hidden = !has;
    this.rewriteEditor.hidden = !this.rewriting;
    this.rewriteButton.setAttribute("aria-expanded", String(this.rewriting));
    this.rewriteButton.disabled = this.deleted || this.rewriteBusy;
    this.rewriteBox.disabled = this.rewriteBusy;
    this.saveRewriteButton.disabled = this.deleted || this.rewriteBusy;
    this.cancelRewriteButton.disabled = this.rewriteBusy;
    this.removeRewriteButton.hidden = !has;
    this.removeRewriteButton.disabled = this.deleted || this.rewriteBusy;
    text(this.rewriteStateText, message || "");
    this.node.classList.toggle("is-rewritten", has);
    this.renderHint();
  }

  /** Open the editor with the stored rewrite, else the reply, to edit. */
  openRewrite() {
    if (this.deleted) return;
    if (this.rewriting) { this.rewriteBox.focus(); return; }
    this.rewriteBox.value = this.rewrite ? this.rewrite.text : this.reply;
    this.rewriting = true;
    this.renderRewrite();
    this.rewriteBox.focus();
  }

  /** Close the editor; what was typed and not saved is dropped. */
  closeRewrite() {
    if (this.rewriteBusy) return;
    this.rewriting = false;
    this.renderRewrite();
    this.rewriteButton.focus();
  }

  async saveRewrite() {
    if (this.deleted || this.rewriteBusy) return;
    this.rewriteBusy = true;
    this.renderRewrite("Saving…");
    try {
      const rewrite = await Reinf.api("PUT", `/api/turns/${this.turnId}/rewrite`,
                                      {text: this.rewriteBox.value});
      this.rewriteBusy = false;
      this.rewrite = rewrite;
      this.rewriting = false;
      this.renderRewrite("Rewrite saved");
      this.rewriteButton.focus();
    } catch (err) {
      this.rewriteBusy = false;
      if (err.status === 404) { this.gone(); return; }
      this.renderRewrite(`Rewrite not saved: ${Reinf.describeError(err)}`);
      this.rewriteBox.focus();  // the editor stays open with the text, to fix it
    }
  }

  async removeRewrite() {
    if (this.deleted || this.rewriteBusy || !this.rewrite) return;
    this.rewriteBusy = true;
    this.renderRewrite("Removing…");
    try {
      await Reinf.api("DELETE", `/api/turns/${this.turnId}/rewrite`);
      this.rewriteBusy = false;
      this.rewrite = null;
      this.renderRewrite("Rewrite removed");
      this.rewriteButton.focus();
    } catch (err) {
      this.rewriteBusy = false;
      if (err.status === 404) { this.gone(); return; }
      this.renderRewrite(`Rewrite not removed: ${Reinf.describeError(err)}`);
    }
  }
}
