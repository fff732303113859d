"""`peer-rl bench ...`: benchmarks that print a table. Speed figures live here, never in timed
tests."""
