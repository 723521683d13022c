"""Drafts: every draft kind behind one interface, and the prompt lookup."""
