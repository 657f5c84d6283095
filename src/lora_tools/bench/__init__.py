"""Load generation and benchmarks (perf_analyzer input data, runners, reports)."""
