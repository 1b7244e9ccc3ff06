import sys

from highway_repro.bench.run import main

sys.exit(main())
