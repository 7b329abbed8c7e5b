"""`python -m diagnoser.evaluation [DIR]`: the `diagnoser eval` command on its own."""

import typer

from diagnoser.evaluation.command import evaluate

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(evaluate)
app()
