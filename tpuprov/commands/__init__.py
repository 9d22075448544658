"""One module per ``tpuprov`` subcommand, each exposing ``register(subparsers)``."""
