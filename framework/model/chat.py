"""Chat prompts from the model's own template (jinja2), as llama.cpp applies them."""

from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .metadata import MetadataError, get_str

# Used only when the file has no tokenizer.chat_template, and always said so: llama.cpp's
# built-in templates for these architectures (gemma3: llama-chat.cpp's "gemma", which merges the system
# messages into the next user turn; BOS written here, where llama.cpp's tokenizer adds it).
BUILTIN_TEMPLATES = {
    "gemma3": ("{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
               "{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] | trim) %}"
               "{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
               "<start_of_turn>{{ role }}\n{% if ns.system and role != 'model' %}{{ ns.system }}\n\n"
               "{% set ns.system = '' %}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
}


class ChatTemplateError(ValueError):
    pass


def chat_template_for(metadata: dict, arch: str) -> tuple[str, str]:
    """(template, where it came from)."""
    try:
        template = get_str(metadata, "tokenizer.chat_template", None)
    except MetadataError as e:
        raise ChatTemplateError(str(e)) from None
    if template:
        return template, "the model file"
    if arch in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[arch], f"the built-in {arch} template (the model file has none)"
    raise ChatTemplateError(f"the model file has no tokenizer.chat_template and there is no built-in template "
                            f"for architecture '{arch}' (built-in: {', '.join(BUILTIN_TEMPLATES)})")


def render_chat(template: str, messages: list[dict], bos_token: str, eos_token: str,
                add_generation_prompt: bool = True) -> str:
    try:
        return _compiled(template).render(messages=messages, bos_token=bos_token, eos_token=eos_token,
                                          add_generation_prompt=add_generation_prompt)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template does not render: {e}") from e
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError) as e:
        # a template is code from the model file: whatever it raises is the template's fault
        raise ChatTemplateError(f"the chat template fails: {type(e).__name__}: {e}") from e


def chat_prompt_ids(tokenizer, template: str, messages: list[dict]) -> list[int]:
    """A conversation's token ids, ready for the assistant's turn: special tokens in the rendered text are
    parsed, and BOS is added only when the tokenizer wants one and the template did not write it."""
    tok = tokenizer
    bos = tok.token_bytes(tok.bos_id, special=True).decode(errors="replace") if tok.bos_id is not None else ""
    eos = tok.token_bytes(tok.eos_id, special=True).decode(errors="replace") if tok.eos_id is not None else ""
    text = render_chat(template, messages, bos, eos)
    add_bos = tok.add_bos and not (bos and text.startswith(bos))
    return tok.encode(text, add_bos=add_bos, parse_special=True)


@lru_cache(maxsize=8)
def _compiled(template: str) -> jinja2.Template:
    """Compiling a template takes milliseconds; a server renders one per request."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template refused the conversation: {message}")

    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from e
    except (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RecursionError) as e:
        raise ChatTemplateError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
