"""Document -> text, one document at a time: the function the extraction pool's processes run.

Extractors (``batch_contract.documents.extractor_for`` picks one per document):

* ``pdf``: the text layer of every page (pypdf, ``extract_text``); a page without one is OCR'd from its
  embedded images (a scanned page is one image) when ``ocr`` is on.
* ``html``: the main text of the page (trafilatura's ``extract``: boilerplate such as navigation and
  footers dropped); a page too short for its main-text heuristics falls back to all of its visible
  text (``trafilatura.html2txt``).
* ``ocr``: an image file (every frame of a multi-page TIFF) or every page of a PDF through tesseract
  (Debian's ``tesseract-ocr`` through ``pytesseract``).

A document that cannot become text is an :class:`Extracted` with a dead-letter reason, never an
exception: missing or unreadable file, larger than ``max_document_bytes``, not the kind its extractor
reads, corrupt, or any other exception of a parser on it (``unreadable_document``); a PDF that needs a password (``encrypted_document``); more
pages than ``max_pages`` (``page_limit_exceeded``); no text at all (``empty_extraction``). Only a host
problem raises: :class:`OcrUnavailableError` when a page needs OCR and tesseract is not installed.

This module never imports torch or Airflow; pypdf, trafilatura, PIL and pytesseract are imported when
first needed, in the pool's processes.
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import dataclass
from typing import Any

from batch_contract import storage
from batch_contract.documents import DocumentSettings, extractor_for
from batch_contract.enums import DeadLetterReason
from batch_contract.rows import repair_text


class OcrUnavailableError(RuntimeError):
    """A page needs OCR and tesseract (or pytesseract) is not installed on this host (a deployment
    problem, not a bad document: the shard fails with exit code 2 and the message says what to install)."""


@dataclass(frozen=True)
class Extracted:
    """What one document gave.

    Attributes:
        text: the extracted text (valid Unicode, stripped; ``""`` when ``reason`` is set).
        reason / detail: ``None`` / ``""``, or why the document is a dead letter.
        method: the extractor that ran (``pdf``, ``html``, ``ocr``; ``pdf+ocr`` when a PDF's pages
            without a text layer were OCR'd).
        pages: pages (PDF, TIFF frames) read; 1 for HTML and single images.
        cpu_seconds: CPU seconds this document cost, tesseract's child processes included.
        wall_seconds: wall seconds it took in the pool process.
    """

    text: str
    reason: DeadLetterReason | None = None
    detail: str = ""
    method: str = ""
    pages: int = 0
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0


class _Refused(Exception):
    """Internal: a document that becomes a dead letter (reason, detail)."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def read_document(uri: str, settings: DocumentSettings, roots: list[str] | tuple[str, ...] = ()) -> bytes:
    """The bytes of the document at ``uri``, opened through the input roots.

    Raises:
        _Refused: missing, outside ``roots``, not a regular file, or over ``max_document_bytes``
            (``unreadable_document``).
    """
    try:
        with storage.open_input_file(uri, roots) as fh:
            size = fh.size()
            if size > settings.max_document_bytes:
                raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT,
                               f"{size} bytes, above input.documents.max_document_bytes "
                               f"({settings.max_document_bytes}); not read")
            return fh.read()
    except _Refused:
        raise
    except storage.InputRefusedError as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"refused: {exc}") from None
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT,
                       f"cannot open {uri!r:.300}: {type(exc).__name__}: {exc}") from None
    except OSError as exc:  # pyarrow raises OSError subclasses for missing objects and local errors alike
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT,
                       f"cannot open {uri!r:.300}: {type(exc).__name__}: {exc}") from None


