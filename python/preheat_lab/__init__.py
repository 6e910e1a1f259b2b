"""preheat-lab: experiments, analysis, plots and reports around the `preheat` CLI.

The Rust tools measure; this package runs them with the right parameters, collects their JSON,
and turns it into tables, plots and an HTML report. Every number it shows carries the label the
tool gave it (measured / emulated / modeled) and its sample count.
"""

__all__ = ["cli", "report", "sleeping"]
