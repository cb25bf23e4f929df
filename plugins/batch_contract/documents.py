"""Documents in: rules the planner and the worker share for inputs whose rows point at documents.

Two input shapes (``docs/documents.md``):

* **A column of URIs**: a Parquet/JSONL input whose text column holds one document URI per row (local
  path, ``file://``, ``gs://``, ``s3://`` or ``az://``). The id column is the row's id as usual.
* **A folder (or glob) of documents**: every file with a document suffix (:data:`DOCUMENT_SUFFIXES`)
  under it is one row; its id is the file's path relative to the folder (``2019/contract-7.pdf``). The
  planner writes these rows into a document index (Parquet: ``id``, ``uri``) in the run directory
  (:func:`index_uri`), and the manifest reads that index as a Parquet input, so sharding, resume by
  id, canary sampling and publish's coverage check work exactly as for text.

The ``preprocess`` Param picks the extractor (:data:`PREPROCESS_MODES`); :class:`DocumentSettings`
travels in the manifest (``input.documents``) and its output-relevant part is hashed into the config
fingerprint (:meth:`DocumentSettings.fingerprint_dict`).
"""

from __future__ import annotations

import posixpath
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from batch_contract.engine_config import ConfigError

PREPROCESS_NONE = "none"
PREPROCESS_MODES = ("none", "pdf", "html", "ocr", "auto")
"""``preprocess`` values. ``none``: the text column is text (no documents). ``pdf``: the PDF's text layer
(pypdf), pages without one through OCR (tesseract) when ``ocr`` is on. ``html``: main text of an HTML
page (trafilatura). ``ocr``: image files (PNG, JPEG, TIFF, ...) and PDFs, every page through OCR.
``auto``: by the file's suffix (:func:`extractor_for`)."""

PDF_SUFFIXES = (".pdf",)
HTML_SUFFIXES = (".html", ".htm", ".xhtml")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp")
DOCUMENT_SUFFIXES = PDF_SUFFIXES + HTML_SUFFIXES + IMAGE_SUFFIXES
"""File suffixes (lower case) a folder input lists as documents."""

INDEX_DIR = "documents"
INDEX_NAME = "index.parquet"
INDEX_ID_COLUMN = "id"
INDEX_URI_COLUMN = "uri"

POD_POOL_WORKERS = 4
"""Extraction processes of a shard pod when ``pool_workers`` is 0: the pod requests this many CPUs on
top of the engine's (``batch_inference.pod_spec.with_preprocess_cpus``) and the worker runs that many."""
POOL_WORKERS_ENV = "BATCH_PREPROCESS_WORKERS"
"""Environment variable the pod spec sets to the pool size it requested CPUs for."""

DEFAULT_MAX_PAGES = 2000
DEFAULT_MAX_DOCUMENT_BYTES = 256 << 20


@dataclass(frozen=True)
class DocumentSettings:
    """How the worker turns a row's document into text (``manifest.input.documents``).

    Attributes:
        preprocess: one of :data:`PREPROCESS_MODES` other than ``none``.
        ocr: OCR the pages of a PDF that have no text layer (``pdf`` / ``auto``); off: such a page adds
            no text (a PDF with no text at all is an ``empty_extraction`` dead letter).
        ocr_lang: tesseract language code(s), ``eng`` or ``eng+deu`` (the Debian packages
            ``tesseract-ocr-<lang>`` must be installed where the worker runs).
        max_pages: a PDF with more pages is a ``page_limit_exceeded`` dead letter (pages).
        max_document_bytes: a larger file is an ``unreadable_document`` dead letter, never read (bytes).
        pool_workers: extraction processes; 0: what the pod requested CPUs for
            (:data:`POOL_WORKERS_ENV`, :data:`POD_POOL_WORKERS` on Kubernetes), else the CPUs this
            process may run on minus one for the engine, at least 1.
        queue_depth: documents extracted ahead of the engine at most (bounds memory); 0: 4 per pool
            process.

    ``pool_workers`` and ``queue_depth`` change speed, never text: they are not in the fingerprint.
    """

    NOT_IN_FINGERPRINT: ClassVar[frozenset[str]] = frozenset({"pool_workers", "queue_depth"})

    preprocess: str = "auto"
    ocr: bool = True
    ocr_lang: str = "eng"
    max_pages: int = DEFAULT_MAX_PAGES
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    pool_workers: int = 0
    queue_depth: int = 0

    def __post_init__(self) -> None:
        if self.preprocess not in PREPROCESS_MODES or self.preprocess == PREPROCESS_NONE:
            raise ConfigError(f"input.documents.preprocess: {self.preprocess!r} is not one of "
                              f"{[m for m in PREPROCESS_MODES if m != PREPROCESS_NONE]}")
        if not isinstance(self.ocr, bool):
            raise ConfigError("input.documents.ocr: must be true or false")
        if not (isinstance(self.ocr_lang, str) and self.ocr_lang
                and all(part.isalnum() or part.replace("_", "").isalnum() for part in self.ocr_lang.split("+"))):
            raise ConfigError(f"input.documents.ocr_lang: {self.ocr_lang!r} is not a tesseract language "
                              "code such as 'eng' or 'eng+deu'")
        for name, low in (("max_pages", 1), ("max_document_bytes", 1), ("pool_workers", 0), ("queue_depth", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"input.documents.{name}: {value!r} is not an integer >= {low}")

    def fingerprint_dict(self) -> dict[str, Any]:
        """The fields that decide the extracted text (and so the outputs and dead letters)."""
        return {k: v for k, v in asdict(self).items() if k not in self.NOT_IN_FINGERPRINT}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DocumentSettings:
        """Settings of a manifest's ``input.documents`` object.

        Raises:
            ConfigError: an unknown key or an invalid value (the message names the field).
        """
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"input.documents: unknown field(s) {unknown}; known fields are {sorted(names)}")
        return cls(**data)


