"""Writes rag/sample_kb/BSB-720-busbar-plating.pdf, the sample knowledge base's PDF document.

    .venv/bin/python tools/make_sample_pdf.py

The PDF carries the same metadata the Markdown specs keep in front matter, as custom document-info entries
(/Product, /Station, /DefectClasses, /Severities), which the ingester reads. Output is deterministic.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

from fpdf import FPDF
from pypdf import PdfReader, PdfWriter

OUT = Path(__file__).resolve().parent.parent / "rag" / "sample_kb" / "BSB-720-busbar-plating.pdf"
TITLE = "BSB-720 Copper busbar tin plating inspection"

SECTIONS = [
    (
        "1 Scope",
        "Tin-plated copper busbars BSB-720 (Cu-ETP, 3 x 12 mm) connect the DC link of the power board PCB-420 to the "
        "motor terminals. Plating: matte tin 8-12 um over nickel barrier 2-4 um, supplier-plated. Incoming "
        "inspection per QS-002; plating thickness per lot by XRF.",
    ),
    (
        "2 Plating thickness (XRF)",
        "Measure tin and nickel thickness with the XRF instrument on 5 busbars per lot, 3 points each (both contact "
        "pads and the middle). Tin below 8 um or nickel below 2 um: major, return to supplier. Tin above 15 um: "
        "minor (whisker and press-fit risk).",
    ),
    (
        "3 Discolouration and oxidation",
        "Uniform matte grey is acceptable. Yellow, brown or blue discolouration (oxidation, heat tint from reflow) on "
        "the contact pads: major, contact resistance rises. Light water stains outside the contact pads: minor.",
    ),
    (
        "4 Exposed copper, scratches and blisters",
        "Scratches through the tin showing copper (red-brown) on contact pads: major; elsewhere up to 5 mm long: "
        "minor. Blisters or peeling of the plating (bend test 90 degrees over 2x thickness on one part per lot): "
        "major. Pits larger than 0.2 mm on contact pads: major.",
    ),
    (
        "5 Burrs and bending",
        "Punching burrs max 0.1 mm on the edges; burr on the contact pad face none. Bend angle 90 +/- 1 degree "
        "(angle gauge), flatness of the contact pad 0.1 mm. Burrs can cut the insulation sleeve: major.",
    ),
    (
        "6 Tin whiskers and storage",
        "Whisker check under 40x on 2 parts per lot after 4 weeks in stock: any whisker longer than 50 um is major. "
        "Store in closed bags below 30 C; do not touch contact pads with bare hands.",
    ),
]


def build() -> bytes:
    pdf = FPDF(format="A4")
    pdf.set_creation_date(datetime(2024, 3, 1, tzinfo=UTC))
    pdf.set_title(TITLE)
    pdf.set_author("Quality Engineering, Valdora Motion AB")
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font("Helvetica", "B", 15)
    pdf.multi_cell(0, 9, TITLE, new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", "", 9)
    pdf.multi_cell(0, 6, "Revision C - product BSB-720 - station incoming-busbar", new_x="LMARGIN", new_y="NEXT")
    for n, (heading, body) in enumerate(SECTIONS):
        if n == 3:
            pdf.add_page()  # two pages, so page numbers are exercised
        pdf.ln(3)
        pdf.set_font("Helvetica", "B", 12)
        pdf.multi_cell(0, 7, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", "", 10)
        pdf.multi_cell(0, 5.5, body, new_x="LMARGIN", new_y="NEXT")
    raw = bytes(pdf.output())
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(raw)))
    writer.add_metadata(
        {
            "/Title": TITLE,
            "/Product": "BSB-720, PCB-420",
            "/Station": "incoming-busbar",
            "/DefectClasses": "plating thickness, discolouration, exposed copper, blisters, burrs, tin whiskers",
            "/Severities": "major, minor",
        }
    )
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def main() -> None:
    OUT.write_bytes(build())


if __name__ == "__main__":
    main()
