"""A self-contained HTML report: sections with text, tables (pandas) and PNG plots."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import List, Optional

import pandas as pd


class Report:
    def __init__(self, title: str):
        self.title = title
        self.parts: List[str] = []

    def heading(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def text(self, text: str) -> None:
        self.parts.append(f"<p>{html.escape(text)}</p>")

    def table(self, df: pd.DataFrame, caption: Optional[str] = None) -> None:
        cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
        body = df.to_html(index=False, float_format=lambda x: f"{x:.3g}", border=0)
        self.parts.append(body.replace("<table", f"<table class='t'>{cap}", 1) if cap else body)

    def image(self, png: Path, alt: str) -> None:
        data = base64.b64encode(png.read_bytes()).decode()
        self.parts.append(f"<figure><img alt='{html.escape(alt)}' src='data:image/png;base64,{data}'/>"
                          f"<figcaption>{html.escape(alt)}</figcaption></figure>")

    def write(self, path: Path) -> Path:
        style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
                 "table{border-collapse:collapse;margin:1em 0}td,th{padding:2px 8px;"
                 "border-bottom:1px solid #ddd;text-align:right}img{max-width:100%}")
        doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(self.title)}"
               f"</title><style>{style}</style></head><body><h1>{html.escape(self.title)}</h1>"
               + "\n".join(self.parts) + "</body></html>")
        path.write_text(doc)
        return path
