"""Clients of remote services (googletrans), behind the interfaces the stages use."""
