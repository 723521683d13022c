"""Verification: token-wise and block verifiers, token-tree shapes and tree verification."""
