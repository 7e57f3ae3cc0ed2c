"""The framework-neutral parts both callbacks drive: probes that receive the fit's events and publish
``fitprof/epoch/*`` figures."""
