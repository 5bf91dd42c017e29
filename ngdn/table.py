"""Markdown tables for the command-line reports (``ngdn check``, ``ngdn errors``, ``ngdn scheme check``)."""
from __future__ import annotations


def text_table(rows, header) -> str:
    """``rows`` under ``header`` as a Markdown table, each column as wide as its widest cell."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in rows])
