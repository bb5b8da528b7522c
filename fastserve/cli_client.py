"""`fastserve generate`, `fastserve chat` and `fastserve status`: use a running scheduler.

stdout carries only what was asked for (generated text, the status table or its JSON), so
the output pipes cleanly; prompts, usage figures and errors go to stderr. Errors print as
``error: <CODE>: <details>`` and exit 1 (2 for INVALID_ARGUMENT, 130 after Ctrl-C).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from fastserve.client import Client, Completion
    from fastserve.errors import FastServeError

STATUS_TIMEOUT_S = 10.0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Register the generate, chat and status commands."""
    conn = argparse.ArgumentParser(add_help=False)
    conn.add_argument("--address", default=None,
                      help="scheduler HOST:PORT (default $FASTSERVE_ADDRESS or 127.0.0.1:50051)")
    conn.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    conn.add_argument("--api-key", default=None,
                      help="API key for a scheduler started with --api-keys "
                           "(default $FASTSERVE_API_KEY)")
    conn.add_argument("--tls-ca", default=None, metavar="PEM",
                      help="CA that signed the scheduler's certificate, for TLS "
                           "(default $FASTSERVE_TLS_CA; none: plaintext)")
    sampling = argparse.ArgumentParser(add_help=False)
    sampling.add_argument("--max-tokens", type=int, default=None)
    sampling.add_argument("--temperature", type=float, default=None, help="0 = greedy")
    sampling.add_argument("--top-p", type=float, default=None)
    sampling.add_argument("--top-k", type=int, default=None)
    sampling.add_argument("--seed", type=int, default=None)
    sampling.add_argument("--stop", action="append", default=None, metavar="STR",
                          help="stop before this string (repeatable)")
    sampling.add_argument("--ignore-eos", action="store_true", help="generate past end-of-text")
    sampling.add_argument("-v", "--verbose", action="store_true",
                          help="print usage and finish reason to stderr")

    gen = sub.add_parser("generate", parents=[conn, sampling],
                         help="stream one completion to stdout")
    gen.add_argument("prompt")
    form = gen.add_mutually_exclusive_group()
    form.add_argument("--chat", dest="raw", action="store_false",
                      help="send the prompt as one user chat message (the default)")
    form.add_argument("--raw", dest="raw", action="store_true",
                      help="send the prompt as plain text, no chat template (completion)")
    gen.set_defaults(func=run_generate, raw=False)

    chat = sub.add_parser("chat", parents=[conn, sampling],
                          help="interactive chat on stdin/stdout (/reset, /exit)")
    chat.add_argument("--system", default=None, help="system message")
    chat.set_defaults(func=run_chat)

    status = sub.add_parser("status", parents=[conn], help="show the scheduler's state")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=run_status)


def run_generate(args: argparse.Namespace) -> int:
    from fastserve.client import Client
    from fastserve.errors import FastServeError, InvalidArgument

    chat: dict[str, Any] = {"messages": [{"role": "user", "content": args.prompt}]}
    raw: dict[str, Any] = {"prompt": args.prompt}
    with Client(args.address, timeout=args.timeout, api_key=args.api_key,
                tls_ca=args.tls_ca) as client:
        try:
            try:
                completion = _answer(client, sys.stdout, **(raw if args.raw else chat),
                                     **_sampling(args))
            except InvalidArgument as e:
                # A base model without a chat template: the prompt is plain text after all.
                if args.raw or "no chat template" not in e.details:
                    raise
                completion = _answer(client, sys.stdout, **raw, **_sampling(args))
        except FastServeError as e:
            return _fail(e)
        except KeyboardInterrupt:
            return 130
    return _finish(completion, args.verbose)


def run_chat(args: argparse.Namespace) -> int:
    """A read-eval loop: each line is a user turn; the answer streams to stdout."""
    from fastserve.client import Client
    from fastserve.errors import FastServeError

    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    interactive = sys.stdin.isatty()
    exit_code = 0
    with Client(args.address, timeout=args.timeout, api_key=args.api_key,
                tls_ca=args.tls_ca) as client:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            try:
                line = sys.stdin.readline()
            except KeyboardInterrupt:
                line = ""
            if not line or line.strip() == "/exit":  # EOF or /exit
                if interactive and not line:
                    print(file=sys.stderr)
                return exit_code
            text = line.strip()
            if text == "/reset":
                messages = list(system)
                if interactive:
                    print("(conversation cleared)", file=sys.stderr)
                continue
            if not text:
                continue
            if text.startswith("/"):
                print("commands: /reset, /exit", file=sys.stderr)
                continue
            messages.append({"role": "user", "content": text})
            completion = None
            try:
                completion = _answer(client, sys.stdout, messages=messages, **_sampling(args))
                code = _finish(completion, args.verbose)
            except FastServeError as e:
                code = _fail(e)
            except KeyboardInterrupt:  # stops this answer, not the chat
                code = 0
            if code == 0 and completion is not None:
                messages.append({"role": "assistant", "content": completion.text})
            else:
                messages.pop()  # a failed or interrupted turn is not part of the conversation
                exit_code = exit_code or code


