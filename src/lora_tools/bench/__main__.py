"""`python -m lora_tools.bench [--config FILE] ...`: the benchmarks of `make bench`."""

import sys

from lora_tools.bench.run import main

if __name__ == "__main__":
    sys.exit(main())
