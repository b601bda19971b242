"""Retrieval quality on the sample spec library, filters, PDF pages, chunking and prompt context."""

from __future__ import annotations

import re

import pytest

from edgeinspect.errors import InvalidInput
from edgeinspect.rag import format_context, sample_kb_dir
from edgeinspect.rag.chunking import sections, split_bounded
from edgeinspect.rag.documents import Document, read_document
from edgeinspect.rag.embed import Embedder
from edgeinspect.rag.indexer import build_index
from edgeinspect.rag.search import Searcher

# Operator-style questions about the sample spec library, each with the document that answers it.

QUERIES: list[tuple[str, str]] = [
    ("burr along the housing edge, is 0.3 mm acceptable?", "HSG-210-burrs-flash-edges"),
    ("loose burr inside the housing near the connector opening", "HSG-210-burrs-flash-edges"),
    ("step at the parting line of the die casting, how much mismatch is allowed", "HSG-210-burrs-flash-edges"),
    ("small holes on the cast surface of the housing front, how many pores are ok", "HSG-210-casting-surface-defects"),
    ("line where two metal flows did not fuse on the casting, cold shut", "HSG-210-casting-surface-defects"),
    ("raised bubbles on the housing after shot blasting", "HSG-210-casting-surface-defects"),
    ("housing failed the pressure decay leak test twice", "HSG-210-leak-test-internal-porosity"),
    ("x-ray shows shrinkage in the mounting boss", "HSG-210-leak-test-internal-porosity"),
    ("thread gauge does not go into the M20 cable gland thread", "HSG-210-machined-features"),
    ("chatter marks in the bearing bore of the housing", "HSG-210-machined-features"),
    ("solder bridge between two pins of the IC on the control board", "PCB-410-solder-joints"),
    ("too many voids under the MOSFET thermal pad in the x-ray", "PCB-410-solder-joints"),
    ("resistor standing up on one end after reflow", "PCB-410-solder-joints"),
    ("electrolytic capacitor fitted the wrong way round", "PCB-410-components-contamination"),
    ("white sticky flux residue on the board near the connector", "PCB-410-components-contamination"),
    ("cracked ceramic capacitor at the board edge after depaneling", "PCB-410-components-contamination"),
    ("under UV light the coating is missing on part of the power board", "PCB-420-conformal-coating"),
    ("conformal coating got on the connector pins", "PCB-420-conformal-coating"),
    ("black plastic cover not completely filled, snap hook missing", "CVR-310-moulded-cover-defects"),
    ("sink mark over the rib on top of the moulded cover", "CVR-310-moulded-cover-defects"),
    ("silver streaks on the PA66 cover surface", "CVR-310-moulded-cover-defects"),
    ("scratch on the clear status window, LEDs hard to read", "CVR-320-window-cover"),
    ("clear window looks cloudy and yellow", "CVR-320-window-cover"),
    ("runout of the output shaft is 0.015 mm", "SHF-510-machined-shaft"),
    ("magnetic particle test shows a line on the shaft", "SHF-510-machined-shaft"),
    ("rust spots on the ground bearing seat of the shaft", "SHF-510-machined-shaft"),
    ("gasket is twisted in the groove of the cover", "GSK-610-seals-gaskets"),
    ("rubber seal hardness check at incoming, Shore A", "GSK-610-seals-gaskets"),
    ("paint thickness only 50 microns on the housing edge", "PNT-810-powder-coating"),
    ("cross-cut adhesion test failed on the powder coat", "PNT-810-powder-coating"),
    ("powder on the earthing pad that should be bare metal", "PNT-810-powder-coating"),
    ("undercut on the fillet weld of the mounting bracket", "WLD-710-bracket-welds"),
    ("pores in the weld seam of the steel bracket", "WLD-710-bracket-welds"),
    ("DataMatrix code on the type plate reads grade C", "LBL-910-labels-marking"),
    ("rating label is 3 mm off its position", "LBL-910-labels-marking"),
    ("PCB spare parts shipped in pink bag, humidity card shows 20 percent", "PKG-950-packaging"),
    ("one cover screw has no yellow torque mark", "ASM-100-final-assembly-check"),
    ("gap between cover and housing is 0.7 mm at one corner", "ASM-100-final-assembly-check"),
    ("busbar tin plating looks brown on the contact pad", "BSB-720-busbar-plating"),
    ("XRF shows tin only 6 micrometres on the busbar", "BSB-720-busbar-plating"),
    ("white powder corrosion on machined aluminium housings in the rack", "QS-007-corrosion-handling-damage"),
    ("how many parts do I sample from a lot of 400 housings", "QS-002-sampling-plans"),
    ("can MRB accept a major defect use as is", "QS-004-mrb-disposition"),
    ("how do I decide whether a defect is major or minor", "QS-001-severity-classification"),
    ("how much light and what viewing distance for cosmetic inspection", "QS-005-surface-zones-and-viewing"),
    ("which gauge do I use to measure burr height", "QS-003-measurement-methods"),
]


