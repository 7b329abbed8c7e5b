"""HTTP routers and their dependencies."""
