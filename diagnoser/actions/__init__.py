"""Recovery actions: their wire models, the policy that releases them, and their consumers."""