@pytest.fixture(scope="module")
def sample_searcher(tmp_path_factory):
    kb = tmp_path_factory.mktemp("kb")
    embedder = Embedder()
    summary = build_index(sample_kb_dir(), kb, embedder)
    assert summary.skipped == []
    return Searcher(kb, embedder)


def test_operator_queries_find_their_spec_in_the_top_3(sample_searcher):
    misses = []
    for query, expected in QUERIES:
        top = [h.chunk.doc_id for h in sample_searcher.search(query, 3).hits]
        if expected not in top:
            misses.append((query, expected, top))
    rate = 1 - len(misses) / len(QUERIES)
    print(f"\nretrieval hit rate (expected doc in top 3 chunks): {rate:.1%} of {len(QUERIES)} queries")
    for m in misses:
        print("  miss:", m)
    assert len(QUERIES) >= 30
    assert rate >= 0.90


def test_every_expected_document_exists_in_the_sample_base():
    ids = {p.name.rsplit(".", 1)[0] for p in sample_kb_dir().iterdir()}
    assert {doc for _, doc in QUERIES} <= ids
    assert 20 <= len(ids) <= 25


def test_sample_documents_carry_front_matter_and_limits():
    for path in sample_kb_dir().iterdir():
        doc = read_document(path, sample_kb_dir())
        assert isinstance(doc, Document), path
        assert doc.product and doc.station and doc.defect_classes and doc.severities, path
        text = " ".join(p.text for p in doc.pages)
        assert re.search(r"\d+(\.\d+)?\s?(mm|µm|um|%|Nm|bar)", text), f"{path.name} has no numeric limits"


def test_product_filter_keeps_that_product_and_general_specs(sample_searcher):
    hits = sample_searcher.search("porosity limits", 10, {"product": "WLD-710"}).hits
    assert hits
    assert all("WLD-710" in h.chunk.product or "all" in h.chunk.product for h in hits)
    assert hits[0].chunk.doc_id == "WLD-710-bracket-welds"


def test_station_and_doc_filters_are_exact(sample_searcher):
    hits = sample_searcher.search("defect", 5, {"doc_id": "PKG-950-packaging"}).hits
    assert hits and {h.chunk.doc_id for h in hits} == {"PKG-950-packaging"}
    # Only the `station: all` procedures (the QS-* general specs) are at every station, an unknown one included.
    general = sample_searcher.search("defect", 5, {"station": "no-such-station"}).hits
    assert general and {h.chunk.station for h in general} == {"all"}
    with pytest.raises(InvalidInput):
        sample_searcher.search("defect", 5, {"colour": "red"})


def test_pdf_chunks_keep_their_page_and_metadata(sample_searcher):
    hits = sample_searcher.search("tin whiskers longer than 50 um on busbars in stock", 3).hits
    top = hits[0].chunk
    assert top.doc_id == "BSB-720-busbar-plating"
    assert top.page == 2
    assert "BSB-720" in top.product
    assert top.section.startswith("6 Tin whiskers")


def test_scores_are_cosine_similarities_in_descending_order(sample_searcher):
    scores = [h.score for h in sample_searcher.search("gasket cut on the sealing lip", 8).hits]
    assert scores == sorted(scores, reverse=True)
    assert all(-1.0 <= s <= 1.0001 for s in scores)


def test_format_context_respects_the_budget_and_names_sources(sample_searcher):
    hits = sample_searcher.search("burr on the housing edge", 5).hits
    for budget in (300, 800, 3000):
        text = format_context(hits, budget)
        assert len(text) <= budget
        assert text.startswith("[1] HSG-210-burrs-flash-edges") or text.startswith("[1] QS-003")
    assert format_context(hits, 50) == ""


def test_split_bounded_caps_size_and_keeps_every_word():
    text = "\n\n".join(" ".join(f"w{p}_{i}" for i in range(70)) + "." for p in range(12))
    pieces = split_bounded(text, 300, 60)
    assert all(len(p) <= 300 for p in pieces)
    assert set(text.split()) == set(" ".join(pieces).split())
    # Overlap: each piece after the first starts with words that ended the previous one.
    assert any(p.split()[0] in prev.split() for prev, p in zip(pieces, pieces[1:], strict=False))


def test_sections_follow_markdown_headings_with_their_parent():
    body = "# Spec\nintro\n## 1 Burrs\nmax 0.1 mm\n### 1.1 Loose burrs\nnone\n## 2 Flash\n0.3 mm\n"
    assert sections(body, markdown=True) == [
        ("Spec", "intro"),
        ("Spec > 1 Burrs", "max 0.1 mm"),
        ("1 Burrs > 1.1 Loose burrs", "none"),
        ("Spec > 2 Flash", "0.3 mm"),
    ]
