"""memfit's benchmarks: each script compares memfit with what people use today, in one run."""
