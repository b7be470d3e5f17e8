"""Training subcommands of `htmllm` (each module exposes `register(subparsers)`)."""
