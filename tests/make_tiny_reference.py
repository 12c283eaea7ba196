"""llama.cpp's outputs on the tiny models (tests/tiny_models.py) and on the real vocabularies
(tests/real_vocab.py), written to tests/reference/tiny/. Tests read them; llama.cpp is never a test-time
dependency.

Run with a Python that has llama-cpp-python 0.3.36 (built as benchmarks/install_llama_cpp.sh does),
gguf, numpy and quicktok-v1, from the repository root:

    PYTHON tests/make_tiny_reference.py --llama-src DIR

DIR: llama.cpp's source (vendor/llama.cpp of llama-cpp-python's source distribution); its
models/ggml-vocab-*.gguf are compared with the vocabularies real_vocab.py builds, and its tokenizer test
strings (models/ggml-vocab-*.gguf.inp) are tokenized with the rest.

Per model, <arch>.json holds the file's sha256, the token ids of a list of strings, and per prompt its ids,
llama.cpp's greedy tokens (argmax) over a prefill and DECODE_STEPS decode steps, and the keys in
<arch>.npz of the logits (float16) of the prefill's last position, of every decode step, and of every
prefill position of the first prompt. vocab-<family>.json holds the token ids of the strings under the
full real vocabulary, with and without special-token parsing, and the chat templates' renderings by
llama.cpp's llama_chat_apply_template.

gemma4-assistant.json holds llama.cpp's MTP drafting (common/speculative.cpp's draft-mtp, driven here
through its low-level API) of the tiny Gemma 4 assistant over the tiny Gemma 4 target: per prompt, the
target's greedy first token, N_DRAFT greedy draft tokens of the assistant (every one at the position after
the target's context, each from the previous step's h_nextn), then the target's verification of that token
and the drafts (its greedy acceptance), the rollback of the rejected ones, and a second round of drafts
from the hidden state of the last accepted token; the assistant's logits of every draft step are in
gemma4-assistant.npz.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import real_vocab  # noqa: E402
from make_chat_reference import apply_template  # noqa: E402
import tiny_models  # noqa: E402

OUT = HERE / "reference" / "tiny"
DECODE_STEPS = 8
N_THREADS = 2

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Once upon a time, in 1987, there were 42 cats!",
]

OWN_STRINGS = [
    "Hello world", " Hello world", "Hello  world", "hello\n\nworld\n", "\t tabs\tand  spaces  ",
    "I'm sure they'll say it's fine, we've done it; you'd agree, THEY'RE right, DON'T you?",
    "Numbers: 1 12 123 1234 12345 3.14159 1,000,000 0x7f", "2024-12-01T08:54:00Z",
    "naïve café résumé Ωmega Добрый день Γειά σου", "日本語のテキスト、中文文本。한국어 텍스트",
    "emoji 😀👍🏽 🇫🇷 ❤️", "  leading and trailing   ", "\n\n\n", "   ", "a\r\nb\rc",
    "mixed  \n  whitespace \t\n\t lines", "snake_case camelCase kebab-case PascalCase",
    "<|im_start|>user\nhi<|im_end|>", "<think>reasoning</think> answer", "<|begin_of_text|>x<|eot_id|>",
    "if (x != y && z >= 0) { return a->b; } // comment", "e\u0301 (combining acute) vs \u00e9",
    "ＦＵＬＬＷＩＤＴＨ ａｎｄ ½ ⅔ ²³", "Zero\u200bwidth and\u00a0nbsp", "'quoted' \"double\" `back`",
]

CHATS = [
    [{"role": "user", "content": "Hello, who are you?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}],
]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def llama_inp_strings(src: Path, vocab_file: str) -> list[str]:
    """llama.cpp's own tokenizer test strings (models/ggml-vocab-*.gguf.inp)."""
    path = src / "models" / f"{vocab_file}.inp"
    return path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1] if path.is_file() else []


