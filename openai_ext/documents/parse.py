"""A file's text, as a vector store reads it: plain text and code, Markdown, JSON, HTML and PDF.

The format is told by the file's name first and, for names that say nothing, by its bytes: a
UTF-8 text without NUL bytes is read as text. PDFs are read with pypdf; HTML with the standard
library's parser (scripts and styles left out, block elements on lines of their own). Anything
else (images, office documents, archives) is an unsupported file: its vector store file fails with
``unsupported_file`` and says which formats are read.
"""

from __future__ import annotations

import io
import json
from html.parser import HTMLParser
from pathlib import PurePosixPath

TEXT = {".txt", ".md", ".markdown", ".rst", ".csv", ".tsv", ".log", ".tex", ".xml", ".yaml", ".yml", ".toml",
        ".ini", ".py", ".js", ".ts", ".tsx", ".jsx", ".java", ".c", ".h", ".cc", ".cpp", ".hpp", ".cs", ".go",
        ".rs", ".rb", ".php", ".sh", ".css", ".sql", ".kt", ".swift", ".scala", ".lua", ".r", ".jl", ".m"}
HTML = {".html", ".htm", ".xhtml"}
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".zip", ".gz", ".tar", ".docx", ".doc", ".pptx",
          ".xlsx", ".xls", ".mp3", ".wav", ".mp4", ".exe", ".bin"}
READS = "text, code, Markdown, JSON, HTML and PDF"


class Unsupported(Exception):
    """The file is of a kind this server does not read (``unsupported_file``)."""


class Invalid(Exception):
    """The file claims a kind it is not, or holds no text (``invalid_file``)."""


def extract(data: bytes, filename: str) -> str:
    suffix = PurePosixPath(filename.lower()).suffix
    if suffix == ".pdf" or (not suffix and data.startswith(b"%PDF-")):
        text = _pdf(data)
    elif suffix in BINARY:
        raise Unsupported(f"{filename} is a {suffix[1:]} file; vector stores here read {READS}.")
    else:
        raw = _utf8(data, filename)
        if suffix in HTML or (suffix not in TEXT and suffix != ".json" and _looks_html(raw)):
            text = _html(raw)
        elif suffix == ".json":
            try:
                json.loads(raw)
            except ValueError as e:
                raise Invalid(f"{filename} is not valid JSON ({e}).") from None
            text = raw
        else:
            text = raw
    text = text.replace("\x00", "")   # (a NUL is no text, and PostgreSQL's text columns refuse it)
    if not text.strip():
        raise Invalid(f"{filename} holds no text to search.")
    return text


def _utf8(data: bytes, filename: str) -> str:
    if b"\x00" in data[:65536]:
        raise Unsupported(f"{filename} is a binary file; vector stores here read {READS}.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise Unsupported(f"{filename} is not UTF-8 text; vector stores here read {READS} "
                          "(text in UTF-8).") from None


def _looks_html(text: str) -> bool:
    head = text.lstrip()[:512].lower()
    return head.startswith("<!doctype html") or head.startswith("<html")


def _pdf(data: bytes) -> str:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PyPdfError
    except ImportError:
        raise Unsupported("Reading PDFs needs pypdf: pip install pypdf.") from None
    try:
        reader = PdfReader(io.BytesIO(data))
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages)
    except (PyPdfError, ValueError, KeyError, TypeError) as e:
        raise Invalid(f"The PDF could not be read ({e}).") from None


BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre",
          "blockquote", "table", "ul", "ol", "header", "footer", "title"}
SKIPPED = {"script", "style", "noscript", "template", "svg"}


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        if tag in SKIPPED:
            self.skipping += 1
        elif tag in BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def _html(text: str) -> str:
    parser = _Text()
    parser.feed(text)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
