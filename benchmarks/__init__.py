"""Benchmark scripts (a package only so that mypy names benchmarks/redis.py benchmarks.redis, not redis)."""