def run_status(args: argparse.Namespace) -> int:
    from fastserve.client import Client
    from fastserve.errors import FastServeError

    with Client(args.address, timeout=args.timeout or STATUS_TIMEOUT_S,
                api_key=args.api_key, tls_ca=args.tls_ca) as client:
        try:
            status = client.status()
        except FastServeError as e:
            return _fail(e)
    print(json.dumps(status, indent=2) if args.json else format_status(status))
    return 0


def format_status(status: dict) -> str:
    """Render a ``Client.status()`` dict as a readable table."""
    waiting = f"{status.get('num_waiting', 0)} waiting"
    if status.get("max_waiting"):
        waiting += f" (max {status['max_waiting']})"
    queues = ", ".join(f"{q.get('name', '?')} {q.get('num_jobs', 0)}"
                       for q in status.get("queues", [])) or "-"
    lines = [
        f"model     {status.get('model') or '-'}",
        f"policy    {status.get('policy') or '-'}",
        (f"requests  {status.get('num_running', 0)} running, {waiting}, "
         f"{status.get('num_finished', 0)} finished"),
        f"queues    {queues}",
    ]
    rows = [("WORKER", "STATE", "HEALTHY", "KV BLOCKS USED", "ITERATIONS")]
    errors: list[str] = []
    predictors: list[str] = []
    for w in status.get("workers", []):
        used = 100 * float(w.get("kv_usage", 0.0))
        kv = f"{w.get('num_used_blocks', 0)}/{w.get('num_blocks', 0)} ({used:.1f}%)"
        rows.append((w.get("address", "?"), w.get("state", "?"),
                     "yes" if w.get("healthy") else "no", kv, str(w.get("num_iterations", 0))))
        if w.get("error"):
            errors.append(f"  {w.get('address', '?')}: {w['error']}")
        if w.get("predictor"):
            predictors.append(f"  {w.get('address', '?')}: {w['predictor']}; "
                              f"{w.get('num_predicted', 0)} answers predicted, MAE "
                              f"{float(w.get('prediction_mae_tokens', 0.0)):.1f} tokens, "
                              f"{w.get('num_probes', 0)} estimated at arrival")
    if len(rows) == 1:
        return "\n".join([*lines, "workers   none"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join([*lines, "", *table,
                      *(["", "length predictors:", *predictors] if predictors else []),
                      *(["", "worker errors:", *errors] if errors else [])])


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p,
        "top_k": args.top_k, "seed": args.seed, "stop": args.stop, "ignore_eos": args.ignore_eos,
    }


def _answer(client: Client, out: TextIO, **request: Any) -> Completion | None:
    """Stream one answer's text to ``out``, end it with a newline; return its Completion.

    Leaving early (an error, Ctrl-C) cancels the request and still ends any text with a newline.
    """
    wrote = False
    try:
        with client.stream(**request) as stream:
            for chunk in stream:
                if chunk.text:
                    out.write(chunk.text)
                    out.flush()
                    wrote = True
    except BaseException:
        if wrote:
            out.write("\n")
            out.flush()
        raise
    out.write("\n")
    out.flush()
    return stream.completion


def _finish(completion: Completion | None, verbose: bool) -> int:
    """Report how a streamed answer ended (stderr); return the exit code."""
    if completion is None:
        print("error: UNKNOWN: the stream ended without a final message", file=sys.stderr)
        return 1
    if verbose:
        u = completion.usage
        print(f"[{completion.finish_reason}] {u.prompt_tokens} prompt + {u.completion_tokens} "
              f"completion tokens; queue {u.queue_time_s:.3f} s, first token "
              f"{u.time_to_first_token_s:.3f} s, total {u.total_time_s:.3f} s", file=sys.stderr)
    if completion.finish_reason == "error":
        print(f"error: INTERNAL: {completion.error or 'generation failed'}", file=sys.stderr)
        return 1
    if completion.finish_reason == "cancelled":
        print(f"error: CANCELLED: request {completion.request_id} was cancelled", file=sys.stderr)
        return 1
    return 0


def _fail(e: FastServeError) -> int:
    import grpc

    print(f"error: {e.code.name}: {e.details}", file=sys.stderr)
    return 2 if e.code == grpc.StatusCode.INVALID_ARGUMENT else 1
