"""The report: tables, Markdown and HTML with charts, rendered from recorded cells and the projection model."""
