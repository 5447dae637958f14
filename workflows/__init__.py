"""Workflows: deterministic code only (models, the pure decision, activity references)."""
