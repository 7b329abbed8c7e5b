"""Online template mining, the learned filter set and the compressed log (the Log Agent)."""

from diagnoser.native import load_fresh

load_fresh()  # before anything imports the compiled miner: an old build must not shadow its source
