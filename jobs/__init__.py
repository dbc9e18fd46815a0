"""Job entrypoints: build, nightly, eval, serve, submit."""
