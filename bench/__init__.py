"""Benchmarks: one module per question, each `run(quick) -> list[record]`, figures beside their limits."""
