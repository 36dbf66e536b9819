"""The `edgemon` command line: one module per subcommand, dispatched by `main`."""
