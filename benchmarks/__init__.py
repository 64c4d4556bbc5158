"""cc2ops benchmarks (run on a GPU machine; never part of the test suite)."""
