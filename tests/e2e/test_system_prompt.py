"""The system prompt end to end on a real (tiny random Qwen2, ChatML) model: the config's is
copied into each new conversation, a conversation keeps its own, the web API and the
OpenAI API put theirs into the prompt, and the stored prompt ids, which hold it, are
exactly what a training round replays to sample fresh replies."""
from __future__ import annotations

import pytest

import trainkit as tk
from webui_fakes import build_daemon  # noqa: F401 - fixture

pytestmark = pytest.mark.e2e
single_thread = pytest.fixture(autouse=True)(tk.one_thread)

SYSTEM = "You are a pirate. Answer in one short sentence."
MESSAGES = ["Hello, how are you today?", "Tell me about the weather.",
            "What is a language model?", "Why is the sky blue?"]


def system_turn(text: str) -> str:
    return f"<|im_start|>system\n{text}<|im_end|>\n"


def prompt_text(engine, turn) -> str:
    return engine.tokenizer.decode(turn.prompt_ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tk.make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture
def setup(home, model_dir):
    """(config with a system_prompt, store, engine, ChatService)."""
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store

    config = tk.train_config(home, model_dir, system_prompt=SYSTEM, max_new_tokens=6)
    store = Store.open(config)
    engine = Engine.load(config)
    yield config, store, engine, ChatService(engine, store, config)
    store.close()


def test_the_configs_system_prompt_is_copied_into_each_new_conversation(setup):
    from reinf.serving.chat import ChatService
    from reinf.errors import Conflict

    config, store, engine, chat = setup
    first = chat.send(MESSAGES[0])
    assert first.system_prompt == SYSTEM
    assert store.get_conversation(first.conversation_id).system_prompt == SYSTEM
    assert prompt_text(engine, first).startswith(system_turn(SYSTEM))
    assert first.prompt_ids == engine.build_prompt([], MESSAGES[0], system=SYSTEM)

    # the config changes: the conversation keeps what its turns were generated with
    later = ChatService(engine, store, config.replace(system_prompt="Be formal."))
    second = later.send(MESSAGES[1], conversation_id=first.conversation_id)
    text = prompt_text(engine, second)
    assert text.startswith(system_turn(SYSTEM)) and "Be formal." not in text
    assert MESSAGES[0] in text and first.reply in text
    assert prompt_text(engine, later.send("hi")).startswith(system_turn("Be formal."))

    # one given with the first message beats the config's; "" means none at all
    own = later.send("hi", system_prompt="Be kind.")
    assert own.system_prompt == "Be kind."
    assert prompt_text(engine, own).startswith(system_turn("Be kind."))
    bare = later.send("hi", system_prompt="")
    assert bare.system_prompt is None
    assert bare.prompt_ids == engine.build_prompt([], "hi")

    # once a conversation has turns its system prompt stays; before, it may change
    with pytest.raises(Conflict, match="system prompt is fixed"):
        later.send("x", conversation_id=first.conversation_id, system_prompt="Be rude.")
    assert store.get_conversation(first.conversation_id).turns == 2
    empty = store.create_conversation(system_prompt="Be brief.").id
    assert later.update_conversation(empty, system_prompt="Be loud.").system_prompt == \
        "Be loud."
    turn = later.send("hi", conversation_id=empty, system_prompt="Be quiet.")
    assert prompt_text(engine, turn).startswith(system_turn("Be quiet."))
    assert store.get_conversation(empty).system_prompt == "Be quiet."
    with pytest.raises(Conflict):
        later.update_conversation(empty, system_prompt="Be loud.")


def test_training_replays_the_stored_prompt_ids_that_hold_the_system_prompt(home, model_dir,
                                                                            monkeypatch):
    """The round's fresh replies are sampled for the stored prompt ids (the system text
    included), never a prompt rebuilt from the text."""
    import reinf.training.rollouts as rollouts
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    config = tk.train_config(home, model_dir, system_prompt=SYSTEM, max_new_tokens=6,
                             training_method="rollouts", training_min_ratings=2,
                             training_min_consistency=-1.0, training_rollout_prompts=4,
                             training_rollouts_per_prompt=2, batch_size=4, ppo_epochs=1,
                             kl_max=100.0, training_max_perplexity_increase=100.0,
                             # the win rate samples the same prompts again: not this test's
                             training_winrate_prompts=0)
    store = Store.open(config)
    engine = Engine.load(config)
    chat = ChatService(engine, store, config)
    turns = []
    for i, message in enumerate(MESSAGES):
        own = {"system_prompt": "Be formal."} if i == 3 else {}
        turns.append(chat.send(message, **own))
        store.rate(turns[-1].id, 5 if i % 2 == 0 else 1)
    for turn in turns[:3]:
        assert SYSTEM in prompt_text(engine, turn)
    assert "Be formal." in prompt_text(engine, turns[3]) and SYSTEM not in \
        prompt_text(engine, turns[3])

    sampled: list[list[int]] = []
    real = rollouts.sample_rollouts

    def spy(model, tokenizer, prompts, k, **kw):
        sampled.extend(list(p) for p in prompts)
        return real(model, tokenizer, prompts, k, **kw)
    monkeypatch.setattr(rollouts, "sample_rollouts", spy)
    result = train_round(config, store, force=True)
    assert result.metrics.get("mode") == "rollouts", result.metrics.get("mode_reason")
    assert sorted(sampled) == sorted(t.prompt_ids for t in turns)
    store.close()


def test_the_web_and_openai_apis_put_the_system_prompt_in_the_stored_prompt(
        home, model_dir, build_daemon):
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from webui import create_app

    config = tk.train_config(home, model_dir, max_new_tokens=6)
    store = Store.open(config)
    engine = Engine.load(config)
    app = create_app(config, store=store, chat=ChatService(engine, store, config),
                     engine=engine, daemon=build_daemon(engine, config=config))
    client = app.test_client()
    r = client.post("/api/chat", json={"message": "hi", "system_prompt": SYSTEM})
    assert r.status_code == 200, r.get_json()
    turn = store.get_turn(r.get_json()["turn_id"])
    assert prompt_text(engine, turn).startswith(system_turn(SYSTEM))
    r = client.post("/api/chat", json={"message": "hi"})  # the config has none
    assert "<|im_start|>system" not in prompt_text(engine, store.get_turn(r.get_json()["turn_id"]))

    r = client.post("/v1/chat/completions", json={"model": "m", "messages": [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "Be kind."}, {"role": "user", "content": "now"}]})
    assert r.status_code == 200, r.get_json()
    turn = store.get_turn(r.get_json()["turn_id"])
    text = prompt_text(engine, turn)
    assert text.startswith(system_turn("Be brief.\n\nBe kind."))
    assert "earlier" in text and text.count("<|im_start|>system") == 1
    assert r.get_json()["usage"]["prompt_tokens"] == len(turn.prompt_ids)
    store.close()


