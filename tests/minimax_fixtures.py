"""Fixtures of the CLOUD route (MiniMax activities and double); loaded by conftest."""
