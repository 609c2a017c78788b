"""The model zoo: every architecture family a person may point Reinf at, as a tiny random
model with its family's chat template, through chat -> rate -> train -> swap -> chat.

Each family also checks the log-prob invariant PPO rests on: re-forwarding a sampled reply
with ``Policy.forward`` under the adapter that sampled it reproduces the behaviour log-probs
the engine stored (fp32 on the CPU: max abs error ``LOGP_TOL``). Sampling and scoring both
call the model's own forward (reinf.model.sampling), so whatever a family does to its logits holds
on both sides; Gemma 2 and Gemma 3 get a final-logit soft cap of 0.05 to show it.

The models are built once per module (hidden 64, 2 layers, the tiny BPE vocabulary of
tests/tiny.py). A family whose transformers class is missing is skipped with the reason.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import trainkit as tk
from tiny import build_chat_tokenizer, save_causal_lm

pytestmark = pytest.mark.e2e
single_thread = pytest.fixture(autouse=True)(tk.one_thread)

LOGP_TOL = 1e-4
SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, max_position_embeddings=256)


def template(turn: str, reply: str, prompt: str, start: str = "", role_map=None) -> str:
    """A Jinja chat template from three format strings over {role} and {content}."""
    roles = role_map or {}
    names = "{%- set names = " + json.dumps(roles) + " -%}" if roles else ""
    role = "names.get(m['role'], m['role'])" if roles else "m['role']"

    def expr(fmt: str) -> str:
        parts = fmt.replace("{role}", "\x00R\x00").replace("{content}", "\x00C\x00").split("\x00")
        return " + ".join({"R": role, "C": "m['content']"}.get(p, json.dumps(p))
                          for p in parts if p) or "''"
    return (names + "{{- " + json.dumps(start) + " -}}"
            "{%- for m in messages -%}"
            "{%- if m['role'] == 'assistant' -%}{{- " + expr(reply) + " -}}"
            "{%- else -%}{{- " + expr(turn) + " -}}{%- endif -%}"
            "{%- endfor -%}"
            "{%- if add_generation_prompt -%}{{- " + json.dumps(prompt) + " -}}{%- endif -%}")


LLAMA3 = template("<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                  "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
                  "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|begin_of_text|>")
CHATML = template("<|im_start|>{role}\n{content}<|im_end|>\n",
                  "<|im_start|>{role}\n{content}<|im_end|>\n", "<|im_start|>assistant\n")
MISTRAL = template("[INST] {content} [/INST]", "{content}</s>", "", "<s>")
GEMMA = template("<start_of_turn>{role}\n{content}<end_of_turn>\n",
                 "<start_of_turn>{role}\n{content}<end_of_turn>\n", "<start_of_turn>model\n",
                 "<bos>", role_map={"assistant": "model"})
PHI3 = template("<|{role}|>\n{content}<|end|>\n", "<|{role}|>\n{content}<|end|>\n",
                "<|assistant|>\n")
TULU = template("<|{role}|>\n{content}\n", "<|{role}|>\n{content}<|endoftext|>\n",
                "<|assistant|>\n", "<|endoftext|>")
PLAIN = template("User: {content}\n", "Assistant: {content}<|endoftext|>\n", "Assistant:")
PLAIN_OPT = template("User: {content}\n", "Assistant: {content}</s>\n", "Assistant:", "</s>")


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    config_class: str                # in transformers
    model_class: str
    chat_template: str
    specials: tuple[str, ...]        # token ids 0, 1, ... in this order
    eos: str                         # the tokenizer's (and config's) eos
    pad: str
    stop: tuple[str, ...]            # generation_config.eos_token_id
    header: str                      # how every prompt ends (the generation prompt)
    targets: frozenset[str]          # what lora.target_modules auto must pick
    dims: dict = dataclasses.field(default_factory=dict)
    softcap: bool = False            # a final soft cap (the model's own forward applies it)

    def build(self, root: Path) -> Path:
        import transformers

        missing = [c for c in (self.config_class, self.model_class)
                   if not hasattr(transformers, c)]
        if missing:
            pytest.skip(f"transformers {transformers.__version__} has no {missing[0]}")
        tok = build_chat_tokenizer(self.chat_template, list(self.specials), eos=self.eos,
                                   pad=self.pad)
        ids = {t: tok.convert_tokens_to_ids(t) for t in self.specials}
        config = getattr(transformers, self.config_class)(
            vocab_size=len(tok), eos_token_id=ids[self.eos], pad_token_id=ids[self.pad],
            bos_token_id=ids[self.specials[1]] if len(self.specials) > 1 else ids[self.eos],
            **{**SIZE, **self.dims})
        return save_causal_lm(root / self.name, getattr(transformers, self.model_class), config,
                              tok, eos_ids=[ids[t] for t in self.stop])


LLAMA3_SPECIALS = ("<|end_of_text|>", "<|begin_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>")
CHATML_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
GEMMA_SPECIALS = ("<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>")
GEMMA_HEADER = "<start_of_turn>model\n"
QV, QKV = frozenset({"q_proj", "v_proj"}), frozenset({"query_key_value"})

FAMILIES = [
    Family("llama3", "LlamaConfig", "LlamaForCausalLM", LLAMA3, LLAMA3_SPECIALS,
           "<|end_of_text|>", "<|end_of_text|>", ("<|end_of_text|>", "<|eot_id|>"),
           "<|start_header_id|>assistant<|end_header_id|>\n\n", QV),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM", CHATML, CHATML_SPECIALS,
           "<|im_end|>", "<|endoftext|>", ("<|im_end|>", "<|endoftext|>"),
           "<|im_start|>assistant\n", QV, dict(tie_word_embeddings=True)),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", CHATML, CHATML_SPECIALS,
           "<|im_end|>", "<|endoftext|>", ("<|im_end|>", "<|endoftext|>"),
           "<|im_start|>assistant\n", QV, dict(head_dim=16)),
    Family("mistral", "MistralConfig", "MistralForCausalLM", MISTRAL,
           ("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), "</s>", "<unk>", ("</s>",),
           "[/INST]", QV),
    Family("gemma", "GemmaConfig", "GemmaForCausalLM", GEMMA, GEMMA_SPECIALS, "<eos>",
           "<pad>", ("<eos>", "<end_of_turn>"), GEMMA_HEADER, QV, dict(head_dim=16)),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM", GEMMA, GEMMA_SPECIALS, "<eos>",
           "<pad>", ("<eos>", "<end_of_turn>"), GEMMA_HEADER, QV,
           dict(head_dim=16, final_logit_softcapping=0.05, query_pre_attn_scalar=16),
           softcap=True),
    Family("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", GEMMA, GEMMA_SPECIALS,
           "<eos>", "<pad>", ("<eos>", "<end_of_turn>"), GEMMA_HEADER, QV,
           dict(head_dim=16, final_logit_softcapping=0.05, query_pre_attn_scalar=16),
           softcap=True),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM", PHI3,
           ("<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"), "<|end|>",
           "<|endoftext|>", ("<|end|>", "<|endoftext|>"), "<|assistant|>\n",
           frozenset({"qkv_proj"})),
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel", PLAIN, ("<|endoftext|>",),
           "<|endoftext|>", "<|endoftext|>", ("<|endoftext|>",), "Assistant:",
           frozenset({"c_attn"})),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM", PLAIN, ("<|endoftext|>",),
           "<|endoftext|>", "<|endoftext|>", ("<|endoftext|>",), "Assistant:", QKV),
    Family("opt", "OPTConfig", "OPTForCausalLM", PLAIN_OPT, ("<pad>", "</s>"), "</s>",
           "<pad>", ("</s>",), "Assistant:", QV,
           dict(ffn_dim=128, word_embed_proj_dim=64)),
    Family("falcon", "FalconConfig", "FalconForCausalLM", PLAIN, ("<|endoftext|>",),
           "<|endoftext|>", "<|endoftext|>", ("<|endoftext|>",), "Assistant:", QKV),
    Family("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM", CHATML, CHATML_SPECIALS,
           "<|im_end|>", "<|endoftext|>", ("<|im_end|>",), "<|im_start|>assistant\n", QV),
    Family("olmo2", "Olmo2Config", "Olmo2ForCausalLM", TULU,
           ("<|pad|>", "<|endoftext|>", "<|user|>", "<|assistant|>"), "<|endoftext|>",
           "<|pad|>", ("<|endoftext|>",), "<|assistant|>\n", QV),
]
MESSAGES = ["Hello, how are you today?", "Tell me about the weather.",
            "What is a language model?", "Why is the sky blue?"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Family name -> saved model directory (or the reason it is skipped)."""
    root = tmp_path_factory.mktemp("zoo")
    out = {}
    for family in FAMILIES:
        try:
            out[family.name] = family.build(root)
        except pytest.skip.Exception as exc:
            out[family.name] = str(exc)
    return out


