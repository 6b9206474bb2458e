"""One module per `gc3` subcommand; each defines `command` (a click command)."""
