"""`framework split`: where every node of the plan runs, why, and what it costs.

    framework split -m MODEL --backends example:0,cpu -o plan.html     # interactive page
    framework split --backends example:0,cpu --phase decode           # terminal summary
    framework split ... -o plan.svg | plan.dot | plan.json | plan.txt

The plan is the one `framework check` reserves. When reservation fails, the plans that can still be
made are shown with the error on the node, tensor or device it names, and the exit status is 1.
`write_run_view` writes the view of the plans a session ran (`framework run --plan-view FILE`).
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape

from ..exit_codes import EXIT_CAPABILITY
from ..terminal import err, out, select_devices
from .common import check_output, fail, load_model, memory_caps


def run_split(args) -> int:
    from ..runtime.session import Session
    from ..viz import GraphvizMissing, PlanView, render_text, write_view

    devices = select_devices(args.backends, args.device_profile)
    target = check_output(args.output, "-o") if args.output and args.output != "-" else None
    if target is not None and not target.suffix:
        return fail(f"-o {target}: name the file .html, .svg, .dot, .json or .txt (the extension picks the format)")
    model = load_model(args.model)
    session = Session(model, devices, n_ctx=args.ctx, n_batch=args.batch, strict=args.strict,
                      kv_device=args.kv_device, memory_caps=memory_caps(args.device_memory))
    from .draft import speculative_decoder
    decoder = speculative_decoder(args, session, devices)
    view = (PlanView.from_decoder(decoder, args.prompt_tokens, args.n_predict, args.phase) if decoder is not None
            else PlanView.from_session(session, args.prompt_tokens, args.n_predict, args.phase))
    if target is None:
        out(render_text(view))
    else:
        try:
            write_view(view, target)
        except GraphvizMissing as e:
            return fail(str(e))
        err.print(f"{len(view.plans)} plan(s) of {model.name} written to {target}")
    if view.error is not None:
        e = view.error
        where = ", ".join(x for x in (e.node, e.tensor) if x) or ", ".join(e.devices)
        err.print(f"[red]reservation failed[/red] {escape(f'[{e.code}]')}: the view marks where ({escape(where)})",
                  soft_wrap=True)
        return EXIT_CAPABILITY
    return 0


def write_run_view(session, path: Path, decoder=None) -> None:
    """The view of the plans that ran, with the time measured per fragment (or per device)."""
    from ..viz import GraphvizMissing, PlanView, write_view
    view = PlanView.after_run(session) if decoder is None else PlanView.after_run_pair(decoder)
    try:
        write_view(view, path)
    except GraphvizMissing as e:
        err.print(f"[yellow]{e}[/yellow]", soft_wrap=True)
        return
    err.print(f"plan view written to {path}")