def model_dir_of(zoo, family: Family) -> Path:
    found = zoo[family.name]
    if isinstance(found, str):
        pytest.skip(found)
    return found


def zoo_config(home, model_dir, **overrides):
    """trainkit's fast config, with the default ``auto`` targets and lenient gates (these
    tests check that each architecture runs, test_trainer that training learns)."""
    settings = dict(lora_target_modules="auto", max_new_tokens=6, temperature=1.0,
                    batch_size=4, ppo_epochs=1, kl_max=100.0,
                    training_max_perplexity_increase=100.0)
    settings.update(overrides)
    return tk.train_config(home, model_dir, **settings)


def replay_logprobs(model_dir, checkpoint, turn) -> tuple[torch.Tensor, torch.Tensor]:
    """Policy.forward's log-probs of a stored reply under ``checkpoint`` -> (theirs, stored)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from reinf.training.ppo import Policy, ValueHead, build_rollout, update_mode

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(base, str(checkpoint)) if checkpoint else base
    policy = Policy(model, ValueHead(base.config.get_text_config().hidden_size))
    temperature = turn.gen_params["temperature"]
    b = build_rollout([(turn.prompt_ids, turn.reply_ids, turn.logprobs, temperature, 0.0, 1.0)])
    with torch.no_grad(), update_mode(model):
        out = policy.forward(b, values=False)
    return out.logp[0], b.logp_behaviour[0]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_chat_rate_train_swap_chat(family, zoo, home):
    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    model_dir = model_dir_of(zoo, family)
    config = zoo_config(home, model_dir)
    store = Store.open(config)
    engine = Engine.load(config)
    assert not engine.warnings, engine.warnings  # its own template, targets found
    chat = ChatService(engine, store, config)
    tok = engine.tokenizer

    # chat: the family's template, and rate every reply
    conv = None
    for i, message in enumerate(MESSAGES):
        turn = chat.send(message, conversation_id=conv)
        conv = turn.conversation_id
        prompt = tok.decode(turn.prompt_ids, skip_special_tokens=False)
        assert prompt.endswith(family.header) and message in prompt, prompt
        assert turn.reply_ids and len(turn.logprobs) == len(turn.reply_ids)
        store.rate(turn.id, 5 if i % 2 == 0 else 1)

    # train: a round on the rated replies, adapters on the family's attention projections
    result = train_round(config, store, force=True)
    assert result.status == "succeeded", result.message
    ckpt = store.get_checkpoint(result.checkpoint_id)
    saved = json.loads((Path(ckpt.path) / "adapter_config.json").read_text())
    assert set(saved["target_modules"]) == family.targets
    assert tk.lora_vector(ckpt.path).abs().max() > 0      # LoRA B starts at 0: it trained

    # swap, then chat on the new adapter
    engine.request_swap(ckpt.id, ckpt.path)
    turn = chat.send("Thank you! Write a list: one, two, three.", conversation_id=conv)
    assert turn.checkpoint_id == ckpt.id and turn.reply_ids
    assert tok.decode(turn.prompt_ids, skip_special_tokens=False).endswith(family.header)

    # the log-prob invariant, under the adapter that sampled the reply
    logp, stored = replay_logprobs(model_dir, ckpt.path, turn)
    error = (logp - stored).abs().max().item()
    print(f"\n{family.name}: max log-prob error {error:.2e}")
    assert error < LOGP_TOL, error
    # the next round continues that adapter: auto still describes it, no "settings changed"
    from reinf.training.session import build_session
    assert not [w for w in build_session(config, store).warnings if "lora" in w]
    store.close()


def test_two_stop_ids_from_generation_config(zoo, home):
    """Llama-3 style: the tokenizer's and config's eos is <|end_of_text|>; instruct replies
    end with <|eot_id|>, listed only in generation_config.eos_token_id. A copy of the tiny
    Llama made to always say <|eot_id|> stops there at once."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinf.serving.engine import Engine
    from reinf.model.sampling import eos_token_ids

    src = model_dir_of(zoo, FAMILIES[0])
    model = AutoModelForCausalLM.from_pretrained(src)
    tok = AutoTokenizer.from_pretrained(src)
    eot, end = (tok.convert_tokens_to_ids(t) for t in ("<|eot_id|>", "<|end_of_text|>"))
    assert tok.eos_token_id == end and model.config.eos_token_id == end
    assert model.generation_config.eos_token_id == [end, eot]
    assert eos_token_ids(model, tok) == {end, eot}
    with torch.no_grad():
        # Every token embedding carries +1000 on unit 0, so the residual stream does too and
        # the final norm maps it to a large positive unit 0; only <|eot_id|> reads unit 0.
        model.get_input_embeddings().weight[:, 0] = 1000.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[eot, 0] = 10.0
    out = home.parent / "llama3-stop"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    engine = Engine.load(zoo_config(home, out))
    reply = engine.generate([], "Hello, how are you today?")
    assert reply.finish_reason == "stop" and reply.reply_ids == [eot], reply


