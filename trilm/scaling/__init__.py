"""Scaling-law tools."""
