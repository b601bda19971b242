"""`edgeinspect kb ...`: index a folder of specs, search it, show stats, verify it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(no_args_is_help=True, help="Knowledge base of defect specifications: index, search, stats, verify.")
console = Console()

KB_HELP = "knowledge-base folder (env EDGEINSPECT_KB)"


def _kb_option(*names: str) -> Any:
    return typer.Option(Path("var/kb"), *names, envvar="EDGEINSPECT_KB", help=KB_HELP)


def _logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(
        level=logging.INFO if verbose else logging.ERROR,
        handlers=[RichHandler(console=Console(stderr=True), show_path=False)],
        format="%(message)s",
    )


@app.command("index")
def index_command(
    source: Path = typer.Argument(..., help="folder of specs (.md, .txt, .pdf; subfolders included)"),
    kb: Path = _kb_option("--kb"),
    old_out: Path | None = typer.Option(None, "--out", hidden=True, help="the old spelling of --kb"),
    hnsw_threshold: int = typer.Option(20_000, help="chunk count from which an HNSW index replaces exact search"),
    max_chars: int = typer.Option(900, help="largest chunk, in characters"),
    overlap: int = typer.Option(150, help="characters a split section repeats from the previous chunk"),
    batch_size: int = typer.Option(64, help="chunks embedded per batch"),
    full: bool = typer.Option(False, "--full", help="embed every document again instead of reusing unchanged ones"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="log progress and skipped files to stderr"),
) -> None:
    """Index a folder of specs into a new KB version (incremental: only new or changed documents are embedded)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from edgeinspect.errors import EdgeInspectError
    from edgeinspect.rag.chunking import ChunkConfig
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.indexer import IndexConfig, build_index
    from edgeinspect.rag.indexer import Progress as Hooks

    _logging(verbose)
    kb = old_out or kb
    cfg = IndexConfig(chunk=ChunkConfig(max_chars=max_chars, overlap_chars=overlap), hnsw_threshold=hnsw_threshold)
    bar = Progress(
        TextColumn("[bold]embedding"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    )
    task = bar.add_task("embed", total=None)

    def started(total: int) -> None:
        # A plain line as well as the bar: logs and supervising scripts see when embedding begins.
        console.print(f"Embedding {total} chunks", highlight=False)
        bar.update(task, total=total)
        bar.start()

    hooks = Hooks(on_embed_start=started, on_embedded=lambda n: bar.advance(task, n))
    try:
        summary = build_index(source, kb, Embedder(batch_size=batch_size), cfg, hooks)
    except EdgeInspectError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)  # one line on stderr, as edgeinspect.cli prints
        raise typer.Exit(1) from e
    finally:
        bar.stop()

    table = Table(title=f"Knowledge base {kb} - version {summary.index_version}", show_header=False)
    table.add_row("documents", str(summary.documents))
    table.add_row("chunks", f"{summary.chunks} ({summary.embedded_chunks} embedded, {summary.reused_chunks} reused)")
    table.add_row("new / changed / removed", f"{len(summary.new_docs)} / {len(summary.changed_docs)} / "
                  f"{len(summary.removed_docs)}")  # fmt: skip
    table.add_row("index", summary.index_type)
    table.add_row("skipped files", str(len(summary.skipped)))
    table.add_row("time", f"{summary.seconds:.1f} s")
    if summary.unchanged:
        table.add_row("result", "no changes: kept the current version")
    console.print(table)
    if summary.no_product:
        # Not an error (general specs may have no product), but part-filtered searches never return these.
        names = ", ".join(summary.no_product)
        console.print(
            f"[yellow]warning:[/yellow] {len(summary.no_product)} document(s) name no product, so no part filter "
            f"will match them (add `product: <part>` to the front matter, or `product: all` for every part; for a "
            f"PDF, a <name>.yaml beside it): {names}",
            highlight=False,
        )
    if summary.skipped or summary.bounded:
        issues = Table(title="Files skipped or bounded")
        issues.add_column("file")
        issues.add_column("what happened")
        for path, reason in summary.skipped:
            issues.add_row(path, f"skipped: {reason}")
        for path, note in summary.bounded:
            issues.add_row(path, f"bounded: {note}")
        console.print(issues)


