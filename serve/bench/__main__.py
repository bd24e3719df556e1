"""`python -m serve.bench exports=[…]`: served sentences/s and latency (serve/bench/sweep.py, conf/bench.yaml)."""

from serve.bench.sweep import main

if __name__ == "__main__":
    main()