def test_targets_that_do_not_fit_are_reported_before_training(zoo, home):
    """GPT-2 has no q_proj/v_proj (the old default): the engine's warnings and `reinf status`
    say so with the names it does have, and a round stops before training."""
    from reinf.serving.engine import Engine
    from reinf.errors import ConfigError
    from reinf.daemon.status import collect_status
    from reinf.storage.store import Store
    from reinf.training.trainer import train_round

    model_dir = model_dir_of(zoo, FAMILIES[8])
    config = zoo_config(home, model_dir, lora_target_modules="q_proj, v_proj")
    store = Store.open(config)
    status = collect_status(config, store)                     # no server: from the files
    assert any("lora.target_modules" in w and "c_attn" in w for w in status["warnings"])
    engine = Engine.load(config)                               # a server: from the model
    [warning] = [w for w in engine.warnings if "lora.target_modules" in w]
    assert "q_proj" in warning and "c_attn" in warning and "c_fc" in warning
    served = collect_status(config, store, engine=engine)
    assert warning in served["warnings"]
    store.append_turn(store.create_conversation("t").id, "hi", "there", prompt_ids=[1, 2],
                      reply_ids=[3, 0], logprobs=[-1.0, -1.0], gen_params={"temperature": 1.0})
    store.rate(store.last_turn().id, 5)
    with pytest.raises(ConfigError) as info:
        train_round(config, store)
    assert info.value.key == "lora.target_modules" and "c_attn" in info.value.message
    [run] = store.list_runs()
    assert run.status == "failed" and not run.checkpoint_id
    assert "lora.target_modules" in run.error
    assert not any(w for w in collect_status(zoo_config(home, model_dir), store)["warnings"]
                   if "lora.target_modules" in w)              # auto fits: no warning
    store.close()


