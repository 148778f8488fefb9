"""The Workbench facade: one module per state machine, every durable change one MetadataCommand."""
