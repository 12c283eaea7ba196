"""The chat templates of the project's models, rendered by jinja2 (framework/model/chat.py), against llama.cpp's
llama_chat_apply_template on a few conversations (tests/reference/chat_templates.json, made by
tests/make_chat_reference.py): system and user, several turns, with and without the generation prompt.

llama_chat_apply_template does not run the jinja template: it recognises the template's family and writes
that family's format in C++. Where a template does more than the format, the test states it and checks that
exact difference (any other one fails):
- SmolLM2 and Qwen2.5 insert their default system message when the conversation has none;
- Llama 3.2 writes BOS itself (llama.cpp's tokenizer adds it) and a system turn that opens with the knowledge
  cut-off and today's date (its default date string);
- Gemma 3 (the framework's built-in template: the 270M model's file has none) writes BOS itself;
- Qwen3 and Qwen3.5 put an empty <think></think> before an assistant answer after the last user turn, and
  Qwen3.5 opens the generation prompt with <think> (thinking on, the template's default).
"""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import REF_DIR, load_model

import real_vocab
import tiny_models
from framework.model.chat import BUILTIN_TEMPLATES, chat_template_for, render_chat

REF = json.loads((REF_DIR / "chat_templates.json").read_text(encoding="utf-8"))
THINK = "<think>\n\n</think>\n\n"
DEFAULT_SYSTEM = {"smollm2": "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                  "qwen2": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."}
LLAMA3_SYSTEM = "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n" \
                "Today Date: 26 Jul 2024\n\n"


def template_and_tokens(key: str) -> tuple[str, str, str]:
    """(jinja template, BOS text, EOS text) as the framework renders the model's chats."""
    if key in ("smollm2", "gemma3"):
        model = load_model(key)
        template, _ = chat_template_for(model.file.metadata, model.arch.name)
        tok = model.tokenizer
        return template, tok.tokens[tok.bos_id], tok.tokens[tok.eos_id]
    spec = tiny_models.SPECS[key]
    meta = real_vocab.vocab_metadata(spec.vocab, tiny_models.N_BASE, spec.n_special)
    tokens = meta["tokenizer.ggml.tokens"]
    template = (tiny_models.TEMPLATES / spec.template).read_text(encoding="utf-8")
    return template, tokens[meta["tokenizer.ggml.bos_token_id"]], tokens[meta["tokenizer.ggml.eos_token_id"]]


def expected(key: str, messages: list[dict], add_generation_prompt: bool, theirs: str) -> str:
    """llama.cpp's rendering with the template's own additions (the module docstring) made."""
    has_system = messages[0]["role"] == "system"
    if key in DEFAULT_SYSTEM and not has_system:
        return f"<|im_start|>system\n{DEFAULT_SYSTEM[key]}<|im_end|>\n" + theirs
    if key == "gemma3":
        return "<bos>" + theirs
    if key == "llama":
        opening = "<|start_header_id|>system<|end_header_id|>\n\n"
        rest = theirs[len(opening):] if has_system else "<|eot_id|>" + theirs
        assert not has_system or theirs.startswith(opening), theirs
        return "<|begin_of_text|>" + LLAMA3_SYSTEM + rest
    if key in ("qwen3", "qwen35"):
        if messages[-1]["role"] == "assistant":
            head, _, answer = theirs.rpartition("<|im_start|>assistant\n")
            theirs = head + "<|im_start|>assistant\n" + THINK + answer
        if key == "qwen35" and add_generation_prompt:
            theirs += "<think>\n"
    return theirs


@pytest.mark.parametrize("key", list(REF["templates"]))
def test_rendering_follows_llama_cpp(key):
    template, bos, eos = template_and_tokens(key)
    ref = REF["templates"][key]
    if key != "gemma3":      # llama.cpp rendered the very text the framework reads (gemma3: its built-in "gemma")
        assert hashlib.sha256(template.encode("utf-8")).hexdigest() == ref["sha256"], (
            f"{key}'s chat template is not the one tests/reference/chat_templates.json was made from; rerun "
            f"tests/make_chat_reference.py")
    else:
        assert template == BUILTIN_TEMPLATES["gemma3"]
    for r in ref["renderings"]:
        ours = render_chat(template, r["messages"], bos, eos, r["add_generation_prompt"])
        want = expected(key, r["messages"], r["add_generation_prompt"], r["text"])
        assert ours == want, (f"{key}, {len(r['messages'])} messages, add_generation_prompt="
                              f"{r['add_generation_prompt']}:\n ours   {ours!r}\n wanted {want!r}\n llama.cpp "
                              f"{r['text']!r}")
