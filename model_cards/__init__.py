"""The model-card template (`template.md`), installed as `shapeformers.model_cards` (see setup.cfg's package_dir)."""
