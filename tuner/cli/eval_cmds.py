"""Placeholder command group; filled in by its issue."""

import typer


def register(app: typer.Typer) -> None:
    return None