def reference_strings(src: Path, vocab_file: str) -> list[str]:
    """The strings of tests/reference/*.json (their tokenizer strings, prompts and texts), llama.cpp's
    tokenizer test strings and OWN_STRINGS."""
    out = []
    for path in sorted((HERE / "reference").glob("*.json")):
        ref = json.loads(path.read_text(encoding="utf-8"))
        out += [e["text"] for e in ref.get("tokenize", [])] + [p["prompt"] for p in ref.get("prompts", [])]
        if "text_file" in ref.get("text", {}):
            out.append((HERE / "reference" / ref["text"]["text_file"]).read_bytes().decode("utf-8"))
    return list(dict.fromkeys(out + llama_inp_strings(src, vocab_file) + OWN_STRINGS))


def tokenize(llm, strings: list[str], special: bool) -> list[dict]:
    return [{"text": s, "ids": llm.tokenize(s.encode("utf-8"), add_bos=False, special=special)} for s in strings]


def chat_renderings(template: str) -> list[dict]:
    """llama_chat_apply_template (llama.cpp's C++ rendering of a recognised template) of CHATS."""
    return [{"messages": chat, "text": apply_template(template, chat, True) or None} for chat in CHATS]


def model_reference(arch: str, work: Path) -> tuple[dict, dict]:
    from llama_cpp import Llama
    path = tiny_models.write(arch, work / f"tiny-{arch}.gguf")
    llm = Llama(str(path), n_ctx=512, n_batch=512, n_threads=N_THREADS, logits_all=True, verbose=False, seed=0)
    add_bos = llm.tokenize(b"a", add_bos=True) != llm.tokenize(b"a", add_bos=False)     # BOS prepended by llama.cpp
    ref = {"arch": arch, "file_sha256": sha256(path), "add_bos": add_bos, "n_vocab": llm.n_vocab(),
           "decode_steps": DECODE_STEPS, "tokenize": tokenize(llm, PROMPTS + OWN_STRINGS[:12], False), "prompts": []}
    arrays = {}
    for i, prompt in enumerate(PROMPTS):
        llm.reset()
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=False)
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)
        if i == 0:
            arrays[f"p{i}_prefill"] = scores.astype(np.float16)
        rows, greedy = [scores[-1]], []
        for _ in range(DECODE_STEPS):
            tok = int(np.argmax(rows[-1]))
            greedy.append(tok)
            llm.eval([tok])
            rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        arrays[f"p{i}_steps"] = np.stack(rows).astype(np.float16)     # row 0: prefill's last; row k: after k tokens
        ref["prompts"].append({"prompt": prompt, "ids": ids, "greedy_ids": greedy,
                               "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
                               "steps_key": f"p{i}_steps", "prefill_key": f"p{i}_prefill" if i == 0 else None})
    template = (tiny_models.TEMPLATES / tiny_models.SPECS[arch].template).read_text(encoding="utf-8")
    ref["chat"] = chat_renderings(template)
    del llm
    return ref, arrays


N_DRAFT = 4


