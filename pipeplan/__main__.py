from pipeplan.cli import main

raise SystemExit(main())
