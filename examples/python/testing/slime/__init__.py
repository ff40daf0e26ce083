"""Stand-in for THUDM/slime in tests; see ../README.md."""
