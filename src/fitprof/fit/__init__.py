"""The framework-neutral parts both callbacks drive (no framework import)."""
