"""Training: the update loop (`trainer`), its settings (`config`), the hooks a procedure such as GHT-PS implements
(`procedure`), and what the loop runs on — optimiser and schedule, threads, CPU allocator, throughput, distributed
ranks, progress bar, stop requests. `python -m zoo.train` is the command; this package is its library."""
