"""Figures several tests share, named for what they are."""

from __future__ import annotations

from spillway.cli.dev import FREE_VRAM_PCT

# An A40 well past the 85 % VRAM threshold: what a test sets to make the GPU busy.
BUSY_VRAM_PCT = 97.0
# routing_tiers.json: MiniMax 768P/6s, the default cloud request's estimated cost.
CLIP_USD = 0.28
# Distinctive on purpose: finding it anywhere but in the MiniMax double's expectation is a leak.
CANARY_KEY = "sk-spillway-CANARY-7f3a9c2e-do-not-log"
# The workers' SPILLWAY_LEDGER_SECRET (a worker with a key does not start without one); the canary
# inside, so the secrets check finds it wherever it leaks.
LEDGER_SECRET = f"{CANARY_KEY}-ledger"
# A key for workers whose create is a stand-in: present (so a job may be approved), never sent.
TEST_KEY = "mm-test-key"

__all__ = ["BUSY_VRAM_PCT", "CANARY_KEY", "CLIP_USD", "FREE_VRAM_PCT", "LEDGER_SECRET", "TEST_KEY"]