def test_send_many_stores_each_reply_as_a_first_turn_like_send(setup):
    """``ChatService.send_many`` (the batch the learning bench's simulated people use):
    each message opens its own conversation with the config's system prompt, its turn is
    stored as ``send`` stores one (prompt ids, log-probs, the model), can be rated, and a
    bad message is refused before anything is stored or sampled."""
    from reinf.errors import BadInput

    config, store, engine, chat = setup
    turns = chat.send_many(MESSAGES[:3], seed=7)
    assert [t.user_message for t in turns] == MESSAGES[:3]
    assert len({t.conversation_id for t in turns}) == 3
    alone = chat.send(MESSAGES[0], seed=7)
    for turn, message in zip(turns, MESSAGES):
        assert turn.system_prompt == SYSTEM
        assert turn.prompt_ids == engine.build_prompt([], message, system=SYSTEM)
        assert len(turn.reply_ids) == len(turn.logprobs) > 0
        assert turn.model == alone.model and turn.gen_params["seed"] == 7
    store.rate(turns[1].id, 4)
    assert store.get_turn(turns[1].id).rating.score == 4
    before = len(store.list_conversations())
    with pytest.raises(BadInput, match="empty"):
        chat.send_many([MESSAGES[0], "  "])
    assert len(store.list_conversations()) == before
