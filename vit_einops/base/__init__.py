"""The base layer: helpers with no model in them (checks, atomic I/O, verified downloads, the JSON
reader, the memory and time budgets, lazy exports, init, Sequential, plotting, text)."""
