"""Pure codecs of the NoKV workspace schema: no I/O, no clocks except id generation."""
