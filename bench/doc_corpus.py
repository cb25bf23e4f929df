"""Generated documents for the documents benchmark and tests: PDFs with a text layer, scanned PDFs
(an image per page, no text layer), HTML pages with boilerplate, and bad documents (encrypted,
corrupt, blank).

Text PDFs are written by :func:`text_pdf` directly (PDF 1.4, Helvetica, one content stream per page);
scanned pages are rendered with Pillow (its bundled FreeType font) and saved as image-only PDFs;
encryption uses pypdf. Nothing here is read from the network.
"""

from __future__ import annotations

import io
import random
import textwrap
from collections.abc import Sequence
from pathlib import Path

LINE_CHARS = 90
LINES_PER_PAGE = 48


def _pdf_escape(text: str) -> str:
    safe = text.encode("latin-1", "replace").decode("latin-1")
    return safe.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def text_pdf_bytes(paragraphs: Sequence[str], blank: bool = False) -> bytes:
    """A PDF 1.4 file whose pages carry ``paragraphs`` as a text layer (wrapped at 90 characters, 48
    lines a page); ``blank``: one page with no text and no image (extracts to nothing)."""
    lines: list[str] = []
    for p in paragraphs:
        lines.extend(textwrap.wrap(p, LINE_CHARS) or [""])
        lines.append("")
    pages = [] if blank else [lines[i:i + LINES_PER_PAGE] for i in range(0, max(len(lines), 1), LINES_PER_PAGE)]
    if not pages:
        pages = [[]]
    objects: list[bytes] = []
    n_pages = len(pages)
    # 1 catalog, 2 pages, 3 font, then (page, content) pairs
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n_pages))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {n_pages} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>")
    for i, page_lines in enumerate(pages):
        ops = ["BT", "/F1 10 Tf", "12 TL", "50 800 Td"]
        for line in page_lines:
            ops.append(f"({_pdf_escape(line)}) Tj T*")
        ops.append("ET")
        stream = ("\n".join(ops) if page_lines else "").encode("latin-1")
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Resources << /Font << /F1 3 0 R >> >> "
                       f"/Contents {5 + 2 * i} 0 R >>".encode())
        objects.append(b"<< /Length " + str(len(stream)).encode() + b" >>\nstream\n" + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for k, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(f"{k} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def scanned_pdf_bytes(text: str, width: int = 1240, font_size: int = 30) -> bytes:
    """An image-only PDF (no text layer) of ``text`` rendered in black on white, one page, as a scanner
    would produce it (greyscale, 150 dpi)."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    lines = textwrap.wrap(text, 60) or [" "]
    height = 80 + int(font_size * 1.5) * len(lines)
    image = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((40, 40 + i * int(font_size * 1.5)), line, fill=0, font=font)
    out = io.BytesIO()
    image.save(out, "PDF", resolution=150.0)
    return out.getvalue()


def scanned_png_bytes(text: str, font_size: int = 30) -> bytes:
    """A PNG image of ``text`` (black on white), for the image/OCR extractor."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    lines = textwrap.wrap(text, 60) or [" "]
    image = Image.new("L", (1240, 80 + int(font_size * 1.5) * len(lines)), 255)
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((40, 40 + i * int(font_size * 1.5)), line, fill=0, font=font)
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def html_bytes(title: str, paragraphs: Sequence[str]) -> bytes:
    """An HTML article page with navigation, a cookie banner and a footer around the main text."""
    body = "\n".join(f"<p>{p}</p>" for p in paragraphs)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head><body>"
            "<nav><a href='/'>Home</a> | <a href='/about'>About</a> | <a href='/contact'>Contact</a></nav>"
            "<div class='cookie'>We use cookies to improve your experience. Accept all cookies?</div>"
            f"<article><h1>{title}</h1>{body}</article>"
            "<footer>Copyright 2026 Example Corp. All rights reserved. Privacy policy. Terms of use.</footer>"
            "</body></html>").encode()


def encrypted_pdf_bytes(paragraphs: Sequence[str], password: str = "secret") -> bytes:
    """A text PDF encrypted with a user password (pypdf, AES-128 where available)."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(text_pdf_bytes(paragraphs))).pages:
        writer.add_page(page)
    writer.encrypt(user_password=password, owner_password=password + "-owner")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


CORRUPT_PDF = b"%PDF-1.4\n1 0 obj << /Type /Catalog /Pages 9 0 R >> this is not a PDF body\n%%EOF\n"


def write_corpus(folder: Path, texts: Sequence[str], n_text_pdf: int, n_html: int, n_scanned: int,
                 bad: bool = True, seed: int = 7, paragraphs_per_doc: int = 6) -> dict[str, int]:
    """Write a corpus into ``folder``: ``n_text_pdf`` PDFs with a text layer, ``n_html`` HTML pages,
    ``n_scanned`` image-only PDFs (OCR), each built from ``texts`` (paragraphs drawn in order, cycling);
    with ``bad``: also one encrypted, one corrupt and one blank PDF.

    Returns:
        Counts by kind (``text_pdf``, ``html``, ``scanned_pdf``, ``bad``).
    """
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    pos = 0

    def take(n: int) -> list[str]:
        nonlocal pos
        out = [texts[(pos + i) % len(texts)] for i in range(n)]
        pos += n
        return out

    for i in range(n_text_pdf):
        sub = folder / f"batch-{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"report-{i:05d}.pdf").write_bytes(text_pdf_bytes(take(rng.randint(2, paragraphs_per_doc * 2))))
    for i in range(n_html):
        (folder / f"page-{i:05d}.html").write_bytes(html_bytes(f"Package notes {i}", take(paragraphs_per_doc)))
    for i in range(n_scanned):
        (folder / f"scan-{i:05d}.pdf").write_bytes(scanned_pdf_bytes(" ".join(take(1))[:400]))
    counts = {"text_pdf": n_text_pdf, "html": n_html, "scanned_pdf": n_scanned, "bad": 0}
    if bad:
        (folder / "bad-encrypted.pdf").write_bytes(encrypted_pdf_bytes(take(2)))
        (folder / "bad-corrupt.pdf").write_bytes(CORRUPT_PDF)
        (folder / "bad-blank.pdf").write_bytes(text_pdf_bytes([], blank=True))
        counts["bad"] = 3
    return counts
