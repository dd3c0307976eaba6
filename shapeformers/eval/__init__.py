"""Evaluation: lm-eval tasks (online, or offline from local JSON Lines files with lm-eval's own definitions),
sliding-window perplexity, and results to model cards. Needs `lm-eval` (`pip install shapeformers[eval]`);
importing this package does not import it."""
