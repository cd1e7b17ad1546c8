from gpucloud_cli.main import main

raise SystemExit(main())
