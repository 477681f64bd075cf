"""Helpers shared by the tests and the benchmarks: servers, console drivers, made PDFs, seeds."""