class MTP:
    """llama.cpp's Gemma 4 target and assistant contexts (the assistant reads the target's cache)."""

    def __init__(self, target: Path, assistant: Path):
        import llama_cpp as L
        self.L = L
        lib = L.llama_cpp._lib
        # llama-ext.h's staging API (C++ linkage): h_nextn, the hidden state after the output norm
        self.set_nextn = getattr(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
        self.set_nextn.argtypes, self.set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
        self.nextn_ith = getattr(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")
        self.nextn_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
        self.nextn_ith.restype = ctypes.POINTER(ctypes.c_float)
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        self.models = [L.llama_model_load_from_file(str(p).encode(), mp) for p in (target, assistant)]
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.models[0]))
        self.n_embd = L.llama_model_n_embd(self.models[0])
        self.ctx_t = L.llama_init_from_model(self.models[0], self._params())
        self.set_nextn(self.ctx_t, True, False)
        cp = self._params()
        cp.ctx_type, cp.ctx_other = L.LLAMA_CONTEXT_TYPE_MTP, self.ctx_t
        self.ctx_a = L.llama_init_from_model(self.models[1], cp)
        self.set_nextn(self.ctx_a, True, True)

    def _params(self):
        cp = self.L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
        cp.n_threads = cp.n_threads_batch = N_THREADS
        return cp

    def process(self, ctx, tokens: list[int], pos: list[int], embd=None) -> None:
        L = self.L
        batch = L.llama_batch_ext_init(ctx)
        keep = []
        for i, (t, p) in enumerate(zip(tokens, pos)):
            idx = L.llama_batch_ext_add_token(batch, 0, t)
            L.llama_batch_ext_set_pos(batch, idx, (L.llama_pos * 1)(p))
            if embd is not None:
                row = np.ascontiguousarray(embd[i], dtype=np.float32)
                keep.append(row)
                L.llama_batch_ext_set_embd_token(batch, idx, L.llama_embd(
                    row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.shape[0]))
            L.llama_batch_ext_set_output_logits(batch, idx, True)
        rc = L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
        L.llama_batch_ext_free(batch)
        if rc != 0:
            raise RuntimeError(f"llama_process returned {rc}")

    def logits(self, ctx, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(ctx, i), shape=(self.n_vocab,)).copy()

    def hidden(self, ctx, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(self.nextn_ith(ctx, i), shape=(self.n_embd,)).copy()

    def draft(self, token: int, h: np.ndarray, pos0: int) -> tuple[list[int], list[np.ndarray]]:
        """draft-mtp's loop for a shared-memory (Gemma 4) assistant: every draft at pos0, greedy."""
        out, rows = [], []
        for _ in range(N_DRAFT):
            self.process(self.ctx_a, [token], [pos0], [h])
            rows.append(self.logits(self.ctx_a, 0))
            h = self.hidden(self.ctx_a, 0)
            token = int(np.argmax(rows[-1]))
            out.append(token)
        return out, rows

    def clear(self) -> None:
        self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.ctx_t), 0, -1, -1)

    def rewind(self, n: int) -> None:
        self.L.llama_memory_seq_rm(self.L.llama_get_memory(self.ctx_t), 0, n, -1)


def assistant_reference(work: Path) -> tuple[dict, dict]:
    target = tiny_models.write("gemma4", work / "tiny-gemma4.gguf")
    assistant = tiny_models.write("gemma4-assistant", work / "tiny-gemma4-assistant.gguf")
    mtp = MTP(target, assistant)
    ref = {"target_sha256": sha256(target), "assistant_sha256": sha256(assistant), "n_draft": N_DRAFT,
           "prompts": []}
    arrays = {}
    gemma4 = json.loads((OUT / "gemma4.json").read_text(encoding="utf-8"))
    for i, p in enumerate(gemma4["prompts"]):
        mtp.clear()
        ids, n = p["ids"], len(p["ids"])
        mtp.process(mtp.ctx_t, ids, list(range(n)))
        first = int(np.argmax(mtp.logits(mtp.ctx_t, n - 1)))
        drafts, rows = mtp.draft(first, mtp.hidden(mtp.ctx_t, n - 1), n)
        # the target verifies [first, *drafts] at n..n+N_DRAFT; greedy acceptance, then rollback
        mtp.process(mtp.ctx_t, [first] + drafts, list(range(n, n + N_DRAFT + 1)))
        verify = [mtp.logits(mtp.ctx_t, j) for j in range(N_DRAFT + 1)]
        accepted = 0
        while accepted < N_DRAFT and int(np.argmax(verify[accepted])) == drafts[accepted]:
            accepted += 1
        after = int(np.argmax(verify[accepted]))
        h = mtp.hidden(mtp.ctx_t, accepted)
        mtp.rewind(n + 1 + accepted)
        drafts2, rows2 = mtp.draft(after, h, n + 1 + accepted)
        arrays[f"p{i}_draft1"] = np.stack(rows).astype(np.float16)
        arrays[f"p{i}_verify"] = np.stack(verify).astype(np.float16)
        arrays[f"p{i}_draft2"] = np.stack(rows2).astype(np.float16)
        ref["prompts"].append({"ids": ids, "first": first, "drafts": drafts, "accepted": accepted, "next": after,
                               "drafts2": drafts2, "keys": [f"p{i}_draft1", f"p{i}_verify", f"p{i}_draft2"]})
    return ref, arrays


