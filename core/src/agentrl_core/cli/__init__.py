"""The ``agentrl`` command line. Each subcommand lives in its own module with
``add_parser(subparsers)`` and ``run(args) -> int``; heavy imports happen inside ``run``."""
