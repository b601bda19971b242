"""Knowledge-base authoring: `kb index` names the documents no part filter will match, `station: all` matches every
station like `product: all` every part, and a PDF takes its front matter from a sidecar `<name>.yaml`."""

from __future__ import annotations

import shutil

import pytest
from typer.testing import CliRunner

from edgeinspect.rag import sample_kb_dir
from edgeinspect.rag.documents import read_document, scan_folder
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.search import Searcher

PDF = "BSB-720-busbar-plating.pdf"


def _md(meta: str, body: str) -> str:
    return f"---\n{meta}\n---\n# {body.split('.')[0]}\n\n{body}\n"


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    src = tmp_path_factory.mktemp("specs")
    (src / "housing.md").write_text(_md("product: HSG-210\nstation: casting", "Housing porosity over 0.5 mm fails."))
    (src / "general.md").write_text(_md("product: all\nstation: all", "Every defect is photographed and logged."))
    (src / "orphan.md").write_text(_md("station: casting", "Orphan burr rule: burrs over 0.2 mm are removed."))
    (src / "notes.txt").write_text("A plain text note without front matter about cover scratches.\n")
    shutil.copy(sample_kb_dir() / PDF, src / "busbar.pdf")  # its doc-info says BSB-720 at incoming-busbar
    (src / "busbar.yaml").write_text("product: [PLT-1]\nstation: plating\n")
    return src


@pytest.fixture(scope="module")
def indexed(specs, tmp_path_factory):
    from edgeinspect.cli import app

    kb = tmp_path_factory.mktemp("kb") / "kb"
    result = CliRunner().invoke(app, ["kb", "index", str(specs), "--kb", str(kb)], terminal_width=400)
    assert result.exit_code == 0, result.output
    return kb, result.output


def test_index_names_the_documents_no_part_filter_will_match(indexed):
    _, output = indexed
    flat = " ".join(output.split())  # rich wraps at its console width
    warning = flat[flat.index("warning:") :]
    assert warning.startswith("warning: 2 document(s) name no product, so no part filter will match them")
    assert "notes.txt, orphan.md" in warning and "housing.md" not in warning and "busbar.pdf" not in warning


def test_station_all_matches_every_station_as_product_all_matches_every_part(indexed):
    kb, _ = indexed
    searcher = Searcher(kb, Embedder())
    at_casting = {h.chunk.doc_id for h in searcher.search("defect", 10, {"station": "casting"}).hits}
    assert at_casting == {"housing", "orphan", "general"}
    elsewhere = {h.chunk.doc_id for h in searcher.search("defect", 10, {"station": "paint"}).hits}
    assert elsewhere == {"general"}
    for_part = {h.chunk.doc_id for h in searcher.search("defect", 10, {"product": "HSG-210"}).hits}
    assert for_part == {"housing", "general"}  # the orphan vanishes from part-filtered search: hence the warning


def test_a_pdf_takes_its_front_matter_from_a_sidecar_yaml(indexed, specs, tmp_path):
    kb, _ = indexed
    hits = Searcher(kb, Embedder()).search("tin whiskers on busbars", 3, {"product": "PLT-1"}).hits
    assert hits and hits[0].chunk.doc_id == "busbar" and hits[0].chunk.station == "plating"
    assert "busbar.yaml" not in [p.name for p in scan_folder(specs)]  # read with its PDF, not skipped as a file
    # Editing the sidecar changes the document's hash, so an incremental index picks the change up.
    copy = tmp_path / "specs"
    shutil.copytree(specs, copy)
    before = read_document(copy / "busbar.pdf", copy)
    (copy / "busbar.yaml").write_text("product: PLT-2\n")
    after = read_document(copy / "busbar.pdf", copy)
    assert (before.product, after.product) == (["PLT-1"], ["PLT-2"])
    assert before.sha256 != after.sha256
    (copy / "busbar.yaml").write_text("- not\n- a mapping\n")
    assert "not a YAML mapping" in read_document(copy / "busbar.pdf", copy).reason
