"""The prepared GPU check: the wheel bundle the device machine lacks, the one script run there
(gpu_check.sh), its stages (tests, kernel timings, served benchmarks) and the lists they read."""
