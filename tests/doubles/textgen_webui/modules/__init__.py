"""Test double of the web UI's `modules` package (see ../README.md)."""
