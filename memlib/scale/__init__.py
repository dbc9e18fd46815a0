"""Scale corpora composed from real sessions (no Ray here)."""
