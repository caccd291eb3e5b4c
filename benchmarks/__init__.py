"""Performance measurements that print numbers (``python -m benchmarks``; see __main__)."""
