"""Helpers for dart-ray's own tests and benchmarks (not used by the training path)."""