def test_all_linear_and_changed_targets(zoo, home):
    """all-linear adapts every Linear/Conv1D but the LM head; a later setting that selects
    the same layers under another spelling is no change, one that selects others is."""
    from reinf.storage.store import Store
    from reinf.training.session import build_session
    from reinf.training.trainer import train_round

    model_dir = model_dir_of(zoo, FAMILIES[1])                 # qwen2
    config = zoo_config(home, model_dir, lora_target_modules="all-linear")
    store = Store.open(config)
    for i, message in enumerate(MESSAGES[:2]):
        conv = store.create_conversation(message).id
        store.append_turn(conv, message, "ok", prompt_ids=[1, 5, 6], reply_ids=[40 + i, 2],
                          logprobs=[-5.0, -5.0], gen_params={"temperature": 1.0})
        store.rate(store.last_turn().id, 5 - 4 * i)
    result = train_round(config, store)
    assert result.status == "succeeded", result.message
    saved = json.loads((Path(store.active_checkpoint().path) / "adapter_config.json").read_text())
    leaves = {name.rsplit(".", 1)[-1] for name in saved["target_modules"]}
    assert leaves == set(tk.ALL_LINEAR)                        # not lm_head
    same = config.replace(lora_target_modules=tk.ALL_LINEAR)
    assert not [w for w in build_session(same, store).warnings if "lora" in w]
    other = build_session(config.replace(lora_target_modules="auto"), store).warnings
    assert any("lora settings changed" in w and "q_proj, v_proj" in w for w in other), other
    store.close()


# --- the system prompt in each family's template ---------------------------------------------

SYSTEM = "You are a pirate. Answer in one short sentence."
# As the families ship them: Gemma (1, 2) raises on a system message; early Mistral insists
# that user and assistant alternate, which a system message breaks.
GEMMA_AS_SHIPPED = ("{%- if messages[0]['role'] == 'system' -%}"
                    "{{- raise_exception('System role not supported') -}}{%- endif -%}" + GEMMA)
