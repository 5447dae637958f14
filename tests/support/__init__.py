"""Test helpers shared by several test modules: fixtures for real servers run on 127.0.0.1."""
