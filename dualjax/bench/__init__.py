"""Benchmarks: each runs its baseline in the same run, prints one JSON object and can write it to a file."""
