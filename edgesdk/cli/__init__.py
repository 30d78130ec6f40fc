"""The ``edgesdk`` command line: subcommands grouped by who uses them."""
