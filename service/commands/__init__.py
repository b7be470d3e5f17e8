"""Console subcommands that ship with the service image."""

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT
