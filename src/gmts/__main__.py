from gmts.cli import main

raise SystemExit(main())
