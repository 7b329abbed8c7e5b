"""The LLM stage: prompts, redaction, the OpenAI-compatible client and self-consistency voting."""
