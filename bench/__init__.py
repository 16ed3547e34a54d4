"""Benchmarks that print tables (`python -m bench`); not timed tests."""
