"""Engines: computations inside attention (statistics without ``[n n]`` maps; the KV press)."""
