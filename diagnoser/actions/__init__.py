"""Recovery actions: the operator wire contract, plans and the (pure) policy."""
