"""Ingest: framing of byte streams into lines, stream offsets, job events."""