def _ocr_image(image: Any, settings: DocumentSettings) -> str:
    """Tesseract's text of one PIL image.

    Raises:
        OcrUnavailableError: pytesseract or the tesseract binary is missing.
    """
    try:
        import pytesseract
    except ImportError:
        raise OcrUnavailableError("OCR needs pytesseract (pip install pytesseract) and Debian's tesseract-ocr "
                                  "(apt-get install tesseract-ocr tesseract-ocr-eng)") from None
    try:
        return pytesseract.image_to_string(image, lang=settings.ocr_lang)
    except pytesseract.TesseractNotFoundError:
        raise OcrUnavailableError("OCR needs Debian's tesseract-ocr on this host "
                                  "(apt-get install tesseract-ocr tesseract-ocr-eng)") from None
    except pytesseract.TesseractError as exc:
        if "Failed loading language" in str(exc) or "Error opening data file" in str(exc):
            raise OcrUnavailableError(f"tesseract has no language {settings.ocr_lang!r} on this host "
                                      f"(apt-get install tesseract-ocr-{settings.ocr_lang.split('+')[0]})") from None
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"tesseract failed: {exc}"[:500]) from None


def _page_images(page: Any) -> list[Any]:
    """PIL images embedded in a PDF page (a scanned page: one); unreadable ones are skipped."""
    out = []
    try:
        images = list(page.images)
    except Exception:  # noqa: BLE001 - pypdf raises many types for odd image streams; such a page has no OCR text
        return out
    for img in images:
        try:
            out.append(img.image)
        except Exception:  # noqa: BLE001 - an image pypdf cannot decode adds no text
            continue
    return out


def _pdf(data: bytes, settings: DocumentSettings, force_ocr: bool) -> tuple[str, str, int]:
    """``(text, method, pages)`` of a PDF."""
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError, PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:  # many PDFs are encrypted with an empty user password (permissions only): they open
                opened = reader.decrypt("")
            except (NotImplementedError, DependencyError) as exc:  # an algorithm this host cannot decrypt
                raise _Refused(DeadLetterReason.ENCRYPTED_DOCUMENT, f"encrypted PDF: {exc}") from None
            if not opened:
                raise _Refused(DeadLetterReason.ENCRYPTED_DOCUMENT, "encrypted PDF: needs a password")
        pages = reader.pages
        n = len(pages)
    except _Refused:
        raise
    except FileNotDecryptedError as exc:
        raise _Refused(DeadLetterReason.ENCRYPTED_DOCUMENT, f"encrypted PDF: {exc}") from None
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError,
            AssertionError, OSError) as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"not a readable PDF: {type(exc).__name__}: {exc}"[:500]) from None
    if n > settings.max_pages:
        raise _Refused(DeadLetterReason.PAGE_LIMIT_EXCEEDED,
                       f"{n} pages, above input.documents.max_pages ({settings.max_pages})")
    texts: list[str] = []
    ocr_pages = 0
    for i in range(n):
        text = ""
        if not force_ocr:
            try:
                text = pages[i].extract_text() or ""
            except FileNotDecryptedError as exc:
                raise _Refused(DeadLetterReason.ENCRYPTED_DOCUMENT, f"encrypted PDF: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - pypdf raises many types on corrupt content streams
                raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT,
                               f"page {i + 1}: text layer unreadable: {type(exc).__name__}: {exc}"[:500]) from None
        if not text.strip() and (force_ocr or settings.ocr):
            images = _page_images(pages[i])
            if images:
                ocr_pages += 1
                text = "\n".join(_ocr_image(img, settings) for img in images)
        texts.append(text.strip())
    method = "ocr" if force_ocr else ("pdf+ocr" if ocr_pages else "pdf")
    return "\n\n".join(t for t in texts if t), method, n


def _html(data: bytes) -> tuple[str, str, int]:
    """``(text, "html", 1)`` of an HTML page."""
    import trafilatura

    if b"\x00" in data[:4096] or data[:5] == b"%PDF-":
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, "not an HTML page (binary content)")
    try:
        text = trafilatura.extract(data, include_comments=False, include_tables=True, favor_recall=True) or ""
        if not text.strip():
            text = trafilatura.html2txt(data) or ""
    except (ValueError, TypeError, AttributeError) as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"not a readable HTML page: {exc}"[:500]) from None
    return text, "html", 1


