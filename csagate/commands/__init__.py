"""One module per subcommand; each exposes ``command``."""
