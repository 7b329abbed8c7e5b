"""Diagnosis: job-level correlation of rule events, the flow rules -> [LLM] -> persist."""
