/* The chat page: streaming replies (fetch + ReadableStream reading Server-Sent Events),
 * Stop, Regenerate, New conversation, the list of past conversations, and a rating panel
 * under each reply. Keys 1-5 rate the latest reply. A conversation's system prompt can be
 * edited until its first message (it starts as config.yaml's system_prompt), then shows.
 * Regenerate asks for another reply to the last message (POST /api/turns/<id>/again),
 * shown in the same place; replies.js pages between them and picks the one in use. */
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
    views: [],            // Replies of each message, oldest first
  };
  const chat = {suggestedTags: data.suggested_tags, isLast: (view) => view === lastView(),
                isBusy: () => state.streaming};

  // --- rendering ---------------------------------------------------------------------

  function turnNode(userText) {
    const view = new Replies(userText, chat);
    transcript.append(view.node);
    state.views.push(view);
    $("empty-hint").hidden = true;
    return view;
  }

  function lastView() {
    return state.views[state.views.length - 1] || null;
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
      for (const t of turns) {  // the conversation's path: the reply in use of each message
        const view = turnNode(t.user_message);
        view.set([t], t.turn_id);
        if (t.alternatives > 1) {
          view.load(t.turn_id).catch((err) => toast(describeError(err), "error"));
        }
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
    state.views = [];
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
    state.views.forEach((view) => view.render());
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

  /** POST ``body`` to a streaming route and read its events: ``onStart`` gets the start
   * event's data, ``onDelta`` each piece of text. Resolves to {done} (the stored turn),
   * {error} (an error event), {thrown} (the request failed or was aborted), or {closed}
   * (the stream ended without a last event). */
  async function streamReply(path, body, onStart, onDelta) {
    const controller = new AbortController();
    state.abort = controller;
    let result = {closed: true};
    try {
      const response = await api("POST", path, body, {raw: true, signal: controller.signal});
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
            onStart(parsed.data);
          } else if (parsed.event === "message" && typeof parsed.data.delta === "string") {
            onDelta(parsed.data.delta);
          } else if (parsed.event === "done") {
            result = {done: parsed.data};
          } else if (parsed.event === "error") {
            result = {error: parsed.data.error};
          }
        }
      }
    } catch (err) {
      result = {thrown: err};
    } finally {
      state.streamId = null;
      state.abort = null;
    }
    return result;
  }

  function refreshPillFor(turn) {
    const pill = document.getElementById("status-pill");
    if (pill && pill.dataset.checkpoint !== (turn.checkpoint_id || "base")) {
      Reinf.refreshPill();  // the reply came from a checkpoint the pill does not show
    }
  }

  async function send(message) {
    if (state.streaming || !message.trim()) return;
    const before = lastView();
    if (before) before.showInUse();  // the screen shows what the new message continues from
    state.lastMessage = message;
    const view = turnNode(message);
    if (before) before.render();  // no longer the last: its reply cannot change now
    view.node.classList.add("streaming");
    scrollDown();
    setStreaming(true);
    const body = {message, conversation_id: state.conversationId, stream: true};
    const system = $("system-box").hidden ? null : $("system-prompt").value;
    if (system !== null) body.system_prompt = system;  // "" = none
    const result = await streamReply("/api/chat", body, (start) => {
      if (system !== null) showSystem(system, false);  // fixed from now on
      if (state.conversationId === null) {
        state.conversationId = start.conversation_id;
        setTitle(message.slice(0, 60));
        history.replaceState(null, "", `/?conversation=${state.conversationId}`);
      }
    }, (delta) => {
      view.replyText.textContent += delta;
      scrollDown();
    });
    if (result.done) {
      view.set([result.done], result.done.turn_id);
      refreshPillFor(result.done);
    } else if (result.thrown) {
      const err = result.thrown;
      view.node.classList.add("failed");
      text(view.meta, err.name === "AbortError" ? "stopped" : describeError(err));
      if (err instanceof Reinf.ApiError) view.replyText.remove();
    } else if (result.error !== undefined) {
      view.node.classList.add("failed");
      text(view.meta, `error: ${result.error}`);
    } else {
      text(view.meta, "the reply ended early (connection closed)");
    }
    view.node.classList.remove("streaming");
    setStreaming(false);
    loadConversations();
    scrollDown();
  }

  /** Another reply to the last message, in the same place; it becomes the one in use. */
  async function regenerate() {
    if (state.streaming) return;
    const view = lastView();
    const current = view && view.current;
    if (!current) {  // the last message has no stored reply (it failed): send it again
      if (state.lastMessage) send(state.lastMessage);
      return;
    }
    const was = view.shown;
    view.node.classList.add("streaming");
    setStreaming(true);
    view.startAnother();
    scrollDown();
    const result = await streamReply(`/api/turns/${current.turn_id}/again`, {stream: true},
      () => {}, (delta) => {
        view.replyText.textContent += delta;
        scrollDown();
      });
    view.node.classList.remove("streaming");
    setStreaming(false);
    if (result.done) {
      text(view.replyText, result.done.reply);
      refreshPillFor(result.done);
    } else {
      const err = result.thrown;
      toast(err ? (err.name === "AbortError" ? "stopped" : describeError(err)) :
            result.error !== undefined ? `error: ${result.error}` :
            "the reply ended early (connection closed)", "error");
      view.show(was);
    }
    try {  // the server's list: the new reply is in use, and other tabs may have added some
      await view.load(result.done ? result.done.turn_id : current.turn_id);
    } catch (err) {
      if (result.done) {
        for (const other of view.turns) other.picked = false;
        view.set([...view.turns, result.done], result.done.turn_id);
      }
    }
    loadConversations();
    scrollDown();
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
  $("regenerate").addEventListener("click", regenerate);
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
    const view = lastView();
    const latest = view && view.panel;  // the reply shown for the last message
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
