/* The chat page: streaming replies (fetch + ReadableStream reading Server-Sent Events),
 * Stop, Regenerate, New conversation, the list of past conversations, and a rating panel
 * under each reply. Keys 1-5 rate the latest reply. A conversation's system prompt can be
 * edited until its first message (it starts as config.yaml's system_prompt), then shows. */
"use strict";

(() => {
  const {el, text, api, describeError, toast} = Reinf;
  const data = Reinf.pageData();
  const $ = (id) => document.getElementById(id);
  const transcript = $("transcript");
  const input = $("message");
  const state = {
    conversationId: null,
    streaming: false,
    streamId: null,
    abort: null,
    lastMessage: null,
    panels: [],           // RatingPanel of each reply, oldest first
  };

  // --- rendering ---------------------------------------------------------------------

  function turnNode(userText) {
    const replyText = el("div", {class: "text"});
    const meta = el("div", {class: "meta"});
    const node = el("li", {class: "turn"},
      el("div", {class: "msg user"}, el("span", {class: "who"}, "You"),
         el("div", {class: "text"}, userText)),
      el("div", {class: "msg bot"}, el("span", {class: "who"}, "Reinf"), replyText, meta));
    transcript.append(node);
    $("empty-hint").hidden = true;
    return {node, replyText, meta};
  }

  function describeTurn(t) {
    const parts = [`turn ${t.turn_id}`, `checkpoint ${t.checkpoint_id || "base"}`];
    if (t.ttft_ms !== null && t.ttft_ms !== undefined) parts.push(`first token ${Math.round(t.ttft_ms)} ms`);
    if (t.interrupted) parts.push("stopped");
    return parts.join(" · ");
  }

  function attachPanel(view, turn) {
    text(view.meta, describeTurn(turn));
    view.node.dataset.turnId = String(turn.turn_id);
    const panel = new RatingPanel(turn.turn_id, turn.rating, data.suggested_tags);
    view.node.append(panel.node);
    state.panels.push(panel);
  }

  function scrollDown() {
    transcript.lastElementChild && transcript.lastElementChild.scrollIntoView({block: "end"});
  }

  function setTitle(title) {
    text($("conversation-title"), title || "New conversation");
  }

  /** The system prompt: editable (``editable``) until the conversation has a turn, else
   * shown read-only when there is one. */
  function showSystem(value, editable) {
    $("system-box").hidden = !editable;
    if (editable) $("system-prompt").value = value || "";
    const shown = (value || "").trim();
    $("system-shown").hidden = editable || !shown;
    text($("system-text"), shown);
  }

  // --- conversations -----------------------------------------------------------------

  async function loadConversations() {
    try {
      const {conversations} = await api("GET", "/api/conversations?limit=100");
      const list = $("conversation-list");
      list.replaceChildren(...conversations.map((c) => el("li", {},
        el("button", {type: "button", class: "conversation" +
                        (c.conversation_id === state.conversationId ? " current" : ""),
                      "aria-current": c.conversation_id === state.conversationId ? "true" : null,
                      dataset: {conversationId: String(c.conversation_id)},
                      onclick: () => openConversation(c.conversation_id)},
          el("span", {class: "conversation-name"}, c.title || `Conversation ${c.conversation_id}`),
          el("span", {class: "conversation-meta"},
             `${c.turns} turn${c.turns === 1 ? "" : "s"} · ${Reinf.formatTime(c.updated_at)}`)))));
      $("no-conversations").hidden = conversations.length > 0;
    } catch (err) {
      toast(describeError(err), "error");
    }
  }

  async function openConversation(id) {
    if (state.streaming) return;
    try {
      const {conversation, turns} = await api("GET", `/api/conversations/${id}`);
      newConversation(false);
      state.conversationId = conversation.conversation_id;
      setTitle(conversation.title);
      showSystem(conversation.system_prompt, turns.length === 0);
      for (const t of turns) {
        const view = turnNode(t.user_message);
        text(view.replyText, t.reply);
        attachPanel(view, t);
        state.lastMessage = t.user_message;
      }
      $("regenerate").disabled = !state.lastMessage;
      history.replaceState(null, "", `/?conversation=${conversation.conversation_id}`);
      closeSidebar();
      loadConversations();
      scrollDown();
    } catch (err) {
      toast(describeError(err), "error");
    }
  }

  function newConversation(updateUrl) {
    state.conversationId = null;
    state.panels = [];
    state.lastMessage = null;
    transcript.replaceChildren();
    $("empty-hint").hidden = false;
    $("regenerate").disabled = true;
    setTitle(null);
    showSystem(data.system_prompt, true);
    if (updateUrl !== false) {
      history.replaceState(null, "", "/");
      loadConversations();
      closeSidebar();
      input.focus();
    }
  }

  // --- sending and streaming ---------------------------------------------------------

  function setStreaming(on) {
    state.streaming = on;
    $("send").disabled = on;
    $("stop").hidden = !on;
    $("regenerate").disabled = on || !state.lastMessage;
    $("new-conversation").disabled = on;
    transcript.setAttribute("aria-busy", String(on));
  }

  /** Parse one SSE block ("event: x\ndata: {...}") into {event, data}. */
  function parseEvent(block) {
    let event = "message";
    const lines = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("event:")) event = line.slice(6).trim();
      else if (line.startsWith("data:")) lines.push(line.slice(5).replace(/^ /, ""));
    }
    if (!lines.length) return null;
    try { return {event, data: JSON.parse(lines.join("\n"))}; } catch (e) { return null; }
  }

  async function send(message) {
    if (state.streaming || !message.trim()) return;
    state.lastMessage = message;
    const view = turnNode(message);
    view.node.classList.add("streaming");
    scrollDown();
    setStreaming(true);
    const controller = new AbortController();
    state.abort = controller;
    let finished = false;
    const body = {message, conversation_id: state.conversationId, stream: true};
    const system = $("system-box").hidden ? null : $("system-prompt").value;
    if (system !== null) body.system_prompt = system;  // "" = none
    try {
      const response = await api("POST", "/api/chat", body,
        {raw: true, signal: controller.signal});
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const parsed = parseEvent(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (!parsed) continue;
          if (parsed.event === "start") {
            state.streamId = parsed.data.stream_id;
            if (system !== null) showSystem(system, false);  // fixed from now on
            if (state.conversationId === null) {
              state.conversationId = parsed.data.conversation_id;
              setTitle(message.slice(0, 60));
              history.replaceState(null, "", `/?conversation=${state.conversationId}`);
            }
          } else if (parsed.event === "message" && typeof parsed.data.delta === "string") {
            view.replyText.textContent += parsed.data.delta;
            scrollDown();
          } else if (parsed.event === "done") {
            finished = true;
            text(view.replyText, parsed.data.reply);
            attachPanel(view, parsed.data);
            const pill = document.getElementById("status-pill");
            if (pill && pill.dataset.checkpoint !== (parsed.data.checkpoint_id || "base")) {
              Reinf.refreshPill();  // the reply came from a checkpoint the pill does not show
            }
          } else if (parsed.event === "error") {
            finished = true;
            view.node.classList.add("failed");
            text(view.meta, `error: ${parsed.data.error}`);
          }
        }
      }
      if (!finished) text(view.meta, "the reply ended early (connection closed)");
    } catch (err) {
      view.node.classList.add("failed");
      text(view.meta, err.name === "AbortError" ? "stopped" : describeError(err));
      if (err instanceof Reinf.ApiError) view.replyText.remove();
    } finally {
      view.node.classList.remove("streaming");
      state.streamId = null;
      state.abort = null;
      setStreaming(false);
      loadConversations();
      scrollDown();
    }
  }

  async function stop() {
    if (!state.streaming) return;
    if (state.streamId) {
      try {
        await api("POST", `/api/chat/${state.streamId}/stop`);
        return;  // the stream ends by itself, with a "done" event for the partial reply
      } catch (err) { /* fall back to dropping the connection */ }
    }
    if (state.abort) state.abort.abort();
  }

  // --- sidebar (narrow screens) ------------------------------------------------------

  function closeSidebar() {
    $("sidebar").classList.remove("open");
    $("toggle-sidebar").setAttribute("aria-expanded", "false");
  }

  // --- wiring ------------------------------------------------------------------------

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const message = input.value;
    if (!message.trim() || state.streaming) return;
    input.value = "";
    send(message);
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", stop);
  $("regenerate").addEventListener("click", () => state.lastMessage && send(state.lastMessage));
  $("new-conversation").addEventListener("click", () => newConversation());
  $("toggle-sidebar").addEventListener("click", () => {
    const open = $("sidebar").classList.toggle("open");
    $("toggle-sidebar").setAttribute("aria-expanded", String(open));
  });
  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    // A digit typed into a text field is text, even in the empty message box: a message
    // may start with one ("3 plus 4?"). The 1-5 keys rate only from outside text fields.
    if (Reinf.isTyping(event.target)) return;
    const latest = state.panels[state.panels.length - 1];
    if (/^[1-5]$/.test(event.key) && latest) {
      event.preventDefault();
      latest.setScore(Number(event.key));
    } else if (event.key === "Escape" && state.streaming) {
      stop();
    }
  });

  showSystem(data.system_prompt, true);
  const wanted = new URLSearchParams(location.search).get("conversation");
  if (wanted && /^\d+$/.test(wanted)) openConversation(Number(wanted));
  else loadConversations();
  input.focus();
})();