def vocab_reference(family: str, vocab_file: str, src: Path, work: Path) -> dict:
    """Token ids under the full real vocabulary, from a vocabulary-only GGUF llama.cpp loads."""
    from gguf import GGUFReader, GGUFWriter
    from llama_cpp import Llama
    meta = real_vocab.vocab_metadata(family)
    path = work / f"vocab-{family}.gguf"
    arch = "llama" if family == "llama3" else "qwen2"
    w = GGUFWriter(str(path), arch)
    for key, value in ((f"{arch}.block_count", 1), (f"{arch}.context_length", 4096), (f"{arch}.embedding_length", 64),
                       (f"{arch}.feed_forward_length", 128), (f"{arch}.attention.head_count", 1)):
        w.add_uint32(key, value)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
    w.add_string("tokenizer.ggml.model", meta["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", meta["tokenizer.ggml.pre"])
    w.add_token_list(meta["tokenizer.ggml.tokens"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_token_merges(meta["tokenizer.ggml.merges"])
    w.add_bos_token_id(meta["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(meta["tokenizer.ggml.eos_token_id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    llm = Llama(str(path), vocab_only=True, verbose=False)
    strings = reference_strings(src, vocab_file)
    ref = {"family": family, "pre": meta["tokenizer.ggml.pre"], "n_vocab": len(meta["tokenizer.ggml.tokens"]),
           "tokenize": tokenize(llm, strings, False), "tokenize_special": tokenize(llm, strings, True)}
    theirs = src / "models" / vocab_file
    if theirs.is_file():
        r = GGUFReader(str(theirs))
        tokens = r.fields["tokenizer.ggml.tokens"].contents()
        merges = r.fields["tokenizer.ggml.merges"].contents()
        n_normal = sum(1 for t in meta["tokenizer.ggml.token_type"] if t == real_vocab.NORMAL)
        ref["llama_cpp_vocab_file"] = {
            "file": f"models/{vocab_file}",
            "normal_tokens_equal": tokens[:n_normal] == meta["tokenizer.ggml.tokens"][:n_normal],
            "merges_equal": merges == meta["tokenizer.ggml.merges"], "n_merges": len(merges)}
    del llm
    return ref


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--llama-src", type=Path, required=True, help="llama.cpp's source directory")
    p.add_argument("--only", nargs="*", help="architectures or vocabularies to redo (default: all)")
    args = p.parse_args()
    import llama_cpp
    print(f"llama-cpp-python {llama_cpp.__version__}")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for arch in tiny_models.SPECS:
            if args.only and arch not in args.only:
                continue
            ref, arrays = model_reference(arch, work)
            ref["llama_cpp_python"] = llama_cpp.__version__
            (OUT / f"{arch}.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            np.savez_compressed(OUT / f"{arch}.npz", **arrays)
            print(arch, "greedy", [q["greedy_ids"] for q in ref["prompts"]])
        if not args.only or "gemma4-assistant" in args.only:
            ref, arrays = assistant_reference(work)
            ref["llama_cpp_python"] = llama_cpp.__version__
            (OUT / "gemma4-assistant.json").write_text(json.dumps(ref, indent=1) + "\n", encoding="utf-8")
            np.savez_compressed(OUT / "gemma4-assistant.npz", **arrays)
            print("gemma4-assistant drafts", [(q["drafts"], q["accepted"], q["drafts2"]) for q in ref["prompts"]])
        for family, vocab_file in (("qwen2", "ggml-vocab-qwen2.gguf"), ("qwen35", "ggml-vocab-qwen35.gguf"),
                                   ("llama3", "ggml-vocab-llama-bpe.gguf")):
            if args.only and family not in args.only:
                continue
            ref = vocab_reference(family, vocab_file, args.llama_src, work)
            ref["llama_cpp_python"] = llama_cpp.__version__
            (OUT / f"vocab-{family}.json").write_text(json.dumps(ref, indent=1, ensure_ascii=False) + "\n",
                                                      encoding="utf-8")
            print("vocab", family, len(ref["tokenize"]), "strings", ref.get("llama_cpp_vocab_file"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
