"""Ray Data stages wrapping memlib functions."""
