"""`framework run -cnv` (--conversation, --interactive): llama-cli's conversation mode.

    framework run -m smollm2 -cnv                          # a message a line; /clear, /exit, Ctrl-D
    printf 'Hi\\nAnd in French?\\n' | framework run -m smollm2 -cnv -n 32

Every message is answered in the model's chat template with the whole conversation so far. The
session keeps what it has computed: a turn evaluates only the tokens after the longest prefix the
cache already holds (a model with recurrent state, which cannot be rewound, starts again from the
first token). The prompt argument (or -f FILE), when given, is the system prompt.
"""

from __future__ import annotations

import sys

from rich.markup import escape

from ..terminal import err, out

PROMPT = "> "


def chat_template(model, option: str) -> str:
    """The model's chat template; on a base model (none in its file) the built-in one, with a note saying
    what to expect."""
    from ..model.chat import chat_template_for
    template, source = chat_template_for(model.file.metadata, model.arch.name)
    if "built-in" in source:
        from ..model.default import CATALOG
        chat_models = ", ".join(f"-m {m.name}" for m in CATALOG if m.chat)
        err.print(f"[yellow]note: {escape(model.file.path.name)} has no chat template: it is a base model, trained to "
                  f"continue text rather than to answer. {option} wraps the prompt in {escape(source)} anyway; expect "
                  f"a continuation or repetition, not an answer. A model with its own template: {chat_models}"
                  f"[/yellow]", soft_wrap=True)
    return template


def converse(session, args, sampler) -> tuple[int, bool]:
    """Answer the messages read from stdin until its end or /exit. Returns the tokens generated over all
    replies, and whether a Ctrl-C cut a reply short."""
    from ..model.chat import chat_prompt_ids
    from ..runtime.generate import generate
    from ..runtime.context import ContextFullError
    tok = session.model.tokenizer
    template = chat_template(session.model, "-cnv")
    system = [{"role": "system", "content": args.prompt}] if args.prompt else []
    history: list[dict] = []
    context: list[int] = []          # the conversation's ids; the session holds the first n_past of them
    generated, interrupted = 0, False
    tty = sys.stdin.isatty()
    if tty:
        err.print("conversation: a message a line; /clear forgets the conversation, /exit or Ctrl-D ends it",
                  soft_wrap=True)
    while (message := _read_message(tty)) is not None:
        if message == "/clear":
            history.clear()
            err.print("(the conversation is forgotten)", soft_wrap=True)
            continue
        history.append({"role": "user", "content": message})
        ids = chat_prompt_ids(tok, template, system + history)
        keep = _reuse(session, context, ids)
        reply: list[int] = []
        text = []
        try:
            for piece in generate(session, ids[keep:], args.n_predict, sampler, tok.eog_ids):
                out(piece.text)
                reply.append(piece.token)
                text.append(piece.text)
        except KeyboardInterrupt:           # Ctrl-C ends the reply, not the conversation
            interrupted = True
        except ContextFullError as e:
            history.pop()
            session.reset()
            context = []
            err.print(f"[red]error:[/red] {escape(str(e))}; this message is dropped: /clear starts afresh",
                      soft_wrap=True)
            continue
        out("\n")
        generated += len(reply)
        context = ids + reply
        history.append({"role": "assistant", "content": "".join(text)})
    return generated, interrupted


def _read_message(tty: bool) -> str | None:
    """The next message; None at the end of input or /exit. Blank lines are skipped."""
    while True:
        try:
            line = input(PROMPT) if tty else sys.stdin.readline()
        except (EOFError, KeyboardInterrupt):      # Ctrl-D or Ctrl-C at the prompt ends the conversation
            return None
        if not tty and not line:
            return None
        line = line.strip()
        if line == "/exit":
            return None
        if line:
            return line


def _reuse(session, context: list[int], ids: list[int]) -> int:
    """Keep the longest prefix of ``ids`` the session already holds, at least one token short of all of
    them (the last one's logits start the reply); returns its length."""
    cached = context[:session.n_past]
    n = 0
    while n < min(len(cached), len(ids) - 1) and cached[n] == ids[n]:
        n += 1
    if n < session.n_past:
        if session.model.arch.recurrent:     # its state cannot be rewound: start again
            session.reset()
            return 0
        session.rewind(n)
    return n
