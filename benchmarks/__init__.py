"""Benchmarks: ``python -m benchmarks [NAME ...]`` runs each ``bench_*.py`` module's ``main()``."""
