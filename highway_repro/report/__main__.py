from highway_repro.report.generic import main

raise SystemExit(main())
