"""Small internal helpers (event loop plumbing, paths)."""
