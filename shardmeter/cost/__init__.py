"""Regression cost models (paper §III-B): compute, communication, memory, and the versioned
coefficients document that carries them."""
