"""Harnesses the tests share (a loopback cluster); checkout-only, like the tests."""
