# Shortcuts for the scripts under scripts/, which work without make on a fresh machine.
.PHONY: run test check bench

run:
	./scripts/run.sh

test check:
	./scripts/test.sh
