from feature_repo.synthetic.cli import main

raise SystemExit(main())
