"""Files installed into the lab node image (stdlib-only python3 scripts)."""
