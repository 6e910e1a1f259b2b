"""A self-contained HTML report: sections with text, tables (pandas) and PNG plots (embedded as
base64; an SVG next to a PNG is linked)."""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from . import atomic


class Report:
    def __init__(self, title: str):
        self.title = title
        self.parts: list[str] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.parts.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def text(self, text: str) -> None:
        self.parts.append(f"<p>{html.escape(text)}</p>")

    def html(self, fragment: str) -> None:
        """Raw HTML (the caller escapes what it interpolates)."""
        self.parts.append(fragment)

    def note(self, text: str, kind: str = "note") -> None:
        self.parts.append(f"<div class='{kind}'>{html.escape(text)}</div>")

    def table(self, df: pd.DataFrame, caption: str | None = None) -> None:
        body = df.to_html(index=False, float_format=lambda x: f"{x:.3g}", border=0, na_rep="–")
        if caption:
            end = body.index(">", body.index("<table")) + 1
            body = body[:end] + f"<caption>{html.escape(caption)}</caption>" + body[end:]
        self.parts.append(body)

    def image(self, png: Path, alt: str, svg: Path | None = None) -> None:
        data = base64.b64encode(Path(png).read_bytes()).decode()
        link = (f" <a href='{html.escape(Path(svg).name)}'>SVG</a>"
                if svg is not None and Path(svg).exists() else "")
        self.parts.append(f"<figure><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'/>"
                          f"<figcaption>{html.escape(alt)}{link}</figcaption></figure>")

    def write(self, path: Path) -> Path:
        style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{padding:2px 8px;"
                 "border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}"
                 "caption{text-align:left;font-style:italic;padding:4px 0}"
                 ".note{color:#444;font-size:90%;margin:.5em 0}"
                 ".warn{background:#fff3cd;border:1px solid #e0c060;padding:.5em 1em;margin:1em 0}"
                 ".fail{background:#f8d7da;border:1px solid #d08080;padding:.5em 1em;margin:1em 0}")
        doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}"
               f"</title><style>{style}</style></head><body><h1>{html.escape(self.title)}</h1>"
               + "\n".join(self.parts) + "</body></html>")
        atomic.write_text(Path(path), doc)
        return Path(path)