def _image(data: bytes, settings: DocumentSettings) -> tuple[str, str, int]:
    """``(text, "ocr", frames)`` of an image file (every frame of a multi-page TIFF)."""
    from PIL import Image, ImageSequence, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
        frames = getattr(image, "n_frames", 1)
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"not a readable image: {exc}"[:500]) from None
    if frames > settings.max_pages:
        raise _Refused(DeadLetterReason.PAGE_LIMIT_EXCEEDED,
                       f"{frames} pages, above input.documents.max_pages ({settings.max_pages})")
    texts = []
    try:
        for frame in ImageSequence.Iterator(image):
            texts.append(_ocr_image(frame.convert("RGB"), settings).strip())
    except (OSError, ValueError) as exc:
        raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, f"image unreadable: {exc}"[:500]) from None
    return "\n\n".join(t for t in texts if t), "ocr", frames


def extract_document(uri: str, settings: DocumentSettings, roots: list[str] | tuple[str, ...] = ()) -> Extracted:
    """The text of the document at ``uri`` (see the module docstring for the extractors and reasons).

    Args:
        uri: the document (local path, ``file://``, ``gs://``, ``s3://``, ``az://``).
        settings: the manifest's ``input.documents``.
        roots: the manifest's input roots the document is opened through (empty: no check).

    Returns:
        An :class:`Extracted`: text, or a dead-letter reason with its detail; with the CPU and wall
        seconds it cost (seconds).

    Raises:
        OcrUnavailableError: a page needed OCR and tesseract is missing on this host.
    """
    t0, c0 = time.perf_counter(), _cpu_now()
    kind = extractor_for(uri, settings.preprocess)
    method, pages = kind, 0
    try:
        data = read_document(uri, settings, roots)
        if kind == "html":
            text, method, pages = _html(data)
        elif kind == "pdf" or data[:5] == b"%PDF-":
            if kind == "pdf" and data[:5] != b"%PDF-" and b"%PDF-" not in data[:1024]:
                raise _Refused(DeadLetterReason.UNREADABLE_DOCUMENT, "not a PDF (no %PDF- header)")
            text, method, pages = _pdf(data, settings, force_ocr=kind == "ocr")
        else:
            text, method, pages = _image(data, settings)
        text = repair_text(text.replace("\x00", ""))[0].strip()
        if not text:
            raise _Refused(DeadLetterReason.EMPTY_EXTRACTION,
                           f"{method}: no text in {pages} page(s)" + (
                               "" if settings.ocr or kind != "pdf" else " (no text layer; OCR is off)"))
        reason, detail = None, ""
    except _Refused as refused:
        text, reason, detail = "", refused.reason, refused.detail
    except OcrUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - parsers raise anything on hostile input: that document is a dead letter
        text, reason = "", DeadLetterReason.UNREADABLE_DOCUMENT
        detail = f"{method} extractor failed: {type(exc).__name__}: {exc}"[:500]
    return Extracted(text=text, reason=reason, detail=detail, method=method, pages=pages,
                     cpu_seconds=round(_cpu_now() - c0, 6), wall_seconds=round(time.perf_counter() - t0, 6))


def init_pool_process(environ: dict[str, str] | None = None) -> None:
    """Initializer of each pool process.

    Args:
        environ: the worker's environment when it started the pool: the process takes it over whole
            (storage settings such as an emulator host or credentials). A forkserver's children inherit
            the environment the forkserver started with, which in a long-lived process may be older than
            the worker's. ``None``: keep the inherited one.

    Tesseract runs single-threaded (``OMP_THREAD_LIMIT=1`` unless set): the pool is the parallelism, and
    OpenMP threads per page would oversubscribe the CPUs the pod requested.
    """
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    os.environ.setdefault("OMP_THREAD_LIMIT", "1")
