"""`python -m diagnoser.shipper`: the shipper alone, for images without the service's extras."""

import typer

from diagnoser.shipper.command import ship

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command()(ship)
app()
