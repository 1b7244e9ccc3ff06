from highway_repro.report.cli import main

raise SystemExit(main())
