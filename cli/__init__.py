"""The ``llmedge`` command line: a Typer app with one module per command group, imported lazily."""