MISTRAL_AS_SHIPPED = (
    "<s>{%- for m in messages -%}"
    "{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}"
    "{%- endif -%}"
    "{%- if m['role'] == 'user' -%}{{- '[INST] ' + m['content'] + ' [/INST]' -}}"
    "{%- else -%}{{- m['content'] + '</s>' -}}{%- endif -%}{%- endfor -%}")
MISTRAL_SPECIALS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]")


def family_tokenizer(family: Family, template: str | None = None):
    return build_chat_tokenizer(template or family.chat_template, list(family.specials),
                                eos=family.eos, pad=family.pad)


@pytest.mark.parametrize("family", FAMILIES, ids=[f.name for f in FAMILIES])
def test_a_template_with_a_system_role_gets_the_system_prompt_as_a_system_turn(family):
    from reinf.model.modeling import render_chat

    tok = family_tokenizer(family)
    ids = render_chat(tok, [("Hello, how are you today?", "Fine.")], "Why is the sky blue?",
                      system=SYSTEM)
    expected = tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM},
         {"role": "user", "content": "Hello, how are you today?"},
         {"role": "assistant", "content": "Fine."},
         {"role": "user", "content": "Why is the sky blue?"}],
        add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert ids == list(expected)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.count(SYSTEM) == 1 and text.endswith(family.header)
    assert f"{SYSTEM}\n\nHello" not in text  # kept apart, not folded
    if family.chat_template == CHATML:
        assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n")


@pytest.mark.parametrize("template, specials, first_user", [
    (GEMMA_AS_SHIPPED, GEMMA_SPECIALS, "<bos><start_of_turn>user\n"),
    (MISTRAL_AS_SHIPPED, MISTRAL_SPECIALS, "<s>[INST] ")], ids=["gemma", "mistral"])
def test_a_template_that_refuses_the_system_role_gets_it_in_the_first_user_message(
        template, specials, first_user):
    from reinf.model.modeling import build_prompt_ids

    tok = build_chat_tokenizer(template, list(specials), eos=specials[2], pad=specials[0])
    history = [("Hello, how are you today?", "Fine."), ("Tell me about the weather.", "Sunny.")]
    ids = build_prompt_ids(tok, history, "Why is the sky blue?", max_history=8,
                           max_context_tokens=256, max_new_tokens=8, system=SYSTEM)
    text = tok.decode(ids, skip_special_tokens=False)
    assert text.startswith(f"{first_user}{SYSTEM}\n\nHello, how are you today?")
    assert text.count(SYSTEM) == 1 and "Tell me about the weather." in text


def test_gemma_folds_the_system_prompt_into_every_stored_prompt_and_says_so_once(
        tmp_path, home, caplog):
    """A chat on a Gemma whose template refuses the system role: each turn's stored prompt
    starts with the system prompt inside the first user message; the log says so once."""
    import logging

    from reinf.serving.chat import ChatService
    from reinf.serving.engine import Engine
    from reinf.storage.store import Store

    gemma = dataclasses.replace(next(f for f in FAMILIES if f.name == "gemma"),
                                name="gemma-as-shipped", chat_template=GEMMA_AS_SHIPPED)
    config = zoo_config(home, gemma.build(tmp_path), system_prompt=SYSTEM)
    store = Store.open(config)
    engine = Engine.load(config)
    chat = ChatService(engine, store, config)
    caplog.set_level(logging.INFO, logger="reinf.model.modeling")
    conv, sent = None, []
    for seed, message in enumerate(MESSAGES[:3]):
        turn = chat.send(message, conversation_id=conv, seed=seed)  # the same replies every run
        conv = turn.conversation_id
        prompt = engine.tokenizer.decode(turn.prompt_ids, skip_special_tokens=False)
        # The first user message sent: the oldest earlier turn with a reply (a random model
        # can end a reply before its first token, and such a turn is left out), else this one.
        first = next((m for m, reply in sent if reply), message)
        assert prompt.startswith(f"<bos><start_of_turn>user\n{SYSTEM}\n\n{first}")
        assert prompt.endswith(GEMMA_HEADER) and message in prompt
        sent.append((message, turn.reply))
    assert any(reply for _, reply in sent[:2])  # some history was folded in, not only a message
    assert store.get_conversation(conv).system_prompt == SYSTEM
    notes = [r for r in caplog.records if "refuses a system message" in r.getMessage()]
    assert len(notes) == 1 and "System role not supported" in notes[0].getMessage()
    store.close()
