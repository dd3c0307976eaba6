"""Small training recipes on local text: the `shapeformers demo` run and its data helpers."""
