"""The log shipper (`diagnoser ship`): follow a file or stdin and stream it to the server.

follow (files, tail -F) and pipe (stdin) are pure I/O sources; client is the HTTP upload and
resume loop; command is the CLI entry that builds them. See docs/shipper.md.
"""
