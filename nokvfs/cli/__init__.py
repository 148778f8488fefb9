"""The `nokvfs` command line: a thin front over the workspace facade.

    main.py       the parser, the command-module registry, the one error -> exit code table
    common.py     what every command module shares: opening the root, WB:PATH targets, sizes
    render.py     text and JSON formatting of workbenches, path entries and listings
    commands.py   init, workbench, put, get, ls, stat, rm, mv, append

Command modules expose `register(subparsers)`; `nokvfs.cli.main.COMMAND_MODULES` lists them.
"""
