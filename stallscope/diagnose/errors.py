"""The one exception that ends a diagnosis early: its message is the one line the CLI
prints before exiting with 2 ("could not diagnose")."""


class DiagnoseError(Exception):
    pass
