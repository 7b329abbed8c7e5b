"""Online template mining, the learned filter set and the compressed log (the Log Agent)."""
