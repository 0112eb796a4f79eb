"""The sections of report.md after the answer, one module per kind (markdown.py puts them in order)."""
