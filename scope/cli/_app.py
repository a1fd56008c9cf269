"""The argument parser and ``main``: dispatch, exit statuses and one-line errors."""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Final, NoReturn

from scope import __version__
from scope.cli._errors import CLIError
from scope.errors import InvalidConversationIDError, ScopeError
from scope.history import ConversationID

__all__ = ["build_parser", "main"]

_PROG: Final = "scope"

_STORE_HELP: Final = (
    "history store URL: sqlite:///relative.db, sqlite:////absolute/path.db, "
    "postgresql://USER@HOST/DB or redis://HOST:PORT/N (default: $SCOPE_STORE)"
)

_EPILOG: Final = """\
exit status: 0 success, 1 runtime failure, 2 usage error, 130 interrupted.
Errors are printed as one line: "scope: error: ...".
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``scope: error:`` line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{_PROG}: error: {message} (see '{self.prog} --help')\n")


def _conversation_id(value: str) -> str:
    try:
        return str(ConversationID(value))
    except InvalidConversationIDError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(minimum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {number}")
        return number

    return parse


def _number(*, positive: bool) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            rule = "> 0" if positive else ">= 0"
            raise argparse.ArgumentTypeError(f"must be a finite number {rule}, got {value!r}")
        return number

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The ``scope`` argument parser."""
    parser = _Parser(
        prog=_PROG,
        description="scope: provider-neutral chat with a history that never loses, "
        "duplicates or resurrects a turn.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="run a scripted, offline conversation through the whole stack",
        description="Stream a scripted three-turn conversation (with a parallel tool call) "
        "through the history middleware into a real store, then show the stored history, "
        "a retried batch landing once and a CommitError recovered without calling the "
        "model again. Every step checks its claim: exit status 0 means all held.",
    )
    demo.add_argument(
        "--store",
        metavar="URL",
        help="history store URL (default: a new SQLite file in a fresh temporary directory)",
    )

    chat = commands.add_parser(
        "chat",
        help="chat in the terminal with an OpenAI-compatible, Anthropic or Gemini model, "
        "keeping history",
        description="Read messages from stdin, stream the answers, keep the conversation in "
        "a history store. /exit or end of input quits. Needs the openai (or anthropic, "
        "gemini) extra. The API key is read from $OPENAI_API_KEY, or $ANTHROPIC_API_KEY "
        "with --provider anthropic, $GEMINI_API_KEY with --provider gemini.",
    )
    chat.add_argument(
        "--provider",
        choices=["openai", "anthropic", "gemini", "openai-responses"],
        default="openai",
        help="openai: any OpenAI-compatible Chat Completions server (default); anthropic: "
        "the Anthropic Messages API; gemini: the Gemini API; openai-responses: the OpenAI "
        "Responses API (OpenAI and the Open Responses servers)",
    )
    chat.add_argument(
        "--model",
        metavar="NAME",
        default=os.environ.get("SCOPE_MODEL") or None,
        help="model name (default: $SCOPE_MODEL, else gpt-4o-mini, or claude-sonnet-4-5 "
        "with --provider anthropic, gemini-2.5-flash with --provider gemini, gpt-5-mini with "
        "--provider openai-responses)",
    )
    chat.add_argument(
        "--base-url",
        metavar="URL",
        help="API base URL, e.g. http://localhost:11434/v1 (default: $OPENAI_BASE_URL, else "
        "https://api.openai.com/v1; with --provider anthropic, without /v1: "
        "$ANTHROPIC_BASE_URL, else https://api.anthropic.com)",
    )
    chat.add_argument(
        "--store",
        metavar="URL",
        help="history store URL (default: $SCOPE_STORE, else "
        "sqlite:///$XDG_DATA_HOME/scope/chat.sqlite3, i.e. ~/.local/share/scope/chat.sqlite3)",
    )
    chat.add_argument(
        "--conversation",
        metavar="ID",
        type=_conversation_id,
        help="resume this conversation (default: start a new one with a random id)",
    )
    chat.add_argument("--system", metavar="TEXT", help="a system prompt sent with every turn")

    bench = commands.add_parser(
        "bench",
        help="measure canonical encoding, digests and decoding against the JSON floors",
        description="Measure what scope's canonical encoding (first and cached), Batch "
        "digests and validated decoding cost on a workload, next to the plain JSON floors "
        "measured in the same run (orjson.dumps with sorted keys, json.dumps(sort_keys="
        "True), RFC 8785 via rfc8785 when installed, orjson.loads). The workload is the "
        "built-in standard turn, or up to N conversations of an export file or a store "
        "(only read). Prints min and median per message and per batch, sizes and the "
        "ratio to each floor; a progress counter goes to stderr when it is a terminal.",
    )
    source = bench.add_mutually_exclusive_group()
    source.add_argument(
        "--store",
        metavar="URL",
        help="measure stored conversations of this store (sqlite:///relative.db, "
        "postgresql://USER@HOST/DB, redis://HOST:PORT/N; only read)",
    )
    source.add_argument(
        "--file", metavar="EXPORT.jsonl", help="measure the conversations of an export file"
    )
    bench.add_argument(
        "--conversations",
        metavar="N",
        type=_count(1),
        default=100,
        help="measure at most N conversations of --store or --file (default: 100)",
    )
    bench.add_argument("--json", metavar="OUT", dest="json_out", help="write the result here")
    bench.add_argument(
        "--compare",
        metavar="BASELINE.json",
        help="compare with an earlier --json result; exit 1 when a scope operation got "
        "slower by more than --threshold",
    )
    bench.add_argument(
        "--threshold",
        metavar="PERCENT",
        type=_number(positive=True),
        default=10.0,
        help="how much slower per message --compare tolerates (default: 10)",
    )
    bench.add_argument(
        "--repeats",
        metavar="N",
        type=_count(1),
        default=7,
        help="timed repeats per measurement (default: 7)",
    )
    bench.add_argument(
        "--warmup",
        metavar="N",
        type=_count(0),
        default=1,
        help="untimed repeats before them (default: 1)",
    )
    bench.add_argument(
        "--min-time",
        metavar="SECONDS",
        type=_number(positive=False),
        default=0.05,
        help="the least time one repeat runs: passes over the workload are added until it "
        "does (default: 0.05)",
    )

    history = commands.add_parser(
        "history",
        help="list, show, inspect, export, import, clear, erase, expire, verify, compact "
        "stored conversations, list their branches, rewind or switch them, or migrate a store",
        description="Inspect and move stored conversations.",
    )
    store_parent = _Parser(add_help=False)
    store_parent.add_argument(
        "--store", metavar="URL", default=os.environ.get("SCOPE_STORE") or None, help=_STORE_HELP
    )
    no_create = _Parser(add_help=False)
    no_create.add_argument(
        "--no-create",
        action="store_true",
        help="open the store without creating or upgrading its schema (no DDL: a role "
        "that may only read and write rows runs it)",
    )
    actions = history.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser(
        "list",
        parents=[store_parent, no_create],
        help="print the open conversation ids, one per line",
        description="Print every open (not cleared) conversation id, one per line, in "
        "lexical order.",
    )
    show = actions.add_parser(
        "show",
        parents=[store_parent],
        help="print one conversation",
        description="Print a conversation readably: each message with its role, text, "
        "reasoning, tool calls and results, media as mime type and size or URI, and "
        "metadata. Each batch (one appended turn) starts with its receipt, a line "
        "'batch <append id>  <digest>', when the store can list its batches (every "
        "bundled store can); messages are numbered across batches. With --json, print the "
        "conversation as one JSON line in the export format (no receipts).",
    )
    show.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    show.add_argument("--json", action="store_true", help="print one canonical JSON line")
    inspect = actions.add_parser(
        "inspect",
        parents=[store_parent],
        help="print a conversation's tree of batches (every branch)",
        description="Print a conversation as the tree of batches it is: every batch of "
        "every branch under the batch it follows, in stored order, with its message count, "
        "when it was stored and its digest (shortened), the head marked '<- head'; then "
        "the chain digest of each path. 'show' prints the head path's messages.",
    )
    inspect.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    branches = actions.add_parser(
        "branches",
        parents=[store_parent],
        help="list a conversation's branches",
        description="Print each branch of a conversation, one line each (stored order of "
        "their last batch): '*' for the current one (the head path), its last batch's "
        "append id ('(start)' for the empty path), its turns, the turn where it diverges "
        "from the head path, when its last batch was stored and its chain digest.",
    )
    branches.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    rewind = actions.add_parser(
        "rewind",
        parents=[store_parent],
        help="move a conversation's head back to the end of a turn",
        description="Move the head of a conversation to the end of turn N of its head "
        "path (0: before the first turn); the next turn extends from there. Nothing is "
        "deleted: the turns after N stay on their branch (scope history branches). "
        "With --expected-head the move happens only while the head is that batch "
        "(another turn stored meanwhile: exit 1, nothing moved).",
    )
    rewind.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    rewind.add_argument(
        "--to", metavar="N", type=_count(0), required=True, help="the turn to end at (0: none)"
    )
    rewind.add_argument(
        "--expected-head",
        metavar="APPEND_ID",
        default=None,
        help="move only while the head is this batch ('' before the first batch)",
    )
    switch = actions.add_parser(
        "switch",
        parents=[store_parent],
        help="make another branch of a conversation its head",
        description="Make the branch that ends at batch APPEND_ID (an append id as "
        "'scope history branches' lists it, on any branch; '' for the empty path) the "
        "head of a conversation; the next turn extends it. Nothing is deleted: the branch "
        "it leaves stays listed. With --expected-head the move happens only while the "
        "head is that batch (another turn stored meanwhile: exit 1, nothing moved).",
    )
    switch.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    switch.add_argument(
        "--to", metavar="APPEND_ID", required=True, help="the batch the branch ends at"
    )
    switch.add_argument(
        "--expected-head",
        metavar="APPEND_ID",
        default=None,
        help="move only while the head is this batch ('' before the first batch)",
    )
    export = actions.add_parser(
        "export",
        parents=[store_parent, no_create],
        help="write the whole store as JSON Lines (export format version 3)",
        description="Write every conversation the store lists (one rewound to its start "
        "too) as one JSON line after a header line: its whole tree (every batch of every "
        "branch with its append id, parent, digest and stored time; the head; recorded "
        "moves), its owner and its retention (docs/cli.md, Export format). To stdout or "
        "--output FILE (written under a temporary name and renamed when complete). A "
        "progress counter goes to stderr when it is a terminal. A conversation that "
        "cannot be written (corrupt records, cleared after the listing) is left out and "
        "named on stderr; the others are exported (exit status 1).",
    )
    export.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    import_ = actions.add_parser(
        "import",
        parents=[store_parent],
        help="restore the conversations of an export file",
        description="Restore each conversation of FILE (- for stdin). The whole file is "
        "validated first: a malformed line aborts before anything is written. A version 3 "
        "(or 2) file restores the tombstones of erased conversations (into an empty store), "
        "closed conversations with their owners, and every branch, the head, recorded "
        "moves, owner and retention of the others, each "
        "batch under its original append id (retries get the original receipts) with its "
        "original stored time; every "
        "step is idempotent, so importing twice is a no-op and an import cut short "
        "finishes when run again. A conversation the store contradicts (other messages, "
        "parent or owner, or closed) is named on stderr and left as it is; the others "
        "are imported (exit status 1). An old-format file (no header, one "
        '{"conversation_id", "messages"} line per conversation) appends each line as one '
        "batch under an append id derived from the conversation id.",
    )
    import_.add_argument("file", metavar="FILE")
    clear = actions.add_parser(
        "clear",
        parents=[store_parent],
        help="close a conversation for ever",
        description="Clear a conversation: its messages are deleted and the id is closed "
        "for ever (later appends fail). Asks for confirmation on a terminal; without a "
        "terminal, or at end of input, the answer is no.",
    )
    clear.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    clear.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    verify = actions.add_parser(
        "verify",
        parents=[store_parent],
        help="check every stored batch: digest, canonical bytes, decodable messages, and "
        "every branch's chain digest",
        description="Read every stored batch record (or those of the conversations named) "
        "and check what a read checks: the digest matches the stored bytes, the bytes are "
        "the canonical encoding and every message decodes; then, for each conversation "
        "whose records are sound, the chain digest of every path (branch), recomputed "
        "from its messages. Prints one 'scope: error:' line "
        "per bad conversation (its id, each bad batch or path and what failed) and a summary; exit "
        "status 1 when anything is wrong. Read-only: the store is opened without creating "
        "anything (a role that may only SELECT runs it), and records are streamed in pages.",
    )
    verify.add_argument("conversation", metavar="CONVERSATION", nargs="*", type=_conversation_id)
    verify.add_argument(
        "--erased",
        metavar="RECEIPT_FILE",
        help="instead, check the erasure receipts in RECEIPT_FILE (- for stdin; one JSON "
        "receipt per line, as scope history erase prints them): each tombstone is in the "
        "store and no stored conversation id hashes to it",
    )
    verify.add_argument(
        "--against",
        metavar="URL",
        help="then compare with the store at URL (an export's source and its import, say): "
        "every conversation either lists must have the same batches (append id, digest, "
        "parent: the same chain digest on every path) stored at the same times, head, "
        "owner, recorded moves and expiry; one error line per conversation that differs "
        "(exit status 1)",
    )
    erase_ = actions.add_parser(
        "erase",
        parents=[store_parent],
        help="erase a conversation (or every conversation of an owner), with a receipt",
        description="Erase a conversation: every batch of every branch, its dedupe, lease "
        "and move records, expiry and owner are deleted and the id is closed for ever; "
        "only a tombstone (a keyed hash of the id) remains. With --owner, every "
        "conversation of that owner (open, cleared or expired), page by page; running it "
        "again after an interruption finishes the job. Prints one JSON erasure receipt per "
        "erased conversation on stdout: keep them, and check them later with scope "
        "history verify --erased FILE. Asks for confirmation on a terminal; without a "
        "terminal, or at end of input, the answer is no. What stays on disk until the "
        "database compacts: see docs/retention.md.",
    )
    erase_.add_argument("conversation", metavar="CONVERSATION", nargs="?", type=_conversation_id)
    erase_.add_argument("--owner", metavar="OWNER", help="erase every conversation of OWNER")
    erase_.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    expire = actions.add_parser(
        "expire",
        parents=[store_parent],
        help="remove expired conversations",
        description="Remove the conversations whose retention ran out (they already read as "
        "closed): their batches and records are deleted and each id stays closed. Removes "
        "them all, 1000 at a time, or at most --limit N.",
    )
    expire.add_argument(
        "--limit", metavar="N", type=_count(1), default=None, help="remove at most N"
    )
    compact = actions.add_parser(
        "compact",
        parents=[store_parent],
        help="summarise the older turns of a conversation with a model",
        description="Ask a model for a summary of everything before the last "
        "--keep-turns turns (the previous summary included) and append it as one system "
        "message marked scope/compaction. Nothing is rewritten or deleted: export and "
        "show keep every message; windows (WindowReader) replay the summary instead of "
        "what it covers. Appending is fenced and idempotent: a turn landing meanwhile "
        "makes it start over, and running it twice compacts once. The API key is read "
        "as for scope chat.",
    )
    compact.add_argument("conversation", metavar="CONVERSATION", type=_conversation_id)
    summarizer = compact.add_mutually_exclusive_group()
    summarizer.add_argument(
        "--provider",
        choices=["openai", "anthropic", "gemini", "openai-responses"],
        default=None,
        help="the summarizer's API, as for scope chat (default: openai)",
    )
    summarizer.add_argument(
        "--summarizer",
        metavar="MODULE:ATTR",
        help="a Python model to summarise with instead of a provider: ATTR of the importable "
        "MODULE, a scope.chat Model or a class of one made without arguments "
        "(scope.testing:offline_summarizer summarises offline, first lines only)",
    )
    compact.add_argument(
        "--model",
        metavar="NAME",
        help="the summarizer model (default: $SCOPE_MODEL, else scope chat's default for "
        "the provider)",
    )
    compact.add_argument("--base-url", metavar="URL", help="API base URL, as for scope chat")
    compact.add_argument(
        "--keep-turns",
        metavar="N",
        type=_count(0),
        default=2,
        help="whole turns kept verbatim after the summary (default: 2)",
    )
    actions.add_parser(
        "migrate",
        parents=[store_parent],
        help="create or upgrade the store's schema",
        description="Create the store's tables when missing, or upgrade a schema written by "
        "an older scope in place (SQLite, PostgreSQL; Redis has no schema). Run it as a "
        "role allowed to change the schema; services can then open the store with "
        "create=False and a role that holds only SELECT, INSERT, UPDATE, DELETE and "
        "EXECUTE.",
    )
    return parser


