"""Console subcommands that ship with the service image."""