@app.command("search")
def search_command(
    query: str = typer.Argument(..., help="question or defect description"),
    k: int = typer.Option(5, "-k", "--top-k", help="number of chunks to return"),
    part: str | None = typer.Option(None, "--part", help="only chunks of this part / product (and general specs)"),
    old_product: str | None = typer.Option(None, "--product", hidden=True, help="the old spelling of --part"),
    station: str | None = typer.Option(None, "--station", help="only chunks of this station"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    kb: Path = _kb_option("--kb"),
) -> None:
    """Search the current KB version."""
    from edgeinspect.errors import EdgeInspectError
    from edgeinspect.rag.embed import Embedder
    from edgeinspect.rag.search import Searcher

    _logging(False)
    product = part or old_product  # the front matter calls it `product`; the CLI says --part everywhere
    filters = {key: v for key, v in (("product", product), ("station", station)) if v}
    try:
        result = Searcher(kb, Embedder()).search(query, k, filters)
    except EdgeInspectError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)  # one line on stderr, as edgeinspect.cli prints
        raise typer.Exit(1) from e
    if as_json:
        out = {
            "index_version": result.index_version,
            "search_ms": round(result.search_ms, 2),
            "chunks": [
                {"rank": n, "score": round(h.score, 4), **_chunk_json(h.chunk)}
                for n, h in enumerate(result.hits, start=1)
            ],
        }
        typer.echo(json.dumps(out, indent=2))
        return
    table = Table(title=f"{query!r} - index {result.index_version}, {result.search_ms:.0f} ms")
    for col in ("#", "score", "document", "section", "text"):
        table.add_column(col, overflow="fold")
    for n, h in enumerate(result.hits, start=1):
        c = h.chunk
        text = " ".join(c.text.split())
        table.add_row(str(n), f"{h.score:.3f}", c.doc_id, c.section + (f" (p. {c.page})" if c.page else ""),
                      text[:240] + ("…" if len(text) > 240 else ""))  # fmt: skip
    console.print(table)


def _chunk_json(c) -> dict:
    from dataclasses import asdict

    return asdict(c)


@app.command("stats")
def stats_command(kb: Path = _kb_option("--kb")) -> None:
    """Show the current KB version: size, embedding model, index type and documents."""
    from edgeinspect.errors import EdgeInspectError
    from edgeinspect.rag import store

    try:
        manifest = store.read_manifest(store.version_path(kb))
    except EdgeInspectError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)  # one line on stderr, as edgeinspect.cli prints
        raise typer.Exit(1) from e
    table = Table(title=f"Knowledge base {kb}", show_header=False)
    for key in ("index_version", "created_at", "document_count", "chunk_count", "embedding_model", "dimension",
                "index_type", "source_dir"):  # fmt: skip
        table.add_row(key, str(manifest.get(key)))
    table.add_row("versions on disk", ", ".join(sorted(p.name for p in store.versions_dir(kb).glob("v[0-9]*"))))
    console.print(table)
    docs = Table(title="Documents")
    for col in ("doc_id", "chunks", "title", "note"):
        docs.add_column(col)
    for doc_id, meta in sorted(manifest["documents"].items()):
        docs.add_row(doc_id, str(meta["chunks"]), meta["title"], meta.get("note", ""))
    console.print(docs)


@app.command("verify")
def verify_command(
    kb: Path = _kb_option("--kb"),
    sources: bool = typer.Option(True, "--sources/--no-sources", help="also compare source files with the hashes"),
) -> None:
    """Check the current version's files against its manifest and the source files against their hashes."""
    from edgeinspect.rag.search import verify_kb

    problems = verify_kb(kb, check_sources=sources)
    if problems:
        for p in problems:
            console.print(f"[red]✗[/red] {p}", highlight=False)
        raise typer.Exit(1)
    console.print(f"[green]✓[/green] {kb}: index, chunk store and manifest agree" + (
        "; sources unchanged" if sources else ""))  # fmt: skip
