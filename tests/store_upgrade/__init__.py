"""Upgrades from the previous release: its store, its code, and today's on both."""