def _history(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from scope.cli import _history as h
    from scope.cli._stores import check_sqlite_location

    url: str | None = args.store
    if not url:
        parser.exit(
            2,
            f"{_PROG}: error: scope history {args.action} needs --store URL (or $SCOPE_STORE)\n",
        )
    action: str = args.action
    # list and export name skipped invalid ids on stderr themselves (one "scope: error:"
    # line each): keep the stores' log warnings off stderr (logging's last resort).
    stores_logger = logging.getLogger("scope.historystores")
    if not any(isinstance(h, logging.NullHandler) for h in stores_logger.handlers):
        stores_logger.addHandler(logging.NullHandler())
    # Reading commands never create a store: a mistyped SQLite path is refused, not
    # turned into a new empty file. Every command names a missing directory.
    check_sqlite_location(
        url,
        must_exist=action
        in ("list", "show", "export", "verify", "inspect", "branches", "erase", "expire"),
    )
    if action == "list":
        return asyncio.run(
            h.list_conversations(url, sys.stdout, stderr=sys.stderr, create=not args.no_create)
        )
    if action == "show":
        return asyncio.run(
            h.show_conversation(url, args.conversation, as_json=args.json, out=sys.stdout)
        )
    if action == "export":
        return asyncio.run(
            h.export_conversations(
                url,
                args.output,
                stdout=sys.stdout.buffer,
                stderr=sys.stderr,
                create=not args.no_create,
            )
        )
    if action in ("erase", "expire") or (action == "verify" and args.erased is not None):
        return _erasure(args, url, parser)
    if action == "verify":
        from scope.cli._verify import verify_store

        if args.against is not None:
            from scope.cli._compare import compare_stores

            async def verify_and_compare() -> int:
                status = await verify_store(
                    url, args.conversation, stdout=sys.stdout, stderr=sys.stderr
                )
                return max(
                    status,
                    await compare_stores(
                        url, args.against, args.conversation, stdout=sys.stdout, stderr=sys.stderr
                    ),
                )

            return asyncio.run(verify_and_compare())
        return asyncio.run(
            verify_store(url, args.conversation, stdout=sys.stdout, stderr=sys.stderr)
        )
    if action in ("inspect", "branches", "rewind", "switch"):
        from scope.cli import _branches as b

        if action == "inspect":
            return asyncio.run(b.inspect_conversation(url, args.conversation, out=sys.stdout))
        if action == "branches":
            return asyncio.run(b.list_branches(url, args.conversation, out=sys.stdout))
        if action == "switch":
            return asyncio.run(
                b.switch_conversation(
                    url,
                    args.conversation,
                    to=args.to,
                    expected_head=args.expected_head,
                    out=sys.stdout,
                )
            )
        return asyncio.run(
            b.rewind_conversation(
                url,
                args.conversation,
                to=args.to,
                expected_head=args.expected_head,
                out=sys.stdout,
            )
        )
    if action == "compact":
        return _compact(args, url)
    if action == "migrate":
        return asyncio.run(h.migrate_store(url, sys.stdout))
    if action == "import":
        data, source = h.read_import_file(args.file, sys.stdin.buffer)
        return asyncio.run(
            h.import_conversations(url, data, source, stdout=sys.stdout, stderr=sys.stderr)
        )
    return asyncio.run(
        h.clear_conversation(
            url,
            args.conversation,
            yes=args.yes,
            stdin=sys.stdin,
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
    )


def _erasure(args: argparse.Namespace, url: str, parser: argparse.ArgumentParser) -> int:
    from scope.cli import _erasure as e

    if args.action == "expire":
        return asyncio.run(e.expire_command(url, args.limit, stdout=sys.stdout))
    if args.action == "verify":
        if args.conversation:
            parser.exit(2, f"{_PROG}: error: verify --erased takes no CONVERSATION\n")
        return asyncio.run(
            e.verify_erased(
                url, args.erased, stdin=sys.stdin.buffer, stdout=sys.stdout, stderr=sys.stderr
            )
        )
    if (args.conversation is None) == (args.owner is None):
        parser.exit(2, f"{_PROG}: error: erase needs one CONVERSATION or --owner OWNER\n")
    return asyncio.run(
        e.erase_command(
            url,
            args.conversation,
            args.owner,
            yes=args.yes,
            stdin=sys.stdin,
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
    )


def _compact(args: argparse.Namespace, url: str) -> int:
    from scope.cli import _history as h
    from scope.cli._chat import DEFAULT_MODELS, make_model

    if args.summarizer is not None:
        flags = (("--model", args.model), ("--base-url", args.base_url))
        given = [flag for flag, value in flags if value]
        if given:
            raise CLIError(f"--summarizer replaces the provider: drop {' and '.join(given)}")
        summarizer = h.load_summarizer(args.summarizer)
        return asyncio.run(
            h.compact_conversation(
                url, args.conversation, summarizer, keep_turns=args.keep_turns, out=sys.stdout
            )
        )
    provider = args.provider or "openai"
    name = args.model or os.environ.get("SCOPE_MODEL") or DEFAULT_MODELS[provider]
    model = make_model(provider, name, args.base_url)

    async def run() -> int:
        async with model:
            return await h.compact_conversation(
                url, args.conversation, model, keep_turns=args.keep_turns, out=sys.stdout
            )

    return asyncio.run(run())


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from scope.cli._demo import run_demo

    return asyncio.run(run_demo(args.store, sys.stdout))


def _chat(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from scope.cli._chat import DEFAULT_MODELS, run_chat
    from scope.cli._stores import chat_store_url

    return run_chat(
        provider=args.provider,
        model_name=args.model or DEFAULT_MODELS[args.provider],
        base_url=args.base_url,
        store_url=args.store or chat_store_url(os.environ),
        conversation_id=args.conversation,
        system=args.system,
        stdin=sys.stdin,
        stdout=sys.stdout,
        stderr=sys.stderr,
    )


def _bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from scope.cli._bench import Settings, run_bench
    from scope.cli._stores import check_sqlite_location

    if args.store:
        check_sqlite_location(args.store, must_exist=True)
    return asyncio.run(
        run_bench(
            store=args.store,
            file=args.file,
            conversations=args.conversations,
            settings=Settings(args.repeats, args.warmup, args.min_time),
            json_out=args.json_out,
            baseline_path=args.compare,
            threshold=args.threshold,
            stdout=sys.stdout,
            stderr=sys.stderr,
        )
    )


_COMMANDS: Final[dict[str, Callable[[argparse.Namespace, argparse.ArgumentParser], int]]] = {
    "demo": _demo,
    "chat": _chat,
    "bench": _bench,
    "history": _history,
}


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        return (
            f"the Python package {exc.name!r} is not installed; install the matching extra, "
            "e.g. pip install 'scope-chat[postgres]', 'scope-chat[redis]', 'scope-chat[openai]' or "
            "'scope-chat[anthropic]'"
        )
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ScopeError):
        return f"{text} ({type(exc).__name__})"
    return text


def _fail(message: str, status: int) -> int:
    sys.stdout.flush()
    sys.stderr.write(f"{_PROG}: error: {message}\n")
    sys.stderr.flush()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``scope`` command line; return the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    try:
        return _COMMANDS[args.command](args, parser)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    except CLIError as exc:
        return _fail(str(exc), exc.status)
    except KeyboardInterrupt:
        sys.stderr.write("\n")
        return 130
    except BrokenPipeError:
        # The reader went away (``scope history export | head``): stop quietly, and keep
        # the interpreter from complaining while flushing stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (ScopeError, ValueError, OSError, ImportError) as exc:
        return _fail(_describe(exc), 1)
