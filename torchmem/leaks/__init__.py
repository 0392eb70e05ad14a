"""Leak analysis: what a checked region left alive, who holds it, and growth across steps."""
