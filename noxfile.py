"""Development sessions: ``nox -s tests lint typecheck docs bench``."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests", "lint", "typecheck"]

PYTHONS = ["3.11", "3.12", "3.13"]
BENCHMARKS = [
    "benchmarks/bench_codec.py",
    "benchmarks/bench_accumulator.py",
    "benchmarks/bench_history.py",
    "benchmarks/bench_middleware.py",
    "benchmarks/bench_conversation.py",
    "benchmarks/bench_stores.py",
    "benchmarks/bench_peers.py",
    "benchmarks/bench_read.py",
    "benchmarks/bench_append.py",
    "benchmarks/bench_openai.py",
    "benchmarks/bench_otel.py",
    "benchmarks/bench_anthropic.py",
    "benchmarks/bench_openai_responses.py",
    "benchmarks/bench_gemini.py",
    "benchmarks/bench_window.py",
    "benchmarks/bench_redis_listing.py",
    "benchmarks/bench_redis_imported.py",
    "benchmarks/bench_listing.py",
    "benchmarks/bench_memory.py",
    "benchmarks/bench_web.py",
]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite (server tests skip unless SCOPE_TEST_* servers are reachable)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and the import contracts (lint-imports)."""
    session.install("-e", ".[dev]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install("-e", ".[dev]")
    session.run("mypy", "--strict", "scope")


@nox.session
def docs(session: nox.Session) -> None:
    """The docs site, built as CI builds it: mkdocs build --strict (``-- serve`` to browse)."""
    session.install("-e", ".[docs]")
    if session.posargs == ["serve"]:
        session.run("mkdocs", "serve")
    else:
        session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site")


@nox.session
def bench(session: nox.Session) -> None:
    """Every benchmark, competitors included (they are never runtime dependencies)."""
    session.install(
        "-e",
        ".[postgres,redis,openai,otel,anthropic,gemini]",
        "opentelemetry-sdk",
        "langchain-core",
        "pydantic-ai-slim",
        "openai",
        "openai-agents[redis,sqlalchemy]",
        "aiosqlite",
        "langchain-community",
        "langchain-postgres",
        "langchain-redis",
        "psycopg[binary]",
        "anthropic",
        "google-genai",
        "rfc8785",
    )
    for script in session.posargs or BENCHMARKS:
        session.run("python", script)
