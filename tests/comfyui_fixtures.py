"""Fixtures of the LOCAL route (ComfyUI activities and double); loaded by conftest."""
