"""The fit engine both callbacks drive, and its probes (framework-free)."""