def suffix_of(uri: str) -> str:
    """The lower-case suffix of a URI's last path segment (``".pdf"``; ``""`` when it has none); a query
    or fragment is not part of it."""
    name = uri.split("?", 1)[0].split("#", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return posixpath.splitext(name)[1].lower()


MODE_SUFFIXES = {"pdf": PDF_SUFFIXES, "html": HTML_SUFFIXES, "ocr": IMAGE_SUFFIXES + PDF_SUFFIXES,
                 "auto": DOCUMENT_SUFFIXES}
"""The files a folder input lists under each ``preprocess`` mode: a folder planned with ``pdf`` takes its
PDFs (other files are not rows of the run), ``auto`` every document suffix."""


def is_document_name(path: str, preprocess: str = "auto") -> bool:
    """Whether a listed file is a document a folder input takes under ``preprocess``: not hidden
    (``.``/``_``) and with a suffix in :data:`MODE_SUFFIXES` of the mode (``auto``: any of
    :data:`DOCUMENT_SUFFIXES`; ``none`` or an unknown mode: none)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith((".", "_")) and suffix_of(name) in MODE_SUFFIXES.get(preprocess, ())


def extractor_for(uri: str, preprocess: str) -> str:
    """Which extractor reads ``uri`` under ``preprocess``: ``pdf``, ``html`` or ``ocr``.

    ``pdf`` and ``html`` read every document as that kind (a file that is not one becomes an
    ``unreadable_document`` dead letter when read); ``ocr`` reads PDFs page by page through OCR and any
    other file as an image; ``auto`` goes by the suffix (PDF, HTML, else image through OCR).

    Raises:
        ConfigError: ``preprocess`` is not a document mode.
    """
    if preprocess in ("pdf", "html"):
        return preprocess
    if preprocess == "ocr":
        return "ocr"
    if preprocess != "auto":
        raise ConfigError(f"preprocess: {preprocess!r} is not one of {list(PREPROCESS_MODES[1:])}")
    suffix = suffix_of(uri)
    if suffix in PDF_SUFFIXES:
        return "pdf"
    if suffix in HTML_SUFFIXES:
        return "html"
    return "ocr"


def document_id(file_uri: str, folder_uri: str) -> str:
    """The id of a document found under a folder input: its path relative to the folder, with ``/``
    separators (the folder's own name is not part of it, so the same tree under another mount or bucket
    gets the same ids); a file given directly gets its own name."""
    base = folder_uri.rstrip("/")
    if file_uri.startswith(base + "/"):
        return file_uri[len(base) + 1:]
    return file_uri.rstrip("/").rsplit("/", 1)[-1]


def index_uri(run_dir: str) -> str:
    """``<run_dir>/documents/index.parquet``: the document index a folder input is planned into."""
    return f"{run_dir.rstrip('/')}/{INDEX_DIR}/{INDEX_NAME}"


def index_root(run_dir: str) -> str:
    """``<run_dir>/documents``: added to the manifest's input roots when it has some, so the worker may
    open the index."""
    return f"{run_dir.rstrip('/')}/{INDEX_DIR}"
