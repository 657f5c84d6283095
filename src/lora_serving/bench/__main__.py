"""`python -m lora_serving.bench [--config FILE] ...`: the benchmarks of `make bench`."""

import sys

from lora_serving.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
