"""`python -m export.bench`: the runtime's speed against PyTorch or another commit's runtime (export/bench/speed.py)."""

from export.bench.speed import main

if __name__ == "__main__":
    main()
