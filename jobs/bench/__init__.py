"""Benchmark code behind ``memlib bench``: load generators, timed builds, synthetic enterprises and
the measurements they print (the CLI commands are in jobs/cli/bench_*.py)."""
