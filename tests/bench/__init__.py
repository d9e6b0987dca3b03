"""Benchmarks, not runtime code: ``python -m tests.bench.read`` (also small, plan, view, ab); see the Makefile."""
